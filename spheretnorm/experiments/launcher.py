"""Launch the paper's grid: 8 methods x 3 scales x 2 datasets = 48 torchrun training runs.

    python scripts/launch.py --dry_run                                   # print all 48 commands
    python scripts/launch.py --methods pre_ln,p_spheret:0.5 --scales S --datasets openwebtext
    python scripts/launch.py --mode print > grid.sh                      # a shell script of the commands
    python scripts/launch.py --mode slurm --nnodes 2 --batch_size=8      # one sbatch job per run
    python scripts/launch.py --mode slurm --sbatch_args="--partition=gpu --account=lab --time=12:00:00"
    python scripts/launch.py --nnodes 2 --node_rank 0 --rdzv_endpoint node0:29500   # on each node
    python scripts/launch.py --stage zero_shot --scales L --eval_args "--local_data ../shared/evaldata"
    python scripts/launch.py --mode slurm --chain_zero_shot              # + each run's zero-shot job, afterok

Each run is `train.py config/<dataset>_<scale>.py --connection=... [--<method parameter>=...]
--out_dir=<runs_root>/<dataset>_<scale>/<method>` (e.g. out/openwebtext_s/p_spheret-0.5); its W&B
name is its folder's, <dataset>_<scale>/<method folder>, and its W&B group <dataset>_<scale>, as
train.py sets them (add --wandb_log=true). Any other --key=value is passed to every train.py command.

Modes: local runs the commands one after another on this machine (every GPU per run);
print writes them to stdout; slurm submits one `sbatch scripts/slurm_train.sh ...` job per run
(that script resumes from the checkpoint when SLURM requeues the job), with --sbatch_args and
SLURM's SBATCH_* variables (SBATCH_PARTITION, SBATCH_ACCOUNT, SBATCH_TIMELIMIT, ...) for what the
cluster wants; --nproc_per_node and --nnodes default to SBATCH_GPUS_PER_NODE and SBATCH_NODES.
Before anything runs or is submitted, the grid is checked: a dataset not prepared, W&B online
without an API key, a config that does not parse or a batch size that does not divide stops it
with one line per problem (--dry_run and print only warn), and so does a --runs_root that cannot
hold the run folders. --sbatch_args may not set what the launcher sets (the job's name, log,
nodes, GPUs, tasks, --export), in any form sbatch reads (-N2, -N 2, --nodes=2, --nodes 2), nor hold
a bare word, an option without its value or one option twice; SBATCH_NODES and
SBATCH_GPUS_PER_NODE must be counts: each is refused in one line before anything is submitted.
--dry_run prints what a
mode would run without running it. A multi-node local launch runs this script on every node
with the same arguments and its own --node_rank; the nodes meet at --rdzv_endpoint.

A run is skipped when it has finished: its metrics.jsonl has an eval row at iter >= max_iters
(train.py evaluates at the last iteration), when train.py stopped it for good (its metrics.jsonl
ends with a stop row for a collapse or a non-finite loss: reported as "stopped: collapse", since a
resume would stop again), and when its folder holds a run with other settings (reported, never
overwritten; the other runs are still planned). A run that ends with a non-zero exit status is
reported by what the status means (train.py's EXIT_* codes: crashed, stopped: collapse, ...). Every command carries
--init_from=auto, so a run resumes from its checkpoint whenever one exists by the time it
starts. A run counts as finished only when its ckpt.pt is there too: one that reached max_iters
without it (a folder from before train.py always saved the final state) trains again, with
--overwrite=true; any other folder that holds an earlier run's history (an evaluation past iter 0,
zero-shot results) but no ckpt.pt is skipped, saying so, since train.py refuses to start over it
(spheretnorm/runtime/run_folder.py, earlier_run). --stage
zero_shot runs eval/zero_shot.py on finished runs that have no ckpt_zero_shot.json yet;
scripts/tables.py reads those files for Tables 4 and 5.

--mode slurm submits nothing twice. It asks squeue which of the user's jobs of this grid (by job
name: spheretnorm-<run> for training, spheretnorm-zero_shot-<run> for evaluation) are queued or
running, and reads the lock each submission leaves in its run folder (slurm_train.lock,
slurm_zero_shot.lock: the job id); a run whose job is still listed is skipped, one line saying
which job, and a lock whose job squeue no longer lists is stale and ignored. Every job id is
also recorded in the run folder's slurm_jobs.json (a damaged one is kept as slurm_jobs.json.damaged,
said in a line). sbatch is given SBATCH_TIMEOUT_S to answer, then stopped and its lock released
(squeue and scontrol SQUEUE_TIMEOUT_S, a line saying what went unchecked);
a job id sbatch returns for a second run is not recorded; a lock or record that is a folder is
refused before the first submission; a record that cannot be written (a full disk) is one line
naming the submitted job id. --chain_zero_shot (with --stage train) also
submits each run's zero-shot job with --dependency=afterok:<training job id>, so it starts when
training has succeeded (after a job already queued, too; a finished run's evaluation at once).
The variables HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, TRANSFORMERS_OFFLINE and WANDB_MODE, when set
here, are passed to every job by name in its --export.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import getpass
import json
import os
import re
import shlex
import shutil
import socket
import threading
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from spheretnorm.runtime.run_folder import checkpoint_path as written_checkpoint  # the file or folder a run writes
from spheretnorm.runtime.run_folder import (
    SLURM_JOBS_NAME, OutDirError, check_folder, earlier_run, slurm_lock_name, write_json_atomic,
)
from spheretnorm.experiments.grid import (
    checkpoint_path,
    PAPER_DATASETS,
    PAPER_SCALES,
    SCALES,
    ZERO_SHOT_NAME,
    check_overrides,
    config_file,
    exit_text,
    has_checkpoint,
    is_evaluated,
    is_finished,
    last_eval_iter,
    parse_choices,
    reached_max_iters,
    stopped_row,
)
from spheretnorm.runtime.methods import parse_methods
from spheretnorm.runtime.cli import REPO_ROOT, HelpFormatter, UsageError
from spheretnorm.runtime.imports import folders_off_sys_path, imports_of_overrides
from spheretnorm.runtime.methods import method_args
from spheretnorm.runtime.methods import found_run_folder, method_dirname
from spheretnorm.runtime.config import RESTART_FREE_KEYS, ConfigError, TrainConfig, parse_config
from spheretnorm.runtime.identity import config_conflicts, run_settings
from spheretnorm.runtime.methods import resolve_paths, resolve_wandb_names
from spheretnorm.runtime.token_files import META_FILE
from spheretnorm.runtime.tracking import check_wandb

MODES = ("local", "print", "slurm")
STAGES = ("train", "zero_shot")
SLURM_SCRIPT = "scripts/slurm_train.sh"
# Set on the submitting machine, these reach every job by name (an air-gapped cluster's settings).
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "WANDB_MODE")
# Keys the launcher sets itself, and the option to use instead (the method's keys: check_overrides).
RESERVED = {
    "dataset": "--datasets",
    "out_dir": "--runs_root",
    "init_from": "nothing (every run gets --init_from=auto: it resumes from a checkpoint by itself)",
    # One value for every run would give all runs of a method the same folder or W&B name.
    "config_name": "nothing (it is <dataset>_<scale>, as the config file's name)",
    "wandb_run_name": "nothing (each run is named after its folder, <dataset>_<scale>/<method folder>)",
}


@dataclass
class GridRun:
    """One training run of the grid, as train.py will see it."""

    dataset: str
    scale: str
    method: str
    name: str  # also the W&B run name: <config_name>/<method>
    out_dir: Path
    max_iters: int
    train_args: list[str]  # everything after train.py
    train: TrainConfig  # as train.py will resolve it on the cluster (data_dir, W&B keys)
    conflicts: list[str] = field(default_factory=list)  # settings where out_dir's run differs
    settings: dict[str, Any] | None = None  # what train.py compares with out_dir's config.json (earlier_run)

    @property
    def slug(self) -> str:
        """The name as a job or rendezvous id: 'openwebtext_s-p_spheret-0.5'."""
        return self.name.replace("/", "-").replace(":", "-")

    @property
    def path(self) -> Path:
        """out_dir on this machine: commands run in the repository root, so it is relative to that."""
        return REPO_ROOT / self.out_dir

    @property
    def finished(self) -> bool:
        return is_finished(self.path, self.max_iters)

    def args(self) -> list[str]:
        """train.py arguments; auto resumes from a checkpoint that exists when the command runs
        (a printed grid may run much later, a SLURM job may be requeued)."""
        return [*self.train_args, "--init_from=auto"]


def build_grid(
    methods: list[str], scales: list[str], datasets: list[str], runs_root: Path, overrides: list[str], world_size: int
) -> list[GridRun]:
    """The runs of datasets x scales x methods; every command's config is parsed (and so checked)
    here, and every problem found is reported together, once each."""
    runs, problems = [], []
    for dataset in datasets:
        for scale in scales:
            config = str(config_file(dataset, scale).relative_to(REPO_ROOT))
            for method in methods:
                args = [config, *method_args(method), *overrides]
                try:
                    # The commands run in the repository root; this script may run anywhere.
                    parsed = parse_config([str(REPO_ROOT / config), *args[1:]], world_size=world_size)
                except ConfigError as e:
                    problems.append(f"{dataset} {scale} {method}: {e}")
                    continue
                config_name = parsed.train.config_name
                folder = grid_folder(method, parsed.overrides, runs_root / config_name)
                out_dir = runs_root / config_name / folder
                model = parsed.model_config()
                try:
                    train = resolve_wandb_names(resolve_paths(parsed.train, model, parsed.overrides), model)
                except ConfigError as e:  # WANDB_MODE of this shell: the same for every run, said once
                    problems.append(str(e))
                    continue
                conflicts = config_conflicts(REPO_ROOT / out_dir, parsed)
                settings = run_settings(parsed)  # what train.py compares with out_dir's config.json
                runs.append(
                    GridRun(dataset, scale, method, f"{config_name}/{folder}", out_dir, parsed.train.max_iters,
                            [*args, f"--out_dir={out_dir}"], train, conflicts, settings)
                )
    if problems:
        raise UsageError("\n".join(dict.fromkeys(problems)))
    return runs


def grid_folder(method: str, overrides: dict[str, Any], parent: Path) -> str:
    """A grid run's folder under parent (<runs_root>/<config_name>, from the repository root): the
    method's, and a suffix naming every key the command line sets to a value that computes otherwise
    (identity.run_suffix: '+optimizer=muon'), so the grid of another setting never lands in the paper
    grid's folders; keys a restart may change (max_iters) are left out, so a grid is extended in place.
    A folder an earlier form of the suffix named (methods.found_run_folder) is found again."""
    kept = {k: v for k, v in overrides.items() if k not in RESTART_FREE_KEYS}
    return Path(found_run_folder(str(parent / method_dirname(method)), kept, REPO_ROOT)).name


def check_run_folders(runs: list[GridRun], runs_root: str) -> None:
    """Every run folder can be made under --runs_root: refused before the first job starts or is
    submitted, never halfway through the grid."""
    for run in runs:
        try:
            check_folder(run.path, "run folder")
        except OutDirError as e:
            raise UsageError(f"--runs_root {runs_root!r} cannot hold the run folders: {e}") from None


def preflight(runs: list[GridRun]) -> list[str]:
    """What would make the jobs of this grid fail in their first second, each problem once:
    a dataset not prepared, W&B online without an API key."""
    problems = []
    for run in runs:
        data_dir = Path(run.train.data_dir)
        data_dir = data_dir if data_dir.is_absolute() else REPO_ROOT / data_dir
        missing = [name for name in ("train.bin", "val.bin", META_FILE) if not (data_dir / name).is_file()]
        if missing:
            problems.append(
                f"dataset {run.train.dataset} is not prepared: {data_dir} lacks {', '.join(missing)}; "
                f"run `python data/prepare.py {run.train.dataset}` first (or pass --data_dir=...)."
            )
        try:
            check_wandb(run.train)
        except ConfigError as e:
            problems.append(str(e))
    return list(dict.fromkeys(problems))


# -----------------------------------------------------------------------------
# Commands


@dataclass
class Layout:
    nproc_per_node: int
    nnodes: int
    node_rank: int
    rdzv_endpoint: str | None
    sbatch_args: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


def torchrun_command(run: GridRun, layout: Layout) -> list[str]:
    if layout.nnodes == 1:
        launcher = ["torchrun", "--standalone", f"--nproc_per_node={layout.nproc_per_node}"]
    else:
        launcher = [
            "torchrun",
            f"--nnodes={layout.nnodes}",
            f"--nproc_per_node={layout.nproc_per_node}",
            f"--node_rank={layout.node_rank}",
            f"--rdzv_id={run.slug}",  # one rendezvous per run, so consecutive runs never meet
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint={layout.rdzv_endpoint}",
        ]
    return [*launcher, "train.py", *run.args()]


def job_name(run: GridRun, stage: str) -> str:
    """The SLURM job name of a run's training or zero-shot job: what squeue is asked for."""
    return f"spheretnorm-{run.slug}" if stage == "train" else f"spheretnorm-zero_shot-{run.slug}"


