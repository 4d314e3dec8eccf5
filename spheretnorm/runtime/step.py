"""One training step's gradients, shared by train.py, bench.py and the coordinate check.

The forward under autocast, the loss (cross-entropy plus the loss terms that are on), the backward
of each micro-batch, then, where the caller clips, unscaling and clipping; the optimizer's step is
the caller's. With no loss term on, the operations are the ones each command ran before this module
existed, so the same seed gives the same losses bit for bit.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ContextManager

import torch

from spheretnorm.runtime.loss_terms import active_loss_terms, loss_term_values, switch_off
from spheretnorm.runtime.parallel import clip_grad_norm
from spheretnorm.runtime.run_folder import LossTermError, NonFiniteLossError

if TYPE_CHECKING:
    from spheretnorm.runtime.tracking import Progress

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class StepLosses:
    """What a step's backward was of, summed over its micro-batches (each divided by their number)."""

    loss: torch.Tensor  # the cross-entropy alone (float, detached): what train rows, tables and evaluations call the loss
    total: torch.Tensor  # with the loss terms that are on: what the gradient is of (equal to loss when none is)
    grad_norm: torch.Tensor | None  # the gradients' global norm before clipping; None where the caller does not clip
    # Each micro-batch's loss-term values by name, detached (no kernel, no sync): read only where
    # the total is not finite, to name the term (check_terms_finite).
    terms: list[dict[str, torch.Tensor]] = field(default_factory=list)


def forward_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, train: Any,
                 autocast: ContextManager | None = None, loss_hook: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(cross-entropy, total, the value of each loss term that is on) of one micro-batch; loss_hook
    sees the cross-entropy first (train.py's fault injection). A term that raises or returns other
    than a scalar tensor is a LossTermError naming it (loss_terms.loss_term_values)."""
    with autocast or contextlib.nullcontext():
        logits, loss = model(x, y)
        if loss_hook is not None:
            loss = loss_hook(loss)
        if logits is None and active_loss_terms(train):  # loss_chunk_tokens: parse_config refuses this pairing first
            raise LossTermError("the loss terms read the logits, which loss_chunk_tokens > 0 never forms; set loss_chunk_tokens=0.")
        terms = loss_term_values(logits, y, train, LossTermError)
        values = list(terms.values())
        extra = sum(values[1:], values[0]) if values else None  # the terms' sum first: the order the totals had before
    return loss, loss if extra is None else loss + extra, terms


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
    """Accumulate one optimizer step's gradients in `model` (the module that runs the forward) over
    `accum` micro-batches, batch(i) giving the i-th, drawn while the previous backward is queued.

    sync(last) wraps each micro-step (DDP reduces on the last only); scaler scales each backward
    (fp16) and is unscaled on `optimizer` before clipping. clip: the model whose gradients are
    clipped to train.grad_clip (0: no clipping, the norm still measured); None: neither.
    """
    x, y = batch(0)
    loss_sum = total_sum = None
    terms = []
    for micro in range(accum):
        last = micro == accum - 1
        with sync(last) if sync is not None else contextlib.nullcontext():
            loss, total, micro_terms = forward_loss(model, x, y, train, autocast, loss_hook)
            part = total / accum
            if not last:
                x, y = batch(micro + 1)
            (scaler.scale(part) if scaler is not None else part).backward()
        ce = part if total is loss else loss / accum
        loss_sum = ce.detach().float() if loss_sum is None else loss_sum + ce.detach().float()
        total_sum = part.detach().float() if total_sum is None else total_sum + part.detach().float()
        terms.append({name: value.detach() for name, value in micro_terms.items()})
    grad_norm = None
    if clip is not None:
        if scaler is not None:
            scaler.unscale_(optimizer)
        grad_norm = clip_grad_norm(clip, train.grad_clip if train.grad_clip > 0 else math.inf)
    return StepLosses(loss_sum, total_sum, grad_norm, terms)


def check_terms_finite(losses: StepLosses, total: float, step: int, progress: Progress) -> None:
    """Stop where the loss terms made step `step`'s all-reduced total not finite, the cross-entropy
    being finite (checked first): at a session's first step the term itself is wrong (a log of 0,
    say), a LossTermError naming it; later it is the run's divergence, NonFiniteLossError. Under fp16
    this is the only stop: the grad scaler would skip every step of a non-finite term."""
    if math.isfinite(total):
        return
    found = nonfinite_term(losses.terms)
    names = [found[0]] if found else list(losses.terms[0])  # this rank's were finite: another rank's were not
    value = found[1] if found else total
    what = f"loss term {names[0]!r}" if found else f"loss terms {', '.join(map(repr, names))} (on another rank)"
    if step == progress.start_iter:
        raise LossTermError(
            f"{what} returned {value} at iter {step + 1}, this session's first step, where a term's value must be a finite number; "
            f"fix it, or turn it off with {' '.join(switch_off(name) for name in names)}.",
            shared=True,
        )
    raise NonFiniteLossError.at(what, value, step + 1, progress.kept_checkpoint_text())


def nonfinite_term(terms: list[dict[str, torch.Tensor]]) -> tuple[str, float] | None:
    """(name, value) of the first term of this rank that was not finite in a micro-batch; None
    where all were. Each value read is a sync: only on the way to a stop."""
    for micro in terms:
        for name, value in micro.items():
            if not math.isfinite(number := value.item()):
                return name, number
    return None
