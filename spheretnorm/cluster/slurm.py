"""What SLURM already has (squeue, scontrol) and the locks and records the submissions leave in the
run folders, so that nothing is submitted twice; and the submission itself (submit), each job
under its run folder's lock, its id recorded there.
"""

from __future__ import annotations

import errno
import getpass
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spheretnorm.cluster.grid_runs import GridRun, Job, job_name
from spheretnorm.cluster.sbatch import with_dependency
from spheretnorm.experiments.grid import exit_text
from spheretnorm.runtime.cli import REPO_ROOT, UsageError
from spheretnorm.runtime.run_folder import SLURM_JOBS_NAME, slurm_lock_name, write_json_atomic


@dataclass
class QueuedJob:
    """One line of squeue."""

    job_id: str
    state: str  # PENDING, RUNNING, ...
    reason: str  # why it is pending, e.g. Priority, Dependency, DependencyNeverSatisfied
    name: str


# States squeue may still show for a while after a job ended: no longer queued or running.
ENDED_STATES = frozenset({
    "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL",
    "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT",
})
# squeue's fields, the name last: it is the one field that may hold the separator.
SQUEUE_FORMAT = "%i|%T|%r|%j"


def parse_squeue(text: str) -> list[QueuedJob]:
    """The jobs of `squeue --noheader --format=SQUEUE_FORMAT` output that are queued or running.

    Robust to what squeue prints besides: blank lines, a header line, warnings, padding, array
    and heterogeneous job ids (123_4, 123+0: the job id is 123), states such as "CANCELLED by 0".
    """
    jobs = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split("|", 3)]
        if len(parts) != 4:
            continue
        match = re.fullmatch(r"(\d+)(?:[_+]\S*)?", parts[0])
        state = parts[1].split(" ")[0].upper()
        if match is None or not state or state in ENDED_STATES:
            continue
        jobs.append(QueuedJob(match.group(1), state, parts[2], parts[3]))
    return jobs


