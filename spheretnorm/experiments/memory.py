"""Memory of a training step on one GPU beyond the weights, gradients and AdamW: the terms of
README's "Memory per GPU" table as formulas, and the measurement that checks the largest one.

Per token of a GPU's micro-batch (batch_size x block_size tokens), under bf16 autocast (the CUDA
default: fp32 weights and residual stream, bf16 inputs to every matmul) and fused attention (no
T x T matrix is kept), a pre-LN GPT-2 block keeps for its backward, in bytes:

    attention:  4d (fp32 input of ln_1) + 2d (its bf16 copy, c_attn's input) + 6d (q, k, v)
                + 2d (attention output, which is also c_proj's input: the fused kernel writes
                it in the token-major layout, so merging the heads copies nothing)       = 14d
    MLP:        4d (fp32 input of ln_2) + 2d (bf16 copy) + 2h (c_fc's output, GELU's input)
                + 2h (GELU's output, c_proj's input), h = 4d                              = 22d

so BLOCK_BYTES_PER_D = 36 bytes per token per unit of width, per block (fp32 throughout: 64).
Autocast also keeps the bf16 copy of every matrix until the backward: 2 bytes a parameter (not
under FSDP, whose gathered bf16 weights are freed after each block's forward). With
--activation_checkpointing a block keeps only its fp32 input (4d) and recomputes the rest
in its backward, so one block's 36d is alive at a time. The head keeps the log-softmax of the
loss in fp32 (4V) while the training loop holds the bf16 logits (2V); the backward adds their
fp32 and bf16 gradients (4V + 2V): about LOGIT_BYTES_PER_V = 12 bytes per token per vocabulary
entry at the loss. Under FSDP each block's gradient is unsharded for a moment, in bf16 and then
fp32 for the reduce-scatter: 12 d^2 x 6 bytes.

`python scripts/memory_check.py` (takes no options) measures the bytes autograd saves (saved_activation_bytes) at
small sizes on the CPU and prints them beside saved_bytes_formula; docs/LOG.md has the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass
from typing import Any

import torch

GIB = 2**30
# Bytes per token per unit of width that one block keeps for backward (the module docstring).
BLOCK_BYTES_PER_D = {"bfloat16": 36, "float32": 64}
CHECKPOINT_BYTES_PER_D = 4  # a checkpointed block keeps its fp32 input only
# The head: what one token's logits cost at the loss, per vocabulary entry (saved and transient).
LOGIT_BYTES_PER_V = 12
# Saved for backward per token beyond the blocks: ln_f's fp32 input and bf16 copy (4d + 2d), the
# log-softmax (4V); in fp32, 8d and 4V.
HEAD_SAVED = {"bfloat16": (6, 4), "float32": (8, 4)}  # (bytes per d, bytes per V)
GRAD_BYTES_PER_PARAM = 2 + 4  # a block's unsharded gradient in bf16, then in fp32 for the reduce-scatter


@dataclass(frozen=True)
class Shape:
    """What the activation terms depend on: the model and a GPU's micro-batch."""

    n_layer: int
    n_embd: int
    vocab_size: int
    batch_size: int
    block_size: int

    @property
    def tokens(self) -> int:
        return self.batch_size * self.block_size


def activation_bytes(shape: Shape, checkpointing: bool = False, dtype: str = "bfloat16") -> int:
    """The blocks' activations kept for backward: every block's, or with checkpointing every
    block's input and one block's activations (the one being recomputed)."""
    per_block = BLOCK_BYTES_PER_D[dtype] * shape.n_embd * shape.tokens
    if not checkpointing:
        return shape.n_layer * per_block
    return shape.n_layer * CHECKPOINT_BYTES_PER_D * shape.n_embd * shape.tokens + per_block


def logit_bytes(shape: Shape) -> int:
    """The logits at the loss: saved log-softmax, the loop's bf16 logits, and their gradients."""
    return LOGIT_BYTES_PER_V * shape.vocab_size * shape.tokens


def block_grad_bytes(n_embd: int) -> int:
    """FSDP's transient unsharded gradient of one block (12 d^2 parameters)."""
    return 12 * n_embd**2 * GRAD_BYTES_PER_PARAM


def autocast_weight_bytes(shape: Shape) -> int:
    """The bf16 copies of the matrices (12 d^2 a block, the tied head V x d) that autocast keeps for backward."""
    return 2 * (12 * shape.n_layer * shape.n_embd**2 + shape.vocab_size * shape.n_embd)


