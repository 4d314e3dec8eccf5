"""The lines train.py prints as a run starts, about choices a first run easily gets wrong: how
many CPU threads run (and the thread default itself), a warm-up as long as the run, and a sphere
connection under a Hyperball optimizer at its initial radius."""

from __future__ import annotations

import os
from typing import Mapping

import torch

from spheretnorm.model import CONNECTIONS, GPTConfig, SphereConnection
from spheretnorm.optim import OPTIMIZERS, Hyperball
from spheretnorm.runtime.config import TrainConfig
from spheretnorm.runtime.distributed import print0

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
    if given:
        return None, f"CPU: {torch.get_num_threads()} torch thread(s), as OMP_NUM_THREADS={given} says."
    threads = default_cpu_threads(cores, load)
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


def warmup_note(train: TrainConfig) -> str | None:
    """A warning when the warm-up lasts the whole run: the peak rate is never reached."""
    if train.eval_only or train.warmup_iters < train.max_iters:
        return None
    return (
        f"warning: warmup_iters={train.warmup_iters} >= max_iters={train.max_iters}: the learning rate never reaches its "
        f"peak and the collapse alarm never counts; for a short run set --warmup_iters below {train.max_iters}."
    )


def hyperball_note(train: TrainConfig, model: GPTConfig) -> str | None:
    """A note when a sphere connection runs a Hyperball optimizer at the matrices' initial radius,
    which holds every sphere step at its init size (docs/OPTIMIZERS.md, "With a sphere connection")."""
    recipe, connection = OPTIMIZERS.get(train.optimizer), CONNECTIONS.get(model.connection)
    if recipe is None or connection is None or not issubclass(recipe, Hyperball) or not issubclass(connection, SphereConnection):
        return None
    if train.optimizer_params.get("hyperball_radius", 0) != 0:
        return None
    return (
        f"note: {train.optimizer} keeps each block matrix at its initial norm (hyperball_radius=0), which holds "
        f"{model.connection}'s sphere steps small and barely trains it; --hyperball_radius=1 is what docs/OPTIMIZERS.md measured best."
    )


def announce_start(train: TrainConfig, model: GPTConfig, device: str) -> None:
    """Set the CPU threads and print (rank 0) the lines above that apply to this run."""
    for line in (set_cpu_threads(device), warmup_note(train), hyperball_note(train, model)):
        if line:
            print0(line)
