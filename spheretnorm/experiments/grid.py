"""What the experiment scripts share: method keys, the paper's reference numbers, run folders.

A *method key* is the paper's name of a model variant: a key of ``model.CONNECTIONS``, or
``p_spheret:P`` for p-SpheretNorm with ``spheret_p = P`` (the paper's 0.5-SpheretNorm is
``p_spheret:0.5``). Keys map to train.py arguments, run folders and W&B names through
``spheretnorm.runtime.methods`` (``method_key``, ``method_dirname``, ``resolve_wandb_names``), so every script
names a run the way train.py does.

A *run folder* is what train.py writes to its out_dir: ``config.json`` (both configs and the
method key), ``metrics.jsonl`` (rows of kind "train" and "eval") and ``ckpt.pt``; the
zero-shot results of eval/zero_shot.py go beside the checkpoint as ``ckpt_zero_shot.json``
(a --limit evaluation writes ``ckpt_zero_shot_limit<N>.json`` instead: partial, never final).
Tables and plots read only these structured files, never logs.

A run is *finished* when its metrics.jsonl has an eval row at iter >= max_iters (train.py
evaluates at the last iteration, so this row exists exactly when training ran to the end) and
its ckpt.pt is there (train.py always saves the final state; a run folder from before that
rule may lack it, and then counts as not finished).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from spheretnorm.runtime.cli import REPO_ROOT, UsageError
from spheretnorm.runtime.imports import import_modules, import_recorded, imports_of_overrides
from spheretnorm.runtime.identity import method_keys_neutral, settings_labels
from spheretnorm.runtime.methods import PAPER_METHODS, display_name, scale_of, sort_methods
from spheretnorm.runtime.token_files import load_meta, open_split
from spheretnorm.zeroshot.driver import incomplete_reason, results_limit
from spheretnorm.model import BLOCKS, CONNECTIONS, GPTConfig
from spheretnorm.runtime.checkpoint import newest_run_checkpoint
from spheretnorm.runtime.run_folder import (
    CKPT_NAME, CONFIG_NAME, EXIT_COLLAPSE, EXIT_CONFIG, EXIT_CRASH, EXIT_NON_FINITE, METRICS_NAME, read_metrics,
)
from spheretnorm.runtime.config import config_keys

SHARED_DIR = REPO_ROOT.parent / "shared"
ZERO_SHOT_NAME = "ckpt_zero_shot.json"  # eval/zero_shot.py's default name for <run>/ckpt.pt

PAPER_DATASETS = ("fineweb_edu", "openwebtext")  # column order of Tables 2 and 3
PAPER_SCALES = ("S", "M", "L")
# Every scale the launcher can run (config/<dataset>_<scale>.py exists for each): the paper's,
# and XL past them, whose config sets parallel = "fsdp" (train.py shards it over the GPUs).
SCALES = (*PAPER_SCALES, "XL")

_DATASET_NAMES = {"fineweb_edu": "FineWeb-Edu", "openwebtext": "OpenWebText", "shakespeare_char": "Shakespeare-char", "shakespeare": "Shakespeare"}

# Collapse: no better than the token frequencies (docs/EXPERIMENTS.md's unigram rule; final_cosine is shown, not judged).
COLLAPSE_MARGIN = 0.05  # nats below the unigram loss that a val loss must reach to count as learning

assert all(m.partition(":")[0] in CONNECTIONS for m in PAPER_METHODS), "a paper method left the registry"


# -----------------------------------------------------------------------------
# Method keys


def parse_choices(spec: str, valid: Iterable[str], what: str) -> list[str]:
    """A comma-separated subset of `valid`, in the order given."""
    valid = list(valid)
    items = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [s for s in items if s not in valid]
    if bad or not items:
        raise UsageError(f"--{what} {spec!r} is not valid; choose from: {', '.join(valid)}.")
    return list(dict.fromkeys(items))


def dataset_display(dataset: str) -> str:
    return _DATASET_NAMES.get(dataset, dataset)


def group_label(dataset: str, scale: str) -> str:
    """'OpenWebText S': one dataset at one scale (a column group, a figure, a W&B group)."""
    return f"{dataset_display(dataset)} {scale}"


# -----------------------------------------------------------------------------
# Train-argument overrides


def parse_numbers(spec: str, kind: type, what: str) -> list[Any]:
    """'1e-3,3e-3' -> [0.001, 0.003]; one clear error naming the bad item."""
    values = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        try:
            value = kind(float(item)) if kind is int else kind(item)
        except ValueError:
            raise UsageError(f"--{what} {spec!r}: {item!r} is not a number; give a comma-separated list such as {'1e-3,3e-3' if kind is float else '10,100'}.") from None
        if not (math.isfinite(value) and value > 0):
            raise UsageError(f"--{what} {spec!r}: {item!r} must be a positive number.")
        values.append(value)
    if not values:
        raise UsageError(f"--{what} {spec!r} is empty; give a comma-separated list.")
    return sorted(set(values))


def check_overrides(overrides: list[str], reserved: Mapping[str, str]) -> list[str]:
    """Check extra --key=value arguments for train.py; reserved keys are set by the script.

    reserved maps a key to what to use instead (e.g. 'dataset' -> '--datasets'). The method's
    keys (the connection and the parameters connection classes declare) are always reserved:
    every script that takes --methods sets them from the method keys. The modules of an
    --imports=... among them are imported first: they may declare the methods and keys named.
    """
    import_modules(imports_of_overrides(overrides), "--imports")
    valid = config_keys()
    reserved = {**{k: "--methods (e.g. p_spheret:0.25)" for k in method_keys_neutral()}, "connection": "--methods", **reserved}
    for arg in overrides:
        key, eq, _ = arg.removeprefix("--").partition("=")
        if not arg.startswith("--") or not eq:
            raise UsageError(f"{arg!r} is not an option of this script, nor a train.py override of the form --key=value.")
        if key not in valid:
            raise UsageError(f"--{key} is neither an option of this script nor a train.py config key; run with --help, or see spheretnorm/runtime/config/ for the keys.")
        if key in reserved:
            raise UsageError(f"--{key} is set by this script; use {reserved[key]} instead.")
    return overrides


# -----------------------------------------------------------------------------
# The paper's numbers


def config_file(dataset: str, scale: str) -> Path:
    """config/<dataset>_<scale>.py, the paper's setting of one dataset at one scale."""
    path = REPO_ROOT / "config" / f"{dataset}_{scale.lower()}.py"
    if not path.is_file():
        raise UsageError(f"There is no config file {path.relative_to(REPO_ROOT)} for dataset {dataset!r} at scale {scale!r}.")
    return path