def slurm_user() -> str:
    """The name squeue lists this user's jobs under (its uid when there is no name)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


@dataclass
class Active:
    """A job of one run and stage that SLURM still has: why a submission is skipped."""

    job_id: str | None  # None: a launcher elsewhere is submitting it right now
    text: str


# A lock without a job id is a submission under way; one older than this was abandoned.
PENDING_LOCK_S = 600.0
# How long squeue (and scontrol) and sbatch may take: a hung slurmctld must not hold a run's lock for ever.
SQUEUE_TIMEOUT_S = 120.0
SBATCH_TIMEOUT_S = 300.0  # the default of --sbatch_timeout
SBATCH_WAIT_NOTE_S = 10.0  # how long sbatch may take before a line says the launcher waits for it


class Queue:
    """This user's queued and running jobs of the grid (squeue), and the run folders' locks.

    jobs is None when squeue could not be asked (problem says why): a lock then counts as live,
    since nothing can tell that its job is gone, and only locks can prevent a second submission.
    """

    def __init__(self, jobs: list[QueuedJob] | None, problem: str = ""):
        self.jobs = jobs
        self.problem = problem
        self.notes: list[str] = []  # stale locks ignored, one line each
        self.stale: dict[Path, dict[str, Any] | None] = {}  # lock -> its content when found stale

    @classmethod
    def ask(cls, names: list[str]) -> Queue:
        """squeue for the jobs named `names` of this user."""
        squeue = shutil.which("squeue")
        if squeue is None:
            return cls(None, "squeue is not on PATH")
        if not names:
            return cls([])
        command = [squeue, "--noheader", f"--user={slurm_user()}", f"--name={','.join(names)}", f"--format={SQUEUE_FORMAT}"]
        try:
            # A job name or warning in another encoding must not stop the launch: such bytes become
            # U+FFFD, and the names asked for (ASCII) still match.
            result = subprocess.run(command, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=SQUEUE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return cls(None, f"squeue did not answer within {SQUEUE_TIMEOUT_S:g} s and was stopped")
        except OSError as e:
            return cls(None, f"squeue failed: {e}")
        if result.returncode != 0:
            detail = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
            return cls(None, f"squeue failed: {detail}")
        wanted = set(names)
        return cls([job for job in parse_squeue(result.stdout) if job.name in wanted])

    @property
    def known(self) -> bool:
        return self.jobs is not None

    def listed(self, job_id: str) -> QueuedJob | None:
        return next((job for job in self.jobs or [] if job.job_id == job_id), None)

    def active(self, run: GridRun, stage: str, submitting: bool = True) -> Active | None:
        """The job of `stage` that SLURM still has for `run`, else None (a stale lock is noted
        when a job of that stage is about to be submitted)."""
        lock_path = run.path / slurm_lock_name(stage)
        lock = read_lock(lock_path)
        job_id = lock.get("job_id") if lock else None
        if lock is not None and job_id is None:  # a submission under way, or one abandoned
            age = time.time() - lock_time(lock)
            if age < PENDING_LOCK_S and lock_owner_alive(lock):
                return Active(None, f"a launch.py (pid {lock.get('pid')} on {lock.get('host')}) is submitting its {stage} job right now ({run.out_dir / lock_path.name})")
        if job_id is not None and not self.known:
            return Active(str(job_id), f"{stage} job {job_id} was submitted ({run.out_dir / lock_path.name}) and {self.problem}, so it may still be queued; delete that lock if job {job_id} is gone")
        mine = self.listed(str(job_id)) if job_id is not None else None
        if mine is not None:
            return Active(mine.job_id, f"{stage} job {mine.job_id} is already {describe_state(mine)} ({run.out_dir / lock_path.name})")
        named = [job for job in self.jobs or [] if job.name == job_name(run, stage)]
        if named:  # submitted from elsewhere, or before locks existed
            first = named[0]
            more = f" (and {', '.join(j.job_id for j in named[1:])})" if named[1:] else ""
            return Active(first.job_id, f"{stage} job {first.job_id}{more} named {first.name} is already {describe_state(first)}{other_folder_text(first.job_id, run)}")
        if lock_path.exists() and submitting:
            self.stale[lock_path] = lock
            why = f"of job {job_id} is stale (squeue no longer lists it)" if job_id is not None else "of a submission that never finished is stale"
            self.notes.append(f"{run.name}: the lock {run.out_dir / lock_path.name} {why}; submitting again")
        return None


def job_output_folder(job_id: str) -> Path | None:
    """The folder of a queued job's log (scontrol's StdOut; sbatch_command puts it in the run
    folder), or None when scontrol cannot say."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        result = subprocess.run([scontrol, "--oneliner", "show", "job", job_id], capture_output=True, text=True, errors="replace", timeout=SQUEUE_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # said: the folder check it skips is what keeps two roots' runs apart
        print(f"warning: scontrol did not answer within {SQUEUE_TIMEOUT_S:g} s about job {job_id} and was stopped, "
              "so the run folder it writes to is not checked.", file=sys.stderr)
        return None
    except OSError:
        return None
    match = re.search(r"(?:^|\s)StdOut=(\S+)", result.stdout) if result.returncode == 0 else None
    return Path(match.group(1)).parent if match else None


def other_folder_text(job_id: str, run: GridRun) -> str:
    """For a job matched by its name alone: the run folder, and --runs_root, it writes to when that
    is not this run's (job names leave the root out, so two roots' runs share them)."""
    folder = job_output_folder(job_id)
    if folder is None or (REPO_ROOT / folder).resolve() == run.path.resolve():  # sbatch ran in REPO_ROOT
        return ""
    return f", writing to {folder} (--runs_root {folder.parent.parent}), not to {run.out_dir}: job names leave out the root, so launch this run again once that job ends"


def describe_state(job: QueuedJob) -> str:
    """'running', 'pending (Priority)'; a job whose dependency failed says how to clear it."""
    text = job.state.lower() + (f" ({job.reason})" if job.reason and job.reason not in ("None", "(null)") else "")
    if job.reason == "DependencyNeverSatisfied":
        text += f"; it can never start (the job it waits for failed): scancel {job.job_id}, then launch again"
    return text


# -----------------------------------------------------------------------------
# The locks and records of the submissions, and the submission


