"""Sharded checkpoints of an FSDP run: written by every rank at once, read back on any number.

The folder (out_dir/ckpt.dcp) is a torch.distributed.checkpoint folder of the model's and the
optimizer's state by parameter name (so a resume on another number of ranks reshards it), plus
meta.pt (runtime/checkpoint.py's SHARDED_META: config, progress, RNG, and the save's id with the
size and digest of each of its files, so that a file of another save is refused). It is written as
ckpt.dcp.tmp and renamed when whole, so a crash or a full disk mid-write leaves the previous
checkpoint as it was; between the two renames of a replacement the previous one is ckpt.dcp.old.
The next start settles whatever an interrupted save left (settle_interrupted_save: the newest whole
checkpoint is kept), and a save removes a leftover ckpt.dcp.old that would block its renames.

    python scripts/consolidate.py out/RUN/ckpt.dcp [--out out/RUN/ckpt.pt] [--overwrite]

turns a folder into one ckpt.pt of the usual format (consolidate), in one process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from spheretnorm.optim import Optimizers, build_optimizer
from spheretnorm.runtime.config import ConfigError, TrainConfig, optimizer_settings
from spheretnorm.runtime.checkpoint import (
    DCP_METADATA,
    SHARD_SUFFIX,
    SHARDED_FORMAT,
    SHARDED_META,
    STOP_NAMES,
    CheckpointError,
    RecordedImportsError,
    atomic_torch_save,
    checkpoint_iter,
    checkpoint_state,
    dcp_cause,
    dcp_errors,
    describe_error,
    file_records,
    load_checkpoint,
    load_model,
    newest_run_checkpoint,
    one_process_dcp,
    read_sharded_meta,
    safe_dcp_planner,
    safe_dcp_reader,
    write_failure_reason,
)
from spheretnorm.runtime.cli import HelpFormatter
from spheretnorm.runtime.distributed import DistInfo, any_rank, print0
from spheretnorm.runtime.run_folder import (
    CKPT_NAME, SHARDED_CKPT_NAME, SHARDED_STOP_CKPT_NAME, STOP_CKPT_NAME, OutDirError, checkpoint_path, stop_checkpoint_path,
)

TMP_SUFFIX, OLD_SUFFIX = ".tmp", ".old"


def _state(model: torch.nn.Module, optimizer: Optimizers | None) -> dict[str, Any]:
    """Model and optimizer state by parameter name (DTensor shards under FSDP, whole tensors else);
    every optimizer of the container in one state, each parameter's under its own name. Without an
    optimizer, the model's alone (a resume with a fresh optimizer reads no optimizer state)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_state, optim_state = get_state_dict(model, tuple(optimizer))
    return {"model": model_state, "optimizer": optim_state}