# -----------------------------------------------------------------------------
# Run folders


def last_eval_iter(out_dir: Path) -> int | None:
    """Iteration of the last eval row in out_dir/metrics.jsonl (None: no evaluation yet)."""
    path = Path(out_dir) / METRICS_NAME
    iters = [r["iter"] for r in read_metrics(path) if r.get("kind") == "eval"] if path.is_file() else []
    return max(iters, default=None)


def reached_max_iters(out_dir: Path, max_iters: int) -> bool:
    """True when metrics.jsonl has an eval row at iter >= max_iters: training ran to its end."""
    last = last_eval_iter(out_dir)
    return last is not None and last >= max_iters


def is_finished(out_dir: Path, max_iters: int) -> bool:
    """True when training ran to its end (reached_max_iters) and left its checkpoint (see the
    module docstring): a run without ckpt.pt has nothing to evaluate or resume, so it is not done."""
    return reached_max_iters(out_dir, max_iters) and has_checkpoint(out_dir)


# Stops that a resume would only repeat (the same data and weights give the same outcome).
FINAL_STOP_REASONS = ("collapse", "non_finite")


def final_stop(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The stop row train.py wrote when a run ended early for good: collapse or non-finite loss.

    A signalled stop (pre-emption) or a crash may be resumed, so it is no end; nor is a stop
    row that a resumed run has since left behind (it is then not the last row).
    """
    last = rows[-1] if rows else {}
    return last if last.get("kind") == "stop" and last.get("reason") in FINAL_STOP_REASONS else None


def stopped_row(out_dir: Path) -> dict[str, Any] | None:
    """final_stop of out_dir/metrics.jsonl (None: no such file, or the run did not stop for good)."""
    path = Path(out_dir) / METRICS_NAME
    return final_stop(read_metrics(path)) if path.is_file() else None


def checkpoint_path(out_dir: Path) -> Path:
    """The run's checkpoint as every reader takes it (runtime.checkpoint.newest_run_checkpoint: the
    newer of ckpt.pt and the sharded ckpt.dcp of a --parallel=fsdp run); ckpt.pt where neither is there."""
    try:
        chosen, _ = newest_run_checkpoint(out_dir)
    except ValueError:  # one of the two cannot be read: the reader given the run folder says which, in one line
        chosen = None
    return chosen if chosen is not None else Path(out_dir) / CKPT_NAME


def has_checkpoint(out_dir: Path) -> bool:
    path = checkpoint_path(out_dir)
    return path.is_dir() or path.is_file()


# -----------------------------------------------------------------------------
# Runs: what identifies one in tables and plots
#
# A run's *row* is its method key, and for a block other than GPT-2's (the paper's, train.py's
# default) the block too: 'p_spheret:0.5' and 'p_spheret:0.5+block=llama' (as the run folders
# are named), shown as '0.5-SpheretNorm' and '0.5-SpheretNorm (LLaMA)'. So runs of both blocks
# share one results folder, one table and one figure; a folder of GPT-2 runs reads as before.

DEFAULT_BLOCK = GPTConfig.block
BLOCK_TITLES = {"gpt2": "GPT-2", "llama": "LLaMA"}
_ROW_BLOCK = "+block="
_ROW_SETTINGS = ", "  # then the settings that tell runs of one method apart: 'pre_ln, optimizer=muon'


def block_title(block: str) -> str:
    """'LLaMA' for 'llama': a block as tables and figures name it."""
    return BLOCK_TITLES.get(block, block)


def row_key(method: str, block: str = DEFAULT_BLOCK, settings: str = "") -> str:
    """The row of a method in a block: the method key alone for the default block, else
    '<method>+block=<block>'; then ', <settings>' where runs of the method differ in settings
    ('pre_ln, optimizer=muon', identity.settings_labels)."""
    base = method if block == DEFAULT_BLOCK else f"{method}{_ROW_BLOCK}{block}"
    return f"{base}{_ROW_SETTINGS}{settings}" if settings else base


def split_row(row: str) -> tuple[str, str]:
    """(method key, block) of a row key."""
    method, _, block = row.partition(_ROW_SETTINGS)[0].partition(_ROW_BLOCK)
    return method, block or DEFAULT_BLOCK


def row_settings(row: str) -> str:
    """The settings part of a row key ('' for a method whose runs all share their settings)."""
    return row.partition(_ROW_SETTINGS)[2]


def row_label(row: str) -> str:
    """The name of a row: '0.5-SpheretNorm', or '0.5-SpheretNorm (LLaMA)' for a non-default block,
    then the settings that tell it from the method's other rows: 'Pre-LN, optimizer=muon'."""
    method, block = split_row(row)
    settings = row_settings(row)
    return display_name(method) + ("" if block == DEFAULT_BLOCK else f" ({block_title(block)})") + (f"{_ROW_SETTINGS}{settings}" if settings else "")


