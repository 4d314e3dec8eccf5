"""The CPU studies' engine: the CPU model, the data, running train.py jobs, and the declarative sweep.

A study declares a Sweep (its name, base settings, axes, run folders, table columns, and where it
needs one, a follow-up rule) and this module plans it, runs its jobs, resumes or reuses finished
runs, and writes its rows, its Markdown table and the summary over its seeds (where it selects a
rate, the held-out seeds' at each group's selected rate: selected_summary).

The model is deep and narrow, 24 layers of width 128, the regime where the connections differ
most, on Tiny Shakespeare (characters). Jobs run as subprocesses (train.py installs signal
handlers and global RNG state, so a fresh process per run is the robust choice), several at a
time with a fixed number of threads each: on 2 cores, two single-threaded jobs use the machine
better than one two-threaded job after another, since width-128 matrices are too small for a
second thread to pay off and a busy machine makes a two-threaded job wait for its slower thread.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from spheretnorm.diagnostics import DIAGNOSTICS
from spheretnorm.kernels import kernel_path_text
from spheretnorm.optim import OPTIMIZERS
from spheretnorm.runtime.token_files import PrepareError, load_meta, read_json_object
from spheretnorm.data.preparation import prepare, prepared_already
from spheretnorm.data.pipeline import TINY_SHAKESPEARE
from spheretnorm.experiments.grid import (
    CONFIG_NAME,
    FINISHED,
    SHARED_DIR,
    STALLED,
    STOPPED_COLLAPSE,
    STUCK_AT_UNIGRAM,
    Yardsticks,
    check_overrides,
    classify,
    exit_text,
    has_checkpoint,
    load_run,
    parse_numbers,
    reached_max_iters,
    stopped_row,
)
from spheretnorm.experiments.stats import Rule, Spread, parse_rule, spread, verdict
from spheretnorm.runtime.cli import REPO_ROOT, HelpFormatter, UsageError
from spheretnorm.runtime.config import ConfigError, ParsedConfig, config_keys, parse_config
from spheretnorm.runtime.identity import config_conflicts
from spheretnorm.runtime.methods import method_args
from spheretnorm.runtime.run_folder import METRICS_NAME, OutDirError, check_folder, holds_any_checkpoint

DATASET = "shakespeare_char"
DEFAULT_DATA_DIR = REPO_ROOT / "data" / DATASET
SHARED_CORPUS = SHARED_DIR / "data" / "tinyshakespeare.txt"
LOG_NAME = "train.log"

# The model and batch of every CPU study; each script adds its schedule. Block 64 x batch 16
# keeps a step near half a second on one core. Compiled, fp32: the fastest path measured for
# these shapes (docs/LOG.md, 2026-12-04: a step 1.5x faster than eager; bf16 autocast is slower
# still on a CPU without native bf16); --compile=false gives the eager path, which the LOG's runs
# before 2026-12-04 used. Each run's config.json records the path (kernel_path).
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
    "compile": True,
    "compile_scope": "blocks",  # since 2026-12-07: one compile per block at any depth (studies before it: model)
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
    """Prepare a corpus's characters in data_dir unless it is there; returns meta.json.

    The text comes from input_path, else ../shared/data/tinyshakespeare.txt when present, else
    data/prepare.py's download. An explicit input_path prepares afresh unless data_dir already holds
    that file's characters (the same sha256): a second sweep over a data folder must not replace the
    files the first one's runs are training from.
    """
    data_dir = Path(data_dir)
    if input_path is None and (data_dir / "meta.json").is_file():
        return load_meta(data_dir)
    if input_path is not None and not Path(input_path).is_file():
        raise UsageError(f"--input {input_path!r} is not a file; give a plain-text corpus such as tinyshakespeare.txt.")
    if input_path is not None and (meta := prepared_already(DATASET, [input_path], data_dir)) is not None:
        print(f"using the characters of {input_path} prepared in {data_dir} (same sha256)", flush=True)
        return meta
    source = input_path or (str(SHARED_CORPUS) if SHARED_CORPUS.is_file() else None)
    print(f"preparing the characters of {source or 'the download URL of data/prepare.py'} in {data_dir} "
          f"(data/prepare.py's {DATASET} format)", flush=True)
    try:
        return prepare(DATASET, input=[source] if source else None, out_dir=str(data_dir), progress=False)
    except PrepareError as e:  # an empty or too short text: the study's one line, as data/prepare.py says it
        given = f"--input {input_path!r}" if input_path is not None else (source or "the download")
        raise UsageError(f"{given} cannot be prepared in {data_dir}: {e}") from None


def corpus_title(data_dir: Path) -> str:
    """What a study's figures name as its text: 'Tiny Shakespeare characters' where the prepared
    data is Tiny Shakespeare (its sha256, from any source), else the name of the --input file it was
    prepared from ('openwebtext_sample.jsonl characters'); 'characters' where meta.json says nothing."""
    try:
        source = load_meta(Path(data_dir)).get("source") or {}
    except (OSError, ValueError):  # not prepared yet (PrepareError is a ValueError), or unreadable
        return "characters"
    files = source.get("files") or [source]
    if all(f.get("sha256") == TINY_SHAKESPEARE.sha256 for f in files):
        return "Tiny Shakespeare characters"
    names = [Path(f["path"]).name for f in files if f.get("path")]
    return f"{', '.join(names)} characters" if names else "characters"


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
    busy: bool = False  # another sweep trains this folder now: not run, not tabulated
    resumed: bool = False  # it started from a checkpoint an earlier (stopped) job left: `seconds` is its last part only

    @property
    def reused(self) -> bool:
        return self.returncode is None and not self.busy


def make_job(label: str, argv: list[str], out_dir: Path) -> Job:
    """A job whose settings are checked now, and against any run already in out_dir."""
    parsed = parse_train_args(argv)
    try:
        conflicts = config_conflicts(out_dir, parsed)
    except ConfigError as e:  # a damaged config.json
        raise UsageError(str(e)) from None
    if conflicts:
        raise UsageError(f"{out_dir} holds a run with other settings ({'; '.join(conflicts)}); use another --out_dir or remove it.")
    return Job(label, argv, out_dir, parsed.train.max_iters)


def _error_line(log: Path) -> str:
    lines = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.startswith("error:")]
    return lines[-1] if lines else ""


# Held (flock) by the sweep that trains a run folder, released by the kernel when that sweep's
# process ends however it ends: two sweeps over one --out_dir never train one folder together.
SWEEP_LOCK = ".sweep.lock"


class SweepStopped(Exception):
    """A signal stopped the sweep: its running train.py jobs got the signal too and checkpointed."""

    def __init__(self, signum: int, stopped: list[str]):
        self.signum, self.stopped = signum, stopped
        name = signal.Signals(signum).name
        running = f"{len(stopped)} running run(s) got {name} too and saved a checkpoint ({', '.join(stopped)}); " if stopped else ""
        super().__init__(f"stopped by {name}: {running}run the same command again to resume the sweep.")


class Stopper:
    """Passes SIGINT and SIGTERM of the sweep's process on to the train.py jobs it runs (which
    save a checkpoint and exit, train.py's stopping.py), and starts no job after one came:
    `kill -INT <sweep>` reaches only this process, not its children."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.children: dict[subprocess.Popen, str] = {}  # running job -> its label
        self.stopped: list[str] = []

    def handle(self, signum: int, frame: Any) -> None:
        self.signum = signum
        for child, label in list(self.children.items()):
            self.tell(child, label)

    def tell(self, child: subprocess.Popen, label: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(self.signum)
            if label not in self.stopped:
                self.stopped.append(label)

    @contextlib.contextmanager
    def installed(self) -> Iterator[Stopper]:
        """The handlers, in the main thread only (signal's rule); the previous ones after."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self.handle) for sig in self.SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def run(self, job: Job, command: list[str], **kwargs: Any) -> int:
        """The command's exit status; it gets the sweep's stop signal, also one that came as it started."""
        child = subprocess.Popen(command, **kwargs)
        self.children[child] = job.label
        if self.signum is not None:
            self.tell(child, job.label)
        try:
            return child.wait()
        finally:
            self.children.pop(child, None)


@contextlib.contextmanager
def folder_lock(out_dir: Path) -> Iterator[bool]:
    """True while this process holds the run folder's sweep lock, False when another sweep does."""
    with open(out_dir / SWEEP_LOCK, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True  # closing the file releases it


def in_progress(out_dir: Path) -> bool:
    """Whether a sweep trains this run folder now; asks without writing anything (a dry run)."""
    try:
        with open(out_dir / SWEEP_LOCK, "rb") as f:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no lock file: no sweep has trained it since
        return False
    return False


def is_done(out_dir: Path, max_iters: int) -> bool:
    """A sweep's run that needs no more training: it ran to max_iters, or train.py stopped it for
    good (collapse, non-finite loss). Its tables and rules read metrics.jsonl alone, whose last
    evaluation holds every final loss, so a run restored from its run record (config.json and
    metrics.jsonl, the checkpoint not kept: docs/run_records) counts as done and a sweep resumed
    over it adds only what its plan still lacks. (The launcher's runs need their checkpoint for
    the zero-shot evaluation: grid.is_finished.)"""
    return reached_max_iters(out_dir, max_iters) or stopped_row(out_dir) is not None


def train_command(job: Job) -> list[str]:
    # auto: an interrupted run resumes; train.py refuses to start over an existing checkpoint.
    return [sys.executable, str(REPO_ROOT / "train.py"), *job.argv, "--init_from=auto"]


def run_job(job: Job, threads: int, stopper: Stopper | None = None) -> JobResult:
    """train.py in a subprocess with `threads` threads, output to out_dir/train.log; a finished run is reused.

    So is a run that train.py stopped for good (collapse, non-finite loss): resuming it would
    only stop it again. A folder another sweep trains now is left to it (busy).
    """
    if is_done(job.out_dir, job.max_iters):
        return JobResult(job, None, 0.0, "")
    job.out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    log = job.out_dir / LOG_NAME
    start = time.perf_counter()
    with folder_lock(job.out_dir) as held:
        if not held:
            return JobResult(job, None, 0.0, "", busy=True)
        resumed = holds_any_checkpoint(job.out_dir)
        with open(log, "w", encoding="utf-8") as out:
            code = (stopper or Stopper()).run(job, train_command(job), cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    return JobResult(job, code, time.perf_counter() - start, _error_line(log) if code else "", resumed=resumed)


def schedule(take: Callable[[int], list[Job]], ended: Callable[[JobResult], None], parallel: int, threads: int,
             waiting: Callable[[], int]) -> None:
    """Run the jobs take(free) hands out, at most `parallel` at a time, and ask it for more each
    time one ends (after ended(result) has seen it), until it hands out none and none runs: a plan
    that grows with the finished runs starts what they call for at once, not after the rest of an
    older batch. A line is printed as each job ends (waiting(): how many more the plan holds now).
    A stop signal reaches the running jobs (which checkpoint), starts no other, and ends in
    SweepStopped once they have exited."""
    if parallel < 1 or threads < 1:
        raise UsageError(f"--jobs and --threads must be positive integers, got {parallel} and {threads}.")
    stopper = Stopper()
    running: dict[Future[JobResult], Job] = {}
    count, trained = 0, []  # trained: the seconds of the runs that trained here (the ETA's basis)
    with stopper.installed(), ThreadPoolExecutor(max_workers=parallel) as pool:
        while True:
            if stopper.signum is None:  # stopped: no new run starts
                for job in take(parallel - len(running)):
                    running[pool.submit(run_job, job, threads, stopper)] = job
            if not running:
                break
            finished, _ = wait(running, timeout=PROGRESS_EVERY_S, return_when=FIRST_COMPLETED)
            if not finished:  # minutes can pass between two runs' ends: say where the sweep is
                print(progress_line(count, list(running.values()), waiting(), trained, parallel), flush=True)
            for future in finished:
                del running[future]
                result = future.result()
                ended(result)
                count += 1
                if result.returncode is not None and not result.busy:
                    trained.append(result.seconds)
                print(job_status_line(result, count, count + len(running) + waiting()), flush=True)
    if stopper.signum is not None:
        raise SweepStopped(stopper.signum, stopper.stopped)


PROGRESS_EVERY_S = 60.0  # a progress line at least this often while runs go on and none ends


def last_iteration(out_dir: Path) -> int | None:
    """The iteration of a running job's newest metrics row (None before its first)."""
    path = out_dir / METRICS_NAME
    if not path.is_file():
        return None
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
        lines = path.read_text(encoding="utf-8").strip().splitlines()
        return int(json.loads(lines[-1])["iter"]) if lines else None
    return None


def progress_line(done: int, running: list[Job], waiting: int, trained: list[float], parallel: int) -> str:
    """'sweep: 3 runs ended, 2 running (A at 240 of 600, B not logging yet), 5 waiting; about 12 min
    left at 2 at a time (the mean of 3 runs here)'."""
    def where(job: Job) -> str:
        it = last_iteration(job.out_dir)
        return f"{job.label} at {it} of {job.max_iters}" if it is not None else f"{job.label} starting"

    left = len(running) + waiting
    eta = (f"about {statistics.fmean(trained) * left / parallel / 60:.0f} min left at {parallel} at a time "
           f"(the mean of {len(trained)} run{'s' if len(trained) != 1 else ''} here)") if trained else "no run has ended here yet to time the rest"
    return f"sweep: {done} run{'s' if done != 1 else ''} ended, {len(running)} running ({'; '.join(map(where, running))}), {waiting} waiting; {eta}"


def job_status_line(result: JobResult, index: int, total: int) -> str:
    job = result.job
    if result.busy:
        return f"[{index}/{total}] {job.label}: in progress in another sweep ({job.out_dir / SWEEP_LOCK} is held), left to it"
    if result.reused:
        return f"[{index}/{total}] {job.label}: already finished in {job.out_dir}, reused"
    if result.returncode == 0:  # a run a signal stopped exits 0 too, its checkpoint saved: not done
        outcome = "done" if reached_max_iters(job.out_dir, job.max_iters) else "stopped before its end (the same command resumes it)"
    else:
        outcome = f"{exit_text(result.returncode)}: {result.message}".rstrip(": ")
    return f"[{index}/{total}] {job.label}: {outcome} in {result.seconds:.0f} s (log: {job.out_dir / LOG_NAME})"


def outcome(result: JobResult, yardsticks: Yardsticks) -> dict[str, Any]:
    """What a finished job left: status (ok / stuck at unigram / stalled / stopped: collapse / diverged / ...), final losses, time.

    val_loss is None for a diverged run (its last evaluation predates the divergence). seconds
    is the run's whole time (run_seconds).
    """
    run = load_run(result.job.out_dir) if (result.job.out_dir / CONFIG_NAME).is_file() else None
    status, reason = classify(run, result.returncode, yardsticks.unigram, result.message, yardsticks.bigram)
    final = run.final_eval if run else None
    seconds = run_seconds(result, final)
    return {
        "status": status,
        "reason": reason,
        "val_loss": final["val_loss"] if final and status != "diverged" else None,
        # the whole val split, in the final eval row of runs since train.py had it (FULL_METRIC)
        FULL_METRIC: final.get(FULL_METRIC) if final and status != "diverged" else None,
        "kernel_path": kernel_path_of(run.config) if run else None,
        "train_loss_avg": run.final_train_loss if run and status != "diverged" else None,
        "final_cosine": final.get("final_cosine") if final else None,
        "last_eval_iter": final["iter"] if final else None,
        "seconds": None if seconds is None else round(seconds, 1),
        "reused": result.reused,
        "out_dir": str(result.job.out_dir),
    }


# A run's start-up before train.py's clock starts (imports, data, model): what a finished run's
# elapsed_s leaves out, besides its final evaluation's own seconds (measured: 5 to 10 s on 2 cores).
START_UP_SECONDS = 8.0


def run_seconds(result: JobResult, final: dict[str, Any] | None) -> float | None:
    """A run's whole time: this job's wall-clock for a run trained start to end in it; for one found
    finished, or resumed from an earlier job's checkpoint (whose wall-clock is its last part only),
    finished_run_seconds, since train.py's clock carries across a resume."""
    if result.reused:
        return finished_run_seconds(final)
    whole = finished_run_seconds(final) if result.resumed else None
    return result.seconds if whole is None else whole


def finished_run_seconds(final: dict[str, Any] | None) -> float | None:
    """The whole time of a run found finished: train.py's elapsed_s at its last evaluation (its
    steps, compile and earlier evaluations), that evaluation's diagnostics and whole-split loss,
    and the start-up before the clock started; None without an evaluation row."""
    if not final or final.get("elapsed_s") is None:
        return None
    return final["elapsed_s"] + sum(final.get(key) or 0.0 for key in ("diag_s", "full_eval_s")) + START_UP_SECONDS


FULL_METRIC = "val_loss_full"  # the final eval row's loss over the whole val split (non-overlapping windows)
SAMPLED_METRIC = "val_loss"  # the eval_iters random batches every evaluation has; what runs before FULL_METRIC have


def table_metric(rows: Iterable[dict[str, Any]]) -> str:
    """The loss a table (and the plan's selection) ranks: FULL_METRIC where every run that ran to
    its end has it, else SAMPLED_METRIC for all, so that no table compares one run's whole split
    with another's sampled batches."""
    trained = [r for r in rows if r["status"] in FINISHED]  # the ones with a final eval row at max_iters
    return FULL_METRIC if trained and all(r.get(FULL_METRIC) is not None for r in trained) else SAMPLED_METRIC


METRIC_TEXT = {FULL_METRIC: "val_loss_full, the whole validation split in non-overlapping windows",
               SAMPLED_METRIC: "val_loss, the mean of eval_iters sampled batches (some run lacks val_loss_full)"}


def kernel_path_of(config: dict[str, Any]) -> str:
    """A run's numeric path as config.json's kernel_path says ('float32 compiled fused_in_model_compile'),
    or for a run from before that key, derived from its dtype, compile and sphere_kernels: dtype
    'auto' is float32 on a CPU and unknown elsewhere, a missing compile is False, and a missing
    sphere_kernels 'unknown' (whether SPHERETNORM_EAGER_KERNELS was set is not recorded)."""
    if config.get("kernel_path"):
        return str(config["kernel_path"])
    dtype = config.get("resolved_dtype") or config.get("dtype") or "unknown"
    if dtype == "auto":
        dtype = "float32" if config.get("device") == "cpu" else "unknown"
    return kernel_path_text(dtype, bool(config.get("compile", False)), config["sphere_kernels"] if "sphere_kernels" in config else "unknown")


NO_SPHERE = "none"  # kernel_path_text's sphere path of a run off the sphere: it fits any sphere path


def kernel_paths_line(rows: Iterable[dict[str, Any]], mix: bool) -> str:
    """'Kernel path: float32 eager fused_eager.': the paths of a table's runs (a run off the sphere
    fits the sphere runs' path). Several are a UsageError unless mix (--mix_kernel_paths), since
    runs on two paths agree only up to rounding, which near a collapse can decide one."""
    paths = sorted({r["kernel_path"] for r in rows if r.get("kernel_path")})
    numeric = {p.rsplit(" ", 1)[0] for p in paths}
    sphere = {p.rsplit(" ", 1)[-1] for p in paths} - {NO_SPHERE}
    if (len(numeric) > 1 or len(sphere) > 1) and not mix:
        raise UsageError(f"the runs of this table ran on {len(paths)} kernel paths ({'; '.join(paths)}); give --mix_kernel_paths "
                         f"to tabulate them together, or tabulate runs of one path.")
    return f"Kernel path{'s' if len(paths) > 1 else ''}: {'; '.join(paths) or 'none recorded'}."


def wall_clock_line(wall: float, rows: list[dict[str, Any]]) -> str:
    """'Wall-clock: ...', saying how many runs were reused and what their training had cost; rows
    that share a run (one folder) count once."""
    rows = list({r["out_dir"]: r for r in rows}.values())
    text = f"Wall-clock: {wall / 60:.1f} min ({wall:.0f} s) for {len(rows)} runs"
    reused = [r for r in rows if r["reused"]]
    if reused:
        earlier = sum(r["seconds"] or 0 for r in reused)
        text += f", {len(reused)} of them found finished and reused (their training took {earlier / 60:.1f} min of run time)"
    return text + "."


# -----------------------------------------------------------------------------
# A study command: the options the studies share, each with one help text (a study's parse_args adds its own)


def add_place_options(parser: Any, out_dir: str, table_only: bool = True, dry_run: bool = False, data_dir: Path | None = None,
                      corpus: str | None = None) -> None:
    """What Place.of and start_study read: --out_dir (the study's folder), --table_only and --dry_run
    where the study has them, the data (--data_dir, --input) and the machine (--jobs, --threads).
    data_dir and corpus: a study's own defaults of --data_dir and --input (table2_mini's web text)."""
    parser.add_argument("--out_dir", default=out_dir, help=f"where the runs and what the study writes go (default {out_dir})")
    if table_only:
        parser.add_argument("--table_only", action="store_true", help="run nothing: tabulate the runs already in --out_dir")
    if dry_run:
        parser.add_argument("--dry_run", action="store_true", help="print the runs the plan holds now; run nothing")
    where = f"data/{DATASET}" if data_dir is None else str(data_dir.relative_to(REPO_ROOT) if data_dir.is_relative_to(REPO_ROOT) else data_dir)
    parser.add_argument("--data_dir", default=str(data_dir or DEFAULT_DATA_DIR), help=f"prepared {DATASET} data (default: {where}; prepared when missing)")
    source = corpus or "../shared/data/tinyshakespeare.txt when present, else download"
    parser.add_argument("--input", default=corpus, help=f"text corpus to prepare as characters; kept where --data_dir holds it already, same sha256 (default: {source})")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")


def add_length_options(parser: Any, max_iters: int, warmup_iters: int | None = None, warmup_of: str = "", eval_interval: int | None = None) -> None:
    """--max_iters, and where the study sets them --warmup_iters (warmup_of: whose warm-up it is) and --eval_interval."""
    parser.add_argument("--max_iters", type=int, default=max_iters, help=f"iterations per run; the cosine ends there (default {max_iters})")
    if warmup_iters is not None:
        parser.add_argument("--warmup_iters", type=int, default=warmup_iters, help=f"linear warm-up iterations{warmup_of} (default {warmup_iters})")
    if eval_interval is not None:
        parser.add_argument("--eval_interval", type=int, default=eval_interval, help=f"iterations between evaluations (default {eval_interval})")


def add_seed_option(parser: Any, default: str = "1337,1338", role: str = "") -> None:
    """--seeds; role: what the study does with each, where they differ (fair_sweep: the first selects, the rest are held out)."""
    parser.add_argument("--seeds", default=default, help=f"comma-separated seeds{role} (default {default})")


def add_methods_option(parser: Any, default: str) -> None:
    """--methods, as runtime.methods.parse_methods reads it."""
    parser.add_argument("--methods", default=default,
                        help=f"'paper' (the 8 of the paper), 'all' (every registered connection) or comma-separated methods (default {default})")


def add_rate_grid_options(parser: Any, lrs: str, base_lr: float | None = None, lrs_role: str = "", base_lr_beside_others: bool = False,
                          grid_role: str = "") -> None:
    """--lrs, the peak learning rates; with base_lr, an optimizer axis too (rate_grids): --optimizers,
    each sweeping its own rate key, --grid OPT=R1,R2,... and --base_lr for the AdamW part beside them.
    base_lr_beside_others: --base_lr stays None unless given (the study runs base_lr then) and the
    study refuses it with AdamW alone."""
    parser.add_argument("--lrs", default=lrs, help=f"peak learning rates{'' if base_lr is None else ' of AdamW'}{lrs_role} (default {lrs})")
    if base_lr is None:
        return
    parser.add_argument("--optimizers", default="adamw",
                        help=f"comma-separated optimizers, of: {', '.join(OPTIMIZERS)}; each sweeps its own rate key (default adamw)")
    parser.add_argument("--grid", action="append", default=[], metavar="OPT=R1,R2,...",
                        help=f"an optimizer's peak rates of its rate key (default: --lrs for AdamW, else the key's default x 1/4 .. 4){grid_role}; repeatable")
    refused = "; refused with --optimizers adamw alone, where it has no effect" if base_lr_beside_others else ""
    parser.add_argument("--base_lr", type=float, default=None if base_lr_beside_others else base_lr,
                        help=f"learning_rate of the other optimizers' AdamW part (embeddings, gains) (default {base_lr:g}){refused}")


def study_main(parse_args: Callable[[list[str] | None], tuple[Any, list[str]]],
               run: Callable[[Any, list[str]], int], argv: list[str] | None) -> int:
    """A study script's main: a usage error is one line on stderr and status 2, else run's status."""
    args, overrides = parse_args(argv)
    try:
        return run(args, overrides)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SweepStopped as e:
        print(str(e), file=sys.stderr)
        return 128 + e.signum  # as a shell reports a process a signal ended


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


def paired_seed_summary(rows: list[dict[str, Any]], baseline_title: str, metric: str = SAMPLED_METRIC) -> tuple[str, list[tuple[str, Gaps]]]:
    """The loss per variant over its seeds (each seed counts: these studies select nothing): mean
    and SD, and the gap to its baseline's run of the same seed (paired, so that what a seed does to
    every variant cancels) with its mean, SD and 95% interval; a variant with a failed seed says so
    and has no mean. Reads each row's "name", "seed" and "baseline" (name_rows). The table ('' when
    no variant has two seeds) and each variant's gaps (for the rules' verdicts)."""
    by_name: dict[str, dict[Any, dict[str, Any]]] = {}
    for r in rows:
        by_name.setdefault(r["name"], {})[r.get("seed")] = r
    if max(map(len, by_name.values()), default=0) < 2:
        return "", []
    summary, verdicts = [], []
    for name, mine in by_name.items():
        cell = seed_cell(mine, mine, metric)
        base = next((r["baseline"] for r in mine.values() if r.get("baseline")), None)
        gaps = gap_values(cell, seed_cell(by_name.get(base, {}), mine, metric)) if base and base != name else {}
        loss = cell.spread()
        summary.append({"name": name, "seeds": len(mine), "loss": cell.text(), "sd": loss.sd if loss else None, **gap_record("gap", gaps)})
        if gaps:
            verdicts.append((name, gaps))
    table = markdown_table(summary, (Column("method", "name", align=":--"), Column("seeds", "seeds"), Column("loss, mean", "loss"),
                                     Column("SD", "sd", ".3f"), Column(f"minus {baseline_title} (same seed), mean", "gap_text"),
                                     Column("SD", "gap_sd", ".3f"), Column("95% interval", "gap_interval")))
    return table, verdicts


# -----------------------------------------------------------------------------
# The declarative sweep: a study's spec, and the engine that plans, runs and tabulates it


@dataclass(frozen=True)
class Point:
    """One run of a sweep: its value of each row key (method, lr, seed, ...), in any order given."""

    pairs: tuple[tuple[str, Any], ...]

    @property
    def values(self) -> dict[str, Any]:
        return dict(self.pairs)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def but(self, **changes: Any) -> "Point":
        """This point with some values changed or added: its baseline, its twin at the base width."""
        return point(**{**self.values, **changes})


def point(**values: Any) -> Point:
    # Sorted by key, so that points built in any order compare and hash equal.
    return Point(tuple(sorted(values.items(), key=lambda kv: kv[0])))


@dataclass(frozen=True)
class Axis:
    """One dimension of a sweep: a row key and its values. A value that is a dict sets several row
    keys at once, a variant such as {'method': 'p_spheret:0.5', 'alpha_index': 'sublayer'}."""

    key: str
    values: tuple[Any, ...]

    def items(self) -> list[dict[str, Any]]:
        return [dict(v) if isinstance(v, dict) else {self.key: v} for v in self.values]


@dataclass(frozen=True)
class Column:
    """A column of a Markdown table: its header, the row key (or a function of the row) it shows."""

    header: str
    value: str | Callable[[dict[str, Any]], Any]
    fmt: str = ""
    align: str = "--:"

    def cell(self, row: dict[str, Any]) -> str:
        value = row.get(self.value) if isinstance(self.value, str) else self.value(row)
        return "-" if value is None else format(value, self.fmt)


def _no_settings(p: Point) -> dict[str, Any]:
    return {}


def _every_point(p: Point) -> bool:
    return True


@dataclass(frozen=True)
class Sweep:
    """What a study declares; run_sweep does the rest. A point's train.py settings are the base,
    its method's arguments, its row keys that are train.py keys (seed, block, spheret_p, ...), then
    what `settings` derives from it (learning_rate and min_lr from lr, ...), which wins."""

    name: str  # the runs' config_name and the stem of <name>.md and <name>.json
    base: dict[str, Any]  # train.py settings of every run
    axes: tuple[Axis, ...]  # outermost first: runs go in this order, so a sweep cut short has whole outer values
    folder: Callable[[Point], str]  # a run's folder under --out_dir; points that share a folder share its run
    columns: tuple[Column, ...] = ()  # the table of runs
    settings: Callable[[Point], dict[str, Any]] = _no_settings
    label: Callable[[Point], str] | None = None  # a row's name; None: distinct_labels
    baseline: Callable[[Point], Point] | None = None  # the run each row is compared with, seed by seed
    keep: Callable[[Point], bool] = _every_point  # which points of the axes' product run
    follow_up: Callable[["Sweep", dict[Point, float]], list[Point]] | None = None  # the plan, from the finished runs' losses
    extra: Callable[[Point, Path], dict[str, Any]] | None = None  # more row keys, read from the run's folder
    diagnostics: bool = False  # whether rows hold the last evaluation's diagnostic summaries
    rules: tuple[Rule, ...] = ()  # decision rules on each variant's gaps to its baseline, declared before the runs (declare)

    def values(self, key: str) -> tuple[Any, ...]:
        """The values of the axis named key."""
        return next(axis.values for axis in self.axes if axis.key == key)

    def row_keys(self) -> list[str]:
        return list(dict.fromkeys(k for axis in self.axes for item in axis.items() for k in item))


def grid_points(sweep: Sweep) -> list[Point]:
    """The axes' product, outermost axis first, less the points sweep.keep leaves out."""
    combos: list[dict[str, Any]] = [{}]
    for axis in sweep.axes:
        combos = [{**c, **item} for c in combos for item in axis.items()]
    return [p for p in (point(**c) for c in combos) if sweep.keep(p)]


def plan_points(sweep: Sweep, done: dict[Point, float]) -> list[Point]:
    """Every run the sweep holds now, given the final losses of its finished runs."""
    return sweep.follow_up(sweep, done) if sweep.follow_up else grid_points(sweep)


def method_settings(key: str) -> dict[str, Any]:
    """A method key's train.py settings: {'connection': 'p_spheret', 'spheret_p': '0.5'}."""
    return dict(arg[2:].split("=", 1) for arg in method_args(key))


def run_settings(sweep: Sweep, p: Point) -> dict[str, Any]:
    """The train.py settings of one point (see Sweep), --config_name included."""
    own = {k: v for k, v in p.pairs if k in config_keys()}
    method = method_settings(p["method"]) if "method" in p.values else {}
    return {"config_name": sweep.name, **sweep.base, **method, **own, **sweep.settings(p)}


@dataclass
class Place:
    """Where and how a sweep runs: its folders, the user's train.py overrides, the run options."""

    out_dir: Path
    data_dir: Path
    overrides: list[str] = field(default_factory=list)
    jobs: int = 2
    threads: int = 1
    table_only: bool = False  # run nothing: only the runs already in their folders count
    dry_run: bool = False  # as table_only, and print the runs the plan holds
    listed: dict[str, str] = field(default_factory=dict)  # dry run: folder -> its state, as printed
    declared: dict[str, Any] = field(default_factory=dict)  # the sweep's declaration (declare), once start_study made it
    recorded: dict[str, dict[str, Any]] = field(default_factory=dict)  # the record's rows by run folder, as last written (check_row)
    code: dict[str, Any] = field(default_factory=dict)  # the repository's commit this call runs (code_version), asked once

    @staticmethod
    def of(args: Any, overrides: list[str]) -> "Place":
        # Absolute from where the command starts: the runs start in the repository root, and a
        # relative folder would be another one there (the sweep then found none of its runs).
        return Place(Path(args.out_dir).absolute(), Path(args.data_dir).absolute(), overrides, positive_count(args.jobs, "jobs"),
                     positive_count(args.threads, "threads"), getattr(args, "table_only", False), getattr(args, "dry_run", False))


def positive_count(value: int, option: str) -> int:
    """The value of --jobs or --threads, refused below 1 before anything runs (0 divided the dry
    run's estimate; -1 printed 'at -1 at a time')."""
    if value < 1:
        raise UsageError(f"--{option} {value} is not valid; give a positive integer, such as 1 or 2.")
    return value


def train_argv(sweep: Sweep, p: Point, place: Place) -> list[str]:
    """train.py's arguments for a point: its settings, the folders, then the user's overrides."""
    folders = {"data_dir": place.data_dir, "out_dir": place.out_dir / sweep.folder(p)}
    return as_args({**run_settings(sweep, p), **folders}) + place.overrides


def folder_jobs(sweep: Sweep, points: list[Point], place: Place) -> dict[str, Job]:
    """One job per run folder of the points, in their order, each checked (make_job)."""
    jobs: dict[str, Job] = {}
    for p in points:
        folder, argv = sweep.folder(p), train_argv(sweep, p, place)
        if folder in jobs and jobs[folder].argv != argv:  # a spec whose folder drops a setting that matters
            raise ValueError(f"Sweep {sweep.name!r} gives {folder} to runs with other settings; its folder must tell them apart.")
        jobs[folder] = jobs.get(folder) or make_job(folder, argv, place.out_dir / folder)
    return jobs


def run_points(sweep: Sweep, points: list[Point], place: Place) -> dict[Point, JobResult]:
    """Find the points' runs already in their folders, one per folder, running nothing (table_only,
    and dry_run, which also prints each folder's state); run_as_planned runs them."""
    jobs = folder_jobs(sweep, points, place)
    if place.dry_run:
        for folder, job in jobs.items():
            place.listed[folder] = run_state(job)
            print(f"{job.label}: {job.out_dir} ({place.listed[folder]})")
    results = {f: JobResult(job, None, 0.0, "") for f, job in jobs.items() if (job.out_dir / CONFIG_NAME).is_file()}
    note_runs_without_config(jobs.values())
    return {p: results[sweep.folder(p)] for p in points if sweep.folder(p) in results}


def note_runs_without_config(jobs: Iterable[Job]) -> None:
    """A note for each folder that holds metrics rows but no config.json (copied in part, or its
    config lost): the table cannot read its settings, so it leaves the run out, and says so."""
    for job in jobs:
        if (job.out_dir / METRICS_NAME).is_file() and not (job.out_dir / CONFIG_NAME).is_file():
            print(f"note: {job.out_dir} holds {METRICS_NAME} but no {CONFIG_NAME}, so the table leaves its run out.")


# A dry run's states of a run folder; RUN_STATES[:2] cost no training time.
RUN_STATES = ("finished", "in progress in another sweep", "to resume", "to run")


def run_state(job: Job) -> str:
    """What a sweep would do with a job's folder now (a dry run's word for it), reading only."""
    if is_done(job.out_dir, job.max_iters):
        return RUN_STATES[0]
    if in_progress(job.out_dir):
        return RUN_STATES[1]
    return RUN_STATES[2] if has_checkpoint(job.out_dir) else RUN_STATES[3]


def dry_run_summary(name: str, place: Place, rows: list[dict[str, Any]], most: int, default_seconds: float) -> str:
    """The dry run's last line: the runs of the plan now by state, the most the design can grow
    to, and the time the remaining ones would take at --jobs at a time. A run's time is the mean
    of the finished runs' own (finished_run_seconds: their whole time, start-up and final
    evaluation included), else `default_seconds`."""
    states = list(place.listed.values())
    counts = ", ".join(f"{states.count(s)} {s}" for s in RUN_STATES if states.count(s))
    measured = [r["seconds"] for r in rows if r.get("reused") and r.get("seconds")]
    per_run = statistics.fmean(measured) if measured else default_seconds
    basis = f"{per_run:.0f} s a run, the mean of {len(measured)} finished" if measured else f"about {per_run:.0f} s a run, estimated"
    left = sum(s in RUN_STATES[2:] for s in states)
    more = max(most - len(states), 0)

    def hours(runs: int) -> str:
        seconds = runs * per_run / place.jobs
        if seconds < 90:
            return f"{seconds:.0f} s"
        return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"

    return (f"{name}: {len(states)} runs in the plan now ({counts or 'none'}); the follow-ups may add up to {more} more "
            f"(at most {most}). Time: about {hours(left)} for the {left} to run or resume, up to {hours(left + more)} with every "
            f"follow-up, at {place.jobs} at a time ({basis}).")


# grid.classify's statuses of a run that did not learn, and what a table says of each, in "failed
# (seed 1338 collapsed)": each is a failure wherever one of them is (no mean, a gap against its side,
# a cross in a figure). The one table of them: UNSTABLE is its keys.
FAILURE_WORDS = {"diverged": "diverged", STOPPED_COLLAPSE: "collapsed", STUCK_AT_UNIGRAM: "stuck at unigram", STALLED: "stalled"}
UNSTABLE = tuple(FAILURE_WORDS)


def final_loss(row: dict[str, Any], metric: str = SAMPLED_METRIC) -> float:
    """What a follow-up rule and a table rank: the final loss by `metric` (table_metric), inf for a
    run that diverged or collapsed."""
    return row[metric] if row["status"] == "ok" and row.get(metric) is not None else math.inf


def has_ended(row: dict[str, Any]) -> bool:
    """Whether a run counts for the plan: trained to the end, or stopped for good (not failed, not
    still unfinished as a run in progress is, seen by --table_only)."""
    return row["status"] == "ok" or row["status"] in UNSTABLE


def point_row(sweep: Sweep, p: Point, result: JobResult, yardsticks: Yardsticks, place: Place | None = None) -> dict[str, Any]:
    """A run's row: its row keys, its outcome, and what the sweep reads of its folder, checked
    against the sweep's record (check_row) where there is one."""
    row = {**{k: p.get(k) for k in sweep.row_keys()}, **outcome(result, yardsticks)}
    out_dir = result.job.out_dir
    if sweep.diagnostics and (out_dir / CONFIG_NAME).is_file():
        final = load_run(out_dir).final_eval
        row.update(diagnostic_summary(final) if final else {})
    if sweep.extra:
        row.update(sweep.extra(p, out_dir))
    return check_row(row, result.job, place) if place is not None else row


def value_text(value: Any) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


def distinct_labels(sweep: Sweep, points: list[Point]) -> Callable[[Point], str]:
    """Rows named by their method and the settings in which its runs differ ('pre_ln, lr=0.003',
    'pre_ln, optimizer=muon'); the seed has its own column. The method is the point's, else the
    sweep's connection."""

    def method(p: Point) -> str:
        return str(p.get("method", sweep.base.get("connection", sweep.name)))

    keys = [k for k in sweep.row_keys() if k not in ("method", "seed")]
    varying: dict[str, list[str]] = {}
    for m in dict.fromkeys(map(method, points)):
        mine = [p for p in points if method(p) == m]
        varying[m] = [k for k in keys if len({value_text(p.get(k)) for p in mine}) > 1]
    return lambda p: ", ".join([method(p), *(f"{k}={value_text(p.get(k))}" for k in varying.get(method(p), keys))])


def name_rows(sweep: Sweep, points: list[Point], rows: dict[Point, dict[str, Any]], metric: str = SAMPLED_METRIC) -> list[dict[str, Any]]:
    """The rows in the plan's order, each with its name, and with a baseline its baseline's name
    and its loss by `metric` minus the same seed's baseline run's ('gap')."""
    name = sweep.label or distinct_labels(sweep, points)
    out = []
    for p in points:
        if p not in rows:
            continue
        row = {**rows[p], "name": name(p)}
        if sweep.baseline:
            base = rows.get(sweep.baseline(p), {})
            row["baseline"] = name(sweep.baseline(p))
            both = row.get(metric) is not None and base.get(metric) is not None
            row["gap"] = row[metric] - base[metric] if both else None
        out.append(row)
    return out


def run_sweep(sweep: Sweep, place: Place, yardsticks: Yardsticks = Yardsticks()) -> list[dict[str, Any]]:
    """Plan, run what is missing, plan again with the new losses, until the plan stops growing;
    the rows in the plan's order. A finished or stopped run is reused and an interrupted one
    resumes, so a re-run continues the sweep; a run that failed is not tried twice in one call.
    Runs are planned anew as each one ends (run_as_planned); table_only and dry_run find, a
    plan's worth at a time, the runs already there. Each run's status is judged against the
    data's yardsticks (grid.classify; a dry run may find no data yet, and then judges none)."""
    rows: dict[Point, dict[str, Any]] = {}
    if not (place.table_only or place.dry_run):
        run_as_planned(sweep, place, rows, yardsticks)
        return name_rows(sweep, current_plan(sweep, rows), rows, table_metric(rows.values()))
    tried: set[Point] = set()
    while True:
        points = current_plan(sweep, rows)
        todo = [p for p in points if p not in tried]
        if not todo:
            return name_rows(sweep, points, rows, table_metric(rows.values()))
        tried.update(todo)
        for p, result in run_points(sweep, todo, place).items():
            rows[p] = point_row(sweep, p, result, yardsticks, place)


def current_plan(sweep: Sweep, rows: dict[Point, dict[str, Any]]) -> list[Point]:
    """The sweep's plan given the rows of its ended runs, selecting on the loss its table will show."""
    metric = table_metric(rows.values())
    return plan_points(sweep, {p: final_loss(r, metric) for p, r in rows.items() if has_ended(r)})


def run_as_planned(sweep: Sweep, place: Place, rows: dict[Point, dict[str, Any]], yardsticks: Yardsticks = Yardsticks()) -> None:
    """Run the plan's missing runs place.jobs at a time, planning again as each one ends, so that a
    run the finished ones call for (a selected rate's held-out seed) starts next, ahead of the
    older plan's rest (a neighbour's); rows gets each ended run's row. Points that share a folder
    share its one run; every folder is checked (make_job) before any of them starts."""
    tried: set[Point] = set()
    running: dict[str, list[Point]] = {}  # folder -> the points its running job stands for

    def take(free: int) -> list[Job]:
        todo = [p for p in current_plan(sweep, rows) if p not in tried]
        jobs = folder_jobs(sweep, todo, place)
        started = []
        for folder, job in jobs.items():
            if folder not in running and len(started) < free:
                running[folder] = []
                started.append(job)
            if folder in running:
                points = [p for p in todo if sweep.folder(p) == folder]
                running[folder] += points
                tried.update(points)
        return started

    def waiting() -> int:  # the folders the plan holds now that have not started
        return len({sweep.folder(p) for p in current_plan(sweep, rows) if p not in tried} - running.keys())

    def ended(result: JobResult) -> None:
        for p in running.pop(result.job.label):
            if not result.busy:
                rows[p] = point_row(sweep, p, result, yardsticks, place)

    print(f"{sweep.name}: {len({sweep.folder(p) for p in current_plan(sweep, rows)})} runs in the plan now (the finished ones may add more), "
          f"{place.jobs} at a time, {place.threads} thread(s) each", flush=True)
    schedule(take, ended, place.jobs, place.threads, waiting)


def markdown_table(rows: list[dict[str, Any]], columns: tuple[Column, ...] | list[Column]) -> str:
    lines = ["| " + " | ".join(c.header for c in columns) + " |", "|" + "".join(f"{c.align}|" for c in columns)]
    return "\n".join([*lines, *("| " + " | ".join(c.cell(r) for c in columns) + " |" for r in rows)])


def diagnostic_columns() -> list[Column]:
    """The diagnostic columns of a study's table, in DIAGNOSTICS order."""
    return [Column(s.header, s.key, s.fmt) for entry in DIAGNOSTICS for s in entry.summaries]


def write_outputs(out_dir: Path, stem: str, text: str | None, record: dict[str, Any]) -> list[Path]:
    """OUT_DIR/<stem>.md (unless text is None) and <stem>.json; their paths. The declaration that
    <stem>.json held (declare, written before the runs) stays in it as it was."""
    out_dir.mkdir(parents=True, exist_ok=True)
    declared = read_record(out_dir / f"{stem}.json").get("declared")  # one that cannot be read is refused, not replaced
    record = {**record, "declared": declared} if declared is not None else record
    (out_dir / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    if text is None:
        return [out_dir / f"{stem}.json"]
    (out_dir / f"{stem}.md").write_text(text.rstrip("\n") + "\n", encoding="utf-8")
    return [out_dir / f"{stem}.md", out_dir / f"{stem}.json"]


def runs_text(sweep: Sweep, rows: list[dict[str, Any]], baseline_title: str = "", declared: dict[str, Any] | None = None,
              mix: bool | None = None) -> str:
    """The loss and kernel path lines, the table of runs, then the summary and the rules' verdicts
    on its gaps: for a sweep that selects a rate (selection_of), each group at its selected rate on
    the held-out seeds alone (selected_table); else, with a baseline and two seeds, every seed
    alike (paired_seed_summary). mix: --mix_kernel_paths (None: a command without the option, whose
    table names every path and refuses none)."""
    metric = table_metric(rows)
    paths = kernel_paths_line(rows, True if mix is None else mix)
    text = f"Gaps and the summary over the seeds: {METRIC_TEXT[metric]}. {paths}\n\n{markdown_table(rows, sweep.columns)}"
    chosen = selection_of(sweep)
    if chosen is not None:  # the seed that chose a rate is no evidence for it: the held-out seeds alone
        summary, verdicts = selected_table(sweep, rows, baseline_title, metric)
        seeds = Seeds.of(sweep.values(chosen.seed))
        title = (f"Each group at the {chosen.rate} its seed {seeds.selection} selected; the held-out seeds "
                 f"({', '.join(map(str, seeds.held_out)) or 'none'}) there, gaps paired by held-out seed, each group at its own rate:")
    else:
        summary, verdicts = paired_seed_summary(rows, baseline_title, metric) if sweep.baseline else ("", [])
        title = "Over the seeds:"
    if summary:
        text += f"\n\n{title}\n\n{summary}"
    if sweep.rules or (declared or {}).get("rules") or (declared or {}).get("edited"):
        rules = sweep.rules or tuple(parse_rule(t) for t in (declared or {})["rules"])
        text += "\n\n" + rule_lines(rules, verdicts, declared or {})
    return text


def start_study(sweep: Sweep, args: Any, overrides: list[str]) -> tuple[list[dict[str, Any]], Place, Yardsticks]:
    """A study command's run: prepare the data, run (or find) the sweep; its rows, place and the
    data's yardsticks (its unigram and bigram losses, which every run's status was judged against)."""
    place = Place.of(args, overrides)
    check_out_dir(place)
    if place.dry_run and not (place.data_dir / "meta.json").is_file():
        print(f"note: {place.data_dir} holds no prepared {DATASET}; the sweep would prepare it there first (a dry run writes nothing)")
    else:
        ensure_data(place.data_dir, args.input)
    place.declared = declare(sweep, place)  # before any run starts
    place.recorded = recorded_rows(place.out_dir / f"{sweep.name}.json")
    place.code = code_version()
    yardsticks = Yardsticks.of(place.data_dir)
    return run_sweep(sweep, place, yardsticks), place, yardsticks


def check_out_dir(place: Place) -> None:
    """--out_dir is a folder this process can write to, or can be made one: refused in one line
    before any work (a dry run only looks, and so writes nothing)."""
    out = place.out_dir
    if place.dry_run:
        blocking = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            raise UsageError(f"--out_dir {str(out)!r} cannot hold the runs: {str(blocking)!r} is a file; give a folder.")
        return
    try:
        check_folder(out, "--out_dir")
    except OutDirError as e:
        raise UsageError(str(e)) from None


def publish(out_dir: Path, stem: str, text: str | None, record: dict[str, Any], figures: list[Path], rows: list[dict[str, Any]], started: float) -> int:
    """Write OUT_DIR/<stem>.md and .json (the record, with this call's wall-clock), print the text,
    the wall-clock line and what was written; the exit status."""
    wall = time.perf_counter() - started
    paths = write_outputs(out_dir, stem, text, {**record, "wall_clock_s": round(wall, 1)})  # runs found finished cost it nothing
    print(f"\n{text or ''}\n\n{wall_clock_line(wall, rows)}")
    print("Written: " + ", ".join(str(p) for p in [*paths, *figures]))
    return exit_status(rows)


# -----------------------------------------------------------------------------
# An optimizer axis: each optimizer sweeps its own rate key (fair_comparison, lr_transfer)

GRID_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)  # an optimizer's default grid: its rate key's default times these


def default_grid(optimizer: str) -> tuple[float, ...]:
    """GRID_FACTORS times the optimizer's rate key's default (muon_lr 0.02: 0.005 to 0.08)."""
    key = OPTIMIZERS[optimizer].rate_key
    default = next(p.default for p in OPTIMIZERS[optimizer].params if p.key == key)
    return tuple(float(f"{default * f:.6g}") for f in GRID_FACTORS)


def rate_grids(optimizers: list[str], lrs: list[float], given: list[str]) -> dict[str, tuple[float, ...]]:
    """Each optimizer's rates: --lrs for one whose rate is learning_rate, --grid OPT=... or its default grid else."""
    grids = {}
    for item in given:
        name, sep, values = item.partition("=")
        if not sep or name not in optimizers:
            raise UsageError(f"--grid {item!r} must be OPT=R1,R2,... with OPT one of --optimizers ({', '.join(optimizers)}).")
        if name in grids:  # the later item silently replaced the earlier one
            raise UsageError(f"--grid {name}= is given twice; give one --grid {name}=R1,R2,... with every rate.")
        grids[name] = tuple(parse_numbers(values, float, f"grid {name}"))
    for name in optimizers:
        if name not in grids:
            grids[name] = tuple(lrs) if OPTIMIZERS[name].rate_key == "learning_rate" else default_grid(name)
    return {name: grids[name] for name in optimizers}


# -----------------------------------------------------------------------------
# A follow-up rule: each group at its own best rate


def swept_rates(lrs: list[float], losses: dict[float, float], extensions: int = 1) -> tuple[list[float], bool]:
    """(the rates a group sweeps with its first seed, whether all of them are finished), given the
    losses of its finished runs (inf: diverged or collapsed): lrs, plus up to `extensions` grid
    steps beyond the end where the best so far lies, so that the best is bracketed. A grid of one
    rate is a rate given, not chosen: it has no step to extend by."""
    rates = sorted(lrs)
    if len(rates) < 2:
        return rates, all(lr in losses for lr in rates)
    while True:
        if any(lr not in losses for lr in rates):
            return rates, False
        best = min(rates, key=lambda lr: losses[lr])
        if len(rates) - len(lrs) >= extensions or not math.isfinite(losses[best]) or best not in (rates[0], rates[-1]):
            return rates, True
        at_top = best == rates[-1]
        step = rates[-1] / rates[-2] if at_top else rates[1] / rates[0]  # the grid's factor at that end
        rates = sorted([*rates, extension_rate(best * step if at_top else best / step)])


def extension_rate(rate: float) -> float:
    """A rate one grid step past an end, as a user would give it: 6 significant digits (the folder
    names' precision), not 0.0010000091042 for 7.0711e-4 * sqrt(2). A record made before rates were
    rounded holds the unrounded rate in the same folder, which is the same run (identity.same_setting)."""
    return float(f"{rate:.6g}")


def refined_rates(rates: list[float], losses: dict[float, float]) -> list[float]:
    """The rates with the geometric midpoints (a sqrt(2) step on a grid of factor 2) between the
    best and each of its neighbours; at an end of the grid, the midpoint of one grid step beyond.
    A grid of one rate (a rate given) has no neighbours to refine towards."""
    if len(rates) < 2:
        return list(rates)
    best = rates.index(min(rates, key=lambda lr: losses[lr]))
    midpoints = []
    for side in (-1, 1):
        if 0 <= best + side < len(rates):
            neighbour = rates[best + side]
        else:  # one step of the grid's factor at that end
            neighbour = rates[best] * (rates[1] / rates[0] if side < 0 else rates[-1] / rates[-2]) ** side
        midpoints.append(float(f"{math.sqrt(rates[best] * neighbour):.6g}"))  # 6 digits: the folder names' precision
    return sorted({*rates, *midpoints})


@dataclass(frozen=True)
class BestRate:
    """The rule 'each group (every axis but the rate and the seed) at its own best rate': the
    selection seed (the seed axis's first value, Seeds) at each rate of the group's grid
    (grid(group); without one, the rate axis's values), extended past the best (swept_rates); with
    refine, once those are finished, the midpoints on each side of the best (refined_rates). Once
    the selection seed's rates are all finished, the held-out seeds run at its best rate and (unless
    neighbours is False: a study that reports the selected rate alone, issue 50's E3) at that
    rate's neighbours. The best is the selection seed's alone, so the held-out seeds' losses there
    are free of the choice (selected_cell). In the order to run them: every selection run, then
    the held-out seeds at the best rates, then at their neighbours (so a sweep cut short misses
    the least telling runs). The points sweep.keep leaves out are left out of the plan too (a
    whole group, such as nGPT with an optimizer other than AdamW); a group's rates differ by
    `grid`, not by keep, since the extension lies outside every grid.

    A sweep whose follow_up is a BestRate selects a rate: its table's summary is the held-out one
    (selected_summary), read with the same rate and seed keys as the plan, so that the statistics
    cannot pool the seed that chose with the seeds that did not."""

    extensions: int = 1
    rate: str = "lr"
    seed: str = "seed"
    grid: Callable[[Point], tuple[float, ...]] | None = None
    refine: bool = False
    neighbours: bool = True

    def __call__(self, sweep: Sweep, done: dict[Point, float]) -> list[Point]:
        rate, seed = self.rate, self.seed
        axis_rates, seeds = tuple(sweep.values(rate)), Seeds.of(sweep.values(seed))
        groups = grid_points(Sweep(sweep.name, sweep.base, tuple(a for a in sweep.axes if a.key not in (rate, seed)), sweep.folder))
        sweeps: list[Point] = []
        at_best: list[Point] = []
        beside: list[Point] = []
        for group in groups:
            lrs = list(self.grid(group) if self.grid else axis_rates)
            losses = {lr: loss for lr in set(lrs) | {p[rate] for p in done} if (loss := done.get(group.but(**{rate: lr, seed: seeds.selection}))) is not None}
            rates, finished = swept_rates(lrs, losses, self.extensions)
            if self.refine and finished and math.isfinite(min(losses[lr] for lr in rates)):
                rates = refined_rates(rates, losses)
                finished = all(lr in losses for lr in rates)
            sweeps += [group.but(**{rate: lr, seed: seeds.selection}) for lr in rates]
            if not finished or not math.isfinite(min(losses[lr] for lr in rates)):
                continue  # still sweeping, or every rate diverged or collapsed: no best to seed
            best = rates.index(min(rates, key=lambda lr: losses[lr]))
            at_best += [group.but(**{rate: rates[best], seed: s}) for s in seeds.held_out]
            if self.neighbours:
                beside += [group.but(**{rate: lr, seed: s}) for lr in rates[max(best - 1, 0): best + 2] if lr != rates[best] for s in seeds.held_out]
        return [p for p in sweeps + at_best + beside if sweep.keep(p)]


def best_rate_follow_up(extensions: int = 1, rate: str = "lr", seed: str = "seed",
                        grid: Callable[[Point], tuple[float, ...]] | None = None, refine: bool = False,
                        neighbours: bool = True) -> BestRate:
    """A Sweep's follow_up that selects each group's rate on the selection seed (BestRate)."""
    return BestRate(extensions, rate, seed, grid, refine, neighbours)


def selection_of(sweep: Sweep) -> BestRate | None:
    """The rate selection a sweep declares (its follow_up, where that is a BestRate), else None:
    a sweep that selects nothing, whose every seed counts alike (paired_seed_summary)."""
    return sweep.follow_up if isinstance(sweep.follow_up, BestRate) else None


# -----------------------------------------------------------------------------
# Selection and held-out seeds: the statistics of a study's table (stats.py has the maths)


@dataclass(frozen=True)
class Seeds:
    """A study's seeds: its best rate is chosen on `selection` alone, and the held-out seeds'
    losses at that rate are its headline, so that the luck of the choice does not flatter it."""

    selection: int
    held_out: tuple[int, ...]

    @staticmethod
    def of(values: Iterable[int]) -> "Seeds":
        """The first seed selects, the others are held out (a seed axis, --seeds)."""
        first, *others = values
        return Seeds(first, tuple(others))


def seed_order(seeds: list[int], selection: int | None) -> list[int]:
    """--seeds with the selection seed first (--selection_seed; None: the first of --seeds)."""
    if selection is None:
        return seeds
    if selection not in seeds:
        raise UsageError(f"--selection_seed {selection} is not one of --seeds ({', '.join(map(str, seeds))}); give one of them.")
    return [selection, *(s for s in seeds if s != selection)]


@dataclass(frozen=True)
class SeedCell:
    """One variant's runs over some seeds (at one rate): the losses of those that trained, what
    went wrong with those that failed, and the seeds whose run is not there (yet)."""

    losses: dict[int, float]
    failed: dict[int, str]  # seed -> a FAILURE_WORDS word
    missing: tuple[int, ...]

    def values(self) -> dict[int, float | None]:
        """{seed: loss}, inf for a failed run and None for a missing one (what a gap subtracts)."""
        out: dict[int, float | None] = {s: math.inf for s in self.failed}
        out.update(self.losses)
        return {**out, **{s: None for s in self.missing}}

    def spread(self) -> Spread | None:
        """The losses' mean, SD and interval where every seed trained, else None: a failed seed is
        never averaged away, and a missing one leaves the cell open."""
        return spread(list(self.losses.values())) if self.losses and not self.failed and not self.missing else None

    def text(self, fmt: str = ".3f") -> str | None:
        """The headline cell: the mean, 'failed (seed 1338 collapsed)' or 'runs missing (seed 1339)'."""
        if self.failed:
            return "failed (" + ", ".join(f"seed {s} {word}" for s, word in self.failed.items()) + ")"
        if self.missing:
            return f"runs missing (seed {', '.join(map(str, self.missing))})"
        s = self.spread()
        return None if s is None else format(s.mean, fmt)

    def seeds_text(self, fmt: str = ".3f") -> str | None:
        """Each seed: '1338: 2.031, 1339: collapsed, 1340: -'."""
        def one(seed: int) -> str:
            return format(self.losses[seed], fmt) if seed in self.losses else self.failed.get(seed, "-")
        return ", ".join(f"{s}: {one(s)}" for s in sorted(self.values())) or None

    def record(self) -> dict[str, Any]:
        s = self.spread()
        return {"losses": self.losses, "failed": self.failed, "missing": list(self.missing),
                "mean": s.mean if s else None, "sd": s.sd if s else None, "low": s.low if s else None, "high": s.high if s else None}


def seed_cell(runs: dict[int, dict[str, Any]], seeds: Iterable[int], metric: str) -> SeedCell:
    """The SeedCell of `seeds` from their rows ({seed: row}); a run that crashed or is unfinished is missing."""
    losses, failed, missing = {}, {}, []
    for s in seeds:
        row = runs.get(s)
        if row is None or not has_ended(row):
            missing.append(s)
        elif math.isfinite(loss := final_loss(row, metric)):
            losses[s] = loss
        else:
            failed[s] = FAILURE_WORDS.get(row["status"], row["status"])
    return SeedCell(losses, failed, tuple(missing))


def selected_cell(runs: list[dict[str, Any]], seeds: Seeds, metric: str, rate: str = "lr", seed: str = "seed") -> dict[str, Any]:
    """A group's runs (one arm, all rates and seeds) as its table shows them: the rate where the
    selection seed's loss is lowest, that loss, the held-out seeds there (a SeedCell, the
    headline), and each rate where the selection seed trained but a held-out seed failed."""
    by = {(r[rate], r[seed]): r for r in runs}
    chosen = {lr: final_loss(r, metric) for (lr, s), r in by.items() if s == seeds.selection and has_ended(r)}
    trained = {lr: loss for lr, loss in chosen.items() if math.isfinite(loss)}
    best = min(trained, key=trained.__getitem__) if trained else None
    held = seed_cell({s: r for (lr, s), r in by.items() if lr == best}, seeds.held_out, metric)
    failed_beside = [(lr, s, word) for lr in sorted(trained) for s, word in
                     seed_cell({q: r for (x, q), r in by.items() if x == lr}, seeds.held_out, metric).failed.items()]
    return {"rate": best, "selection_loss": trained.get(best) if best is not None else None, "held_out": held, "held_out_failed_at": failed_beside}


def failed_at_text(failed: list[tuple[float, int, str]]) -> str:
    """'0.004 (seed 1338 collapsed)': the rates where the selection seed trained and a held-out seed did not."""
    return ", ".join(f"{lr:g} (seed {s} {word})" for lr, s, word in failed) or "-"


Gaps = dict[int, "float | None"]  # {held-out seed: arm minus baseline}; see gap_values


def gap_values(mine: SeedCell, base: SeedCell) -> Gaps:
    """Per seed, the arm's loss minus the baseline's, each at its own selected rate: None where
    either run is missing, +inf where the arm failed and the baseline trained, -inf the reverse,
    nan where both failed (a failure counts against its side, stats.verdict)."""
    a, b = mine.values(), base.values()
    return {s: None if a[s] is None or b.get(s) is None else a[s] - b[s] for s in a}  # type: ignore[operator]


def gap_spread(gaps: Gaps) -> Spread | None:
    """The gaps' mean, SD and interval where every seed has a finite gap, else None."""
    values = list(gaps.values())
    return spread(values) if values and all(v is not None and math.isfinite(v) for v in values) else None  # type: ignore[arg-type]


def gap_text(gaps: Gaps, fmt: str = "+.3f") -> str | None:
    """The mean gap, or why there is none: 'failed (seed 1338: the arm failed)', 'runs missing (seed 1339)'."""
    sides = {1: "the arm failed", -1: "the baseline failed"}
    failed = [f"seed {s}: {sides.get(int(math.copysign(1, g)), 'both failed') if not math.isnan(g) else 'both failed'}"
              for s, g in gaps.items() if g is not None and not math.isfinite(g)]
    missing = [str(s) for s, g in gaps.items() if g is None]
    if failed:
        return f"failed ({', '.join(failed)})"
    if missing:
        return f"runs missing (seed {', '.join(missing)})"
    s = gap_spread(gaps)
    return None if s is None else format(s.mean, fmt)


def gap_record(prefix: str, gaps: Gaps) -> dict[str, Any]:
    """A summary row's keys of a gap: each seed's, the mean, SD and interval (None where there is none)."""
    s = gap_spread(gaps)
    return {f"{prefix}s": gaps, f"{prefix}_text": gap_text(gaps), f"{prefix}_mean": s.mean if s else None, f"{prefix}_sd": s.sd if s else None,
            f"{prefix}_low": s.low if s else None, f"{prefix}_high": s.high if s else None,
            f"{prefix}_interval": s.interval_text() if s else None}


def gaps_text(gaps: Gaps, fmt: str = "+.3f") -> str | None:
    """Each seed's gap: '1338: -0.012, 1339: +inf'."""
    return ", ".join(f"{s}: {'-' if g is None else format(g, fmt)}" for s, g in sorted(gaps.items())) or None


GroupKey = tuple[Any, ...]  # a group's values of every row key but the rate and the seed (held_out_summary)


def held_out_summary(rows: list[dict[str, Any]], groups: Iterable[GroupKey], key: Callable[[dict[str, Any]], GroupKey],
                     baselines: dict[str, Callable[[GroupKey], GroupKey]], seeds: Seeds, metric: str, rate: str = "lr",
                     seed: str = "seed") -> list[dict[str, Any]]:
    """The statistics of a study that selects a rate: one summary per group of `groups`, in their
    order (key(row): a run's group, every rate and seed of it): the rate selected on the selection
    seed alone ("rate") and that seed's loss there ("selection_loss"); the held-out seeds there,
    each ("held_out_text") and their mean, the headline ("headline"; a failed seed is named, never
    averaged; "held_out": the SeedCell's record); for each baseline (prefix: the baseline group's key
    from the group's), the gaps paired by held-out seed, each group at its own selected rate, with
    their mean, SD and 95% interval (gap_record's keys; none where a group is its own baseline:
    a column of zeros would read as a result); and the rates where the selection seed trained and
    a held-out seed failed ("held_out_failed_at"). A baseline group without runs has every seed missing."""
    runs: dict[GroupKey, list[dict[str, Any]]] = {}
    for r in rows:
        runs.setdefault(key(r), []).append(r)
    cells: dict[GroupKey, dict[str, Any]] = {}

    def cell(group: GroupKey) -> dict[str, Any]:
        if group not in cells:
            cells[group] = selected_cell(runs.get(group, []), seeds, metric, rate, seed)
        return cells[group]

    out = []
    for group in groups:
        mine = cell(group)
        held = mine["held_out"]
        gaps: dict[str, Any] = {}
        for prefix, baseline in baselines.items():
            base = baseline(group)
            gaps.update(gap_record(prefix, gap_values(held, cell(base)["held_out"]) if base != group else {}))
        out.append({"rate": mine["rate"], "selection_loss": mine["selection_loss"], "held_out": held.record(), "held_out_text": held.seeds_text(),
                    "headline": held.text(), **gaps, "held_out_failed_at": failed_at_text(mine["held_out_failed_at"])})
    return out


def selected_summary(sweep: Sweep, rows: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """held_out_summary of a sweep that selects a rate (selection_of), over its rows (name_rows): a
    group per set of values of every row key but the rate and the seed, in the rows' order, named
    ("name") by the settings in which the groups differ (distinct_labels); its baseline ("gap") the
    group of sweep.baseline's point, where the sweep has a baseline."""
    chosen = selection_of(sweep)
    if chosen is None:
        raise ValueError(f"Sweep {sweep.name!r} selects no rate (its follow_up is not a BestRate); its summary is paired_seed_summary.")
    keys = [k for k in sweep.row_keys() if k not in (chosen.rate, chosen.seed)]

    def group_of(values: dict[str, Any] | Point) -> GroupKey:
        return tuple(values.get(k) for k in keys)

    def point_of(row: dict[str, Any]) -> Point:  # a row's point: its row keys, less those its point lacked (None)
        return point(**{k: row[k] for k in sweep.row_keys() if row.get(k) is not None})

    first: dict[GroupKey, dict[str, Any]] = {}
    for r in rows:
        first.setdefault(group_of(r), r)
    baseline = sweep.baseline
    baselines = {"gap": lambda group: group_of(baseline(point_of(first[group])))} if baseline else {}
    summary = held_out_summary(rows, first, group_of, baselines, Seeds.of(sweep.values(chosen.seed)), metric, chosen.rate, chosen.seed)
    points = [point(**{k: v for k, v in zip(keys, group) if v is not None}) for group in first]
    name = distinct_labels(sweep, points)
    return [{"name": name(p), **s} for p, s in zip(points, summary)]


def selected_table(sweep: Sweep, rows: list[dict[str, Any]], baseline_title: str, metric: str) -> tuple[str, list[tuple[str, Gaps]]]:
    """selected_summary as a table ('' without rows) and each group's held-out gaps to its
    baseline, for the rules' verdicts (paired_seed_summary's counterpart for a sweep that selects)."""
    chosen = selection_of(sweep)
    summary = selected_summary(sweep, rows, metric) if chosen else []
    if not summary:
        return "", []
    selection = Seeds.of(sweep.values(chosen.seed)).selection
    gaps = (Column(f"minus {baseline_title} (same seed), each", lambda s: gaps_text(s["gaps"]), align=":--"), Column("mean", "gap_text"),
            Column("SD", "gap_sd", ".3f"), Column("95% interval", "gap_interval")) if sweep.baseline else ()
    columns = (Column("method", "name", align=":--"), Column(f"{chosen.rate} (selected on seed {selection})", "rate", "g"),
               Column(f"seed {selection}", "selection_loss", ".3f"), Column("held-out seeds", "held_out_text", align=":--"),
               Column("held-out mean", "headline"), *gaps, Column("held-out failed at", "held_out_failed_at", align=":--"))
    return markdown_table(summary, columns), [(s["name"], s["gaps"]) for s in summary if s.get("gaps")]


def rule_lines(rules: tuple[Rule, ...] | list[Rule], verdicts: list[tuple[str, Gaps]], declared: dict[str, Any]) -> str:
    """The decision rules with each arm's verdict ('- rule every_gap<-0.02 (...): 0.5-SpheretNorm -> holds'),
    and when they were declared; 'Decision rule: none declared.' without one; a declaration edited
    after it was written (edited_declaration_line) judges nothing, and says so."""
    if declared.get("edited"):
        return str(declared["edited"]).removeprefix("warning: ").capitalize()
    if not rules:
        return "Decision rule: none declared (--rule)."
    before = declared.get("runs_in_folder", 0)
    when = "before any run" if not before else f"after {before} run folder(s) were already there"
    lines = [f"Decision rules, declared {when} ({declared.get('declared_at', 'now')}):"]
    for rule in rules:
        lines += [f"- rule {rule.text} ({rule.describe()}): {name} -> {verdict(rule, gaps)}" for name, gaps in verdicts] or \
                 [f"- rule {rule.text} ({rule.describe()}): no arm has paired gaps to judge yet"]
    return "\n".join(lines)


def declare(sweep: Sweep, place: Place) -> dict[str, Any]:
    """The sweep's declaration: its rules and seeds, written into OUT_DIR/<name>.json before any run
    starts (write_outputs keeps it there), so that a rule cannot be chosen after the results. A
    sweep that declared rules keeps them: no rules given means the declared ones, other rules are a
    UsageError. A dry run writes nothing."""
    path = place.out_dir / f"{sweep.name}.json"
    record = read_record(path)
    given = [r.text for r in sweep.rules]
    old = record.get("declared")
    if old is not None:
        check_declaration(old, path)
        edited = edited_declaration_line(old, path)
        if edited:  # its rules judge nothing: the table is printed, no verdict
            print(edited, flush=True)
            return {**old, "rules": [], "edited": edited}
        if given and given != old.get("rules", []):
            raise UsageError(f"--rule {' '.join(given)} differs from the rule(s) declared in {path} before its runs "
                             f"({' '.join(old.get('rules', [])) or 'none'}); give those, or use another --out_dir.")
        return old
    seeds = Seeds.of(sweep.values("seed")) if any(a.key == "seed" for a in sweep.axes) else None
    declared = {"rules": given, "selection_seed": seeds.selection if seeds else None, "held_out_seeds": list(seeds.held_out) if seeds else [],
                "declared_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs_in_folder": sum(1 for _ in place.out_dir.glob(f"**/{CONFIG_NAME}")),
                "code": code_version()}
    declared["digest"] = declaration_digest(declared)
    if not place.dry_run:
        place.out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**record, "declared": declared}, indent=2) + "\n", encoding="utf-8")
    return declared


# -----------------------------------------------------------------------------
# What a record vouches for (issue 67, item 2): the declaration's digest, written with it before any
# run; each run's config.json and metrics.jsonl digests and the declaration it ran under, kept in the
# record's rows from the first time the run was recorded ended; the code's commit. A re-run,
# --table_only and --compare check them: a run whose files no longer match is one line and left out
# of every headline (status UNVERIFIED: not ended, so no cell, gap, rule or plan reads its loss).

UNVERIFIED = "unverified"
DIGEST_KEYS = ("config_sha256", "metrics_sha256")


def file_digest(path: Path) -> str | None:
    """The sha256 of a file's bytes; None where there is no file."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def declaration_digest(declared: dict[str, Any]) -> str:
    """The sha256 of a declaration's keys, its own digest left out, in a canonical JSON form."""
    return hashlib.sha256(json.dumps({k: v for k, v in declared.items() if k not in ("digest", "edited")}, sort_keys=True).encode()).hexdigest()


def code_version() -> dict[str, Any]:
    """The repository's commit and whether files differed from it (None where git or a repository is missing)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def edited_declaration_line(declared: dict[str, Any], path: Path) -> str | None:
    """One line where a declaration's keys no longer give the digest written with them; None where
    they do, or where the declaration predates digests (nothing to check it against)."""
    digest = declared.get("digest")
    if not isinstance(digest, str) or declaration_digest(declared) == digest:
        return None
    return (f"warning: the declaration in {path} was changed after it was written (digest {digest[:12]} recorded, "
            f"{declaration_digest(declared)[:12]} now): its rules ({', '.join(map(str, declared.get('rules', []))) or 'none'}) judge nothing here; "
            f"restore the record from its run record (docs/run_records/) to read them.")


def recorded_rows(path: Path) -> dict[str, dict[str, Any]]:
    """The record's rows by run folder (their "folder"), those that hold digests: what check_row compares."""
    runs = read_record(path).get("runs")
    return {row["folder"]: row for row in runs if isinstance(row, dict) and isinstance(row.get("folder"), str) and "metrics_sha256" in row} \
        if isinstance(runs, list) else {}


def run_inconsistency(out_dir: Path) -> str | None:
    """A run folder whose two files disagree: metrics.jsonl past the max_iters config.json gives (a
    restored run's config.json swapped for another's)."""
    try:
        config = json.loads((out_dir / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    last, most = last_iteration(out_dir), config.get("max_iters") if isinstance(config, dict) else None
    if isinstance(last, int) and isinstance(most, int) and last > most:
        return f"its metrics.jsonl reaches iter {last}, past the max_iters={most} of its config.json"
    return None


def check_row(row: dict[str, Any], job: Job, place: Place) -> dict[str, Any]:
    """A run's row with what vouches for it (its files' digests, the declaration it ran under, the
    code), checked against the record's row for its folder: once a run was recorded ended, its
    files must keep their digests, and its declaration the one it ran under. A mismatch is one
    line, and the row becomes UNVERIFIED, keeping the recorded digests (never the new files')."""
    folder = job.label
    now = {"folder": folder, **{key: file_digest(job.out_dir / name) for key, name in zip(DIGEST_KEYS, (CONFIG_NAME, METRICS_NAME))},
           "declared_digest": place.declared.get("digest"), "code": place.code}
    old = place.recorded.get(folder)
    wrong = [run_inconsistency(job.out_dir)]
    trained_on = (row.get("last_eval_iter") or 0) > ((old or {}).get("last_eval_iter") or 0)  # extended since: new files, rightly
    if old is not None and old.get("status") in ("ok", *UNSTABLE, UNVERIFIED) and not trained_on:
        wrong += digest_mismatches(old, now)
        ran_under = old.get("declared_digest")
        if ran_under and now["declared_digest"] and ran_under != now["declared_digest"]:
            wrong.append(f"it ran under another declaration (digest {ran_under[:12]}, the record's now {now['declared_digest'][:12]})")
        now = {**now, **{k: old[k] for k in (*DIGEST_KEYS, "declared_digest", "code") if old.get(k)}}  # the record's word stands
    wrong = [w for w in wrong if w]
    if not wrong:
        return {**row, **now}
    line = f"warning: {folder}: {'; '.join(wrong)}; left out of the tables and rules (restore it from its run record to count it)."
    print(line, flush=True)
    return {**row, **now, "status": UNVERIFIED, "reason": line, "val_loss": None, FULL_METRIC: None, "train_loss_avg": None}


def digest_mismatches(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What of a run's files differs from the digests its record row holds, a phrase each."""
    return [f"its {name} is not the file the record holds (sha256 {recorded[key][:12]} recorded, {(now.get(key) or 'none')[:12]} now)"
            for key, name in zip(DIGEST_KEYS, (CONFIG_NAME, METRICS_NAME)) if recorded.get(key) and recorded[key] != now.get(key)]


def record_mismatch_lines(record: dict[str, Any], folder: Path) -> dict[int, str]:
    """A finished sweep's record read back (--compare): {row index: one line} for each ended run
    whose files in `folder` differ from its row's digests, and {-1: line} where the declaration was
    edited; {} for a record that holds no digests (written before them: nothing to check)."""
    lines = {}
    declared = record.get("declared")
    edited = edited_declaration_line(declared, folder) if isinstance(declared, dict) else None
    if edited:
        lines[-1] = edited
    for i, row in enumerate(record.get("runs") or []):
        if not (isinstance(row, dict) and isinstance(row.get("folder"), str) and row.get("status") in ("ok", *UNSTABLE)):
            continue
        run = folder / row["folder"]
        now = {key: file_digest(run / name) for key, name in zip(DIGEST_KEYS, (CONFIG_NAME, METRICS_NAME))}
        wrong = digest_mismatches(row, now) + [w for w in [run_inconsistency(run)] if w]
        if wrong:
            lines[i] = f"warning: {folder}: {row['folder']}: {'; '.join(wrong)}; left out (restore it from its run record to count it)."
    return lines


RECORD_FIX = ("restore it from its run record (docs/run_records/), or move it aside to start the record anew; a record "
              "that cannot be read is never rewritten")


def read_record(path: Path) -> dict[str, Any]:
    """A sweep's record (OUT_DIR/<name>.json), {} when there is none; one that is not a JSON object
    is a UsageError naming it (it held the declaration: rewriting it would drop the rules)."""
    if not path.is_file():
        return {}
    try:
        return read_json_object(path, UsageError, RECORD_FIX)
    except OSError as e:
        raise UsageError(f"{str(path)!r} cannot be read ({e.strerror or e}); {RECORD_FIX}.") from None


def check_declaration(declared: Any, path: Path) -> None:
    """A record's "declared" is an object whose rules are rule texts; anything else is one line."""
    rules = declared.get("rules", []) if isinstance(declared, dict) else None
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        raise UsageError(f"{str(path)!r} holds a declaration that is not an object with a list of rule texts "
                         f"(\"declared\": {json.dumps(declared)[:80]}); {RECORD_FIX}.")
    try:
        for text in rules:
            parse_rule(text)
    except (ValueError, UsageError) as e:
        raise UsageError(f"{str(path)!r} declares a rule that cannot be read ({e}); {RECORD_FIX}.") from None


def declared_rules(place: Place) -> tuple[Rule, ...]:
    return tuple(parse_rule(text) for text in place.declared.get("rules", []))


# -----------------------------------------------------------------------------
# The command of a sweep that needs no options of its own


def study_parser(doc: str) -> argparse.ArgumentParser:
    """A study command's parser: the docstring's first paragraph as its description, the rest as epilog."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=HelpFormatter,
                                   epilog=doc.split("\n\n", 1)[1] if "\n\n" in doc else None, allow_abbrev=False)


def narrowed(sweep: Sweep, specs: list[str]) -> Sweep:
    """The sweep with some axes cut to some of their values: --axis spheret_p=0.25,4."""
    axes = {axis.key: axis for axis in sweep.axes}
    for spec in specs:
        key, _, values = spec.partition("=")
        if key not in axes:
            raise UsageError(f"--axis {spec!r} names no axis of {sweep.name}; its axes are: {', '.join(axes)}.")
        wanted = [v.strip() for v in values.split(",") if v.strip()]
        valid = [value_text(v) for v in axes[key].values]
        if not wanted or any(v not in valid for v in wanted):
            raise UsageError(f"--axis {spec!r} is not valid; give {key}= and some of: {', '.join(valid)}.")
        axes[key] = Axis(key, tuple(v for v in axes[key].values if value_text(v) in wanted))
    return replace(sweep, axes=tuple(axes.values()))


def add_table_options(parser: Any) -> None:
    """The options of a table of held-out seeds, gaps and rules (sweep_main, fair_sweep)."""
    parser.add_argument("--rule", action="append", default=[], metavar="RULE",
                        help="a decision rule on each arm's held-out gaps to the baseline, e.g. every_gap<-0.02 or upper<0 "
                             "(QUANTITY<N or >N, QUANTITY one of every_gap, upper, lower); recorded before the runs; repeatable")
    parser.add_argument("--mix_kernel_paths", action="store_true", help="tabulate runs of several kernel paths together (default: refuse)")


@dataclass
class Done:
    """A study's sweep once it ran: what sweep_main's figures and report hooks read."""

    sweep: Sweep
    args: argparse.Namespace
    rows: list[dict[str, Any]]
    place: Place
    yardsticks: Yardsticks
    figures: list[Path] = field(default_factory=list)  # what the figures hook wrote


Report = tuple[str, "str | None", dict[str, Any]]  # the stem of OUT_DIR/<stem>.md and .json, the .md's text (None: no .md), the record


def sweep_main(sweep: Sweep | Callable[[argparse.Namespace, list[str]], Sweep], argv: list[str] | None = None, doc: str = "",
               baseline_title: str = "the baseline", *, options: Callable[[argparse.ArgumentParser], None] | None = None,
               figures: Callable[[Done], list[Path]] | None = None, report: Callable[[Done], Report] | None = None) -> int:
    """A study's command. A Sweep runs as declared: the common options, --axis to run part of it,
    --rule and --mix_kernel_paths, and any train.py --key=value for every run; writes
    OUT_DIR/<name>.md (runs_text) and .json. A study of its own options gives `options`, which adds
    them (the place options among them), and as `sweep` the function that checks them and the
    train.py overrides and turns them into its Sweep. `figures` draws from the rows and returns the
    paths it wrote; `report` gives the stem, text and record to write instead of runs_text's."""
    p = study_parser(doc or f"The {sweep.name} sweep.")
    if options:
        options(p)
    else:
        p.add_argument("--axis", action="append", default=[], help="KEY=V1,V2: run only these values of an axis (repeatable)")
        add_place_options(p, f"out/{sweep.name}", dry_run=True)
        add_table_options(p)

    def design(args: argparse.Namespace, overrides: list[str]) -> Sweep:
        if options:
            return sweep(args, overrides)
        check_overrides(overrides, {**RESERVED, **{k: "--axis" for k in sweep.row_keys() if k in config_keys()}})
        return replace(narrowed(sweep, args.axis), rules=sweep.rules + tuple(map(parse_rule, args.rule)))

    def runs_report(done: Done) -> Report:
        text = runs_text(done.sweep, done.rows, baseline_title, done.place.declared, done.args.mix_kernel_paths)
        metric = table_metric(done.rows)
        held_out = {"selected": selected_summary(done.sweep, done.rows, metric)} if selection_of(done.sweep) else {}  # every column
        return done.sweep.name, text, {**done.yardsticks.record(), "metric": metric, **held_out, "runs": done.rows}

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        started = time.perf_counter()
        rows, place, yardsticks = start_study(chosen := design(args, overrides), args, overrides)
        if place.dry_run:
            return 0
        done = Done(chosen, args, rows, place, yardsticks)
        done.figures = figures(done) if figures else []
        stem, text, record = (report or runs_report)(done)
        return publish(place.out_dir, stem, text, record, done.figures, rows, started)

    return study_main(p.parse_known_args, run, argv)


def pivot_table(rows: list[dict[str, Any]], heads: list[Column], across: Callable[[dict[str, Any]], Any], values: list[Any],
                header: Callable[[Any], str], cell: Callable[[dict[str, Any] | None], str]) -> str:
    """A table with a line per distinct set of head cells (in the rows' order) and a column per
    value of `across` (e.g. the learning rate); cell(None) fills a combination with no run."""
    lines: dict[tuple[str, ...], dict[Any, dict[str, Any]]] = {}
    for r in rows:
        lines.setdefault(tuple(h.cell(r) for h in heads), {})[across(r)] = r
    top = ["| " + " | ".join([*(h.header for h in heads), *map(header, values)]) + " |",
           "|" + "".join(f"{h.align}|" for h in heads) + "--:|" * len(values)]
    return "\n".join([*top, *("| " + " | ".join([*key, *(cell(line.get(v)) for v in values)]) + " |" for key, line in lines.items())])
