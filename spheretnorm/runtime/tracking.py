"""Where a training run stands and where its rows go: metrics.jsonl, W&B and the console.

`Progress` holds the counters the training loop advances (most travel in the checkpoint);
`RunLog` writes the train, eval and stop rows (rank 0 only), mirrors them to W&B when asked and
prints their console lines; check_wandb checks before any training that W&B logging can work.
"""

from __future__ import annotations

import importlib.util
import math
import netrc
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from spheretnorm.runtime.checkpoint import CheckpointError, checkpoint_iter
from spheretnorm.runtime.config import ConfigError, TrainConfig, wandb_mode
from spheretnorm.diagnostics import DIAGNOSTIC_BY_NAME, DIAGNOSTICS, Diagnostic
from spheretnorm.runtime.run_folder import AVG_WINDOW, CONFIG_NAME, METRICS_NAME, MetricsLog, WriteFailed, remove_run, write_json_atomic


def format_duration(seconds: float) -> str:
    """'2h05m', '3m07s' or '42s': short enough for every console line."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


# The diagnostics in W&B. The UI makes a section of every key prefix before the first '/': one
# section per series (diag.rms/layer_03, ...), collapsible, keeps a 36-layer run's ~440 panels
# readable, and the section `diag` holds one summary panel per series (its mean over the layers,
# its first and last layer) beside the single numbers (diag/final_cosine).


def wandb_diagnostic(entry: Diagnostic, value: Any) -> dict[str, Any]:
    """The W&B keys of one diagnostic of a metrics row."""
    if not entry.is_series:
        return {f"diag/{entry.name}": value}
    out = {f"diag.{entry.name}/{entry.index}_{i:02d}": v for i, v in enumerate(value)}
    if value:
        out[f"diag/{entry.name}_mean"] = sum(value) / len(value)
        out[f"diag/{entry.name}_first"], out[f"diag/{entry.name}_last"] = value[0], value[-1]
    return out


def wandb_payload(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row as flat W&B keys (lists become one series per layer, plus summaries)."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if key in ("kind", "iter"):
            continue
        entry = DIAGNOSTIC_BY_NAME.get(key)
        if entry is not None:
            out.update(wandb_diagnostic(entry, value))
        elif value is not None:
            out[key] = value
    return out


def console_diagnostics(row: dict[str, Any]) -> list[str]:
    """The console parts of a row's diagnostics ('final cosine 0.123', 'rms 1.00 -> 2.31'), in table
    order: a series shows its first and last entry; one the row lacks, or an empty one, is left out."""
    parts = []
    for entry in DIAGNOSTICS:
        value = row.get(entry.name)
        if not entry.console or value is None or value == []:
            continue
        shown = f"{value[0]:{entry.console}} -> {value[-1]:{entry.console}}" if entry.is_series else f"{value:{entry.console}}"
        parts.append(f"{entry.short} {shown}")
    return parts


def start_wandb(train: TrainConfig, run_config: dict[str, Any], run_id: str | None) -> Any:
    """A W&B run (resumed when the checkpoint knows its id), or None if W&B cannot start."""
    import wandb

    try:
        return wandb.init(
            project=train.wandb_project,
            entity=train.wandb_entity or None,
            group=train.wandb_group,
            name=train.wandb_run_name,
            config=run_config,
            mode=train.wandb_mode,
            dir=None if os.environ.get("WANDB_DIR") else train.out_dir,  # wandb reads WANDB_DIR itself
            id=run_id,
            resume="allow" if run_id else None,
        )
    except Exception as e:  # a logging outage must not cost a training run
        print(f"WARNING: W&B did not start ({e}); training continues without it.", file=sys.stderr)
        return None


def _wandb_host() -> str:
    """The W&B host: $WANDB_BASE_URL's, default api.wandb.ai."""
    return urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").netloc


