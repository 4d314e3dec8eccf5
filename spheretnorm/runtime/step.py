"""One training step's gradients, shared by train.py, bench.py and the coordinate check.

The forward under autocast, the loss (the model's cross-entropy plus the registered loss terms
that are on, runtime/loss_terms.py), the backward of each micro-batch (through the grad scaler,
divided by the number of micro-batches), then, where the caller clips, unscaling and clipping.
The optimizer's step is the caller's: train.py agrees with the other ranks first, bench.py times
it apart. With no loss term on, the operations are the ones each command ran before this module
existed, so the same seed gives the same losses bit for bit.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import torch

from spheretnorm.runtime.loss_terms import extra_loss
from spheretnorm.runtime.parallel import clip_grad_norm

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class StepLosses:
    """What a step's backward was of, summed over its micro-batches (each divided by their number)."""

    loss: torch.Tensor  # the cross-entropy alone (float, detached): what train rows, tables and evaluations call the loss
    total: torch.Tensor  # with the loss terms that are on: what the gradient is of (equal to loss when none is)
    grad_norm: torch.Tensor | None  # the gradients' global norm before clipping; None where the caller does not clip


def forward_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, train: Any,
                 autocast: ContextManager | None = None, loss_hook: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cross-entropy, total) of one micro-batch; loss_hook sees the cross-entropy first (train.py's fault injection)."""
    with autocast or contextlib.nullcontext():
        logits, loss = model(x, y)
        if loss_hook is not None:
            loss = loss_hook(loss)
        extra = extra_loss(logits, y, train)
    return loss, loss if extra is None else loss + extra


def backward_step(
    model: torch.nn.Module,
    batch: Callable[[int], Batch],
    train: Any,
    *,
    accum: int = 1,
    autocast: ContextManager | None = None,
    scaler: torch.amp.GradScaler | None = None,
    sync: Callable[[bool], ContextManager] | None = None,
    loss_hook: Callable[[torch.Tensor], torch.Tensor] | None = None,
    clip: torch.nn.Module | None = None,
    optimizer: Any = None,
) -> StepLosses:
    """Accumulate one optimizer step's gradients in `model` (the module that runs the forward:
    the model itself, compiled or DDP-wrapped) over `accum` micro-batches, batch(i) giving the
    i-th; the next one is drawn while the current one's backward is queued (the GPU works).

    sync(last) wraps each micro-step (DDP reduces on the last only); scaler scales each backward
    (fp16) and is unscaled on `optimizer` before clipping. clip: the model whose gradients are
    clipped to train.grad_clip (0: no clipping, the norm still measured); None: neither.
    """
    x, y = batch(0)
    loss_sum = total_sum = None
    for micro in range(accum):
        last = micro == accum - 1
        with sync(last) if sync is not None else contextlib.nullcontext():
            loss, total = forward_loss(model, x, y, train, autocast, loss_hook)
            part = total / accum
            if not last:
                x, y = batch(micro + 1)
            (scaler.scale(part) if scaler is not None else part).backward()
        ce = part if total is loss else loss / accum
        loss_sum = ce.detach().float() if loss_sum is None else loss_sum + ce.detach().float()
        total_sum = part.detach().float() if total_sum is None else total_sum + part.detach().float()
    grad_norm = None
    if clip is not None:
        if scaler is not None:
            scaler.unscale_(optimizer)
        grad_norm = clip_grad_norm(clip, train.grad_clip if train.grad_clip > 0 else math.inf)
    return StepLosses(loss_sum, total_sum, grad_norm)