def export_option(extra: list[str], env: dict[str, str] | None = None) -> str:
    """--export=ALL plus `extra` and the offline variables set in `env`, by name: they reach the
    job even where the cluster's sbatch would not pass the submitting environment on."""
    env = os.environ if env is None else env
    # A value with a comma cannot be written in --export; ALL still carries it.
    offline = [f"{k}={env[k]}" for k in OFFLINE_VARIABLES if env.get(k) and "," not in env[k]]
    return "--export=" + ",".join(["ALL", *extra, *offline])


def sbatch_command(run: GridRun, layout: Layout, wrapped: list[str] | None = None) -> list[str]:
    """sbatch of scripts/slurm_train.sh for training, or of `wrapped` (one GPU) for evaluation.

    layout.sbatch_args (partition, account, QOS, time limit, ...) go to sbatch as they are; what
    they leave out comes from SLURM's own SBATCH_* variables, then from the script's defaults.
    """
    options = [
        "sbatch",
        f"--job-name={job_name(run, 'train' if wrapped is None else 'zero_shot')}",
        f"--output={run.out_dir}/slurm-%x-%j.out",
        *layout.sbatch_args,
    ]
    if wrapped is not None:
        return [*options, "--nodes=1", "--gpus-per-node=1", export_option([]), f"--wrap={shlex.join(wrapped)}"]
    return [
        *options,
        f"--nodes={layout.nnodes}",
        f"--gpus-per-node={layout.nproc_per_node}",
        export_option([f"GPUS_PER_NODE={layout.nproc_per_node}"]),
        SLURM_SCRIPT,
        *run.args(),
    ]