def _netrc_path() -> Path:
    """The netrc file wandb reads: $NETRC, else ~/.netrc, else ~/_netrc (Windows)."""
    if os.environ.get("NETRC"):
        return Path(os.environ["NETRC"]).expanduser()
    unix = Path("~/.netrc").expanduser()
    windows = Path("~/_netrc").expanduser()
    return windows if not unix.exists() and windows.exists() else unix


def wandb_key_source() -> str | None:
    """Where a W&B API key is configured, None if nowhere; reads no network. wandb looks in the same
    places, in this order: WANDB_API_KEY (or an identity token file), the netrc entry of its host."""
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if os.environ.get(name):
            return name
    host = _wandb_host()
    path = _netrc_path()
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    return str(path) if entry and entry[2] else None


def check_wandb(train: TrainConfig) -> None:
    """Stop before training when W&B logging could not work, instead of a warning lost in a log."""
    if not train.wandb_log:
        return
    mode = wandb_mode(train)
    if mode == "disabled":
        return
    if "wandb" not in sys.modules and importlib.util.find_spec("wandb") is None:
        raise ConfigError("wandb_log=true but the wandb package is not installed; pip install wandb, or pass --wandb_log=false.")
    if mode == "online" and wandb_key_source() is None:
        raise ConfigError(
            f"wandb_log=true with wandb_mode=online needs a W&B API key, and none is configured "
            f"(no WANDB_API_KEY, no netrc entry for {_wandb_host()} in {_netrc_path()}); run `wandb login` "
            "or set WANDB_API_KEY, or pass --wandb_mode=offline (upload later with `wandb sync`) "
            "or --wandb_log=false."
        )


# The first iterations of a session build things (torch.compile's graphs, the fused sphere
# kernels, the allocator's pools) and take many times a steady step: the ETA leaves out every
# logging window that starts within them.
ETA_WARMUP_ITERS = 2


def evaluations_left(iter_num: int, max_iters: int, eval_interval: int) -> int:
    """Evaluations after iter_num up to max_iters: at every multiple of eval_interval and at max_iters."""
    if eval_interval <= 0 or iter_num >= max_iters:
        return 0
    return max_iters // eval_interval - iter_num // eval_interval + (1 if max_iters % eval_interval else 0)


