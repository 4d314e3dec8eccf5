"""The learning-rate schedule: linear warm-up, then cosine decay to min_lr (nanoGPT's)."""

from __future__ import annotations

import math

from spheretnorm.runtime.config import TrainConfig


def learning_rate_at(step: int, cfg: TrainConfig) -> float:
    """LR of optimizer step `step` (0-based): linear warm-up from 0, cosine to min_lr, then flat."""
    if not cfg.decay_lr:
        return cfg.learning_rate
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / cfg.warmup_iters
    if step >= cfg.lr_decay_iters:
        return cfg.min_lr
    progress = (step - cfg.warmup_iters) / max(1, cfg.lr_decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)
