"""What reproduce_cpu.py and lr_sweep.py share: the CPU model, the data, and running train.py jobs.

The model is deep and narrow, 24 layers of width 128, the regime where the connections differ
most, on Tiny Shakespeare (characters). Jobs run as subprocesses (train.py installs signal
handlers and global RNG state, so a fresh process per run is the robust choice), several at a
time with a fixed number of threads each: on 2 cores, two single-threaded jobs use the machine
better than one two-threaded job after another, since width-128 matrices are too small for a
second thread to pay off and a busy machine makes a two-threaded job wait for its slower thread.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

T = TypeVar("T")

from spheretnorm.diagnostics import DIAGNOSTICS, Summary, lacking, lacking_note
from spheretnorm.runtime.token_files import load_meta
from spheretnorm.data.preparation import prepare
from spheretnorm.experiments.grid import (
    CONFIG_NAME,
    SHARED_DIR,
    classify,
    config_conflicts,
    exit_text,
    is_finished,
    load_run,
    stopped_row,
)
from spheretnorm.runtime.cli import REPO_ROOT, UsageError
from spheretnorm.runtime.config import ConfigError, ParsedConfig, parse_config

DATASET = "shakespeare_char"
DEFAULT_DATA_DIR = REPO_ROOT / "data" / DATASET
SHARED_CORPUS = SHARED_DIR / "data" / "tinyshakespeare.txt"
LOG_NAME = "train.log"

# The model and batch of every CPU study; each script adds its schedule. Block 64 x batch 16
# keeps a step near half a second on one core.
CPU_MODEL: dict[str, Any] = {
    "dataset": DATASET,
    "n_layer": 24,
    "n_head": 4,
    "n_embd": 128,
    "block_size": 64,
    "batch_size": 16,
    "global_batch_size": 16,
    "eval_iters": 10,
    "log_interval": 10,
    "device": "cpu",
    "dtype": "float32",
    "compile": False,
    "wandb_log": False,
}
# Keys the studies set per run, and the option to use instead (the method's keys: check_overrides).
RESERVED = {
    "dataset": "--data_dir (this study trains on shakespeare_char)",
    "data_dir": "--data_dir",
    "out_dir": "--out_dir",
    "init_from": "nothing (a finished run is reused, an unfinished one resumes from its checkpoint)",
    "config_name": "nothing (it is <dataset>_<layers>x<width>)",
}


def parse_number_list(spec: str, what: str, kind: type) -> list[Any]:
    """Comma-separated numbers of an option (--seeds 1337,1338; --lrs 1e-3,3e-3); floats must be positive."""
    try:
        values = [kind(s) for s in spec.split(",") if s.strip()]
    except ValueError:
        values = []
    if not values or (kind is float and any(v <= 0 for v in values)):
        example = "1337,1338" if kind is int else "1e-3,3e-3"
        raise UsageError(f"--{what} {spec!r} is not valid; give comma-separated {'integers' if kind is int else 'positive numbers'} such as {example}.")
    return values


def as_args(settings: dict[str, Any]) -> list[str]:
    return [f"--{k}={v}" for k, v in settings.items()]


def parse_train_args(argv: list[str]) -> ParsedConfig:
    """spheretnorm.runtime.config's parse of a study's train.py arguments; a bad key or value is a UsageError."""
    try:
        return parse_config(argv, world_size=1)
    except ConfigError as e:
        raise UsageError(str(e)) from None


def study_name(parsed: ParsedConfig) -> str:
    """'shakespeare_char_24x128': the config_name (and W&B group) of a study's runs."""
    model = parsed.model_config()
    return f"{parsed.train.dataset}_{model.n_layer}x{model.n_embd}"


# -----------------------------------------------------------------------------
# Data


def ensure_data(data_dir: Path, input_path: str | None = None) -> dict[str, Any]:
    """Prepare Tiny Shakespeare (characters) in data_dir unless it is there; returns meta.json.

    The text comes from input_path, else ../shared/data/tinyshakespeare.txt when present, else
    data/prepare.py's download. An explicit input_path always prepares afresh.
    """
    data_dir = Path(data_dir)
    if input_path is None and (data_dir / "meta.json").is_file():
        return load_meta(data_dir)
    if input_path is not None and not Path(input_path).is_file():
        raise UsageError(f"--input {input_path!r} is not a file; give a plain-text corpus such as tinyshakespeare.txt.")
    source = input_path or (str(SHARED_CORPUS) if SHARED_CORPUS.is_file() else None)
    print(f"preparing {DATASET} in {data_dir} from {source or 'the download URL of data/prepare.py'}", flush=True)
    return prepare(DATASET, input=[source] if source else None, out_dir=str(data_dir), progress=False)


# -----------------------------------------------------------------------------
# Jobs


@dataclass
class Job:
    label: str  # e.g. 'proj_spheret' or 'proj_spheret lr 1e-3 warm-up 100'
    argv: list[str]  # train.py arguments, --out_dir included
    out_dir: Path
    max_iters: int


