"""How many CPU threads torch runs, chosen in one place for every command that computes on a CPU
(train.py, sample.py, the export, the consolidation, the zero-shot evaluation, the tables): one per
free core unless OMP_NUM_THREADS says, and one line that says which."""

from __future__ import annotations

import os
import sys
from typing import Mapping

import torch

# torch's own default, one thread per (affinity-allowed) core, taken once: set_num_threads below
# changes what get_num_threads says for the rest of the process (tests run train.main many times).
TORCH_DEFAULT_THREADS = torch.get_num_threads()


def load_average() -> float | None:
    """The 1-minute load average: how many cores other work keeps busy (None where unknown)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows
        return None


def default_cpu_threads(cores: int, load: float | None) -> int:
    """Threads for torch on `cores` cores of which `load` are busy: the free ones, at least one.

    torch's own default, one thread per core, is the fastest on an idle machine but the slowest
    on a loaded one: its threads wait for each other at every operation, and each wait is a
    whole time slice when another process holds the core (issue 46: the quick start on a 2-core
    machine busy with other jobs ran 6.27 s per iteration with 2 threads, 0.72 s with one).
    """
    busy = 0 if load is None else round(load)
    return max(1, min(cores, cores - busy))


def cpu_threads_note(env: Mapping[str, str], cores: int, load: float | None) -> tuple[int | None, str]:
    """(threads to set, None to keep the user's; the line saying how many run and how to change it)."""
    given = env.get("OMP_NUM_THREADS", "").strip()
    if given and given.isdigit() and int(given) > 0:
        return None, f"CPU: {torch.get_num_threads()} torch thread(s), as OMP_NUM_THREADS={given} says."
    threads = default_cpu_threads(cores, load)
    if given:  # 0, -1 or a word: OpenMP itself ignores it, so the load decides as if it were unset
        return threads, (f"CPU: {threads} torch thread(s) on {cores} core(s): OMP_NUM_THREADS={given!r} is not a positive "
                         "integer and is ignored; set it to 1, 2, ... to choose.")
    why = "one per core, torch's default" if threads == cores else f"torch's default is one per core; the load average, {load:.1f}, leaves room for {threads}"
    return threads, (
        f"CPU: {threads} torch thread(s) on {cores} core(s) ({why}); set OMP_NUM_THREADS=N to choose "
        "(on a machine shared with other jobs, fewer threads than cores is faster)."
    )


def set_cpu_threads(device: str) -> str | None:
    """On a CPU run, choose torch's thread count unless OMP_NUM_THREADS did; the line saying so."""
    if not device.startswith("cpu"):
        return None
    threads, line = cpu_threads_note(os.environ, TORCH_DEFAULT_THREADS, load_average())
    if threads is not None:
        torch.set_num_threads(threads)
    return line


def cpu_threads_in_use(device: str) -> int | None:
    """torch's thread count on a CPU run (what config.json and the checkpoint record: one and two
    threads give other losses from the first step on), None on an accelerator."""
    return torch.get_num_threads() if device.startswith("cpu") else None


def announce_cpu_threads(device: str) -> None:
    """set_cpu_threads for a command whose stdout is its own output (text, a table): the line on stderr."""
    line = set_cpu_threads(device)
    if line:
        print(line, file=sys.stderr, flush=True)