def save_sharded(
    path: str | Path, model: torch.nn.Module, optimizer: Optimizers, extra: dict[str, Any], dist: DistInfo, device: str
) -> None:
    """Every rank writes its shards into path.tmp and digests them, rank 0 adds meta.pt (`extra`,
    less the tensors, with the save's id and every file's size and digest: save_record), then the
    folder replaces `path`. A write or a replacement that fails on any rank fails on all of them,
    with an OSError naming the folder, and leaves `path` as it was (a failed write's temporary
    folder removed; a failed replacement's whole one kept for the next start, settle_interrupted_save)."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    tmp, old = Path(str(path) + TMP_SUFFIX), Path(str(path) + OLD_SUFFIX)
    if dist.is_master:
        shutil.rmtree(tmp, ignore_errors=True)  # a crashed earlier write
    _barrier()
    failure: BaseException | None = None
    digests: dict[str, list] = {}
    try:
        with contextlib.nullcontext() if torch_dist.is_initialized() else one_process_dcp():
            dcp.save(_state(model, optimizer), checkpoint_id=str(tmp))
        digests = file_records(tmp, sorted(p.name for p in tmp.glob(f"__{dist.rank}_*{SHARD_SUFFIX}")))
    except dcp_errors() as e:  # any failure here must reach every rank, or the others wait for it
        failure = dcp_cause(e)
    digests = _gathered(digests, dist)  # every rank, even one that failed: a collective
    if dist.is_master and failure is None:
        try:
            atomic_torch_save({**extra, "format": SHARDED_FORMAT, **save_record(tmp, digests)}, tmp / SHARDED_META)
        except dcp_errors() as e:
            failure = e
    if any_rank(failure is not None, dist, device):
        if dist.is_master:
            shutil.rmtree(tmp, ignore_errors=True)
        if failure is not None and not isinstance(failure, (OSError, RuntimeError)):
            raise failure  # no file system's doing: a bug, with its traceback
        reason = write_failure_reason(failure) if failure is not None else "another rank could not write its shard"
        raise OSError(getattr(failure, "errno", None) or errno.EIO, f"could not write {path} ({reason})") from None
    failure = _put_in_place(tmp, path, old) if dist.is_master else None
    if any_rank(failure is not None, dist, device):  # rank 0's failure, said by every rank (not a dead peer)
        reason = write_failure_reason(failure) if failure is not None else "rank 0 could not rename it"
        raise OSError(getattr(failure, "errno", None) or errno.EIO, f"could not put the new {path} in place ({reason})") from None
    _barrier()


def _put_in_place(tmp: Path, path: Path, old: Path) -> OSError | None:
    """Replace `path` by the whole folder `tmp`, the previous one moved to `old` in between (a
    leftover `old` of an interrupted save is removed first: it would block the rename); the
    OSError of a failure, None when done. Removing `old` last is best effort: the next save or
    start removes what stays."""
    try:
        if old.exists():
            shutil.rmtree(old)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
    except OSError as e:
        return e
    shutil.rmtree(old, ignore_errors=True)
    return None


def _gathered(digests: dict[str, list], dist: DistInfo) -> dict[str, list]:
    """Every rank's records of its own shard files, merged (rank 0 needs them all for meta.pt)."""
    if not (torch_dist.is_initialized() and torch_dist.get_world_size() > 1):
        return digests
    parts: list[Any] = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(parts, digests)
    return {name: record for part in parts for name, record in (part or {}).items()}


def save_record(folder: Path, digests: dict[str, list]) -> dict[str, Any]:
    """What ties a save's files together in its meta.pt: a new id, and the size and digest of each
    file (the shards the ranks digested, the index and any shard left to rank 0 here)."""
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(SHARD_SUFFIX) or p.name == DCP_METADATA)
    return {"save_id": uuid.uuid4().hex, "files": {**file_records(folder, [n for n in names if n not in digests]), **digests}}


def settle_interrupted_save(folder: str | Path) -> str:
    """Resolve what an interrupted save_sharded left beside `folder` (ckpt.dcp.tmp, ckpt.dcp.old or
    both: a kill between its renames, or during or instead of its last cleanup) by what each
    holds: the newest whole checkpoint among them and `folder` becomes `folder`, the rest is
    removed. Returns a line saying what was done ('' when nothing was left). A leftover holding a
    newer whole checkpoint than a `folder` that cannot be read is not chosen for the user: a
    CheckpointError names the folder to remove. Run by one process (rank 0, before any other
    reads the folder: wait_for_settled)."""
    folder = Path(folder)
    leftovers = [p for p in (Path(str(folder) + TMP_SUFFIX), Path(str(folder) + OLD_SUFFIX)) if p.exists()]
    if not leftovers:
        return ""
    held = {p: _whole_iter(p) for p in (folder, *leftovers) if p.exists()}
    whole = [p for p, it in held.items() if it is not None]  # in preference order on a tie: folder, .tmp, .old
    best = max(whole, key=lambda p: held[p], default=None)  # max keeps the first of equals
    if best is not None and best != folder:
        if folder.exists() and held[folder] is None:
            raise CheckpointError(
                f"{folder} cannot be read, and {best.name}, left by an interrupted save, holds iter {held[best]}; "
                f"remove {folder} to resume from that one, or remove {best} to keep {folder.name}."
            )
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(folder)  # a whole but older state: the leftover's is newer
        os.replace(best, folder)
    for path in leftovers:
        if path.exists():
            _remove_leftover(path)
    kept = f"kept iter {held[best]} as {folder.name}" if best is not None else "none held a whole checkpoint"
    return f"NOTE: an interrupted save left {' and '.join(p.name for p in leftovers)} in {folder.parent}; {kept}, and removed the rest."