@dataclass
class Progress:
    """The counters of a run that the loop advances; all but the session's own travel in the checkpoint."""

    checkpoint: Path  # where this run's checkpoint is (or would be) written
    tokens_per_step: int
    # The checkpoint a resume starts from when it is not `checkpoint`: a stop's during a
    # collapse-alarm streak (checkpoint.resume_checkpoint); saved_iter is its iteration then.
    latest: Path | None = None
    iter_num: int = 0
    best_val_loss: float = math.inf
    collapse_streak: int = 0  # evaluations in a row with final_cosine above collapse_cosine
    recent_losses: deque[float] = field(default_factory=lambda: deque(maxlen=AVG_WINDOW))
    prior_elapsed: float = 0.0  # training time of the attempts that this one resumes
    wandb_run_id: str | None = None
    # Each resume that changed the run's settings: {"iter": the resume's, "changed": key -> [old, new]}
    # (identity.resume_changes); kept in every checkpoint and config.json, so that a run whose keys
    # changed part-way never reads as a run of its last settings.
    settings_history: list[dict[str, Any]] = field(default_factory=list)
    resume_row: dict[str, Any] | None = None  # this session's resume, for metrics.jsonl once it is open
    saved_iter: int = -1  # iteration of the checkpoint this run has on disk; -1: none yet
    start_time: float = 0.0  # this session's start, and its first iteration
    start_iter: int = 0
    # The session's steady pace, for the ETA (note_steps, note_eval): train steps after the
    # first ETA_WARMUP_ITERS, and evaluations after the first (which compiles the eval graphs).
    noted_iter: int = 0  # iteration of the last note_steps
    noted_steps: int = 0  # every step noted, warm-up included: the pace until a steady one is known
    noted_step_seconds: float = 0.0
    steady_steps: int = 0
    steady_step_seconds: float = 0.0
    evals_noted: int = 0
    steady_evals: int = 0
    steady_eval_seconds: float = 0.0
    # This session's checkpoint writes (a study run's parts, issue 62): their count and seconds, and
    # the seconds not yet in a train row (the next row's ckpt_s; the loop's step timer leaves them out).
    checkpoint_writes: int = 0
    checkpoint_write_seconds: float = 0.0
    unlogged_write_seconds: float = 0.0

    def restore(self, ckpt: dict[str, Any]) -> None:
        """Continue the counters of the checkpoint this run resumes from."""
        self.iter_num = ckpt["iter_num"]
        self.best_val_loss = ckpt["best_val_loss"]
        self.collapse_streak = ckpt.get("collapse_streak", 0)
        self.recent_losses.extend(ckpt["recent_losses"])
        self.prior_elapsed = ckpt["elapsed_s"]
        self.wandb_run_id = ckpt.get("wandb_run_id")
        self.settings_history = list(ckpt.get("settings_history") or [])
        self.saved_iter = self.iter_num

    def resumed_with(self, changes: dict[str, list[Any]]) -> None:
        """Record what this resume changed (identity.resume_changes; nothing when it changed nothing)."""
        if changes:
            entry = {"iter": self.iter_num, "changed": changes}
            self.settings_history.append(entry)
            self.resume_row = {"kind": "resume", **entry}

    def checkpoint_fields(self, seed: int, global_batch_size: int) -> dict[str, Any]:
        """What a checkpoint keeps of these counters (restore reads them back)."""
        return {
            "iter_num": self.iter_num,
            "best_val_loss": self.best_val_loss,
            "collapse_streak": self.collapse_streak,
            # The sampler is stateless: step k's batch is drawn from (seed, k) alone.
            "sampler": {"seed": seed, "next_step": self.iter_num, "global_batch_size": global_batch_size},
            "recent_losses": list(self.recent_losses),
            "elapsed_s": self.elapsed(),
            "wandb_run_id": self.wandb_run_id,
            "settings_history": self.settings_history,
        }

    def start(self) -> None:
        self.start_time = time.time()
        self.start_iter = self.noted_iter = self.iter_num

    @property
    def tokens(self) -> int:
        return self.iter_num * self.tokens_per_step

    def elapsed(self) -> float:
        return self.prior_elapsed + time.time() - self.start_time

    def note_checkpoint_write(self, seconds: float) -> None:
        """A checkpoint write (every rank's part of it, on this rank) took `seconds`."""
        self.checkpoint_writes += 1
        self.checkpoint_write_seconds += seconds
        self.unlogged_write_seconds += seconds

    def checkpoint_writes_text(self) -> str:
        """'3 checkpoint writes, 0.42 s in all' (this session's), for the run's last line."""
        return f"{self.checkpoint_writes} checkpoint write(s) this session, {self.checkpoint_write_seconds:.2f} s in all"

    def note_steps(self, seconds_per_step: float) -> None:
        """The train steps since the last note took seconds_per_step each (the loop's timer, evaluations
        and checkpoints left out); a window that starts within ETA_WARMUP_ITERS is no steady pace."""
        steps = self.iter_num - self.noted_iter
        if steps > 0:
            self.noted_steps += steps
            self.noted_step_seconds += steps * seconds_per_step
            if self.noted_iter >= self.start_iter + ETA_WARMUP_ITERS:
                self.steady_steps += steps
                self.steady_step_seconds += steps * seconds_per_step
        self.noted_iter = self.iter_num

    def note_eval(self, seconds: float) -> None:
        """An evaluation took `seconds`; the session's first one (it compiles) does not count."""
        self.evals_noted += 1
        if self.evals_noted > 1:
            self.steady_evals += 1
            self.steady_eval_seconds += seconds

    def eta(self, max_iters: int, eval_interval: int = 0) -> str:
        """Time left at the session's steady pace: the iterations left at the mean steady step, plus
        the evaluations left at the mean steady evaluation once one is measured. Until a steady step
        is known, the pace of the steps so far, compile included; '?' before any."""
        left = max(0, max_iters - self.iter_num)
        if left == 0:
            return format_duration(0)
        steps, step_seconds = (self.steady_steps, self.steady_step_seconds) if self.steady_steps else (self.noted_steps, self.noted_step_seconds)
        if steps == 0:
            return "?"
        seconds = left * step_seconds / steps
        if self.steady_evals:
            seconds += evaluations_left(self.iter_num, max_iters, eval_interval) * self.steady_eval_seconds / self.steady_evals
        return format_duration(seconds)

    def kept_checkpoint_text(self) -> str:
        """How a stop message names the checkpoint a resume would start from, its iteration read back
        from disk (a rank whose writer died believes in a save that never finished), and a temporary
        file a write cut short left beside it."""
        cut = cut_write_text(self.checkpoint) + (cut_write_text(self.latest) if self.latest is not None else "")
        if self.latest is not None and self.latest.exists():
            return f"the latest checkpoint {self.latest}{iter_on_disk_text(self.latest)} is untouched, beside the last healthy one{cut}"
        if self.checkpoint.exists():  # a file, or a sharded folder
            return f"the last good checkpoint {self.checkpoint}{iter_on_disk_text(self.checkpoint)} is untouched{cut}"
        return f"no checkpoint had been written{cut}"

    def stop_text(self, cause: str) -> str:
        """What a stop by `cause` says: the iteration, and the checkpoint it has just written or the one a resume would start from."""
        saved = self.iter_num > 0 and self.saved_iter == self.iter_num
        return f"Stopped by {cause} at iter {self.iter_num}; " + (f"{self.saved_text()}." if saved else f"{self.kept_checkpoint_text()}.")

    def saved_text(self) -> str:
        """How a stop message names the checkpoint it has just written."""
        if self.latest is None:
            return f"checkpoint saved to {self.checkpoint}"
        kept = f"the last healthy checkpoint {self.checkpoint} is kept as it was" if self.checkpoint.exists() else "no healthy checkpoint had been written"
        return (
            f"checkpoint saved to {self.latest}, beside the healthy one: the last evaluation was above collapse_cosine; "
            f"{kept}. --init_from=auto resumes from the latest"
        )