def with_dependency(command: list[str], job_id: str) -> list[str]:
    """An sbatch command that starts only once job `job_id` has ended with exit status 0."""
    return [command[0], f"--dependency=afterok:{job_id}", *command[1:]]


def zero_shot_command(run: GridRun, eval_args: list[str]) -> list[str]:
    return [
        "python",
        "eval/zero_shot.py",
        f"--ckpt={run.out_dir}",  # the run folder: eval/zero_shot.py takes its newest checkpoint when it starts
        "--tasks=paper",
        f"--out={run.out_dir / ZERO_SHOT_NAME}",
        *eval_args,
    ]


# -----------------------------------------------------------------------------
# What SLURM already has: squeue, and the locks the submissions leave in the run folders


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
SBATCH_TIMEOUT_S = 300.0  # --sbatch_timeout sets it
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
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
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


# -----------------------------------------------------------------------------
# The plan


@dataclass(eq=False)
class Job:
    """One command of the plan: a run's training, or its zero-shot evaluation."""

    run: GridRun
    stage: str  # "train" or "zero_shot"
    command: list[str]
    # The training job this one waits for (sbatch --dependency=afterok): one planned here, or the
    # id of one already queued.
    after: Job | str | None = None
    note: str = ""  # said with the plan line
    job_id: str | None = None  # once submitted

    @property
    def name(self) -> str:
        return job_name(self.run, self.stage)