@dataclass
class JobResult:
    job: Job
    returncode: int | None  # None: reused a finished run, nothing ran
    seconds: float
    message: str  # train.py's "error: ..." line when it failed

    @property
    def reused(self) -> bool:
        return self.returncode is None


def make_job(label: str, argv: list[str], out_dir: Path) -> Job:
    """A job whose settings are checked now, and against any run already in out_dir."""
    parsed = parse_train_args(argv)
    conflicts = config_conflicts(out_dir, parsed)
    if conflicts:
        raise UsageError(f"{out_dir} holds a run with other settings ({'; '.join(conflicts)}); use another --out_dir or remove it.")
    return Job(label, argv, out_dir, parsed.train.max_iters)


def _error_line(log: Path) -> str:
    lines = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.startswith("error:")]
    return lines[-1] if lines else ""


def run_job(job: Job, threads: int) -> JobResult:
    """train.py in a subprocess with `threads` threads, output to out_dir/train.log; a finished run is reused.

    So is a run that train.py stopped for good (collapse, non-finite loss): resuming it would
    only stop it again.
    """
    if is_finished(job.out_dir, job.max_iters) or stopped_row(job.out_dir) is not None:
        return JobResult(job, None, 0.0, "")
    job.out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    log = job.out_dir / LOG_NAME
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        # auto: an interrupted run resumes; train.py refuses to start over an existing checkpoint.
        command = [sys.executable, str(REPO_ROOT / "train.py"), *job.argv, "--init_from=auto"]
        code = subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    return JobResult(job, code, time.perf_counter() - start, _error_line(log) if code else "")


def run_jobs(jobs: list[Job], parallel: int, threads: int) -> list[JobResult]:
    """Run the jobs, `parallel` at a time, printing a line as each ends; results in the jobs' order."""
    if parallel < 1 or threads < 1:
        raise UsageError(f"--jobs and --threads must be positive integers, got {parallel} and {threads}.")
    lock = threading.Lock()
    done = [0]

    def work(job: Job) -> JobResult:
        result = run_job(job, threads)
        with lock:
            done[0] += 1
            print(job_status_line(result, done[0], len(jobs)), flush=True)
        return result

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        return list(pool.map(work, jobs))


def run_or_find(items: list[T], jobs: list[Job], table_only: bool, parallel: int, threads: int) -> tuple[list[T], list[JobResult]]:
    """The results of the jobs, each paired with its item (a study's run). table_only runs
    nothing: only the runs already in their folders count, classified from their files alone."""
    if not table_only:
        return items, run_jobs(jobs, parallel, threads)
    found = [(item, job) for item, job in zip(items, jobs) if (job.out_dir / CONFIG_NAME).is_file()]
    return [item for item, _ in found], [JobResult(job, None, 0.0, "") for _, job in found]


def write_study(out_dir: Path, name: str, rows: list[dict[str, Any]], table: str, summary: str, unigram: float) -> None:
    """OUT_DIR/<name>.md (the table, then the summary over seeds) and <name>.json; prints the table."""
    if summary:
        table += "\n\nOver the seeds:\n\n" + summary
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.md").write_text(table + "\n", encoding="utf-8")
    (out_dir / f"{name}.json").write_text(json.dumps({"unigram_loss": unigram, "runs": rows}, indent=2) + "\n", encoding="utf-8")
    print(table)


def job_status_line(result: JobResult, index: int, total: int) -> str:
    job = result.job
    if result.reused:
        return f"[{index}/{total}] {job.label}: already finished in {job.out_dir}, reused"
    outcome = "done" if result.returncode == 0 else f"{exit_text(result.returncode)}: {result.message}".rstrip(": ")
    return f"[{index}/{total}] {job.label}: {outcome} in {result.seconds:.0f} s (log: {job.out_dir / LOG_NAME})"


def outcome(result: JobResult, unigram: float) -> dict[str, Any]:
    """What a finished job left: status (ok / collapsed / stopped: collapse / diverged / ...), final losses, time.

    val_loss is None for a diverged run (its last evaluation predates the divergence). seconds
    is this job's wall-clock, or train.py's own elapsed time for a run found finished.
    """
    run = load_run(result.job.out_dir) if (result.job.out_dir / CONFIG_NAME).is_file() else None
    status, reason = classify(run, result.returncode, unigram, result.message)
    final = run.final_eval if run else None
    seconds = result.seconds if not result.reused else (final or {}).get("elapsed_s")
    return {
        "status": status,
        "reason": reason,
        "val_loss": final["val_loss"] if final and status != "diverged" else None,
        "train_loss_avg": run.final_train_loss if run and status != "diverged" else None,
        "final_cosine": final.get("final_cosine") if final else None,
        "last_eval_iter": final["iter"] if final else None,
        "seconds": None if seconds is None else round(seconds, 1),
        "reused": result.reused,
        "out_dir": str(result.job.out_dir),
    }