def iter_on_disk_text(path: Path) -> str:
    """' (iter N)' of the checkpoint at `path` as read back from disk; '' when it cannot be read."""
    try:
        return f" (iter {checkpoint_iter(path)})"
    except (CheckpointError, OSError):
        return ""


def cut_write_text(path: Path) -> str:
    """'; ckpt.pt.tmp is left by a write cut short' when such a temporary file (or folder) exists."""
    tmp = path.with_name(path.name + ".tmp")
    return f"; {tmp.name} is left by a write cut short" if tmp.exists() else ""


# The most group rates a console line names: under μP every width-scaled group has its own.
MAX_RATES_SHOWN = 3


def group_rates_field(groups: list[dict[str, Any]], lr: float) -> dict[str, list[float]]:
    """{"group_lrs": each distinct rate of the optimizer's groups at the step just done, in group
    order} where one differs from lr (Muon's matrices, μP's widths); {} where every group steps at
    lr, so an AdamW run's rows stay as they were."""
    rates = list(dict.fromkeys(float(g["lr"]) for g in groups if "lr" in g))
    return {"group_lrs": rates} if any(r != lr for r in rates) else {}


def rates_text(row: dict[str, Any]) -> str:
    """'6.0e-04', or with groups at other rates '6.0e-04 (groups 2.0e-02, 6.0e-04)'."""
    rates = row.get("group_lrs")
    if not rates:
        return f"{row['lr']:.1e}"
    shown = ", ".join(f"{r:.1e}" for r in rates[:MAX_RATES_SHOWN]) + (", ..." if len(rates) > MAX_RATES_SHOWN else "")
    return f"{row['lr']:.1e} (groups {shown})"


