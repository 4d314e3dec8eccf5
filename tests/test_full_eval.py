"""The final evaluation over the whole validation split (val_loss_full): every full window of
block_size tokens from the start, none overlapping, the same for every seed."""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

from spheretnorm.model import GPT, GPTConfig
from spheretnorm.runtime.config import TrainConfig
from spheretnorm.runtime.distributed import DistInfo
from spheretnorm.runtime.tracking import Progress
from spheretnorm.runtime.validation import Evaluator

BLOCK = 8


def evaluator(tokens: np.ndarray, model: GPT, batch_size: int, dist: DistInfo = DistInfo()) -> Evaluator:
    cfg = TrainConfig(batch_size=batch_size, global_batch_size=batch_size, max_iters=10, device="cpu")
    data = SimpleNamespace(split=lambda split: tokens)
    progress = Progress(checkpoint=Path("unused"), tokens_per_step=batch_size * BLOCK)
    return Evaluator(cfg, data, dist, "cpu", contextlib.nullcontext(), progress, model=model, fwd_model=model, raw_model=model)


def by_hand(tokens: np.ndarray, model: GPT) -> tuple[float, int]:
    """Each window on its own, the token losses summed in float64: no batching, no means of means."""
    total, count = 0.0, 0
    for start in range(0, len(tokens) - BLOCK, BLOCK):
        x = torch.from_numpy(tokens[start : start + BLOCK].astype(np.int64))[None]
        y = torch.from_numpy(tokens[start + 1 : start + BLOCK + 1].astype(np.int64))[None]
        logits, _ = model(x, y)
        total += F.cross_entropy(logits.view(-1, logits.size(-1)).double(), y.view(-1), reduction="sum").item()
        count += BLOCK
    return total / count, count


def test_the_whole_split_loss_is_the_mean_token_loss_over_every_full_window() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=BLOCK, vocab_size=11, dropout=0.0)).eval()
    # 7 full windows and a 5-token tail (a window needs block_size + 1 tokens: 7 * 8 + 1 <= 62),
    # in batches of 3: the last batch holds one window and must weigh one window, not a third.
    tokens = np.random.default_rng(1).integers(0, 11, size=62).astype(np.uint16)
    loss, scored = evaluator(tokens, model, batch_size=3).full_split_loss("val")
    expected, count = by_hand(tokens, model)
    assert scored == count == 7 * BLOCK
    assert math.isclose(loss, expected, rel_tol=1e-6)


def test_the_ranks_share_the_batches_and_score_each_window_once(monkeypatch) -> None:
    """Two ranks in one process: each scores its own batches, and the sum over the ranks (what
    all_reduce would give) is the one-process loss."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=BLOCK, vocab_size=11, dropout=0.0)).eval()
    tokens = np.random.default_rng(2).integers(0, 11, size=90).astype(np.uint16)
    sums = []
    monkeypatch.setattr("spheretnorm.runtime.validation.all_reduce_sum", lambda t, dist: sums.append(t.item()) or t)
    for rank in (0, 1):
        evaluator(tokens, model, batch_size=2, dist=DistInfo(rank=rank, world_size=2)).full_split_loss("val")
    expected, count = by_hand(tokens, model)
    assert math.isclose(sum(sums) / (count // BLOCK), expected, rel_tol=1e-6)