def plan(
    runs: list[GridRun], stage: str, mode: str, layout: Layout, eval_args: list[str],
    queue: Queue | None = None, chain_zero_shot: bool = False,
) -> tuple[list[Job], list[str]]:
    """([jobs to run], [why each other run is skipped]); queue (slurm) says what is already queued."""
    todo, skipped = [], []

    def add_zero_shot(run: GridRun, after: Job | str | None) -> None:
        job, reason = plan_zero_shot(run, mode, layout, eval_args, queue, after)
        todo.append(job) if job is not None else skipped.append(reason)

    for run in runs:
        if run.conflicts:
            skipped.append(conflict_reason(run))
            continue
        if stage == "zero_shot":
            add_zero_shot(run, None)
            continue
        if run.finished:
            skipped.append(f"{run.name}: finished (eval at iter {last_eval_iter(run.path)} >= max_iters {run.max_iters}, {checkpoint_path(run.path).name} there) in {run.out_dir}")
            if chain_zero_shot:
                add_zero_shot(run, None)
            continue
        stop = stopped_row(run.path)
        if stop is not None:  # resuming would stop again at the same point
            skipped.append(f"{run.name}: stopped: {stop['reason'].replace('_', '-')} at iter {stop['iter']} in {run.out_dir}; move that folder away (or change its settings) to run it again")
            continue
        active = queue.active(run, "train") if queue is not None else None
        if active is not None:
            skipped.append(f"{run.name}: {active.text}")
            if chain_zero_shot and active.job_id is not None:
                add_zero_shot(run, active.job_id)
            continue
        note = ""
        if reached_max_iters(run.path, run.max_iters):
            note = f"it reached max_iters {run.max_iters} but left no {written_checkpoint(run.train).name}, so it trains again"
            # Its settings are this grid's (config_conflicts): train.py may replace its files.
            run = replace(run, train_args=[*run.train_args, "--overwrite=true"]) if not run.train.overwrite else run
        elif not has_checkpoint(run.path) and not run.train.overwrite:
            earlier = earlier_run(run.path, run.settings)
            if earlier is not None:  # train.py would refuse to start over it
                skipped.append(
                    f"{run.name}: {run.out_dir} holds {earlier} but no {written_checkpoint(run.train).name} to resume; "
                    "move that folder away, or pass --overwrite=true to train it again from scratch"
                )
                continue
        command = sbatch_command(run, layout) if mode == "slurm" else torchrun_command(run, layout)
        job = Job(run, "train", command, note=note)
        todo.append(job)
        if chain_zero_shot:
            add_zero_shot(run, job)
    return todo, skipped


def plan_zero_shot(
    run: GridRun, mode: str, layout: Layout, eval_args: list[str], queue: Queue | None, after: Job | str | None
) -> tuple[Job | None, str]:
    """(the zero-shot job of run, "") or (None, why it is skipped); `after`: the training it waits for."""
    if after is None and not run.finished:
        if reached_max_iters(run.path, run.max_iters):
            return None, (
                f"{run.name}: reached max_iters {run.max_iters} but {run.out_dir} has no {written_checkpoint(run.train).name} to evaluate; "
                "train it again with --stage train (train.py now always saves the final state)"
            )
        training = queue.active(run, "train", submitting=False) if queue is not None else None
        queued = f"; its training job is queued ({training.text}): add --chain_zero_shot to a --stage train launch to evaluate it afterwards" if training else ""
        return None, f"{run.name}: not finished training, nothing to evaluate in {run.out_dir}{queued}"
    if is_evaluated(run.path):  # a --limit result does not count
        return None, f"{run.name}: already evaluated ({run.out_dir / ZERO_SHOT_NAME})"
    active = queue.active(run, "zero_shot") if queue is not None else None
    if active is not None:
        return None, f"{run.name}: {active.text}"
    command = zero_shot_command(run, eval_args)
    if mode == "slurm":
        command = sbatch_command(run, layout, wrapped=command)
    return Job(run, "zero_shot", command, after=after), ""


def conflict_reason(run: GridRun) -> str:
    return (
        f"{run.name}: {run.out_dir} holds a run with other settings ({'; '.join(run.conflicts)}); "
        "move that folder away or use another --runs_root to run it"
    )


