"""Shared plumbing for every script: device, dtype, autocast, seeding, distributed set-up.

Scripts (train.py, eval/, scripts/) import from here instead of repeating this logic.
"""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parent
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Dense bf16 tensor-core peak FLOP/s, for MFU. Keys are matched against the device name.
GPU_PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10": 125e12,
    "4090": 165e12,
}


def get_device(device: str = "auto") -> str:
    """'auto' picks cuda, then mps, then cpu; anything else is returned as given."""
    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_master(self) -> bool:
        return self.rank == 0


def init_distributed(backend: str | None = None) -> DistInfo:
    """Join the process group when launched by torchrun (RANK set), else single process."""
    if int(os.environ.get("RANK", -1)) == -1:
        return DistInfo()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group(backend=backend)
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size)


def print0(*args, **kwargs) -> None:
    """print on rank 0 only."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(*args, **kwargs)


def enable_tf32() -> None:
    """TF32 for fp32 matmuls on Ampere and later GPUs (the rest of the model runs in bf16)."""
    torch.set_float32_matmul_precision("high")


def rng_state() -> dict:
    """Every random number generator a training step can touch (dropout, shuffling, ...)."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
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


def atomic_torch_save(obj: object, path: str | Path) -> None:
    """torch.save to a temp file beside `path`, then rename: a crash never leaves half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())  # on disk before the rename, so a node crash cannot leave it empty
    os.replace(tmp, path)
