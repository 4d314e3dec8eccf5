"""The learning-rate schedule: linear warm-up, then cosine decay to min_lr (nanoGPT's).

learning_rate_at is the schedule of learning_rate itself; every parameter group follows the same
shape from its own peak rate (its "peak_lr", stamped by optim.build_optimizer): a group's rate at
step s is its peak times learning_rate_at(s) / learning_rate, so min_lr / learning_rate is every
group's floor as a fraction of its peak.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from spheretnorm.optim import PEAK_LR
from spheretnorm.runtime.config import TrainConfig


def learning_rate_at(step: int, cfg: TrainConfig) -> float:
    """LR of optimizer step `step` (0-based): linear warm-up from 0, cosine to min_lr, then flat."""
    return scheduled(step, cfg, cfg.learning_rate, cfg.min_lr)


def scheduled(step: int, cfg: TrainConfig, peak: float, floor: float) -> float:
    """The schedule's shape (cfg's warm-up and decay steps) from `peak` down to `floor`."""
    if not cfg.decay_lr:
        return peak
    if step < cfg.warmup_iters:
        return peak * (step + 1) / cfg.warmup_iters
    if step >= cfg.lr_decay_iters:
        return floor
    progress = (step - cfg.warmup_iters) / max(1, cfg.lr_decay_iters - cfg.warmup_iters)
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - floor)


def peak_in_learning_rates(group: dict[str, Any], learning_rate: float) -> float:
    """A group's peak rate in units of learning_rate (> 0). A group that carries its μP factor
    unrounded ("lr_scale", optim.adamw_groups) takes it where it agrees with the peak: peak /
    learning_rate can differ from it in the last bit, and the schedule's rates of earlier commits
    were learning_rate_at(step) * lr_scale exactly."""
    peak, scale = group[PEAK_LR], group.get("lr_scale")
    if scale is not None and learning_rate * scale == peak:
        return scale
    return peak / learning_rate


def group_rate_at(group: dict[str, Any], step: int, cfg: TrainConfig) -> float:
    """The rate of `group` at optimizer step `step`: its peak scaled as the schedule scales learning_rate."""
    if cfg.learning_rate > 0:  # written so that a group at learning_rate has learning_rate_at(step) exactly
        return learning_rate_at(step, cfg) * peak_in_learning_rates(group, cfg.learning_rate)
    # learning_rate=0 (so min_lr=0) freezes learning_rate's groups, not a group with a peak of its own.
    return group[PEAK_LR] * scheduled(step, cfg, 1.0, 0.0)


def apply_schedule(groups: Iterable[dict[str, Any]], step: int, cfg: TrainConfig) -> None:
    """Set every group's lr for optimizer step `step`."""
    for group in groups:
        group["lr"] = group_rate_at(group, step, cfg)