def warn_conflicts(runs: list[GridRun]) -> None:
    """On stderr, so that skipped runs stand out even when stdout is a generated script."""
    clashing = [run.name for run in runs if run.conflicts]
    if clashing:
        print(
            f"warning: {len(clashing)} of {len(runs)} runs skipped, their folders hold runs with other "
            f"settings ({', '.join(clashing)}); the skip lines say which settings differ.",
            file=sys.stderr,
        )


def describe(job: Job) -> str:
    run = job.run
    if job.stage == "train":
        state = "resume" if has_checkpoint(run.path) else "new"
    elif isinstance(job.after, Job):
        state = "after its training job succeeds"
    elif isinstance(job.after, str):
        state = f"after training job {job.after} succeeds"
    else:
        state = "new"
    return f"# {run.name} ({job.stage}, {state}) -> {run.out_dir}" + (f"; {job.note}" if job.note else "")


def print_plan(todo: list[Job], skipped: list[str], notes: list[str] = ()) -> None:
    """Shell-ready: commands on their own lines, everything else as # comments.

    A training job that a zero-shot job waits for is submitted with --parsable into a shell
    variable, and the zero-shot job's --dependency reads it. Each run folder is made before its
    first sbatch: sbatch does not create the folder of --output, and a job whose log cannot be
    opened fails without one.
    """
    waited_for = {id(job.after) for job in todo if isinstance(job.after, Job)}
    variables: dict[int, str] = {}
    made: set[Path] = set()
    for job in todo:
        print(describe(job))
        if job.command[0] == "sbatch" and job.run.out_dir not in made:
            made.add(job.run.out_dir)
            print(shlex.join(["mkdir", "-p", str(job.run.out_dir)]))
        if isinstance(job.after, Job) and id(job.after) in variables:
            dependency = f'--dependency=afterok:"${{{variables[id(job.after)]}%%;*}}"'
            line = f"{shlex.join(job.command[:1])} {dependency} {shlex.join(job.command[1:])}"
        elif isinstance(job.after, str):
            line = shlex.join(with_dependency(job.command, job.after))
        else:
            line = shlex.join(job.command)
        if id(job) in waited_for:
            variables[id(job)] = f"job_{len(variables) + 1}"
            line = f"{variables[id(job)]}=$({shlex.join([job.command[0], '--parsable', *job.command[1:]])})"
        print(line)
    for note in notes:
        print(f"# note: {note}")
    for reason in skipped:
        print(f"# skip {reason}")
    if any(job.stage != todo[0].stage for job in todo):
        print(f"# {len(todo)} jobs to run, {len(skipped)} skipped")
    else:
        print(f"# {len(todo) + len(skipped)} runs: {len(todo)} to run, {len(skipped)} skipped")


def check_torchrun_found(todo: list[Job]) -> None:
    """Refuse in one line, before any run starts, when torchrun is not on PATH (a venv's python
    called by its path leaves the venv's bin folder off PATH): subprocess would end in a traceback."""
    if any(job.command[0] == "torchrun" for job in todo) and shutil.which("torchrun") is None:
        bin_dir = Path(sys.executable).parent
        raise UsageError(
            f"torchrun was not found on PATH; activate the environment that has torch (source {bin_dir / 'activate'}) "
            f"or add {bin_dir} to PATH, then launch again (or run each printed command with {sys.executable} -m torch.distributed.run)."
        )