def sort_rows(rows: Iterable[str]) -> list[str]:
    """Rows in the paper's method order (sort_methods), each method's default block first."""
    rows = set(rows)
    order = {m: i for i, m in enumerate(sort_methods(split_row(r)[0] for r in rows))}
    blocks = {b: i for i, b in enumerate(BLOCKS)}
    return sorted(rows, key=lambda r: (order[split_row(r)[0]], blocks.get(split_row(r)[1], len(blocks)), split_row(r)[1], row_settings(r)))


def blocks_text(rows: Iterable[str]) -> str:
    """'' when every row is of the default block, else 'GPT-2 and LLaMA blocks' or 'LLaMA block', for titles."""
    blocks = sorted({split_row(r)[1] for r in rows}, key=lambda b: (BLOCKS.index(b) if b in BLOCKS else len(BLOCKS), b))
    if blocks in ([], [DEFAULT_BLOCK]):
        return ""
    names = [block_title(b) for b in blocks]
    return (" and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " and " + names[-1]) + (" blocks" if len(names) > 1 else " block")


@dataclass
class Run:
    """One run folder: its config.json, metrics rows and (optional) zero-shot paper columns."""

    path: Path
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    zero_shot: dict[str, float | None] | None
    zero_shot_limit: int | float | None = None  # the --limit of partial zero-shot results (None: full)
    settings: str = ""  # what tells it from other runs of its method ('optimizer=muon'; identity.settings_labels)

    @property
    def method(self) -> str:
        return self.config["method"]

    @property
    def dataset(self) -> str:
        return self.config["dataset"]

    @property
    def block(self) -> str:
        """The run's block; a run from before the block key is GPT-2's."""
        return self.config.get("block") or DEFAULT_BLOCK

    @property
    def row(self) -> str:
        """Its row in tables and its curve in figures (row_key)."""
        return row_key(self.method, self.block, self.settings)

    @property
    def scale(self) -> str:
        return scale_of(self.config)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("kind") == kind]

    @property
    def final_eval(self) -> dict[str, Any] | None:
        evals = self.of_kind("eval")
        return evals[-1] if evals else None

    @property
    def final_train_loss(self) -> float | None:
        """Train loss averaged over the last AVG_WINDOW (200) iterations, as train.py logs it."""
        trains = self.of_kind("train")
        return trains[-1]["train_loss_avg200"] if trains else None

    @property
    def final_val_loss(self) -> float | None:
        return self.final_eval["val_loss"] if self.final_eval else None

    @property
    def stop(self) -> dict[str, Any] | None:
        return final_stop(self.rows)

    @property
    def finished(self) -> bool:
        return self.final_eval is not None and self.final_eval["iter"] >= self.config["max_iters"]


