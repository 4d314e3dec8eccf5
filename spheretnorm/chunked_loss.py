"""The LM head and the cross-entropy in chunks of tokens: the full logits (N x V) are never held.

GPT.forward takes this path under the model key loss_chunk_tokens > 0 (an execution key: it
changes the loss and the gradients only to rounding). The plain path materialises the logits of
every token of the micro-batch, in fp32 for the loss: 3.3 GB at 16 x 1024 tokens and GPT-2's
50,304-token vocabulary. Here forward keeps, per token, only the logsumexp of its logits, and
backward computes each chunk's logits again (one more head matmul per step): memory for time.

Only a head that is a linear map is supported (nn.Linear, with or without a bias, or a head
that gives its matrix with a method linear_weight(), as nGPT's scaled head does); any other
head is refused with one error, since its logits are not x @ W.T + b.

Like model.py this file is copied unchanged into a Hugging Face export: it imports torch only.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn import functional as F

IGNORE_INDEX = -1  # the targets GPT.forward's cross-entropy leaves out


class ChunkedLossError(ValueError):
    """A head the chunked path cannot compute (its logits are not a linear map of its input)."""


def head_weight_bias(head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(W, b) of an LM head whose logits are x @ W.T + b; ChunkedLossError for any other head."""
    linear_weight = getattr(head, "linear_weight", None)
    if callable(linear_weight):
        return linear_weight(), getattr(head, "bias", None)
    if isinstance(head, nn.Linear) and type(head).forward is nn.Linear.forward:
        return head.weight, head.bias
    raise ChunkedLossError(
        f"loss_chunk_tokens needs an LM head whose logits are a linear map of its input (nn.Linear, or a head with a "
        f"linear_weight() method); this model's head is {type(head).__name__}, which computes them otherwise; set loss_chunk_tokens=0."
    )


def _compute_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype of the head's matmul: autocast's where it is on (as lm_head(x) would run), else the inputs'."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(x.dtype, weight.dtype)


def _chunk_logits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """x @ W.T + b in `dtype` (the plain path's), returned in fp32 (at least) as the loss reads it."""
    b = None if bias is None else bias.to(dtype)
    logits = F.linear(x.to(dtype), weight.to(dtype), b)
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


class ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of x @ W.T + b against targets (IGNORE_INDEX rows left out), in chunks of rows."""

    @staticmethod
    def forward(ctx, x, weight, bias, targets, chunk):  # noqa: ANN001, ANN205 - autograd's signature
        dtype = _compute_dtype(x, weight)
        loss_dtype = torch.promote_types(dtype, torch.float32)  # the logits' dtype in the loss: fp32, or fp64
        with torch.autocast(x.device.type, enabled=False):
            n = x.size(0)
            lse = torch.empty(n, dtype=loss_dtype, device=x.device)
            total = torch.zeros((), dtype=loss_dtype, device=x.device)
            for start in range(0, n, chunk):
                logits = _chunk_logits(x[start : start + chunk], weight, bias, dtype)
                t = targets[start : start + chunk]
                row_lse = torch.logsumexp(logits, dim=-1)
                picked = logits.gather(1, t.clamp_min(0).unsqueeze(1)).squeeze(1)
                total = total + torch.where(t != IGNORE_INDEX, row_lse - picked, 0.0).sum()
                lse[start : start + chunk] = row_lse
            count = (targets != IGNORE_INDEX).sum()
        ctx.compute_dtype, ctx.chunk, ctx.has_bias = dtype, chunk, bias is not None
        saved = (x, weight, targets, lse, count) + ((bias,) if bias is not None else ())
        ctx.save_for_backward(*saved)
        return total / count  # nan where every row is ignored, as F.cross_entropy's mean

    @staticmethod
    def backward(ctx, grad_out):  # noqa: ANN001, ANN205
        x, weight, targets, lse, count = ctx.saved_tensors[:5]
        bias = ctx.saved_tensors[5] if ctx.has_bias else None
        dtype, chunk, loss_dtype = ctx.compute_dtype, ctx.chunk, lse.dtype
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        scale = grad_out.to(loss_dtype) / count
        grad_x = torch.empty_like(x) if need_x else None
        grad_w = torch.zeros(weight.shape, dtype=loss_dtype, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.size(0), dtype=loss_dtype, device=weight.device) if need_b and bias is not None else None
        w = weight.to(dtype)
        for start in range(0, x.size(0), chunk):
            xc = x[start : start + chunk]
            t = targets[start : start + chunk]
            logits = _chunk_logits(xc, weight, bias, dtype)
            # d loss / d logits: (softmax - one-hot) / count on counted rows, 0 on ignored ones.
            # In place on the chunk's fresh logits: one chunk-sized buffer, not three.
            grad = logits.sub_(lse[start : start + chunk].unsqueeze(1)).exp_()
            grad.scatter_add_(1, t.clamp_min(0).unsqueeze(1), torch.full_like(grad[:, :1], -1.0))
            grad.mul_(torch.where(t != IGNORE_INDEX, scale, 0.0).unsqueeze(1))
            g = grad.to(dtype)
            if grad_x is not None:
                grad_x[start : start + chunk] = (g @ w).to(x.dtype)
            if grad_w is not None and dtype == grad_w.dtype:
                grad_w.addmm_(g.t(), xc.to(dtype))  # no weight-sized temporary
            elif grad_w is not None:
                grad_w += (g.t() @ xc.to(dtype)).to(grad_w.dtype)
            if grad_b is not None:
                grad_b += grad.sum(0).to(grad_b.dtype)
        grad_w = None if grad_w is None else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_x, grad_w, grad_b, None, None


def chunked_cross_entropy(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, chunk: int
) -> torch.Tensor:
    """F.cross_entropy(F.linear(x, weight, bias).float(), targets, ignore_index=-1), the mean over
    counted rows, computed `chunk` rows of x (..., d) at a time; equal up to rounding."""
    if chunk < 1:
        raise ValueError(f"chunk must be a positive number of tokens, got {chunk}.")
    return ChunkedCrossEntropy.apply(x.reshape(-1, x.size(-1)), weight, bias, targets.reshape(-1), chunk)


def head_loss(head: nn.Module, x: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """The mean cross-entropy of head(x) against targets, chunk tokens at a time (GPT.forward's
    loss under loss_chunk_tokens=chunk)."""
    weight, bias = head_weight_bias(head)
    return chunked_cross_entropy(x, weight, bias, targets, chunk)
