"""Writing a training run's checkpoint, as train.py's Trainer.save_checkpoint asks: the model, the
optimizer and what a resume reads besides, with every rank's RNG state.

A plain run writes one file (rank 0, atomically: checkpoint.atomic_torch_save); a sharded one a
folder of every rank's shards (sharded_checkpoint.save_sharded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from spheretnorm.optim import Optimizers
from spheretnorm.runtime.checkpoint import atomic_torch_save, checkpoint_state
from spheretnorm.runtime.device import rng_state
from spheretnorm.runtime.distributed import DistInfo
from spheretnorm.runtime.sharded_checkpoint import save_sharded


def gathered_rng(dist: DistInfo) -> list[Any]:
    """Every rank's RNG state, by rank (a collective: all ranks call it)."""
    if not dist.enabled:
        return [rng_state()]
    states: list[Any] = [None] * dist.world_size
    torch_dist.all_gather_object(states, rng_state())
    return states


def write_run_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: Optimizers, extra: dict[str, Any], sharded: bool, dist: DistInfo, device: str
) -> None:
    """All ranks call this; `extra` is what a resume reads besides the model and the optimizer."""
    extra = {**extra, "rng": gathered_rng(dist), "world_size": dist.world_size}
    if sharded:  # every rank writes its shards
        save_sharded(path, model, optimizer, {**checkpoint_state(model, weights=False), **extra}, dist, device)
    elif dist.is_master:
        atomic_torch_save({**checkpoint_state(model), "optimizer": optimizer.state_dict(), **extra}, path)