def read_lock(path: Path) -> dict[str, Any] | None:
    """A lock's content; an unreadable one is stale (an empty dict), a missing one None."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def lock_time(lock: dict[str, Any]) -> float:
    """When a lock was claimed (seconds since the epoch); 0, so that it counts as abandoned, when
    its claimed_at is not a number (a hand-edited lock: "soon")."""
    try:
        return float(lock.get("claimed_at", 0) or 0)
    except (TypeError, ValueError):
        return 0.0


def lock_owner_alive(lock: dict[str, Any]) -> bool:
    """Whether the launcher that wrote a pending lock may still run (on another host: assume so)."""
    if lock.get("host") != socket.gethostname():
        return True
    try:
        pid = int(lock.get("pid", 0))
        os.kill(pid, 0)
    except (TypeError, ValueError, OverflowError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return pid > 0


def claim_lock(path: Path, job: Job, queue: Queue) -> bool:
    """Create the lock of a submission about to be made; False when another launcher holds it.

    A lock found stale when the plan was made is replaced only if it is still that one.
    """
    if path in queue.stale and read_lock(path) == queue.stale[path]:
        path.unlink(missing_ok=True)
    claim = {"job_id": None, "stage": job.stage, "job_name": job.name, "pid": os.getpid(), "host": socket.gethostname(), "claimed_at": time.time()}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(claim, f)
    return True


def recorded_jobs(path: Path) -> tuple[list[dict[str, Any]], str]:
    """(the job entries of a slurm_jobs.json, "") or, for a damaged one (cut short, not JSON, not
    {"jobs": [...]}), ([], why), so that the caller keeps it aside instead of replacing it."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [], ""
    except UnicodeDecodeError:
        return [], "it is not UTF-8 text"
    except ValueError as e:
        return [], f"it is not whole JSON ({e})"
    jobs = value.get("jobs") if isinstance(value, dict) else None
    if not isinstance(jobs, list):
        return [], f'it holds a JSON {type(value).__name__}, not {{"jobs": [...]}}'
    return [j for j in jobs if isinstance(j, dict)], ""


def keep_aside(path: Path) -> Path:
    """Rename a damaged file to <name>.damaged (.damaged-2, ... when taken): its job ids stay readable."""
    for n in range(1, 1000):
        aside = path.with_name(f"{path.name}.damaged" + (f"-{n}" if n > 1 else ""))
        if not aside.exists():
            os.replace(path, aside)
            return aside
    raise OSError(errno.EEXIST, "every .damaged name is taken", str(path))


def record_submission(run: GridRun, entry: dict[str, Any]) -> str:
    """Append a submitted job to the run folder's slurm_jobs.json (written atomically); a damaged
    record is kept aside first, never replaced: the note that says where, else ""."""
    path = run.path / SLURM_JOBS_NAME
    jobs, damage = recorded_jobs(path)
    note = ""
    if damage:
        aside = keep_aside(path)
        note = f"{run.out_dir / SLURM_JOBS_NAME} was damaged ({damage}); kept as {run.out_dir / aside.name}, a new record started"
    write_json_atomic(path, {"jobs": [*jobs, entry]})
    return note


def submitted_job_id(stdout: str) -> str | None:
    """The job id sbatch printed: 'Submitted batch job 42', or '42' / '42;cluster' (--parsable)."""
    match = re.search(r"Submitted batch job (\d+)", stdout) or re.search(r"^\s*(\d+)(?:;\S*)?\s*$", stdout, re.M)
    return match.group(1) if match else None


def check_slurm_files(todo: list[Job]) -> None:
    """The lock and the job record of every submission are files or absent: a folder in their
    place (a mistaken mkdir, a copy) is refused before the first sbatch, one line each."""
    problems = []
    for job in todo:
        for name, what in ((slurm_lock_name(job.stage), "its job lock"), (SLURM_JOBS_NAME, "its record of job ids")):
            path = job.run.path / name
            if path.is_dir():
                problems.append(f"{job.run.out_dir / name} is a folder, where the launcher keeps {what} (a file); move it away")
    if problems:
        raise UsageError("nothing was submitted: " + "; ".join(dict.fromkeys(problems)) + ".")


def run_sbatch(command: list[str], timeout_s: float = SBATCH_TIMEOUT_S) -> tuple[int | None, str, str]:
    """(exit status, stdout, stderr) of sbatch, or (None, "", why) when it did not answer within
    timeout_s (a hung slurmctld): the launch goes on, and the run's lock is released."""
    # A hung slurmctld holds sbatch for minutes: one line says so once it has waited a while.
    note = threading.Timer(SBATCH_WAIT_NOTE_S, lambda: print(
        f"note: waiting for sbatch to answer (it is stopped after {timeout_s:g} s; --sbatch_timeout=S sets that)", flush=True))
    note.daemon = True
    note.start()
    try:
        result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, encoding="utf-8",
                                errors="replace", timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, "", f"sbatch did not answer within {timeout_s:g} s and was stopped"
    except OSError as e:
        return None, "", f"sbatch could not be started ({e.strerror or e})"
    finally:
        note.cancel()
    return result.returncode, result.stdout, result.stderr


