"""The evaluations of a training run: mean losses on fixed batches, diagnostics, collapse alarm.

Every rank takes part in an evaluation (the loss batches are shared among the ranks); rank 0
alone computes the diagnostics and shares its final_cosine, so that every rank takes the same
save and stop decisions.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Callable, Iterator, TextIO

import numpy as np
import torch
import torch.nn.functional as F

from spheretnorm.runtime.batches import EVAL_STREAM, TokenData, batch_offsets, get_batch
from spheretnorm.diagnostics import parameter_report, pinned_note, residual_stream_report
from spheretnorm.runtime.distributed import DistInfo, all_reduce_sum, print0
from spheretnorm.runtime.config import TrainConfig
from spheretnorm.runtime.parallel import full_parameters, is_sharded
from spheretnorm.model import GPT
from spheretnorm.runtime.token_files import SPLITS
from spheretnorm.runtime.run_folder import CollapseError, NonFiniteLossError
from spheretnorm.runtime.tracking import Progress


STOP_CHECK_ROUNDS = 8  # an evaluation checks for a stop request once per this many batches a rank
# Off a terminal, an evaluation still under way says how far it is at most this often: the first
# one of a session (compiling, on a loaded machine) can otherwise be a minute of silence.
EVAL_PROGRESS_EVERY_S = 10.0


class EvalAbandoned(Exception):
    """A stop was requested during an evaluation: it is dropped, so the stop waits for no more batches."""


class EvalProgress:
    """The console progress of an evaluation, one split at a time: on a terminal one line updates in
    place ("eval val 3/20 batches"); in a log file, where it would pile up, a line at most every
    EVAL_PROGRESS_EVERY_S. Either way each split ends with one line that gives its time.
    """

    def __init__(self, enabled: bool, stream: TextIO | None = None):
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout
        self.tty = enabled and self.stream.isatty()
        self.split, self.total, self.started, self.said = "", 0, 0.0, 0.0

    def start(self, split: str, total: int) -> None:
        self.split, self.total, self.started = split, total, time.time()
        self.said = self.started
        self.update(0)

    def update(self, done: int) -> None:
        if self.tty and done < self.total:
            self.stream.write(f"\reval {self.split} {done}/{self.total} batches")
            self.stream.flush()
        elif self.enabled and not self.tty and done < self.total and time.time() - self.said >= EVAL_PROGRESS_EVERY_S:
            self.said = time.time()
            self.stream.write(f"eval {self.split} {done}/{self.total} batches, {self.said - self.started:.0f} s so far\n")
            self.stream.flush()

    def finish(self) -> None:
        if not self.enabled:
            return
        line = f"eval {self.split} {self.total}/{self.total} batches in {time.time() - self.started:.1f} s"
        self.stream.write(("\r" + line.ljust(40) if self.tty else line) + "\n")
        self.stream.flush()


class Evaluator:
    """Evaluates the model of a run at its current iteration, and watches for collapse. model is what
    the training step calls (DDP-wrapped), fwd_model the same module unwrapped (the evaluation needs
    no gradient sync), raw_model the plain GPT under both."""

    def __init__(self, cfg: TrainConfig, data: TokenData, dist: DistInfo, device: str, autocast: Any, progress: Progress, *,
                 model: torch.nn.Module, fwd_model: torch.nn.Module, raw_model: GPT):
        self.cfg = cfg
        self.data = data
        self.dist = dist
        self.device = device
        self.autocast = autocast
        self.progress = progress
        self.model, self.fwd_model, self.raw_model = model, fwd_model, raw_model
        self.block_size = raw_model.config.block_size
        self.sharded = is_sharded(raw_model)  # FSDP: every rank takes part in every forward
        # Whether every rank agrees to stop (the trainer sets it): checked before each batch.
        self.stop_requested: Callable[[], bool] = lambda: False
        # The final_cosine of a collapse alarm that fired at the final evaluation (stop_if_collapsed).
        self.collapsed_at_end: float | None = None
        self.final_suspect = False  # whether the evaluation at max_iters counted towards a collapse stop
        self.pinned = ""  # pinned_note of the last evaluation (rank 0), for the collapse messages

    @torch.no_grad()
    def estimate_loss(self) -> dict[str, float]:
        """Mean loss over eval_iters fixed batches per split, shared among the ranks. The batches come
        from their own stream, so they are the same at every evaluation and never move the training
        sampler or the dropout generators."""
        self.model.eval()
        out = {}
        progress = EvalProgress(enabled=self.dist.is_master)
        try:
            for split_id, split in enumerate(SPLITS):
                tokens = self.data.split(split)
                total = torch.zeros((), device=self.device)
                for done, i in self._my_batches(split, self.cfg.eval_iters, progress, split):
                    x, y = get_batch(tokens, self._eval_offsets(split_id, min(i, self.cfg.eval_iters - 1)), self.block_size, self.device)
                    with self.autocast:
                        _, loss = self.fwd_model(x, y)
                    if i < self.cfg.eval_iters:
                        total += loss.float()
                        progress.update(done + 1)
                out[split] = all_reduce_sum(total, self.dist).item() / self.cfg.eval_iters
                progress.finish()
        finally:
            self.model.train()
        return out

    @torch.no_grad()
    def full_split_loss(self, split: str = "val") -> tuple[float, int]:
        """(mean token loss over the whole split, tokens scored): every full window of block_size
        tokens from the start, none overlapping, batch_size windows a forward. Unlike estimate_loss it
        depends on no seed, so every run of a study is scored on the same text."""
        tokens = self.data.split(split)
        starts = np.arange((len(tokens) - 1) // self.block_size) * self.block_size
        batches = [starts[i : i + self.cfg.batch_size] for i in range(0, len(starts), self.cfg.batch_size)]
        # On the device, so that no batch waits for the host; float64: thousands of batch sums add up.
        wide = torch.float32 if self.device.startswith("mps") else torch.float64  # MPS has no float64
        total = torch.zeros((), device=self.device, dtype=wide)
        progress = EvalProgress(enabled=self.dist.is_master)
        self.model.eval()
        try:
            for done, i in self._my_batches(split, len(batches), progress, f"{split} (whole split)"):
                offsets = batches[min(i, len(batches) - 1)]
                # The last batch is padded to batch_size with its own last window, and only its own
                # windows count: one shape throughout, so a compiled model compiles nothing new.
                padded = np.concatenate([offsets, np.repeat(offsets[-1:], self.cfg.batch_size - len(offsets))])
                x, y = get_batch(tokens, padded, self.block_size, self.device)
                with self.autocast:
                    logits, _ = self.fwd_model(x, y)
                if i < len(batches):
                    token_losses = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none")
                    total += token_losses.view(len(padded), -1)[: len(offsets)].sum().to(wide) / self.block_size
                    progress.update(done + 1)
            windows = len(starts)
            loss = all_reduce_sum(total, self.dist).item() / max(windows, 1)
            progress.finish()
        finally:
            self.model.train()
        return loss, windows * self.block_size

    def _my_batches(self, split: str, count: int, progress: EvalProgress, label: str) -> Iterator[tuple[int, int]]:
        """(round, batch index) of this rank's share of `count` batches: rank r takes r, r + world_size, ...

        Every rank checks for a stop at the start of a round, the same number of times (every
        STOP_CHECK_ROUNDS rounds: across ranks the check is an all-reduce that waits for the GPU), so
        that a stop abandons the evaluation on all of them together. A sharded model's forward is a
        collective: a rank past the last batch runs one all the same (index >= count: not counted).
        """
        world, rank = self.dist.world_size, self.dist.rank
        progress.start(label, len(range(rank, count, world)))
        for done in range(math.ceil(count / world)):
            if done % STOP_CHECK_ROUNDS == 0 and self.stop_requested():
                raise EvalAbandoned(split)
            if done * world + rank < count or self.sharded:
                yield done, done * world + rank

    def _eval_offsets(self, split_id: int, index: int) -> np.ndarray:
        n_tokens = self.data.num_tokens(SPLITS[split_id])
        return batch_offsets(self.cfg.seed, EVAL_STREAM + split_id, index, self.cfg.batch_size, n_tokens, self.block_size)

    @torch.no_grad()
    def diagnostics(self) -> dict[str, Any]:
        """Per-layer RMS, rotation angles, final-token cosine and sphere step sizes (one val batch)."""
        x, _ = get_batch(self.data.split("val"), self._eval_offsets(1, 0), self.block_size, self.device)
        self.raw_model.eval()
        with self.autocast:
            diag = residual_stream_report(self.raw_model, x)
        self.raw_model.train()
        return {**diag, **parameter_report(self.raw_model)}

    def evaluate(self) -> dict[str, Any]:
        """The eval row of the current iteration; a non-finite val loss stops the run."""
        progress = self.progress
        started = time.perf_counter()
        losses = self.estimate_loss()
        eval_s = time.perf_counter() - started
        if not math.isfinite(losses["val"]):
            raise NonFiniteLossError.at("val loss", losses["val"], progress.iter_num, progress.kept_checkpoint_text())
        row = {
            "kind": "eval",
            "iter": progress.iter_num,
            "tokens": progress.tokens,
            "train_eval_loss": losses["train"],
            "val_loss": losses["val"],
            "val_ppl": math.exp(losses["val"]) if losses["val"] < 700 else None,
            "elapsed_s": round(progress.elapsed(), 3),
            "eval_s": round(eval_s, 4),  # the two loss estimates, so diag_s can be weighed against them
        }
        if self.cfg.full_val_eval and (progress.iter_num >= self.cfg.max_iters or self.cfg.eval_only):
            started = time.perf_counter()
            row["val_loss_full"], row["val_full_tokens"] = self.full_split_loss("val")
            row["full_eval_s"] = round(time.perf_counter() - started, 4)
        if self.dist.is_master or self.sharded:  # a sharded model is gathered by all ranks together
            started = time.perf_counter()
            with full_parameters(self.raw_model):
                diagnostics = self.diagnostics()
            if self.dist.is_master:
                row.update(diagnostics)
                row["diag_s"] = round(time.perf_counter() - started, 4)
        return row

    def collapse_suspect(self, row: dict[str, Any]) -> bool:
        """Whether this evaluation counts towards a collapse stop; updates the streak on every rank
        (rank 0's final_cosine is shared first, so every rank takes the same decisions).

        No evaluation during the warm-up counts (iter <= warmup_iters): a sphere model's final
        states start out nearly parallel and only part as it learns. A suspect state is not saved
        mid-run, but the final one always is: when the alarm fires at max_iters, train.py saves
        first and then calls stop_if_collapsed.
        """
        cfg, progress = self.cfg, self.progress
        if not cfg.collapse_evals or progress.iter_num <= cfg.warmup_iters:
            return False
        mine = row.get("final_cosine", 0.0) if self.dist.is_master else 0.0
        cosine = all_reduce_sum(torch.tensor(float(mine), device=self.device), self.dist).item()
        suspect = cosine > cfg.collapse_cosine
        learns = self.raw_model.config.alpha_cap_grad == "straight_through"
        self.pinned = pinned_note(row, learns) if self.dist.is_master else ""  # the diagnostics live on rank 0
        final = progress.iter_num >= cfg.max_iters
        progress.collapse_streak = progress.collapse_streak + 1 if suspect else 0
        self.final_suspect = final and suspect
        if progress.collapse_streak >= cfg.collapse_evals:
            if not final:
                self._fail_collapse(cosine, final_saved=False)
            self.collapsed_at_end = cosine
        if suspect and self.collapsed_at_end is None:  # a stop says it all in its own one line
            saved = (
                f"this is the final state (iter {progress.iter_num}): it is checkpointed all the same, "
                "as every run that reaches max_iters saves its last state"
                if final
                else "this state is not checkpointed"
            )
            print0(
                f"WARNING: final_cosine {cosine:.3f} > collapse_cosine={cfg.collapse_cosine} "
                f"({progress.collapse_streak} of {cfg.collapse_evals} evaluations before the collapse stop); {saved}.{self.pinned}"
            )
        return suspect

    def stop_if_collapsed(self) -> None:
        """The collapse stop of an alarm that fired at the final evaluation, once its state is saved."""
        if self.collapsed_at_end is not None:
            self._fail_collapse(self.collapsed_at_end, final_saved=True)

    def _fail_collapse(self, cosine: float, final_saved: bool) -> None:
        cfg, progress = self.cfg, self.progress
        if final_saved:
            kept = (
                f"the final state is saved all the same ({progress.checkpoint}, iter {progress.saved_iter}), as "
                "every run that reaches max_iters saves it"
            )
        else:
            kept = f"stopping without saving: {progress.kept_checkpoint_text()}"
        raise CollapseError(
            f"final_cosine {cosine:.3f} stayed above collapse_cosine={cfg.collapse_cosine} for "
            f"{progress.collapse_streak} evaluations in a row (iter {progress.iter_num}): every token's final "
            f"state is nearly the same point (representation collapse); {kept}.{self.pinned} Try a longer warm-up (e.g. --warmup_iters="
            f"{max(4 * cfg.warmup_iters, 100)}) or a lower peak learning rate (e.g. --learning_rate="
            f"{cfg.learning_rate / 3:.1e}); --collapse_evals=0 turns this stop off."
        )