def saved_bytes_formula(shape: Shape, dtype: str) -> int:
    """What saved_activation_bytes should measure for a pre-LN GPT-2 model: the blocks, ln_f, the
    log-softmax and, under autocast, the bf16 weights (the logits' transient copies are not saved tensors)."""
    per_d, per_v = HEAD_SAVED[dtype]
    head = (per_d * shape.n_embd + per_v * shape.vocab_size) * shape.tokens
    return activation_bytes(shape, dtype=dtype) + head + (autocast_weight_bytes(shape) if dtype == "bfloat16" else 0)


def saved_activation_bytes(model: torch.nn.Module, idx: torch.Tensor, autocast: Any = None) -> int:
    """Bytes that autograd saves for backward in one forward pass of `model` on `idx`.

    Each storage counts once (a tensor saved by two ops is one allocation); parameters are
    not activations and are left out.
    """
    seen = {p.untyped_storage().data_ptr() for p in model.parameters()}  # parameters: seen, never counted
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast or contextlib.nullcontext():
        _, loss = model(idx, idx)
    del loss
    return total


def measure(shape: Shape, n_head: int, dtype: str) -> int:
    """saved_activation_bytes of a pre-LN GPT-2 model of `shape` on the CPU (bf16 by CPU autocast)."""
    from spheretnorm.model import GPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(n_layer=shape.n_layer, n_head=n_head, n_embd=shape.n_embd, block_size=shape.block_size,
                       vocab_size=shape.vocab_size, connection="pre_ln", dropout=0.0)
    model = GPT(config)
    idx = torch.randint(0, shape.vocab_size, (shape.batch_size, shape.block_size))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else None
    return saved_activation_bytes(model, idx, autocast)


# -----------------------------------------------------------------------------
# The tables: the check at small sizes, and each scale's terms


# Small pre-LN shapes (n_layer, n_embd, n_head, vocab, batch, block) that run in a second each.
CHECK_SHAPES = ((2, 64, 4, 256, 2, 64), (4, 128, 4, 512, 4, 128), (2, 256, 8, 1024, 2, 256), (6, 192, 6, 2048, 4, 256))


def check_rows() -> list[str]:
    """Measured saved bytes beside the formula, at each of CHECK_SHAPES in fp32 and bf16."""
    rows = ["| L x d, heads | V | B x T | dtype | measured MiB | formula MiB | measured / formula |", "|---|---|---|---|---|---|---|"]
    for n_layer, n_embd, n_head, vocab, batch, block in CHECK_SHAPES:
        shape = Shape(n_layer, n_embd, vocab, batch, block)
        for dtype in ("float32", "bfloat16"):
            measured, formula = measure(shape, n_head, dtype), saved_bytes_formula(shape, dtype)
            rows.append(f"| {n_layer} x {n_embd}, {n_head} | {vocab} | {batch} x {block} | {dtype} | {measured / 2**20:.2f} | "
                        f"{formula / 2**20:.2f} | {measured / formula:.4f} |")
    return rows


def scale_shape(scale: str) -> Shape:
    """A scale's shape and per-GPU micro-batch, as config/openwebtext_<scale>.py sets them."""
    from spheretnorm.experiments.grid import config_file
    from spheretnorm.runtime.config import parse_config

    parsed = parse_config([str(config_file("openwebtext", scale))], world_size=8)
    model = parsed.model_config()
    return Shape(model.n_layer, model.n_embd, model.vocab_size, parsed.train.batch_size, model.block_size)


def scale_rows(scales: tuple[str, ...]) -> list[str]:
    """Each scale's activation, logit and transient terms in GiB, at its config's batch_size."""
    rows = ["| scale | B x T a GPU | activations | with --activation_checkpointing | logits at the loss | "
            "bf16 weight copies (autocast, DDP) | a block's unsharded gradient (FSDP) |", "|---|---|---|---|---|---|---|"]
    for scale in scales:
        s = scale_shape(scale)
        rows.append(f"| {scale} | {s.batch_size} x {s.block_size} | {activation_bytes(s) / GIB:.1f} GiB | "
                    f"{activation_bytes(s, checkpointing=True) / GIB:.1f} GiB | {logit_bytes(s) / GIB:.1f} GiB | "
                    f"{autocast_weight_bytes(s) / GIB:.2f} GiB | {block_grad_bytes(s.n_embd) / GIB:.2f} GiB |")
    return rows


def main(argv: list[str] | None = None) -> int:
    from spheretnorm.experiments.grid import SCALES
    from spheretnorm.runtime.cli import HelpFormatter

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], formatter_class=HelpFormatter)
    parser.parse_args(argv)
    print("\n".join(["Saved for backward by a pre-LN GPT-2 model on the CPU, against spheretnorm.experiments.memory's formula:", "",
                     *check_rows(), "", "Each scale's terms (bf16 autocast, fused attention):", "", *scale_rows(SCALES)]))
    return 0
