"""The CPU studies' runner: the data, train.py jobs, and a sweep's runs found, planned and run
(docs/EXPERIMENTS.md section 6). A finished or stopped run is reused and an interrupted one
resumes, so a re-run continues the sweep.

Jobs run as subprocesses (train.py installs signal handlers and global RNG state, so a fresh
process per run is the robust choice), several at a time with a fixed number of threads each: on
2 cores, two single-threaded jobs use the machine better than one two-threaded job after another,
since width-128 matrices are too small for a second thread to pay off and a busy machine makes a
two-threaded job wait for its slower thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from spheretnorm.diagnostics import DIAGNOSTICS
from spheretnorm.kernels import kernel_path_text
from spheretnorm.runtime.token_files import PrepareError, load_meta
from spheretnorm.data.preparation import prepare, prepared_already
from spheretnorm.data.pipeline import TINY_SHAKESPEARE, UnwritableFolder
from spheretnorm.experiments.grid import (
    CONFIG_NAME, SHARED_DIR, Yardsticks, classify, exit_text, has_checkpoint, load_run, reached_max_iters, stopped_row,
)
from spheretnorm.experiments.sweep_plan import (
    DATASET, FULL_METRIC, UNSTABLE, Place, Point, Sweep, current_plan, name_rows, parse_train_args, table_metric, train_argv,
)
from spheretnorm.experiments.sweep_record import (
    DIGEST_KEYS, UNVERIFIED, code_version, declare, digest_mismatches, file_digest, last_iteration, recorded_rows, run_inconsistency,
)
from spheretnorm.runtime.cli import REPO_ROOT, UsageError
from spheretnorm.runtime.config import ConfigError
from spheretnorm.runtime.identity import config_conflicts
from spheretnorm.runtime.run_folder import (
    METRICS_NAME, ZERO_SHOT_GLOB, OutDirError, check_folder, earlier_run, holds_any_checkpoint, read_metrics,
)

SHARED_CORPUS = SHARED_DIR / "data" / "tinyshakespeare.txt"
LOG_NAME = "train.log"


# -----------------------------------------------------------------------------
# Data


def check_input(input_path: str | None) -> None:
    """An explicit --input is a file (UsageError otherwise)."""
    if input_path is not None and not Path(input_path).is_file():
        raise UsageError(f"--input {input_path!r} is not a file; give a plain-text corpus such as tinyshakespeare.txt.")


def kept_data(data_dir: Path, input_path: str | None) -> dict[str, Any] | None:
    """data_dir's meta.json where ensure_data keeps what it holds, None where it would prepare: any
    prepared data without input_path, else only that file's characters (the same sha256), since a
    second sweep over a data folder must not replace the files the first one's runs train from. A
    dry run's note asks it too, so that it says what the real run would do."""
    if not (data_dir / "meta.json").is_file():
        return None
    if input_path is None:
        return load_meta(data_dir)
    return prepared_already(DATASET, [input_path], data_dir)


def ensure_data(data_dir: Path, input_path: str | None = None) -> dict[str, Any]:
    """Prepare a corpus's characters in data_dir unless kept_data keeps them; returns meta.json. The
    text comes from input_path, else ../shared/data/tinyshakespeare.txt when present, else
    data/prepare.py's download."""
    data_dir = Path(data_dir)
    check_input(input_path)
    if (meta := kept_data(data_dir, input_path)) is not None:
        if input_path is not None:
            print(f"using the characters of {input_path} prepared in {data_dir} (same sha256)", flush=True)
        return meta
    source = input_path or (str(SHARED_CORPUS) if SHARED_CORPUS.is_file() else None)
    print(f"preparing the characters of {source or 'the download URL of data/prepare.py'} in {data_dir} "
          f"(data/prepare.py's {DATASET} format)", flush=True)
    try:
        return prepare(DATASET, input=[source] if source else None, out_dir=str(data_dir), progress=False)
    except UnwritableFolder as e:  # the study's option for this folder is --data_dir, not data/prepare.py's --out_dir
        raise UsageError(f"--data_dir {str(data_dir)!r} cannot be written to ({e.reason}); give a writable folder.") from None
    except PrepareError as e:  # an empty or too short text: the study's one line, as data/prepare.py says it
        given = f"--input {input_path!r}" if input_path is not None else (source or "the download")
        raise UsageError(f"{given} cannot be prepared in {data_dir}: {e}") from None


def dry_run_data_note(data_dir: Path, input_path: str | None) -> str:
    """The note a dry run prints where the real run would (re)prepare data_dir; '' where it would
    keep it. Nothing is written: a dry run only looks."""
    if not (data_dir / "meta.json").is_file():
        return f"note: {data_dir} holds no prepared {DATASET}; the sweep would prepare it there first (a dry run writes nothing)"
    check_input(input_path)
    if kept_data(data_dir, input_path) is not None:
        return ""
    return (f"note: {data_dir} holds {DATASET} not prepared from the characters of --input {input_path}; the sweep would prepare "
            "them there afresh first, replacing its files (a dry run writes nothing)")


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
    set_aside: str = ""  # an earlier attempt killed before its first checkpoint, set aside (set_aside_killed_attempt)

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
    except OSError as e:  # held (BlockingIOError), or no lock file: no sweep has trained it since
        return isinstance(e, BlockingIOError)
    return False


def is_done(out_dir: Path, max_iters: int) -> bool:
    """A sweep's run that needs no more training: it ran to max_iters, or train.py stopped it for
    good (collapse, non-finite loss). Its tables read metrics.jsonl alone, so a run restored from
    its run record (no checkpoint: docs/run_records) is done too. (The launcher's runs need their
    checkpoint for the zero-shot evaluation: grid.is_finished.)"""
    return reached_max_iters(out_dir, max_iters) or stopped_row(out_dir) is not None