class RunLog:
    """The rows of a run: metrics.jsonl, W&B when asked, and their console lines. Every rank calls
    it, so the callers need no rank checks; only rank 0 writes or prints."""

    def __init__(self, cfg: TrainConfig, is_master: bool, progress: Progress, groups: Callable[[], list[dict[str, Any]]] | None = None):
        self.cfg = cfg
        self.is_master = is_master
        self.progress = progress
        self.groups = groups  # the optimizer's parameter groups, whose rates a train row shows where they differ from lr
        self.metrics: MetricsLog | None = None
        self.wandb: Any = None
        # The first metrics row that could not be written (a full disk): the log then stops, and
        # the loop stops the run at the next point where every rank can checkpoint together.
        self.write_error: OSError | None = None

    def open(self, run_config: dict[str, Any], resumed: bool) -> None:
        """config.json, metrics.jsonl (a resume keeps its rows up to the checkpoint) and W&B."""
        if not self.is_master:
            return
        out = Path(self.cfg.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if not resumed and (self.progress.checkpoint.is_file() or self.cfg.overwrite):
            # Replaced whole, before anything new is written: never the old checkpoint beside
            # the new log (a crash before the first save would otherwise resume the old run), nor
            # an earlier run's zero-shot results beside a new run that has no checkpoint yet.
            removed = remove_run(out)
            if removed:
                print(f"NOTE: overwrite=true: removed the earlier run in {out} ({', '.join(removed)}) to start from scratch.")
        try:  # a temporary name, then a rename: a full disk leaves no partial config.json
            write_json_atomic(out / CONFIG_NAME, run_config)
        except OSError as e:  # the write's own error names no file: train.py's one line names it
            raise OSError(e.errno, e.strerror or str(e), str(out / CONFIG_NAME)) from None
        self.metrics = MetricsLog(out / METRICS_NAME, self.progress.iter_num if resumed else None)
        dropped = self.metrics.dropped_text(self.progress.iter_num) if resumed else None
        if dropped:  # the user sees what the file no longer holds (a stop row a tool may have read)
            print(dropped, flush=True)
        if resumed and self.progress.resume_row:  # metrics only: the row is not a point of W&B's curves
            self.metrics.write(self.progress.resume_row)
        if self.cfg.wandb_log:
            self.wandb = start_wandb(self.cfg, run_config, self.progress.wandb_run_id)
            if self.wandb is not None:
                self.progress.wandb_run_id = self.wandb.id

    def log(self, row: dict[str, Any]) -> None:
        if not self.is_master:
            return
        if self.metrics is not None:
            try:
                self.metrics.write(row)
            except OSError as e:  # the row is not in the file (whole lines only), nor any after it
                self.write_error = e
                self.metrics.close()
                self.metrics = None
        if self.wandb is not None:
            self.wandb.log(wandb_payload(row), step=row["iter"])

    def write_failure(self) -> WriteFailed:
        """The stop of a run whose metrics.jsonl could not take a row: one line naming the file and the
        checkpoint a resume starts from (on other ranks than 0, a pointer to its line)."""
        error, progress = self.write_error, self.progress
        if error is None:
            return WriteFailed("rank 0 could not write its metrics rows (a full disk); its line says which checkpoint a resume starts from.")
        kept = progress.saved_text() if progress.saved_iter == progress.iter_num else progress.kept_checkpoint_text()
        return WriteFailed(f"{error.strerror or error}: {error.filename} (its rows end whole, at the last one that fitted); {kept}.")

    def log_eval(self, row: dict[str, Any]) -> None:
        if self.progress is not None:  # the ETA leaves evaluation time out of the step rate
            self.progress.note_eval(sum(row.get(key) or 0.0 for key in ("eval_s", "diag_s", "full_eval_s")))
        if self.is_master:
            ppl = f"{row['val_ppl']:.2f}" if row["val_ppl"] is not None else "inf"
            parts = [f"eval iter {row['iter']}", f"train {row['train_eval_loss']:.4f}", f"val {row['val_loss']:.4f} (ppl {ppl})"]
            if "val_loss_full" in row:
                parts.append(f"val, whole split {row['val_loss_full']:.4f} ({row['val_full_tokens']:,} tokens)")
            print(" | ".join(parts + console_diagnostics(row)))
        self.log(row)

    def log_train(self, loss: float, grad_norm: float, lr: float, step_time: float, mfu: float | None, extra: dict[str, float] | None = None) -> None:
        """The row of the step just done; step_time is the mean over the steps since the last row;
        extra: more keys of the row (train_loss_total, where a loss term is on: runtime/step.py)."""
        self.progress.note_steps(step_time)
        row = {**self.train_row(loss, grad_norm, lr, step_time, mfu), **(extra or {})}
        if self.progress.unlogged_write_seconds:  # the checkpoint writes since the last row, apart from the steps
            row["ckpt_s"] = round(self.progress.unlogged_write_seconds, 3)
            self.progress.unlogged_write_seconds = 0.0
        self.print_train(row, step_time)
        self.log(row)

    def show_first_step(self, loss: float, grad_norm: float, lr: float, step_time: float, mfu: float | None) -> None:
        """The console line of a session's first step, at once; no metrics row and no pace for the ETA."""
        self.print_train(self.train_row(loss, grad_norm, lr, step_time, mfu), step_time)

    def train_row(self, loss: float, grad_norm: float, lr: float, step_time: float, mfu: float | None) -> dict[str, Any]:
        """The metrics row of the step just done."""
        progress = self.progress
        return {
            "kind": "train",
            "iter": progress.iter_num,
            "tokens": progress.tokens,
            "train_loss": loss,
            "train_loss_avg200": sum(progress.recent_losses) / len(progress.recent_losses),
            "lr": lr,
            **group_rates_field(self.groups() if self.groups else [], lr),
            "grad_norm": grad_norm,
            "tokens_per_s": progress.tokens_per_step / step_time,
            "mfu": mfu,
            "elapsed_s": round(progress.elapsed(), 3),
        }

    def print_train(self, row: dict[str, Any], step_time: float) -> None:
        """The console line of a train row (rank 0)."""
        if not self.is_master:
            return
        mfu = row["mfu"]
        mfu_text = f"{100 * mfu:.1f}%" if mfu is not None else "n/a"
        print(
            f"iter {row['iter']}/{self.cfg.max_iters} | loss {row['train_loss']:.4f} | avg{AVG_WINDOW} "
            f"{row['train_loss_avg200']:.4f} | lr {rates_text(row)} | grad {row['grad_norm']:.2f} | "
            f"{row['tokens_per_s']:,.0f} tok/s | mfu {mfu_text} | {step_time:.2f} s/it | ETA {self.progress.eta(self.cfg.max_iters, self.cfg.eval_interval)}",
            flush=True,
        )

    def log_stop(self, reason: str, message: str, exit_code: int) -> None:
        """The metrics row that says why a run ended before max_iters (spheretnorm/runs.py reads it)."""
        self.log({
            "kind": "stop",
            "iter": self.progress.iter_num,
            "reason": reason,
            "exit_code": exit_code,
            "message": message,
            "checkpoint_iter": self.progress.saved_iter if self.progress.saved_iter >= 0 else None,
            "elapsed_s": round(self.progress.elapsed(), 3),
            "ckpt_write_s": round(self.progress.checkpoint_write_seconds, 3),  # this session's writes
        })

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.wandb is not None:
            self.wandb.finish()
