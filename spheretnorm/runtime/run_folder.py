"""What a training run leaves in its out_dir, and the ways a run can end.

train.py writes a run folder; the experiment scripts (spheretnorm/experiments/, the export)
read it. Both sides take the file names, the exit statuses and the stop reasons from here.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spheretnorm.runtime.atomic import replace_file
from spheretnorm.runtime.identity import run_conflicts

if TYPE_CHECKING:
    from spheretnorm.runtime.config import TrainConfig

CKPT_NAME = "ckpt.pt"
SHARDED_CKPT_NAME = "ckpt.dcp"  # --parallel=fsdp's checkpoint, a folder (runtime/checkpoint/sharded.py)
# What a stop signal writes while the collapse alarm is counting (the last evaluation above
# collapse_cosine): the current state, beside the last healthy checkpoint, which stays as it was.
STOP_CKPT_NAME = "ckpt.stop.pt"
SHARDED_STOP_CKPT_NAME = "ckpt.stop.dcp"
METRICS_NAME = "metrics.jsonl"
CONFIG_NAME = "config.json"
AVG_WINDOW = 200  # the paper reports the train loss averaged over the last 200 iterations


# Exit statuses of train.py, one per way a run can end (README, "Training"). A stopped or
# crashed run also writes a {"kind": "stop", "reason": ...} row to metrics.jsonl.
EXIT_OK = 0  # finished, or stopped by SIGTERM/SIGUSR1/SIGINT (a checkpoint to resume from, if any step ran)
# An unexpected exception (a bug, out of memory: traceback on stderr), or a failure of the machine
# around the run, in one line: a file that could not be written (a full disk), a peer process
# that stopped answering (dist_timeout). Resumable from the last checkpoint.
EXIT_CRASH = 1
EXIT_CONFIG = 2  # a bad config or device, refused before any training; or a loss term that breaks its contract (LossTermError)
EXIT_COLLAPSE = 3  # representation collapse: final_cosine above collapse_cosine for collapse_evals evaluations
EXIT_NON_FINITE = 4  # the loss or gradient norm became nan/inf


class RunStopped(RuntimeError):
    """The run stopped itself for a reason its stop row and exit status name."""

    reason = ""
    exit_code = EXIT_CRASH
    # Whether every rank decided this stop together, from the same all-reduced numbers: then the
    # ranks leave together (distributed.leave_process_group) and rank 0 alone says why.
    shared = False


class OutDirError(ValueError):
    """out_dir cannot hold a run (a file, or not writable): refused before any work."""


class WriteFailed(RunStopped):
    """A run output could not be written (a full disk, a read-only file system)."""

    reason = "write_failed"


class PeerTimeout(RunStopped):
    """A collective waited longer than dist_timeout for another process."""

    reason = "peer_timeout"


class PeerLost(RunStopped):
    """A collective found another process gone (killed, or ended while this one was stopped)."""

    reason = "peer_lost"


class NonFiniteLossError(RunStopped):
    """The loss (or gradient norm) became nan/inf; the run stops without saving."""

    reason = "non_finite"
    exit_code = EXIT_NON_FINITE
    shared = True  # the loss and gradient norm are all-reduced first

    @classmethod
    def at(cls, what: str, value: float, iteration: int, kept: str) -> NonFiniteLossError:
        """`what` (a loss, a gradient norm) became `value` at `iteration`; `kept` names the checkpoint
        a resume would start from (tracking.Progress.kept_checkpoint_text)."""
        return cls(f"{what} became {value} at iter {iteration}; stopping without saving: {kept}.")


class LossTermError(RunStopped):
    """A loss term of the user's (runtime/loss_terms.py) raised, or returned other than a finite
    scalar tensor: the term's code is wrong, as a bad config is, so the run stops with its status."""

    reason = "loss_term"
    exit_code = EXIT_CONFIG

    def __init__(self, message: str, shared: bool = False) -> None:
        super().__init__(message)
        self.shared = shared  # True where every rank judged the all-reduced total (step.check_terms_finite)