def train_command(job: Job) -> list[str]:
    # auto: an interrupted run resumes; train.py refuses to start over an existing checkpoint.
    return [sys.executable, str(REPO_ROOT / "train.py"), *job.argv, "--init_from=auto"]


def run_job(job: Job, threads: int, stopper: Stopper | None = None) -> JobResult:
    """train.py in a subprocess with `threads` threads, output to out_dir/train.log; a done run is
    reused (resuming one stopped for good would only stop it again), and a folder another sweep
    trains now is left to it (busy)."""
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
        set_aside = "" if resumed else set_aside_killed_attempt(job.out_dir)
        with open(log, "w", encoding="utf-8") as out:
            code = (stopper or Stopper()).run(job, train_command(job), cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    return JobResult(job, code, time.perf_counter() - start, _error_line(log) if code else "", resumed=resumed, set_aside=set_aside)


KILLED_SUFFIX = ".killed-"  # metrics.jsonl.killed-1: no reader's name or glob (metrics.jsonl, *.json) takes it


def set_aside_killed_attempt(out_dir: Path) -> str:
    """An earlier attempt of this run that was killed (SIGKILL, the machine lost) before its first
    checkpoint leaves metrics.jsonl and config.json and nothing to resume from, and train.py refuses to
    start over them. Its files are renamed (metrics.jsonl.killed-N, kept to read) so that the run starts
    again from iteration 0: the same seed and settings give the same run, so only time is lost. A folder
    the sweep does not own in this way (zero-shot results) is left to train.py's refusal; another run's
    settings were refused when the job was made (make_job), a run that ended is reused (is_done). Returns the words for the sweep's line."""
    if earlier_run(out_dir) is None or any(out_dir.glob(ZERO_SHOT_GLOB)) or not (out_dir / CONFIG_NAME).is_file():
        return ""
    rows = read_metrics(out_dir / METRICS_NAME) if (out_dir / METRICS_NAME).is_file() else []
    last = max((r["iter"] for r in rows if isinstance(r, dict) and isinstance(r.get("iter"), int)), default=0)
    n = 1 + sum(1 for _ in out_dir.glob(f"{CONFIG_NAME}{KILLED_SUFFIX}*"))
    for name in (METRICS_NAME, CONFIG_NAME):
        if (out_dir / name).is_file():
            (out_dir / name).rename(out_dir / f"{name}{KILLED_SUFFIX}{n}")
    return (f"an earlier attempt stopped at iter {last} before its first checkpoint (killed); its files set aside as "
            f"{METRICS_NAME}{KILLED_SUFFIX}{n} and {CONFIG_NAME}{KILLED_SUFFIX}{n}, the run started again from iteration 0")


def schedule(take: Callable[[int], list[Job]], ended: Callable[[JobResult], None], parallel: int, threads: int,
             waiting: Callable[[], int]) -> None:
    """Run the jobs take(free) hands out, at most `parallel` at a time, and ask it for more each
    time one ends (after ended(result) has seen it), until it hands out none and none runs: a plan
    that grows with the finished runs starts what they call for at once, not after the rest of an
    older batch. A line is printed as each job ends (waiting(): how many more the plan holds now).
    A stop signal reaches the running jobs (which checkpoint), starts no other, and ends in
    SweepStopped once they have exited."""
    assert parallel >= 1 and threads >= 1, (parallel, threads)  # Place.of refused them already (positive_count)
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
    again = f" ({result.set_aside})" if result.set_aside else ""
    return f"[{index}/{total}] {job.label}: {outcome}{again} in {result.seconds:.0f} s (log: {job.out_dir / LOG_NAME})"


# -----------------------------------------------------------------------------
# A run's row: what its folder says, checked against the sweep's record


def outcome(result: JobResult, yardsticks: Yardsticks) -> dict[str, Any]:
    """What a finished job left: status (grid.classify), final losses (None for a diverged run: its
    last evaluation predates the divergence), its whole time (run_seconds)."""
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


def diagnostic_summary(row: dict[str, Any]) -> dict[str, float | None]:
    """The study columns of an eval row: each Summary of DIAGNOSTICS, None where the row lacks the
    diagnostic (a run written before it existed), so that runs fit side by side in a table."""
    out: dict[str, float | None] = {}
    for entry in DIAGNOSTICS:
        out.update(entry.summarise(row.get(entry.name)))
    return out


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


# -----------------------------------------------------------------------------
# The sweep: its runs found, planned and run


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
    to, and the time the remaining ones would take at --jobs at a time, a run's time the mean of
    the finished runs' own (finished_run_seconds), else `default_seconds`."""
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


def run_sweep(sweep: Sweep, place: Place, yardsticks: Yardsticks = Yardsticks()) -> list[dict[str, Any]]:
    """Run the sweep (run_as_planned), or with table_only and dry_run find its runs already there a
    plan's worth at a time, until the plan stops growing; the rows in the plan's order. A run that
    failed is not tried twice in one call. Each run's status is judged against the data's
    yardsticks (grid.classify; a dry run may find no data yet, and then judges none)."""
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


def start_study(sweep: Sweep, args: Any, overrides: list[str]) -> tuple[list[dict[str, Any]], Place, Yardsticks]:
    """A study command's run: prepare the data, run (or find) the sweep; its rows, place and the
    data's yardsticks (its unigram and bigram losses, which every run's status was judged against)."""
    place = Place.of(args, overrides)
    check_out_dir(place)
    if not place.dry_run:
        ensure_data(place.data_dir, args.input)
    elif note := dry_run_data_note(place.data_dir, args.input):
        print(note)
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