def wall_clock_line(wall: float, rows: list[dict[str, Any]]) -> str:
    """'Wall-clock: ...', saying how many runs were reused and what their training had cost."""
    text = f"Wall-clock: {wall / 60:.1f} min ({wall:.0f} s) for {len(rows)} runs"
    reused = [r for r in rows if r["reused"]]
    if reused:
        earlier = sum(r["seconds"] or 0 for r in reused)
        text += f", {len(reused)} of them found finished and reused (their training took {earlier / 60:.1f} min of run time)"
    return text + "."


def add_run_options(parser: Any, out_dir: str) -> None:
    """The length, evaluations and output folder of a study's runs (depth_study, block_study)."""
    parser.add_argument("--max_iters", type=int, default=800, help="iterations per run; the cosine ends there (default 800)")
    parser.add_argument("--eval_interval", type=int, default=100, help="iterations between evaluations (default 100)")
    parser.add_argument("--out_dir", default=out_dir, help=f"where the runs and the table go (default {out_dir})")
    parser.add_argument("--table_only", action="store_true", help="run nothing: tabulate the runs already in --out_dir")


def add_common_options(parser: Any) -> None:
    """Options shared by the CPU studies."""
    parser.add_argument("--data_dir", default=str(DEFAULT_DATA_DIR), help=f"prepared {DATASET} data (default: data/{DATASET}; prepared when missing)")
    parser.add_argument("--input", default=None, help="text corpus to prepare (default: ../shared/data/tinyshakespeare.txt when present, else download)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")


def study_main(parse_args: Callable[[list[str] | None], tuple[Any, list[str]]],
               run: Callable[[Any, list[str]], int], argv: list[str] | None) -> int:
    """A study script's main: a usage error is one line on stderr and status 2, else run's status."""
    args, overrides = parse_args(argv)
    try:
        return run(args, overrides)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def exit_status(rows: list[dict[str, Any]]) -> int:
    """1 when any run of a study failed, else 0."""
    return 1 if any(r["status"] == "failed" for r in rows) else 0


# -----------------------------------------------------------------------------
# Tables of a study's runs


def diagnostic_summary(row: dict[str, Any]) -> dict[str, float | None]:
    """The study columns of an eval row: each Summary of DIAGNOSTICS, None where the row lacks the
    diagnostic (a run written before it existed), so that runs fit side by side in a table.

    Today: final_cosine; the largest max/median over layers; the attention sink's mean over
    blocks; contribution and update ratio as means over sublayers, and the last sublayer's
    contribution over the first's (below 1: the deep layers do less, the curse of depth).
    """
    out: dict[str, float | None] = {}
    for entry in DIAGNOSTICS:
        out.update(entry.summarise(row.get(entry.name)))
    return out


def diagnostic_summaries(finals: list[dict[str, Any] | None]) -> list[dict[str, float | None]]:
    """diagnostic_summary of each run's last eval row ({} for a run with none), with one note on
    stderr naming the diagnostics that some runs predate."""
    summarised = [entry for entry in DIAGNOSTICS if entry.summaries]
    evaluated = [[final] for final in finals if final is not None]
    missing = lacking(evaluated, summarised)
    if missing:
        print(lacking_note(missing, len(evaluated), "'-' in the table"), file=sys.stderr)
    return [diagnostic_summary(final) if final is not None else {} for final in finals]


def summary_columns() -> list[Summary]:
    """The diagnostic columns of a study's table, in DIAGNOSTICS order (header, key, format)."""
    return [column for entry in DIAGNOSTICS for column in entry.summaries]


def summary_cells(row: dict[str, Any]) -> list[str]:
    """A study row's diagnostic cells under summary_columns(); '-' where it has no number."""
    return ["-" if row.get(c.key) is None else format(row[c.key], c.fmt) for c in summary_columns()]


def paired_seed_summary(rows: list[dict[str, Any]], baseline_title: str) -> str:
    """Val loss per variant over the seeds: mean, range, and the gap to its baseline's run of the
    same seed (paired, so that what a seed does to every variant cancels). Each row names its
    variant ("name") and its baseline variant ("baseline"); empty when no variant has two seeds."""
    losses: dict[str, dict[int, float]] = {}
    baseline_of: dict[str, str] = {}
    for r in rows:
        if r["val_loss"] is not None:
            losses.setdefault(r["name"], {})[r["seed"]] = r["val_loss"]
            baseline_of[r["name"]] = r["baseline"]
    if max((len(v) for v in losses.values()), default=0) < 2:
        return ""
    lines = [
        f"| method | seeds | val loss, mean | range | minus {baseline_title} (same seed), mean | range |",
        "|:--|--:|--:|--:|--:|--:|",
    ]
    for name, by_seed in losses.items():
        base = losses.get(baseline_of[name], {})
        gaps = [loss - base[seed] for seed, loss in by_seed.items() if seed in base]
        gap = f"{statistics.fmean(gaps):+.3f} | {min(gaps):+.3f} to {max(gaps):+.3f}" if gaps else "- | -"
        vals = list(by_seed.values())
        lines.append(f"| {name} | {len(vals)} | {statistics.fmean(vals):.3f} | {min(vals):.3f} to {max(vals):.3f} | {gap} |")
    return "\n".join(lines)