class CollapseError(RunStopped):
    """Every token's final state has become one point; the run stops without saving."""

    reason = "collapse"
    exit_code = EXIT_COLLAPSE
    shared = True  # rank 0's final_cosine is all-reduced first


def checkpoint_path(train: TrainConfig) -> Path:
    """out_dir/ckpt.pt, or under parallel=fsdp the sharded folder out_dir/ckpt.dcp."""
    return Path(train.out_dir) / (SHARDED_CKPT_NAME if train.parallel == "fsdp" else CKPT_NAME)


def stop_checkpoint_path(train: TrainConfig) -> Path:
    """out_dir/ckpt.stop.pt (under fsdp the folder ckpt.stop.dcp): a stop's state during a collapse-alarm streak."""
    return Path(train.out_dir) / (SHARDED_STOP_CKPT_NAME if train.parallel == "fsdp" else STOP_CKPT_NAME)


def has_checkpoint(train: TrainConfig) -> bool:
    """Whether out_dir holds a checkpoint of this parallel mode to resume: a healthy one or a stop's."""
    return checkpoint_path(train).exists() or stop_checkpoint_path(train).exists()


def holds_any_checkpoint(out_dir: Path) -> bool:
    """has_checkpoint for any parallel mode, from the folder alone (a sweep that has not parsed the
    run's settings): whether train.py --init_from=auto would resume there."""
    return any((out_dir / name).exists() for name in (CKPT_NAME, SHARDED_CKPT_NAME, STOP_CKPT_NAME, SHARDED_STOP_CKPT_NAME))


def missing_resume_text(path: Path) -> str:
    """The one line for init_from=resume with no checkpoint at `path`: the folder it looked in, the
    runs beside it that could be meant (a key changed on the command line names another default
    folder, out/<config>/<method>+key=value), and how to resume one of them with the change."""
    folder = path.parent
    method = folder.name.split("+")[0]
    beside = sorted(p for p in folder.parent.glob(f"{glob.escape(method)}*")
                    if p != folder and p.name.split("+")[0] == method and holds_any_checkpoint(p)) if folder.parent.is_dir() else []
    text = f"init_from=resume but {folder} holds no checkpoint to resume (looked for {path.name})"
    if not beside:
        return text + "; name the run's folder with --out_dir=RUN (or give RUN/config.json), or start it with --init_from=scratch."
    named = ", ".join(str(p) for p in beside[:3]) + (f" and {len(beside) - 3} more" if len(beside) > 3 else "")
    return (f"{text}: a key given on the command line names this folder, and runs of the same method with a checkpoint are in "
            f"{named}; to resume one with the keys you give changed, name it: --out_dir={beside[0]} --init_from=resume.")