def submit(todo: list[Job], queue: Queue, skipped: int = 0, sbatch_timeout_s: float = SBATCH_TIMEOUT_S) -> int:
    """Submit the jobs with sbatch, each under its run folder's lock, its id recorded there;
    returns the number not submitted or not recorded. `skipped`: the runs the plan left out, for the last line."""
    if shutil.which("sbatch") is None:
        raise UsageError("sbatch was not found on PATH; run --mode slurm on a SLURM login node, or add --dry_run to print the commands.")
    if not queue.known:
        print(f"warning: {queue.problem}: jobs submitted without a lock in their run folder cannot be seen, so they may be submitted again.", file=sys.stderr)
    failed, unrecorded, n = [], [], len(todo)
    given: dict[str, str] = {}  # job id -> the run it was given to in this launch
    for i, job in enumerate(todo, start=1):
        run, label = job.run, f"[{i}/{n}] {job.run.name} ({job.stage})"
        after = job.after.job_id if isinstance(job.after, Job) else job.after
        if isinstance(job.after, Job) and after is None:
            print(f"{label}: not submitted, its training job was not submitted.", flush=True)
            failed.append(f"{run.name} ({job.stage})")
            continue
        command = with_dependency(job.command, after) if after is not None else job.command
        print(f"{label}: {shlex.join(command)}" + (f" ({job.note})" if job.note else ""), flush=True)
        lock = run.path / slurm_lock_name(job.stage)
        try:
            run.path.mkdir(parents=True, exist_ok=True)  # SLURM's --output folder must exist
            claimed = claim_lock(lock, job, queue)
        except OSError as e:  # a full disk before sbatch: nothing submitted for this run
            lock.unlink(missing_ok=True)
            print(f"{label}: not submitted, {run.out_dir} could not be written ({e.strerror or e}); continuing.", flush=True)
            failed.append(f"{run.name} ({job.stage})")
            continue
        if not claimed:
            print(f"{label}: skipped, another launch.py has just claimed {run.out_dir / lock.name}.", flush=True)
            continue
        status, stdout, stderr = run_sbatch(command, sbatch_timeout_s)
        job.job_id = submitted_job_id(stdout) if status == 0 else None
        if job.job_id is None:  # sbatch's own words, when they are not the job id said below
            sys.stdout.write(stdout)
        sys.stderr.write(stderr if status is not None else "")
        twice = given.get(job.job_id) if job.job_id is not None else None
        if status != 0 or job.job_id is None or twice is not None:
            lock.unlink(missing_ok=True)
            if status is None:
                why = f"{stderr}; its lock is released (the job may still have been queued: check squeue before launching again, it finds it by name)"
            elif status != 0:
                why = f"sbatch {exit_text(status)}"
            elif twice is not None:
                # Two runs must never share one id: the record would send one run's scancel or
                # dependency to the other's job.
                why = f"sbatch returned job {job.job_id}, which it already returned for {twice}; not recorded (check squeue and sbatch)"
                job.job_id = None
            else:
                why = "sbatch printed no job id; it may be queued, check squeue"
            print(f"{label}: {why}; continuing.", flush=True)
            failed.append(f"{run.name} ({job.stage})")
            continue
        given[job.job_id] = f"{run.name} ({job.stage})"
        entry = {
            "job_id": job.job_id, "stage": job.stage, "job_name": job.name, "after": after,
            "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command,
        }
        try:  # the job id into its lock and the run's slurm_jobs.json; a full disk is said with the job id
            write_json_atomic(lock, {**entry, "pid": os.getpid(), "host": socket.gethostname(), "claimed_at": time.time()})
            note = record_submission(run, entry)
        except OSError as e:
            print(f"{label}: submitted job {job.job_id}, but it could not be recorded in {run.out_dir} ({e.strerror or e}); "
                  f"squeue still finds it by name, so launching again will not submit it twice.", flush=True)
            unrecorded.append(f"{run.name} ({job.stage}) job {job.job_id}")
            continue
        if note:
            print(f"{label}: note: {note}", flush=True)
        print(f"{label}: submitted job {job.job_id}" + (f", to start after job {after} succeeds" if after else ""), flush=True)
    print(f"{n - len(failed)} submitted" + (f", {len(failed)} failed: {', '.join(failed)}" if failed else "")
          + (f", {len(unrecorded)} not recorded: {', '.join(unrecorded)}" if unrecorded else "") + f", {skipped} skipped")
    return len(failed) + len(unrecorded)