def settle_at_start(train: TrainConfig) -> None:
    """What an interrupted sharded save left in out_dir (ckpt.dcp.tmp, .old) is settled by rank 0
    (settle_interrupted_save) before any rank looks for the checkpoint (train.py, before the process
    group exists); the others wait for it, so that every rank sees the same folder."""
    folder = Path(train.out_dir) / SHARDED_CKPT_NAME
    if int(os.environ.get("RANK", "0")) != 0:
        wait_for_settled(folder, train.dist_timeout)
        return
    try:
        note = settle_interrupted_save(folder)
    except OSError as e:
        raise OutDirError(str(e)) from None
    except ValueError as e:  # a CheckpointError: which folder to remove
        raise ConfigError(str(e)) from None
    if note:
        print(note)


def check_newest_is_own(train: TrainConfig) -> None:
    """Refuse, before any process group exists, a resume or evaluation that resume_checkpoint
    would refuse (the other parallel mode's checkpoint is the newer, or none can be taken); init_from
    may still be auto here."""
    resume_checkpoint(dataclasses.replace(train, init_from="resume"))


def resume_checkpoint(train: TrainConfig) -> tuple[Path, str | None]:
    """The checkpoint a resume (or --eval_only) starts from, by the rule every reader follows
    (checkpoint.newest_run_checkpoint: the latest iteration; on a tie the healthy one; a stop's file
    that is damaged or past max_iters not taken), and the one line that names it when out_dir holds
    more than one, or when it is a stop's. With both ckpt.pt and ckpt.dcp (a run consolidated, then
    resumed under the other mode), the other mode's newer state is refused, saying how on."""
    own = checkpoint_path(train)
    if train.init_from != "resume":
        return own, None
    try:
        chosen, why = newest_run_checkpoint(train.out_dir, prefer=own.name, max_iters=train.max_iters)
    except ValueError as e:  # a healthy checkpoint whose iteration cannot be read
        raise ConfigError(str(e)) from None
    where = f"out_dir {str(train.out_dir)!r}"
    if chosen is None:
        if not why:
            return own, None  # nothing there: load_resume_checkpoint says so
        raise ConfigError(f"{where} has no checkpoint to resume: {why}.")
    if chosen.name not in (own.name, stop_checkpoint_path(train).name):  # a stop's state of this mode is its own
        other = "fsdp" if own.name == CKPT_NAME else "ddp"
        how = (f"write it as the {own.name} that --parallel=ddp resumes with `python scripts/consolidate.py {chosen} --overwrite`"
               if other == "fsdp" else f"remove {chosen} to go on from the older {own.name}")
        raise ConfigError(f"{where} {why}, the checkpoint of --parallel={other}; resume it with --parallel={other}, or {how}.")
    stop = chosen.name in STOP_NAMES
    if not why and not stop:
        return chosen, None
    doing = "evaluating" if train.eval_only else "resuming from"
    line = f"NOTE: {where} {why}; {doing} {chosen}" if why else f"NOTE: {doing} {chosen}"
    if stop:  # why a stop's state: the run's latest, written while the collapse alarm was counting
        line += (f", a stop's state written while the collapse alarm was counting (its last evaluation was above collapse_cosine). "
                 f"Delete {chosen.name} to resume from {own.name} instead")
    return chosen, line + "."


def read_resume_meta(path: Path, require: tuple[str, ...]) -> dict[str, Any]:
    """meta.pt of the sharded folder a resume reads (read_sharded_meta), decided by every rank
    together: rank 0 reads every byte of the folder once (its digests), the others check sizes only,
    and before any rank goes on (to build the model, to read a tensor) they gather their verdicts.
    A folder any rank refuses is then refused by every rank with the same sentence, the lowest
    refusing rank's (a damaged or foreign shard of its save's size is seen by rank 0 alone): train.py
    says it once, by rank 0, which exits with EXIT_CONFIG (2: refused before any training), the
    other ranks with it (or ended by torchrun first), none with a traceback. Alone (no process
    group, or one rank) it is read_sharded_meta."""
    rank = torch_dist.get_rank() if torch_dist.is_initialized() else int(os.environ.get("RANK", "0"))
    meta: dict[str, Any] = {}
    error: CheckpointError | None = None
    try:
        meta = read_sharded_meta(path, require, digests=rank == 0)
    except CheckpointError as e:
        error = e
    except OSError as e:  # this rank's view of the folder: said by all the same
        error = CheckpointError(f"Sharded checkpoint {str(path)!r} cannot be read ({describe_error(e)}).")
    if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
        verdicts: list[Any] = [None] * torch_dist.get_world_size()
        torch_dist.all_gather_object(verdicts, None if error is None else str(error))
        first = next((verdict for verdict in verdicts if verdict is not None), None)
        if first is not None and (error is None or str(error) != first):
            raise CheckpointError(first)
    if error is not None:
        raise error
    return meta