def remove_stop_checkpoint(train: TrainConfig) -> None:
    """A healthy save makes a stop's checkpoint stale: removed, so that a resume takes the newer one."""
    stopped = stop_checkpoint_path(train)
    if stopped.is_dir():
        shutil.rmtree(stopped, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            stopped.unlink()


def check_checkpoint_kind(train: TrainConfig) -> None:
    """Refuse a resume that would miss the checkpoint the other parallel mode wrote (a new run over
    it is refused as any other run's files are). What an interrupted sharded save left is settled
    before (checkpoint.settle_interrupted_save)."""
    folder = Path(train.out_dir) / SHARDED_CKPT_NAME
    own = checkpoint_path(train)
    other, mode = (Path(train.out_dir) / CKPT_NAME, "ddp") if train.parallel == "fsdp" else (folder, "fsdp")
    if own.exists() or stop_checkpoint_path(train).exists() or not other.exists() or not (train.init_from in ("resume", "auto") or train.eval_only):
        return
    hint = f", or turn it into a {CKPT_NAME} with `python scripts/consolidate.py {other}`" if mode == "fsdp" else ""
    raise OutDirError(
        f"out_dir {str(train.out_dir)!r} holds {other.name}, the checkpoint of --parallel={mode}, and no {own.name} "
        f"for --parallel={train.parallel}; resume it with --parallel={mode}{hint}."
    )


class MetricsLog:
    """metrics.jsonl: one JSON object per line, flushed at once so a crash loses nothing.

    A resumed run first drops the previous attempt's rows past the checkpoint's iteration, so every
    iteration appears once, and its stop rows (the ending the resume abandons).
    """

    def __init__(self, path: Path, resume_iter: int | None):
        self.path = path
        self.dropped: list[dict[str, Any]] = []  # the previous attempt's rows a resume removed (dropped_text says which)
        kept = self._rows_up_to(resume_iter) if resume_iter is not None else []
        text = "".join(json.dumps(row) + "\n" for row in kept)
        try:  # the old file stays whole until the new one is; a failed write leaves no temp file
            replace_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), temp=path.with_name(path.name + ".tmp"))
        except OSError as e:  # one line, as a failed checkpoint write: machine_failure
            raise OSError(e.errno or 0, f"could not rewrite {path} ({e.strerror or e}); it is as it was") from None
        # Unbuffered bytes: each row reaches the file in write(), so close() has nothing left to
        # flush (a full disk cannot fail there), and a row that does not fit can be cut back out.
        self._file = open(path, "ab", buffering=0)

    def _rows_up_to(self, last_iter: int) -> list[dict[str, Any]]:
        rows = []
        for row in read_metrics(self.path) if self.path.is_file() else []:
            if row.get("iter", 0) <= last_iter and row.get("kind") != "stop":
                rows.append(row)
            else:
                self.dropped.append(row)
        return rows

    def dropped_text(self, resume_iter: int) -> str | None:
        """The line that says what a resume removed from metrics.jsonl: the previous attempt's stop
        row (its reason and iteration) and the rows past the checkpoint's iteration; None for nothing."""
        if not self.dropped:
            return None
        stops = [f"{r.get('reason', '?')} at iter {r.get('iter', '?')}" for r in self.dropped if r.get("kind") == "stop"]
        past = sum(r.get("kind") != "stop" for r in self.dropped)
        parts = ([f"the previous attempt's stop row ({'; '.join(stops)})"] if stops else []) + \
                ([f"{past} row(s) past iteration {resume_iter}, which the checkpoint does not hold"] if past else [])
        return f"NOTE: resuming from iteration {resume_iter}, {self.path.name} drops {' and '.join(parts)}."

    def write(self, row: dict[str, Any]) -> None:
        """Append one row, whole or not at all: a write that fails (a full disk) takes back the
        part of the line it wrote and raises an OSError naming the file."""
        data = (json.dumps(row) + "\n").encode("utf-8")
        end = os.fstat(self._file.fileno()).st_size
        try:
            written = 0
            while written < len(data):  # a raw write may take only part of the line
                written += self._file.write(data[written:]) or 0
        except OSError as e:
            with contextlib.suppress(OSError):  # shrinking a file needs no free space
                os.ftruncate(self._file.fileno(), end)
            raise OSError(e.errno or 0, e.strerror or str(e), str(self.path)) from None

    def close(self) -> None:
        with contextlib.suppress(OSError):  # nothing is buffered: there is nothing to lose here
            self._file.close()


# What a run folder holds besides user files: removed together when a run is replaced.
RUN_FILES = (CKPT_NAME, CKPT_NAME + ".tmp", STOP_CKPT_NAME, STOP_CKPT_NAME + ".tmp", METRICS_NAME, METRICS_NAME + ".tmp", CONFIG_NAME)
RUN_FOLDERS = tuple(name + suffix for name in (SHARDED_CKPT_NAME, SHARDED_STOP_CKPT_NAME) for suffix in ("", ".tmp", ".old"))