def load_run(path: Path) -> Run:
    path = Path(path)
    config = json.loads((path / CONFIG_NAME).read_text(encoding="utf-8"))
    # The user's modules its method's title comes from: imported only with consent (--imports given
    # to this command, or --trust_recorded_imports), else the title is the method's own name.
    import_recorded(config, str(path / CONFIG_NAME), needed=False)
    rows = read_metrics(path / METRICS_NAME) if (path / METRICS_NAME).is_file() else []
    zero_shot, limit = None, None
    if (path / ZERO_SHOT_NAME).is_file():
        results = json.loads((path / ZERO_SHOT_NAME).read_text(encoding="utf-8"))
        zero_shot, limit = results.get("paper_table"), results_limit(results)
    return Run(path, config, rows, zero_shot, limit)


def is_evaluated(out_dir: Path) -> bool:
    """True when out_dir holds final zero-shot results: ckpt_zero_shot.json, not from a --limit run (a limited file
    written there before limited results got their own name does not count) and with no task skipped (--skip_missing)."""
    path = Path(out_dir) / ZERO_SHOT_NAME
    if not path.is_file():
        return False
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return False  # cut short by a crash: evaluate again
    return "paper_table" in results and incomplete_reason(results) is None


def index_runs(runs: Iterable[Run]) -> dict[tuple[str, str, str], Run]:
    """{(dataset, scale, row): run}, row = Run.row. Runs of one method that differ in settings are
    rows of their own, named by those settings (identity.settings_labels); two runs with the same
    settings are refused, naming both folders, never silently merged."""
    runs = list(runs)
    cells = [(run.dataset, run.scale, row_key(run.method, run.block)) for run in runs]
    for run, label in zip(runs, settings_labels(cells, [run.config for run in runs])):
        run.settings = label
    index: dict[tuple[str, str, str], Run] = {}
    for run in runs:
        key = (run.dataset, run.scale, run.row)
        if key in index:
            first = index[key]
            block = "" if first.block == DEFAULT_BLOCK else f" with the {block_title(first.block)} block"
            settings = f" ({first.settings})" if first.settings else ""
            raise UsageError(f"Two runs of {first.method}{block}{settings} on {first.dataset} at scale {first.scale} hold the same settings: "
                             f"{first.path} and {run.path} (a copied folder?); point --runs_root at the folder of one experiment, or move one away.")
        index[key] = run
    return index


