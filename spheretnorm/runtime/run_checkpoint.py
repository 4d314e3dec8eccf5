"""Writing a training run's checkpoint, as train.py's Trainer.save_checkpoint asks: the model, the
optimizer and what a resume reads besides, with every rank's RNG state (in plain values:
checkpoint.rng_to_plain); and restoring the weights and the optimizer on resume under the
current settings (restore_training_state).

A plain run writes one file (rank 0, atomically: checkpoint.atomic_torch_save); a sharded one a
folder of every rank's shards (sharded_checkpoint.save_sharded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from spheretnorm.optim import Optimizers, apply_group_settings, group_settings, refused_resume_change
from spheretnorm.runtime.checkpoint import atomic_torch_save, checkpoint_state, rng_to_plain
from spheretnorm.runtime.config import ConfigError, TrainConfig
from spheretnorm.runtime.device import rng_state
from spheretnorm.runtime.distributed import DistInfo
from spheretnorm.runtime.sharded_checkpoint import restore_weights, save_sharded


def gathered_rng(dist: DistInfo) -> list[Any]:
    """Every rank's RNG state, by rank (a collective: all ranks call it)."""
    if not dist.enabled:
        return [rng_to_plain(rng_state())]
    states: list[Any] = [None] * dist.world_size
    torch_dist.all_gather_object(states, rng_to_plain(rng_state()))
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


def restore_training_state(cfg: TrainConfig, ckpt: dict[str, Any], model: torch.nn.Module, optimizer: Optimizers, path: Path) -> None:
    """The checkpoint's weights and optimizer state, trained on under the current settings: the
    saved param groups that load_state_dict restores give way to those cfg built (rates, betas,
    weight decay, every optimizer key), and a changed key the state fixes is refused."""
    refusal = None if cfg.fresh_optimizer else refused_resume_change(cfg, ckpt["train_config"].get("optimizer_params") or {})
    if refusal:
        raise ConfigError(refusal)
    fresh = group_settings(optimizer)
    restore_weights(cfg, ckpt, model, optimizer, path)
    apply_group_settings(optimizer, fresh)