def _whole_iter(path: Path) -> int | None:
    """The iteration of a whole, readable sharded folder (read_sharded_meta's checks, the files'
    digests included), None for one that is not: its writing never finished, or it is damaged."""
    try:
        return read_sharded_meta(path).get("iter_num")
    except RecordedImportsError:
        raise  # whole perhaps, but unreadable without the user's modules: never removed as damaged
    except (CheckpointError, OSError):
        return None


def _remove_leftover(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except OSError as e:
        raise OSError(e.errno or errno.EIO, f"could not remove {path}, left by an interrupted save ({e.strerror or e}); remove it by hand") from None


def wait_for_settled(folder: str | Path, timeout_s: float) -> None:
    """On a rank other than 0: wait until rank 0 has settled the folder's leftovers (settle_interrupted_save),
    before reading it; if rank 0 refuses them, torchrun ends this rank with it."""
    leftovers = (Path(str(folder) + TMP_SUFFIX), Path(str(folder) + OLD_SUFFIX))
    deadline = time.monotonic() + timeout_s
    while any(p.exists() for p in leftovers) and time.monotonic() < deadline:
        time.sleep(0.1)


def restore_weights(cfg: TrainConfig, ckpt: dict[str, Any], model: torch.nn.Module, optimizer: Optimizers, path: Path) -> None:
    """The weights and optimizer state of the checkpoint read from `path`; with fresh_optimizer the
    weights only (the optimizer, perhaps another one, starts anew)."""
    keep = None if cfg.fresh_optimizer else optimizer
    if cfg.parallel == "fsdp":  # each rank reads its own shards, from any number of ranks' files
        load_sharded(path, model, keep)
    else:
        model.load_state_dict(ckpt["model"])
        if keep is not None:
            load_optimizer_state(keep, ckpt["optimizer"], path)
    if keep is None:
        was = ckpt["train_config"].get("optimizer", "adamw")
        print0(f"NOTE: fresh_optimizer=true: the checkpoint's {was} state is dropped; {cfg.optimizer} starts a new one at iteration {ckpt['iter_num']}.")


def load_optimizer_state(optimizer: Optimizers, state: dict[str, Any], path: Path) -> None:
    """The checkpoint's optimizer state, or one line when it does not fit the model (damaged)."""
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise ConfigError(f"The optimizer state in {path} does not fit the model ({e}); the checkpoint is damaged.") from None


def load_sharded(path: str | Path, model: torch.nn.Module, optimizer: Optimizers | None) -> None:
    """Fill the model and the optimizer (sharded or whole; None: the model alone) from a folder
    written by any number of ranks; a damaged one is a CheckpointError (read_sharded_meta checks first)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    state = _state(model, optimizer)
    try:
        # The index and the optimizer's values are pickles: read as checkpoint.py reads files, without code.
        safe = {"storage_reader": safe_dcp_reader(path), "planner": safe_dcp_planner()}
        if torch_dist.is_initialized():
            dcp.load(state, **safe)
        else:  # consolidate: this one process reads every rank's files
            with one_process_dcp():
                dcp.load(state, no_dist=True, **safe)
    except dcp_errors() as exc:
        raise CheckpointError(
            f"Sharded checkpoint {str(path)!r} cannot be read: it is damaged or not of this model ({describe_error(dcp_cause(exc))})."
        ) from None
    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(model, tuple(optimizer), model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def _barrier() -> None:
    if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
        torch_dist.barrier()


def check_consolidate_out(folder: Path, out: Path, overwrite: bool) -> None:
    """Refuse an output that is a folder, lies inside the folder being read (a file there is not one
    of its shards, and would be taken for damage), or exists (another checkpoint of the run, say)
    without overwrite."""
    if out.resolve() == folder.resolve() or out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a folder; give the file to write, e.g. {folder.resolve().parent / 'ckpt.pt'}.")
    if folder.resolve() in out.resolve().parents:
        raise ValueError(f"--out {str(out)!r} is inside the sharded folder {str(folder)!r} being read; write it beside the folder, e.g. {folder.resolve().parent / 'ckpt.pt'}.")
    if out.exists() and not overwrite:
        raise ValueError(f"{str(out)!r} already exists; pass --overwrite to replace it, or give another --out.")


def newer_output_text(folder: Path, out: Path, replace_newer: bool) -> str:
    """'' when `out` is absent or not newer than the folder; else, with replace_newer, the line that
    says what is replaced; without, a ValueError: --overwrite alone never puts an older state over a newer one."""
    if not out.is_file():
        return ""
    try:
        held = checkpoint_iter(out)
    except CheckpointError:
        return ""  # a damaged file: nothing newer is lost
    iteration = checkpoint_iter(folder)
    if held <= iteration:
        return ""
    if not replace_newer:
        raise ValueError(
            f"{str(out)!r} holds iter {held}, newer than the iter {iteration} of {str(folder)!r}; pass --replace_newer to replace it "
            "all the same, or give another --out."
        )
    return f"NOTE: replacing {out} (iter {held}) by the older iter {iteration} of {folder}, as --replace_newer asks."


def consolidate(folder: str | Path, out: str | Path, overwrite: bool = False, replace_newer: bool = False) -> Path:
    """Write a sharded folder as one ckpt.pt of today's format (model, optimizer, progress, RNG),
    in one process: train.py --parallel=ddp resumes it, and every reader of ckpt.pt reads it. An
    existing `out` is replaced only with overwrite (check_consolidate_out), and one holding a later
    iteration only with replace_newer too, saying so (newer_output_text)."""
    folder, out = Path(folder), Path(out)
    check_consolidate_out(folder, out, overwrite)
    note = newer_output_text(folder, out, replace_newer)
    ckpt = load_checkpoint(folder, require=("optimizer", "train_config"))  # checked once, the whole weights read
    model = load_model(ckpt)  # then the optimizer state by name into a whole optimizer
    optimizer = build_optimizer(model, optimizer_settings(ckpt["train_config"]))
    load_sharded(folder, model, optimizer)
    fields = {k: v for k, v in ckpt.items() if k not in ("format", "model_config", "model")}
    atomic_torch_save({**checkpoint_state(model), "optimizer": optimizer.state_dict(), **fields}, out)
    if note:
        print(note)
    return out


def default_consolidated_name(folder: Path) -> str:
    """ckpt.pt beside a ckpt.dcp; a stop's state (ckpt.stop.dcp) keeps a stop's name, ckpt.stop.pt,
    so that it never takes the healthy checkpoint's."""
    return STOP_CKPT_NAME if folder.resolve().name == SHARDED_STOP_CKPT_NAME else CKPT_NAME


def main(argv: list[str] | None = None) -> None:
    """scripts/consolidate.py: FOLDER [--out FILE] [--overwrite], FILE by default beside FOLDER as ckpt.pt."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        description="A sharded checkpoint folder (train.py --parallel=fsdp) as one ckpt.pt of the usual format (model, "
        "optimizer, progress, RNG), which --parallel=ddp resumes:\n\n    python scripts/consolidate.py out/RUN/ckpt.dcp [--out FILE]",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("folder", help="the sharded checkpoint, e.g. out/RUN/ckpt.dcp")
    parser.add_argument("--out", default="", help="the file to write (default: ckpt.pt beside the folder; ckpt.stop.pt beside a ckpt.stop.dcp), never inside the folder")
    parser.add_argument("--overwrite", action="store_true", help="replace the file to write when it exists (refused otherwise)")
    parser.add_argument("--replace_newer", action="store_true", help="with --overwrite: replace it even when it holds a later iteration than the folder")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    try:
        if not folder.is_dir():
            raise ValueError(f"{str(folder)!r} is not a folder; give the sharded checkpoint folder (e.g. out/RUN/ckpt.dcp) that --parallel=fsdp writes.")
        # resolve(): the folder's parent, also for `consolidate.py .` run inside it
        out = Path(args.out) if args.out else folder.resolve().parent / default_consolidated_name(folder)
        written = consolidate(folder, out, args.overwrite, args.replace_newer)
    except (ValueError, OSError) as e:  # CheckpointError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {written}")