def remove_run(out_dir: Path) -> list[str]:
    """Delete the run in out_dir (checkpoint, metrics, config and zero-shot results) as a whole,
    so that a replacing run never mixes with what it replaces; returns the names removed."""
    removed = []
    for path in [*(out_dir / name for name in RUN_FILES), *out_dir.glob(ZERO_SHOT_GLOB)]:
        if path.is_file():
            with contextlib.suppress(FileNotFoundError):  # another rank removed it first
                path.unlink()
                removed.append(path.name)
    for path in (out_dir / name for name in RUN_FOLDERS):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)  # another rank may be removing it too
            removed.append(path.name)
    return removed


ZERO_SHOT_GLOB = "ckpt_zero_shot*.json"


def earlier_run(out_dir: str | Path, wanted: dict[str, Any] | None = None) -> str | None:
    """What a new run started in out_dir, which has no ckpt.pt, would replace: a phrase naming the
    files; None when nothing, or only the start of this same run (restarted before its first
    checkpoint): its config.json has the settings in `wanted` (identity.run_settings; None: not
    compared), no eval row past iter 0 and no zero-shot results, nothing the new run does not write again.
    """
    out = Path(out_dir)
    found = [name for name in (METRICS_NAME, CONFIG_NAME) if (out / name).is_file()]
    found += sorted(p.name for p in out.glob(ZERO_SHOT_GLOB) if p.is_file()) if out.is_dir() else []
    if not found:
        return None
    files = ", ".join(found)
    if any(name not in (METRICS_NAME, CONFIG_NAME) for name in found):
        return f"an earlier run's {files} (its zero-shot results)"
    rows = read_metrics(out / METRICS_NAME) if METRICS_NAME in found else []
    evaluated = [r["iter"] for r in rows if isinstance(r, dict) and r.get("kind") == "eval" and isinstance(r.get("iter"), int)]
    if evaluated and max(evaluated) > 0:
        return f"an earlier run's {files} (evaluated up to iter {max(evaluated)})"
    if wanted is None:
        return None
    try:
        saved = json.loads((out / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        saved = None
    if not isinstance(saved, dict):
        return f"an earlier run's {files} (with no readable {CONFIG_NAME} to tell whose)"
    differ = run_conflicts(saved, wanted)
    if differ:
        return f"an earlier run's {files} with other settings ({'; '.join(differ[:3])})"
    return None


def check_no_earlier_run(train: TrainConfig, wanted: dict[str, Any] | None) -> None:
    """A new run (init_from scratch, hf:DIR, or auto without a checkpoint) never replaces another
    run's files without overwrite=true; the same run starting again is no other run (earlier_run)."""
    if train.overwrite or train.eval_only:
        return
    found = earlier_run(train.out_dir, wanted)
    if found is not None:
        raise OutDirError(
            f"out_dir {str(train.out_dir)!r} holds {found} but no {checkpoint_path(train).name} to resume, and init_from={train.init_from} "
            "would start a new run over it; pass --overwrite=true to remove that run first, or give another --out_dir."
        )


# What scripts/launch.py --mode slurm keeps in a run folder (never removed with a run: the jobs
# may still be queued): one lock per stage naming the job submitted last, and every job submitted.
SLURM_JOBS_NAME = "slurm_jobs.json"


def slurm_lock_name(stage: str) -> str:
    """'slurm_train.lock', 'slurm_zero_shot.lock': the job of that stage submitted for this run."""
    return f"slurm_{stage}.lock"


def write_json_atomic(path: Path, value: Any) -> None:
    """path holds the JSON of value, or what it held before: never a half-written file."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, lambda tmp: tmp.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8"))


def check_out_dir(train: TrainConfig) -> None:
    """out_dir must be a folder this process can write to: found before any work, in one line."""
    check_folder(Path(train.out_dir), "out_dir")


def check_folder(out: Path, what: str) -> None:
    """`out` is, or can be made, a folder this process can write to (OutDirError, naming it as `what`);
    the probe leaves nothing behind: folders it had to create are removed again."""
    if out.exists() and not out.is_dir():
        raise OutDirError(f"{what} {str(out)!r} is a file; give a folder (it is created if missing).")
    if out.is_symlink() and not out.exists():  # mkdir would say only "File exists"
        raise OutDirError(f"{what} {str(out)!r} is a link to {os.readlink(out)!r}, which does not exist; create that folder, or give another {what}.")
    blocking = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise OutDirError(f"{what} {str(out)!r} cannot be created because {str(blocking)!r} is a file; give a path under a folder.")
    missing = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write_probe.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise OutDirError(f"{what} {str(out)!r} cannot be written to ({e.strerror or e}); give a writable folder.") from None
    finally:
        for folder in missing:  # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()


def collective_timed_out(error: BaseException) -> bool:
    """Whether `error` is a collective giving up after dist_timeout (gloo raises a plain RuntimeError)."""
    import torch.distributed as torch_dist

    dist_error = getattr(torch_dist, "DistError", ())
    return isinstance(error, RuntimeError) and (isinstance(error, dist_error) or "timed out" in str(error).lower())


# What gloo and NCCL say when the process at the other end of a connection is gone (killed, or
# ended by torchrun while this one was stopped): "Read error [10.0.0.2]:4242: Connection reset by
# peer", "Connection closed by peer [10.0.0.2]:4242", "Application timeout caused pair closure".
LOST_PEER_PHRASES = ("closed by peer", "reset by peer", "broken pipe", "pair closure", "remote process exited", "communicator was aborted")


def collective_lost_peer(error: BaseException) -> bool:
    """Whether `error` is a collective that found its peer process gone (a plain RuntimeError under gloo)."""
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(phrase in text for phrase in LOST_PEER_PHRASES)


def lost_rank_text(rank: int, world_size: int, error: BaseException) -> str:
    """Which rank a lost connection was to: of two processes the other one; of more, the
    connection's address only (gloo's message names no rank)."""
    if world_size == 2:
        return f"rank {1 - rank}"
    address = re.search(r"\[[0-9a-fA-F.:]+\]:\d+", str(error))
    return f"another rank{f' (at {address.group(0)})' if address else ''}"


def machine_failure(error: BaseException, dist_timeout: float, kept: str, rank: int = 0, world_size: int = 1) -> RunStopped | None:
    """The one-line stop for a failure of the machine around a run, None for anything else: a file
    that could not be written is WriteFailed, a collective that gave up waiting for a peer
    PeerTimeout, one that found its peer gone PeerLost. kept says which checkpoint a resume would
    start from; rank and world_size are this process's, to name the rank that was lost.
    """
    if isinstance(error, RunStopped):
        return None
    if isinstance(error, OSError):
        text = error.strerror or str(error)
        return WriteFailed(f"{text}{f': {error.filename}' if error.filename else ''}; {kept}.")
    if collective_lost_peer(error):
        return PeerLost(
            f"rank {rank} lost its connection to {lost_rank_text(rank, world_size, error)} (the process was killed or "
            f"ended while this one waited); {kept}; resume with --init_from=auto."
        )
    if collective_timed_out(error):
        detail = re.sub(r"^\[[^]]*\]\s*", "", str(error).splitlines()[0])[:200]  # no C++ source location
        return PeerTimeout(
            f"a collective waited longer than dist_timeout={dist_timeout:g} s for another process "
            f"(stopped, dead or unreachable: {detail}); {kept}; resume with --init_from=auto."
        )
    return None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl; a line cut short by a crash is skipped."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def evaluated_at(out_dir: str | Path, iter_num: int) -> bool:
    """Whether out_dir's metrics.jsonl has an eval row at iter_num. A run stopped by a signal during
    its final evaluation has its final checkpoint but not that row: train.py's resume evaluates it
    then, so that the run has its last eval row and counts as finished."""
    path = Path(out_dir) / METRICS_NAME
    rows = read_metrics(path) if path.is_file() else []
    return any(isinstance(r, dict) and r.get("kind") == "eval" and r.get("iter") == iter_num for r in rows)