def sort_groups(groups: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(dataset, scale) pairs in the paper's column order, then the others alphabetically."""
    d_order = {d: i for i, d in enumerate(PAPER_DATASETS)}
    s_order = {s: i for i, s in enumerate(SCALES)}
    return sorted(set(groups), key=lambda g: (d_order.get(g[0], len(d_order)), g[0], s_order.get(g[1], len(s_order)), g[1]))


# -----------------------------------------------------------------------------
# Outcome of a run: finished, stuck at unigram, stalled, diverged


def unigram_loss(data_dir: Path) -> float:
    """Cross-entropy (nats) of the val tokens under the train split's token frequencies.

    This is the loss of a model that ignores its context; a collapsed model sits at it
    (3.35 on Shakespeare-char).
    """
    meta = load_meta(data_dir)
    vocab = int(meta["vocab_size"])
    counts = {s: np.bincount(np.asarray(open_split(data_dir, s, meta)), minlength=vocab) for s in ("train", "val")}
    p_train = counts["train"] / counts["train"].sum()
    p_val = counts["val"] / counts["val"].sum()
    seen = p_val > 0
    return float(-(p_val[seen] * np.log(np.maximum(p_train[seen], 1e-12))).sum())


def bigram_loss(data_dir: Path) -> float:
    """Cross-entropy (nats) of the val split's neighbouring token pairs under the train split's pair
    counts with add-one smoothing over the vocabulary: P(b | a) = (n(a, b) + 1) / (n(a) + V), n(a, b)
    the train positions where b follows a, n(a) their sum over b (docs/LOG.md, 2026-12-07).

    The loss of a model that reads the previous token alone; a run that ends above it is "stalled"
    (2.482 on Shakespeare-char). Pairs are counted sparsely (np.unique), so a vocabulary of 50,257
    costs no V x V table.
    """
    meta = load_meta(data_dir)
    vocab = int(meta["vocab_size"])
    train, val = (np.asarray(open_split(data_dir, s, meta), dtype=np.int64) for s in ("train", "val"))
    if len(val) < 2:
        return math.nan  # no pair to predict
    pairs, counts = np.unique(train[:-1] * vocab + train[1:], return_counts=True)
    starts = np.bincount(train[:-1], minlength=vocab)  # n(a)
    wanted = val[:-1] * vocab + val[1:]
    at = np.clip(np.searchsorted(pairs, wanted), 0, max(len(pairs) - 1, 0))
    seen = counts[at] * (pairs[at] == wanted) if len(pairs) else np.zeros(len(wanted), dtype=np.int64)
    return float(-np.mean(np.log((seen + 1) / (starts[val[:-1]] + vocab))))


@dataclass(frozen=True)
class Yardsticks:
    """What a finished run's final loss is judged against (classify): the unigram and bigram losses
    of its data, nan where the data is not there to compute them."""

    unigram: float = math.nan
    bigram: float = math.nan

    @staticmethod
    def of(data_dir: Path) -> "Yardsticks":
        """Both losses of a prepared data folder; nan for both where it holds no meta.json (a dry run's)."""
        if not (Path(data_dir) / "meta.json").is_file():
            return Yardsticks()
        return Yardsticks(unigram_loss(data_dir), bigram_loss(data_dir))

    def record(self) -> dict[str, float]:
        """The keys a study's record stores them under."""
        return {"unigram_loss": self.unigram, "bigram_loss": self.bigram}

    def rules_text(self) -> str:
        """What classify's statuses of a run that finished but did not learn mean, with these numbers."""
        return (f"{STUCK_AT_UNIGRAM}: final val loss above the unigram loss {self.unigram:.3f} - {COLLAPSE_MARGIN}, no better than "
                f"predicting token frequencies; {STALLED}: final whole-split val loss above the bigram loss {self.bigram:.3f}, no "
                "better than the previous token's pair counts; diverged: the loss became non-finite and train.py stopped")


STOPPED_COLLAPSE = "stopped: collapse"
# A run that finished no better than the token frequencies: it never learnt past the unigram
# level (it may or may not have collapsed; the collapse alarm's status is STOPPED_COLLAPSE).
STUCK_AT_UNIGRAM = "stuck at unigram"
# A run that finished below the unigram line but no better than the previous token's pair counts
# (bigram_loss) on its whole val split: it did not learn to use its context (docs/LOG.md, 2026-12-07).
STALLED = "stalled"
# classify's statuses of a run that has its final eval row at max_iters.
FINISHED = ("ok", STUCK_AT_UNIGRAM, STALLED)
# What each exit status of train.py means (its EXIT_* constants), for the scripts' progress lines.
EXIT_TEXT = {EXIT_CRASH: "crashed", EXIT_CONFIG: "refused its config", EXIT_COLLAPSE: STOPPED_COLLAPSE, EXIT_NON_FINITE: "stopped: non-finite loss"}


def exit_text(code: int) -> str:
    """'stopped: collapse (exit status 3)' and so on; any other status by its number."""
    return f"{EXIT_TEXT[code]} (exit status {code})" if code in EXIT_TEXT else f"exit status {code}"


def final_val_loss(final: Mapping[str, Any]) -> float:
    """The loss a stall is judged on: the whole val split's (val_loss_full) where the final eval row
    (or a study's row of the run) has it, else its sampled val_loss."""
    full = final.get("val_loss_full")
    return float(full if full is not None else final["val_loss"])


def is_stalled(final: Mapping[str, Any], bigram: float | None) -> bool:
    """Whether a finished run's final loss (final_val_loss) lies above the bigram loss; never where
    the bigram loss is not known (None or nan)."""
    return bigram is not None and final_val_loss(final) > bigram


def stall_reason(final: Mapping[str, Any], bigram: float, unigram: float | None) -> str:
    """'val loss 3.133 above the bigram loss 2.482 (unigram 3.347)'."""
    below = f" (unigram {unigram:.3f})" if unigram is not None and math.isfinite(unigram) else ""
    return f"val loss {final_val_loss(final):.3f} above the bigram loss {bigram:.3f}{below}"


def classify(run: Run | None, returncode: int | None, unigram: float | None, error_line: str = "",
             bigram: float | None = None) -> tuple[str, str]:
    """(status, reason): status is ok, stuck at unigram, stalled, stopped: collapse, diverged, failed or unfinished
    (the constants above, and docs/EXPERIMENTS.md's unigram rule). A stop, from train.py's exit status or, where
    returncode is None (the run was not started here: found finished or stopped), from its stop row."""
    stop = run.stop if run is not None else None
    reason = stop.get("reason") if stop else None  # a stop row cut short may lack its keys: no KeyError here
    message = str(stop.get("message") or f"stopped ({reason or 'no reason recorded'})") if stop else error_line.removeprefix("error:").strip()
    if returncode == EXIT_COLLAPSE or (returncode is None and reason == "collapse"):
        return STOPPED_COLLAPSE, message
    if returncode == EXIT_NON_FINITE or (returncode is None and reason == "non_finite"):
        return "diverged", message
    if returncode not in (None, 0):
        return "failed", f"train.py exited with status {returncode}" + (f": {error_line}" if error_line else "")
    if run is None or not run.finished:
        return "unfinished", "no eval row at max_iters"
    final = run.final_eval
    if not math.isfinite(final["val_loss"]):
        return "diverged", "non-finite val loss"
    if unigram is not None and final["val_loss"] > unigram - COLLAPSE_MARGIN:
        cosine = final.get("final_cosine")
        extra = f", final cosine {cosine:.3f}" if cosine is not None else ""
        return STUCK_AT_UNIGRAM, f"val loss {final['val_loss']:.3f} vs unigram {unigram:.3f}{extra}"
    if is_stalled(final, bigram):
        return STALLED, stall_reason(final, bigram, unigram)  # type: ignore[arg-type]
    return "ok", ""