def execute(todo: list[Job], mode: str) -> int:
    """Run the commands one after another on this machine; returns the number that failed."""
    check_torchrun_found(todo)
    failed = []
    for i, job in enumerate(todo, start=1):
        run = job.run
        print(f"[{i}/{len(todo)}] {run.name}: {shlex.join(job.command)}" + (f" ({job.note})" if job.note else ""), flush=True)
        run.path.mkdir(parents=True, exist_ok=True)
        status = subprocess.run(job.command, cwd=REPO_ROOT).returncode
        if status != 0:
            print(f"[{i}/{len(todo)}] {run.name} {exit_text(status)}; continuing.", flush=True)
            failed.append(run.name)
    print(f"{len(todo) - len(failed)} of {len(todo)} completed" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return len(failed)


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


def run_sbatch(command: list[str]) -> tuple[int | None, str, str]:
    """(exit status, stdout, stderr) of sbatch, or (None, "", why) when it did not answer within
    SBATCH_TIMEOUT_S (a hung slurmctld): the launch goes on, and the run's lock is released."""
    # A hung slurmctld holds sbatch for minutes: one line says so once it has waited a while.
    note = threading.Timer(SBATCH_WAIT_NOTE_S, lambda: print(
        f"note: waiting for sbatch to answer (it is stopped after {SBATCH_TIMEOUT_S:g} s; --sbatch_timeout=S sets that)", flush=True))
    note.daemon = True
    note.start()
    try:
        result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, encoding="utf-8",
                                errors="replace", timeout=SBATCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, "", f"sbatch did not answer within {SBATCH_TIMEOUT_S:g} s and was stopped"
    except OSError as e:
        return None, "", f"sbatch could not be started ({e.strerror or e})"
    finally:
        note.cancel()
    return result.returncode, result.stdout, result.stderr


def record_job(job: Job, entry: dict[str, Any], lock: Path) -> list[str]:
    """Write the job id into its lock and the run's slurm_jobs.json; the notes to print. A write
    that fails (a full disk) is an OSError the caller reports with the job id."""
    write_json_atomic(lock, {**entry, "pid": os.getpid(), "host": socket.gethostname(), "claimed_at": time.time()})
    note = record_submission(job.run, entry)
    return [note] if note else []


def release(lock: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        lock.unlink()


def submit(todo: list[Job], queue: Queue, skipped: int = 0) -> int:
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
            release(lock)
            print(f"{label}: not submitted, {run.out_dir} could not be written ({e.strerror or e}); continuing.", flush=True)
            failed.append(f"{run.name} ({job.stage})")
            continue
        if not claimed:
            print(f"{label}: skipped, another launch.py has just claimed {run.out_dir / lock.name}.", flush=True)
            continue
        status, stdout, stderr = run_sbatch(command)
        job.job_id = submitted_job_id(stdout) if status == 0 else None
        if job.job_id is None:  # sbatch's own words, when they are not the job id said below
            sys.stdout.write(stdout)
        sys.stderr.write(stderr if status is not None else "")
        twice = given.get(job.job_id) if job.job_id is not None else None
        if status != 0 or job.job_id is None or twice is not None:
            release(lock)
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
        try:
            notes = record_job(job, entry, lock)
        except OSError as e:
            print(f"{label}: submitted job {job.job_id}, but it could not be recorded in {run.out_dir} ({e.strerror or e}); "
                  f"squeue still finds it by name, so launching again will not submit it twice.", flush=True)
            unrecorded.append(f"{run.name} ({job.stage}) job {job.job_id}")
            continue
        for note in notes:
            print(f"{label}: note: {note}", flush=True)
        print(f"{label}: submitted job {job.job_id}" + (f", to start after job {after} succeeds" if after else ""), flush=True)
    print(f"{n - len(failed)} submitted" + (f", {len(failed)} failed: {', '.join(failed)}" if failed else "")
          + (f", {len(unrecorded)} not recorded: {', '.join(unrecorded)}" if unrecorded else "") + f", {skipped} skipped")
    return len(failed) + len(unrecorded)


# -----------------------------------------------------------------------------
# Command line


def imports_notes(overrides: list[str]) -> list[str]:
    """What a job needs to find the modules of --imports that came from this folder, not sys.path:
    the jobs started here inherit it on PYTHONPATH (runtime/imports.py), a printed command does not."""
    return [
        f"--imports found modules in {folder}, which is not on sys.path: the jobs started here get it on PYTHONPATH; "
        f"run printed commands with PYTHONPATH={shlex.quote(folder)}"
        for folder in folders_off_sys_path(imports_of_overrides(overrides))
    ]


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
        allow_abbrev=False,  # so an unknown --key=value is a train.py override, never a prefix match
    )
    p.add_argument("--methods", default="paper", help="'paper' (the 8 of the paper), 'all', or a comma-separated list such as pre_ln,p_spheret:0.5")
    p.add_argument("--scales", default=",".join(PAPER_SCALES), help=f"comma-separated subset of {','.join(SCALES)} (default {','.join(PAPER_SCALES)}, the paper's; XL trains with FSDP, as its config sets)")
    p.add_argument("--datasets", default=",".join(PAPER_DATASETS), help="comma-separated subset of fineweb_edu,openwebtext")
    p.add_argument("--mode", choices=MODES, default="local", help="run the commands here, print them, or submit them with sbatch")
    p.add_argument("--stage", choices=STAGES, default="train", help="train, or zero_shot (evaluate finished runs)")
    p.add_argument("--dry_run", action="store_true", help="print the commands instead of running them")
    p.add_argument("--runs_root", default="out", help="the run folders go to RUNS_ROOT/<dataset>_<scale>/<method>; relative to the repository root (default: out)")
    p.add_argument("--nproc_per_node", type=int, default=None, help="GPUs per node (default: $SBATCH_GPUS_PER_NODE, else 8)")
    p.add_argument("--nnodes", type=int, default=None, help="nodes per run (default: $SBATCH_NODES, else 1)")
    p.add_argument("--sbatch_args", default="", help="options for every sbatch call, as one string: --sbatch_args=\"--partition=gpu --account=lab --qos=high --time=12:00:00 --cpus-per-task=16\"; SLURM's SBATCH_* variables work too")
    p.add_argument("--sbatch_timeout", type=float, default=SBATCH_TIMEOUT_S,
                   help=f"seconds to wait for each sbatch to answer before stopping it (default {SBATCH_TIMEOUT_S:g}); a line says when it waits")
    p.add_argument("--node_rank", type=int, default=0, help="this node's rank, for a multi-node local launch")
    p.add_argument("--rdzv_endpoint", default=None, help="HOST:PORT where the nodes of a multi-node local launch meet")
    p.add_argument("--eval_args", default="", help="extra arguments for eval/zero_shot.py, as one string")
    p.add_argument(
        "--chain_zero_shot", action="store_true",
        help="with --mode slurm --stage train: also submit each run's zero-shot job, held until its training job succeeds (sbatch --dependency=afterok:<training job id>)",
    )
    return p.parse_known_args(argv)


def env_count(name: str, default: int, env: dict[str, str] | None = None) -> int:
    """A count from a SLURM variable such as SBATCH_GPUS_PER_NODE ('8' or 'a100:8'), else default
    when it is unset; any other value is refused (sbatch itself would read it too)."""
    env = os.environ if env is None else env
    text = env.get(name, "").strip()
    if not text:
        return default
    match = re.fullmatch(r"(?:[A-Za-z0-9_-]*:)?(\d+)", text)
    if match is None or int(match.group(1)) < 1:
        form = "a whole number >= 1 or TYPE:COUNT such as a100:8" if name == "SBATCH_GPUS_PER_NODE" else "a whole number >= 1"
        option = LAYOUT_VARIABLES.get(name, "")
        raise UsageError(f"{name}={env[name]!r} is not a count the launcher can use; set it to {form}, or unset it{f' and pass {option}' if option else ''}.")
    return int(match.group(1))


# The SLURM variables the launcher's layout options default to.
LAYOUT_VARIABLES = {"SBATCH_GPUS_PER_NODE": "--nproc_per_node", "SBATCH_NODES": "--nnodes"}

# sbatch's short options and their long names: those that take a value, and those that do not
# (-I and -k take an optional value, attached only).
SBATCH_SHORT_VALUES = {
    "A": "account", "a": "array", "b": "begin", "C": "constraint", "c": "cpus-per-task", "D": "chdir",
    "d": "dependency", "e": "error", "F": "nodefile", "G": "gpus", "i": "input", "J": "job-name",
    "L": "licenses", "M": "clusters", "m": "distribution", "N": "nodes", "n": "ntasks", "o": "output",
    "p": "partition", "q": "qos", "S": "core-spec", "t": "time", "w": "nodelist", "x": "exclude",
}
SBATCH_SHORT_FLAGS = {
    "H": "hold", "h": "help", "I": "immediate", "k": "no-kill", "O": "overcommit", "Q": "quiet",
    "s": "oversubscribe", "u": "usage", "V": "version", "v": "verbose", "W": "wait",
}
# Long options that take no value (or an optional one, given only as --name=value).
SBATCH_LONG_FLAGS = frozenset({
    *SBATCH_SHORT_FLAGS.values(), "exclusive", "requeue", "no-requeue", "parsable", "test-only", "contiguous",
    "spread-job", "use-min-nodes", "ignore-pbs", "reboot", "get-user-env", "nice", "propagate", "overcommit",
})
# sbatch options that the launcher sets itself, so that the job's name (what squeue is asked
# for), its log, and its allocation agree with torchrun and the batch-size checks: how instead.
OWNED_SBATCH_OPTIONS = {
    "nodes": "from --nnodes; use that instead",
    "gpus-per-node": "from --nproc_per_node; use that instead",
    "gpus": "from --nproc_per_node (GPUs per node, one process each); use that instead",
    "gres": "from --nproc_per_node as --gpus-per-node; use that instead",
    "ntasks": "to one task per node (torchrun starts the processes); leave it out",
    "ntasks-per-node": "to one task per node (torchrun starts the processes); leave it out",
    "job-name": "from each run's name, which squeue is asked for; leave it out",
    "output": "to each run's folder (slurm-%x-%j.out); leave it out",
    "error": "to each run's log in its folder (with --output); leave it out",
    "export": "to ALL plus the offline variables; set variables in this shell instead",
    "wrap": "for zero-shot jobs only; leave it out",
}
# Options that may be given more than once.
REPEATABLE = frozenset({"verbose", "quiet"})


def taken(options: list[str], i: int) -> str:
    """What sbatch would read as the value of an option that has none: the next word, or the script."""
    return repr(options[i]) if i < len(options) else "the option the launcher adds next"


def sbatch_option_words(options: list[str]) -> list[tuple[str, str, str | None]]:
    """(as written, sbatch's long name, value or None) of each option in `options`, as sbatch's
    getopt reads them: -N2, -N 2, --nodes=2 and --nodes 2 are one option, nodes=2."""
    found, i = [], 0
    while i < len(options):
        word = options[i]
        i += 1
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            if not eq:
                value = None
                if name not in SBATCH_LONG_FLAGS and i < len(options) and not options[i].startswith("-"):
                    value, i = options[i], i + 1
                elif name in OWNED_SBATCH_OPTIONS or name in SBATCH_SHORT_VALUES.values():
                    raise UsageError(f"--sbatch_args gives {word} no value (sbatch would take {taken(options, i)} as its value); write {word}=VALUE.")
            found.append((word, name, value))
        elif word.startswith("-") and len(word) > 1 and word != "--":
            j = 1
            while j < len(word):  # a cluster of short options: -vH, -N2, -HN2
                letter = word[j]
                j += 1
                if letter in SBATCH_SHORT_VALUES:
                    value = word[j:]
                    if not value:
                        if i >= len(options) or options[i].startswith("-"):
                            raise UsageError(f"--sbatch_args gives -{letter} no value (sbatch would take {taken(options, i)} as its value); write -{letter} VALUE.")
                        value, i = options[i], i + 1
                    found.append((f"-{letter} {value}", SBATCH_SHORT_VALUES[letter], value))
                    break
                if letter in SBATCH_SHORT_FLAGS:
                    found.append((f"-{letter}", SBATCH_SHORT_FLAGS[letter], word[j:] or None if letter in "Ik" else None))
                    if letter in "Ik":
                        break
                    continue
                raise UsageError(f"--sbatch_args has {word!r}, and -{letter} is not an option of sbatch; give sbatch's options, such as --partition=gpu --time=12:00:00.")
        else:
            raise UsageError(
                f"--sbatch_args has {word!r}, which is not an option: sbatch would take it as the batch script "
                f"instead of {SLURM_SCRIPT}; give options only, such as --partition=gpu --time=12:00:00."
            )
    return found


def parse_sbatch_args(text: str) -> list[str]:
    """The options of --sbatch_args, checked before anything is submitted: none the launcher sets
    itself (in any of its forms), none given twice, no bare word, none missing its value."""
    try:
        options = shlex.split(text)
    except ValueError as e:
        raise UsageError(f"--sbatch_args {text!r} cannot be split into options ({e}).") from None
    seen: dict[str, str] = {}
    for written, name, value in sbatch_option_words(options):
        if name in OWNED_SBATCH_OPTIONS and (name != "gres" or "gpu" in (value or "")):
            long = f"--{name}"
            shown = long if written.split("=", 1)[0] == long else f"{written.split(' ', 1)[0]} ({long})"
            raise UsageError(f"--sbatch_args sets {shown}, which the launcher sets {OWNED_SBATCH_OPTIONS[name]}.")
        if name in seen and name not in REPEATABLE:
            raise UsageError(f"--sbatch_args gives --{name} twice ({seen[name]} and {written}); give it once.")
        seen[name] = written
    return options


def check_layout(args: argparse.Namespace) -> Layout:
    """The layout of every job, and the sbatch options, checked before anything runs."""
    for name, variable, default in (("nproc_per_node", "SBATCH_GPUS_PER_NODE", 8), ("nnodes", "SBATCH_NODES", 1)):
        if getattr(args, name) is None:
            setattr(args, name, env_count(variable, default))
        elif args.mode == "slurm":  # sbatch reads the variable too, whatever the command line says
            env_count(variable, default)
    for name in ("nproc_per_node", "nnodes"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be a positive integer, got {getattr(args, name)}.")
    if not 0 <= args.node_rank < args.nnodes:
        raise UsageError(f"--node_rank {args.node_rank} is not valid with --nnodes {args.nnodes}; use 0 to {args.nnodes - 1}.")
    if args.chain_zero_shot and (args.mode, args.stage) != ("slurm", "train"):
        bad = f"--mode {args.mode}" if args.mode != "slurm" else f"--stage {args.stage}"
        raise UsageError(f"--chain_zero_shot does not work with {bad}; it needs --mode slurm and --stage train (it queues each run's zero-shot job after its training job).")
    multi_node_local = args.nnodes > 1 and args.mode != "slurm" and args.stage == "train"
    if multi_node_local and not args.rdzv_endpoint:
        raise UsageError("--nnodes > 1 outside SLURM needs --rdzv_endpoint HOST:PORT (the address of one of the nodes).")
    return Layout(args.nproc_per_node, args.nnodes, args.node_rank, args.rdzv_endpoint, parse_sbatch_args(args.sbatch_args))


def main(argv: list[str] | None = None) -> int:
    global SBATCH_TIMEOUT_S
    args, overrides = parse_args(argv)
    try:
        if not args.sbatch_timeout > 0:
            raise UsageError(f"--sbatch_timeout {args.sbatch_timeout:g} is not valid; give a positive number of seconds, such as 300.")
        SBATCH_TIMEOUT_S = args.sbatch_timeout
        layout = check_layout(args)
        check_overrides(overrides, RESERVED)
        runs = build_grid(
            parse_methods(args.methods),
            parse_choices(args.scales, SCALES, "scales"),
            parse_choices(args.datasets, PAPER_DATASETS, "datasets"),
            Path(args.runs_root),
            overrides,
            layout.world_size if args.stage == "train" else 1,  # an evaluation job takes one GPU
        )
        queue = None
        if args.mode == "slurm":  # what is already queued or running is not submitted again
            queue = Queue.ask([job_name(run, stage) for run in runs for stage in STAGES])
        todo, skipped = plan(runs, args.stage, args.mode, layout, shlex.split(args.eval_args), queue, args.chain_zero_shot)
        notes = [*(queue.notes if queue is not None else []), *imports_notes(overrides)]
        warn_conflicts(runs)
        problems = preflight([job.run for job in todo if job.stage == "train"])
        if args.dry_run or args.mode == "print":
            for problem in problems:  # a plan may be printed on a machine without the data
                print(f"warning: {problem}", file=sys.stderr)
            print_plan(todo, skipped, notes)
            return 0
        if problems:
            raise UsageError(f"nothing was started, {len(problems)} problem(s) would make the jobs fail at start:\n" + "\n".join(problems))
        check_run_folders([job.run for job in todo], args.runs_root)
        if queue is not None:
            check_slurm_files(todo)
        for note in notes:
            print(f"note: {note}")
        for reason in skipped:
            print(f"skip {reason}")
        failed = submit(todo, queue, len(skipped)) if queue is not None else execute(todo, args.mode)
        return 1 if failed else 0
    except (UsageError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
