"""The machine a command runs on: device and dtype choice, autocast, seeding and RNG state, MFU's
peak FLOP/s, and how many CPU threads torch runs (for every command that computes on a CPU: one
per free core unless OMP_NUM_THREADS says, and one line that says which). Commands import it
instead of repeating this logic; distributed.py joins the process group."""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Dense bf16 tensor-core peak FLOP/s, for MFU. Keys are matched against the device name, in order (A100 before A10).
GPU_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "4090": 165e12}


class DeviceError(ValueError):
    """The requested device cannot be used with the installed torch (a user-facing, one-sentence error)."""


_DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda)(?::(\d+))?$")
_NVIDIA_PROC_GPUS = Path("/proc/driver/nvidia/gpus")
_NVIDIA_DEVICE_NODE = Path("/dev/nvidia0")
_warned_cpu_torch_on_gpu_machine = False


def nvidia_gpus_present() -> bool:
    """True when the NVIDIA driver sees a GPU on this machine, whatever torch was built for: checked
    without torch (a CPU-only torch cannot tell), by the driver's /proc entries, the device node, `nvidia-smi -L`."""
    try:
        if _NVIDIA_PROC_GPUS.is_dir() and any(_NVIDIA_PROC_GPUS.iterdir()):
            return True
        if _NVIDIA_DEVICE_NODE.exists():
            return True
    except OSError:  # unreadable /proc or /dev: fall through to nvidia-smi
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(line.startswith("GPU ") for line in listing.splitlines())


def torch_is_cpu_only_build() -> bool:
    """True when the installed torch was built without CUDA (and without ROCm, which also serves 'cuda')."""
    return torch.version.cuda is None and getattr(torch.version, "hip", None) is None


def _warn_cpu_torch_on_gpu_machine() -> None:
    """The loud warning for device=auto falling back to the CPU while GPUs sit idle, once per process
    (get_device is called more than once per run)."""
    global _warned_cpu_torch_on_gpu_machine
    if _warned_cpu_torch_on_gpu_machine:
        return
    _warned_cpu_torch_on_gpu_machine = True
    build = f"torch {torch.__version__}" + (" (a CPU-only build)" if torch_is_cpu_only_build() else "")
    print(
        "\n"
        "WARNING ***********************************************************************\n"
        "WARNING: this machine has NVIDIA GPUs, but torch cannot use them, so device=auto\n"
        f"WARNING: runs on the CPU, many times slower. Installed: {build}.\n"
        "WARNING: Fix: install a CUDA build of torch in this environment, for the CUDA\n"
        "WARNING: version your driver supports (https://pytorch.org/get-started/locally/),\n"
        "WARNING: then `pip install -e .` again; or check CUDA_VISIBLE_DEVICES.\n"
        "WARNING: To run on the CPU on purpose, pass --device=cpu.\n"
        "WARNING ***********************************************************************\n",
        file=sys.stderr,
        flush=True,
    )


def _mps_available() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def _check_cuda_device(device: str, index: str | None) -> None:
    """Raise DeviceError unless torch can use the CUDA device `device` (cuda or cuda:N)."""
    if not torch.cuda.is_available():
        if torch_is_cpu_only_build():
            raise DeviceError(
                f"device={device!r} needs CUDA, but the installed torch {torch.__version__} is a CPU-only "
                "build; install a CUDA build of torch (see README, Quick start) or use --device=cpu."
            )
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        raise DeviceError(
            f"device={device!r} needs CUDA, but torch {torch.__version__} sees no usable GPU{where}; "
            "run on a GPU node or use --device=cpu."
        )
    count = torch.cuda.device_count()
    if index is not None and int(index) >= count:
        raise DeviceError(f"device={device!r} does not exist: {count} GPU(s) are visible, cuda:0 to cuda:{count - 1}.")


def get_device(device: str = "auto") -> str:
    """The torch device to run on: 'auto' picks cuda, then mps, then cpu (with a loud warning on a
    machine with NVIDIA GPUs); an explicit device that this torch cannot use raises DeviceError."""
    match = _DEVICE_RE.match(device)
    if match is None:
        raise DeviceError(f"device={device!r} is not valid; use auto, cpu, cuda, cuda:N or mps.")
    kind, index = match.groups()
    if kind == "auto":
        if index is not None:
            raise DeviceError(f"device={device!r} is not valid; use auto, cpu, cuda, cuda:N or mps.")
        if torch.cuda.is_available():
            return "cuda"
        if _mps_available():
            return "mps"
        if nvidia_gpus_present():
            _warn_cpu_torch_on_gpu_machine()
        return "cpu"
    if kind == "cuda":
        _check_cuda_device(device, index)
    elif kind == "mps" and not _mps_available():
        raise DeviceError(f"device={device!r} is not available with this torch and machine; use --device=cpu or auto.")
    return device


def available_device(device: str) -> str:
    """get_device's choice, except that a CUDA device on a machine without CUDA falls back to auto's
    (the zero-shot harness: lm-eval's CLI passes device "cuda:0" unless told otherwise; its hf
    model falls back the same way)."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        warnings.warn(f"Device {device!r} requested but CUDA is not available; using {get_device('auto')!r}.")
        return get_device("auto")
    return get_device(device)


def resolve_dtype(dtype: str, device_type: str) -> str:
    """'auto' means bf16 on a CUDA device that supports it, fp32 elsewhere."""
    if dtype == "auto":
        if device_type == "cuda" and torch.cuda.is_bf16_supported():
            return "bfloat16"
        return "float32"
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; valid values are: auto, {', '.join(DTYPES)}.")
    return dtype


def autocast_context(device_type: str, dtype: str) -> contextlib.AbstractContextManager:
    """Mixed precision for bf16/fp16, a no-op for fp32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=DTYPES[dtype])


def peak_flops_for(device: str) -> float | None:
    """Peak bf16 FLOP/s of the current CUDA device if known, else None (MFU not reported)."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    for key, flops in GPU_PEAK_FLOPS.items():
        if key in name:
            return flops
    return None


def estimate_mfu(model: torch.nn.Module, fwdbwd_per_iter: int, dt: float, peak_flops: float) -> float:
    """Model FLOPs utilisation of a GPT as a fraction of peak_flops (e.g. 989e12 for H100 bf16);
    FLOPs per token as the PaLM paper (Appendix B) counts them: 6N + 12 L H Q T."""
    cfg = model.config
    N = model.get_num_params()
    L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
    flops_per_token = 6 * N + 12 * L * H * Q * T
    flops_per_iter = flops_per_token * T * fwdbwd_per_iter
    return flops_per_iter / dt / peak_flops


def seed_everything(seed: int) -> None:
    random.seed(seed)
    # numpy takes seeds below 2**32; train.py seeds rank r with seed + r, which may pass the largest
    # valid --seed, so wrap (a no-op for every seed numpy takes).
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def enable_tf32() -> None:
    """TF32 for fp32 matmuls on Ampere and later GPUs (the rest of the model runs in bf16)."""
    torch.set_float32_matmul_precision("high")


def rng_state() -> dict:
    """Every random number generator a training step can touch (dropout, shuffling, ...)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device's generator
    return state


def set_rng_state(state: dict) -> None:
    """Restore what rng_state() captured (a CUDA state is skipped when running on CPU)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


# -----------------------------------------------------------------------------
# CPU threads

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
