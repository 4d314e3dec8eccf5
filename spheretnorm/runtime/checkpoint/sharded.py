"""Sharded checkpoints of an FSDP run (train.py --parallel=fsdp, format spheretnorm-dcp-v1):
written by every rank at once, read back on any number.

The folder (out_dir/ckpt.dcp) is a torch.distributed.checkpoint folder of the model's and the
optimizer's state by parameter name (one file per rank, resharded on another number of ranks),
plus meta.pt (SHARDED_META: the rest of a checkpoint's dict, with the save's id and the size and
digest of each of its files). It is written as ckpt.dcp.tmp and renamed when whole (ckpt.dcp.old
between the two renames); settle_interrupted_save settles what an interrupted save left. README.md
("Past one GPU's memory: --parallel=fsdp") says the rest.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import pickle
import shutil
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as torch_dist

from spheretnorm.optim import PEAK_LR, Optimizers
from spheretnorm.runtime.checkpoint.single_file import (
    CHECKPOINT_FORMAT, CheckpointError, RecordedImportsError, atomic_torch_save, check_checkpoint, describe_error, read_torch_file,
    write_failure_reason,
)
from spheretnorm.runtime.distributed import DistInfo, any_rank, every_rank

# What marks a sharded folder, read by run_choice.py too to tell a run's checkpoints apart:
SHARDED_META = "meta.pt"  # a sharded folder's config, progress and RNG: everything but the tensors
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of the folder's tensors
SHARDED_FORMAT = "spheretnorm-dcp-v1"
SHARD_SUFFIX = ".distcp"  # torch.distributed.checkpoint's data files, __<rank>_<n>.distcp
TMP_SUFFIX, OLD_SUFFIX = ".tmp", ".old"


# -----------------------------------------------------------------------------
# Writing a folder (every rank), settling an interrupted save


def _state(model: torch.nn.Module, optimizer: Optimizers | None) -> dict[str, Any]:
    """Model and optimizer state by parameter name (DTensor shards under FSDP, whole tensors else);
    without an optimizer the model's alone (a resume with a fresh optimizer reads none)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_state, optim_state = get_state_dict(model, tuple(optimizer))
    return {"model": model_state, "optimizer": optim_state}


def save_sharded(
    path: str | Path, model: torch.nn.Module, optimizer: Optimizers, extra: dict[str, Any], dist: DistInfo, device: str
) -> None:
    """Every rank writes its shards into path.tmp and digests them, rank 0 adds meta.pt (`extra`
    with save_record's), then the folder replaces `path`. A failure on any rank fails on all of
    them, with an OSError naming the folder, and leaves `path` as it was (a failed replacement's
    whole folder is kept for the next start, settle_interrupted_save)."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    tmp, old = _leftovers(path)
    if dist.is_master and (tmp.exists() or tmp.is_symlink()):
        # A crashed earlier write (or a file of that name): dcp.save writes a folder there. Best
        # effort, as a failure here alone would leave the other ranks at the barrier: dcp.save's
        # failure then reaches every rank.
        with contextlib.suppress(OSError):
            _remove_folder_or_file(tmp)
    _barrier()
    failure: BaseException | None = None
    digests: dict[str, list] = {}
    try:
        with contextlib.nullcontext() if torch_dist.is_initialized() else one_process_dcp():
            dcp.save(_state(model, optimizer), checkpoint_id=str(tmp))
        digests = file_records(tmp, sorted(p.name for p in tmp.glob(f"__{dist.rank}_*{SHARD_SUFFIX}")))
    except dcp_errors() as e:  # any failure here must reach every rank, or the others wait for it
        failure = dcp_cause(e)
    # Every rank's records of its own shard files, merged (rank 0 needs them all for meta.pt); every rank,
    # even one that failed: a collective.
    digests = {name: record for part in every_rank(digests) for name, record in (part or {}).items()}
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


def _leftovers(path: Path) -> tuple[Path, Path]:
    """path.tmp and path.old: a save's whole folder before its rename, and the one it replaces."""
    return Path(str(path) + TMP_SUFFIX), Path(str(path) + OLD_SUFFIX)


def _remove_folder_or_file(path: Path) -> None:
    """Remove what was left at a name a save writes: usually a folder, but a file there (or a
    link) blocks a resume and a save just as well."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _put_in_place(tmp: Path, path: Path, old: Path) -> OSError | None:
    """Replace `path` by `tmp`, the previous one moved to `old` in between (a leftover `old`, which
    would block the rename, removed first); the OSError of a failure, None when done. Removing
    `old` last is best effort: the next save or start removes what stays."""
    try:
        if old.exists() or old.is_symlink():
            _remove_folder_or_file(old)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
    except OSError as e:
        return e
    shutil.rmtree(old, ignore_errors=True)
    return None


def save_record(folder: Path, digests: dict[str, list]) -> dict[str, Any]:
    """What ties a save's files together in its meta.pt: a new id, and the size and digest of each
    file (the shards the ranks digested, the index and any shard left to rank 0 here)."""
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(SHARD_SUFFIX) or p.name == DCP_METADATA)
    return {"save_id": uuid.uuid4().hex, "files": {**file_records(folder, [n for n in names if n not in digests]), **digests}}


def settle_interrupted_save(folder: str | Path) -> str:
    """Resolve what an interrupted save_sharded left beside `folder` (ckpt.dcp.tmp, ckpt.dcp.old or
    both): the newest whole checkpoint among them and `folder` becomes `folder`, the rest is
    removed; returns the line saying so ('' when nothing was left). A leftover newer than a
    `folder` that cannot be read is not chosen for the user: a CheckpointError names the folder to
    remove. Run by rank 0 alone, before any other reads the folder (wait_for_settled)."""
    folder = Path(folder)
    leftovers = [p for p in _leftovers(folder) if p.exists()]
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
    for path in (p for p in leftovers if p.exists()):
        try:
            _remove_folder_or_file(path)
        except OSError as e:
            why = f"could not remove {path}, left by an interrupted save ({e.strerror or e}); remove it by hand"
            raise OSError(e.errno or errno.EIO, why) from None
    kept = f"kept iter {held[best]} as {folder.name}" if best is not None else "none held a whole checkpoint"
    return f"NOTE: an interrupted save left {' and '.join(p.name for p in leftovers)} in {folder.parent}; {kept}, and removed the rest."


def _whole_iter(path: Path) -> int | None:
    """The iteration of a whole, readable sharded folder (read_sharded_meta's checks, digests
    included), None for one whose writing never finished or that is damaged."""
    try:
        return read_sharded_meta(path).get("iter_num")
    except RecordedImportsError:
        raise  # whole perhaps, but unreadable without the user's modules: never removed as damaged
    except (CheckpointError, OSError):
        return None


def wait_for_settled(folder: str | Path, timeout_s: float) -> None:
    """On a rank other than 0: wait until rank 0 has settled the folder's leftovers (settle_interrupted_save),
    before reading it; if rank 0 refuses them, torchrun ends this rank with it."""
    leftovers = _leftovers(Path(folder))
    deadline = time.monotonic() + timeout_s
    while any(p.exists() for p in leftovers) and time.monotonic() < deadline:
        time.sleep(0.1)


def _barrier() -> None:
    if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
        torch_dist.barrier()


# -----------------------------------------------------------------------------
# Reading a folder: its index and files checked, its meta.pt, its state loaded on any number of ranks or whole in one process


def _where(path: str | Path) -> str:
    return f"Sharded checkpoint {str(path)!r}"


def _load_safely(state: dict[str, Any], path: str | Path, alone: bool, damaged: str) -> None:
    """dcp.load of `state` from the folder, its pickles (the index, the optimizer's values) read
    without code, as read_torch_file reads files; alone: this one process reads every rank's files."""
    import torch.distributed.checkpoint as dcp

    try:
        safe = {"storage_reader": safe_dcp_reader(path), "planner": safe_dcp_planner()}
        if not alone:
            dcp.load(state, **safe)
        else:
            with one_process_dcp():
                dcp.load(state, no_dist=True, **safe)
    except dcp_errors() as exc:
        raise CheckpointError(f"{_where(path)} cannot be read: {damaged} ({describe_error(dcp_cause(exc))}).") from None


def load_sharded(path: str | Path, model: torch.nn.Module, optimizer: Optimizers | None) -> None:
    """Fill the model and the optimizer (sharded or whole; None: the model alone) from a folder
    written by any number of ranks; a damaged one is a CheckpointError (read_sharded_meta checks first)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    state = _state(model, optimizer)
    as_built = _set_aside_added_group_keys(state, set(_dcp_metadata(Path(path), _where(path)).state_dict_metadata))
    _load_safely(state, path, not torch_dist.is_initialized(), "it is damaged or not of this model")  # alone: consolidate
    groups = state.get("optimizer", {}).get("param_groups", [])
    for (i, key), value in as_built.items():  # back into the groups DCP filled
        groups[i][key] = value
    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(model, tuple(optimizer), model_state_dict=state["model"], optim_state_dict=state["optimizer"])


# Keys that later code added to every optimizer group, which the folders of earlier commits lack:
# each is filled as those commits meant it, with the value the group is built with now (peak_lr,
# issue 47: the group's rate as its recipe built it, which the old code's schedule scaled too).
ADDED_GROUP_KEYS = (PEAK_LR,)


def _set_aside_added_group_keys(state: dict[str, Any], held: set[str]) -> dict[tuple[int, str], Any]:
    """Take out of `state`'s optimizer groups the ADDED_GROUP_KEYS that the folder's index (`held`:
    'optimizer.param_groups.I.KEY') lacks, so that DCP does not ask for them; returns them,
    {(group, key): value as built}. Any other key the folder lacks stays, and DCP refuses it."""
    groups = state.get("optimizer", {}).get("param_groups", [])
    missing = [(i, key) for i, group in enumerate(groups) for key in ADDED_GROUP_KEYS
               if key in group and f"optimizer.param_groups.{i}.{key}" not in held]
    return {(i, key): groups[i].pop(key) for i, key in missing}


# What torch.distributed.checkpoint's index (.metadata, a pickle) is built of: its own metadata
# classes, torch's Size, dtypes and layouts, and a path. Anything else is refused unrun.
_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_DCP_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath")}


class _IndexUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if module in _DCP_MODULES or (module, name) in _DCP_GLOBALS or dtype:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name}")


def safe_dcp_reader(path: str | Path) -> Any:
    """torch.distributed.checkpoint's FileSystemReader, reading the index with _IndexUnpickler."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            with open(Path(self.path) / DCP_METADATA, "rb") as f:
                metadata = _IndexUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(path))


def safe_dcp_planner() -> Any:
    """DCP's load planner, unpickling the non-tensor values (the optimizer's hyperparameters) as
    torch.load(weights_only=True) does: plain values only."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            plain = io.BytesIO()
            torch.save(torch.load(value, weights_only=True), plain)  # refuses code, as read_torch_file does
            plain.seek(0)
            super().load_bytes(read_item, plain)

    return SafePlanner()


def _dcp_metadata(path: Path, where: str) -> Any:
    """torch.distributed.checkpoint's index of a folder, after checking that every file it names is
    there and long enough (a shard deleted or cut short is named before any tensor is read)."""
    if not (path / DCP_METADATA).is_file():
        raise CheckpointError(f"{where} has no {DCP_METADATA} (torch.distributed.checkpoint's index); it is damaged or was never finished.")
    try:
        metadata = safe_dcp_reader(path).read_metadata()
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{where} has a {DCP_METADATA} that holds disallowed objects ({str(exc).removeprefix('GLOBAL ')}) that could run "
            "code when unpickled, so it was not loaded."
        ) from None
    except Exception as exc:  # noqa: BLE001 - an unpickling failure of damaged bytes has no one type
        raise CheckpointError(f"{where} has a {DCP_METADATA} that cannot be read ({describe_error(exc)}); it is damaged.") from None
    for name, end in sorted(_entry_ends(metadata).items()):
        size = (path / name).stat().st_size if (path / name).is_file() else -1
        if size < end:
            state = "is missing" if size < 0 else f"has {size} of its {end} bytes"
            raise CheckpointError(f"{where} is damaged: its shard file {name} {state}.")
    return metadata


def _entry_ends(metadata: Any) -> dict[str, int]:
    """Where the last of its entries ends in each shard file the index names (its byte count as written)."""
    ends: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    return ends


def sharded_shapes(path: Path, where: str, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """The tensors under `prefix` in a sharded folder, as meta tensors of their full shapes and dtypes."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    items = _dcp_metadata(path, where).state_dict_metadata.items()
    return {
        key[len(prefix):]: torch.empty(tuple(md.size), dtype=md.properties.dtype, device="meta")
        for key, md in items
        if key.startswith(prefix) and isinstance(md, TensorStorageMetadata)
    }


def read_sharded_meta(path: str | Path, require: tuple[str, ...] = (), digests: bool = True) -> dict[str, Any]:
    """The checkpoint dict of a sharded folder without its tensors (meta.pt), checked as
    check_checkpoint checks a file (the weights' shapes from the index; the optimizer's tensors count
    for `require`), and its files as those of the save it records (check_save_files; digests=False:
    sizes only, for the ranks of a resume other than rank 0, which reads every byte once for all)."""
    path = Path(path)
    where = _where(path)
    if not (path / SHARDED_META).is_file():
        raise CheckpointError(
            f"{where} is not a spheretnorm sharded checkpoint: it has no {SHARDED_META} "
            "(train.py --parallel=fsdp writes one last; its folder is another program's, or its writing never finished)."
        )
    meta = read_torch_file(path / SHARDED_META)
    if not isinstance(meta, dict) or meta.get("format") != SHARDED_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointError(f"{where} is not a spheretnorm sharded checkpoint (format {found!r}, expected {SHARDED_FORMAT!r}).")
    check_checkpoint({**meta, "format": CHECKPOINT_FORMAT, "model": sharded_shapes(path, where)}, where)
    check_save_files(path, meta, where, digests)  # after the index's own checks, which name a missing or cut file plainly
    has_optimizer = bool(sharded_shapes(path, where, "optimizer."))
    missing = [key for key in require if key not in meta and not (key == "optimizer" and has_optimizer)]
    if missing:
        raise CheckpointError(f"{where} lacks {', '.join(missing)}, which train.py writes and this use of it needs; it is damaged.")
    return meta


def file_records(folder: Path, names: list[str]) -> dict[str, list]:
    """[size, sha256] of each named file of `folder`, as a save records them in its meta.pt."""
    records = {}
    for name in names:
        digest = hashlib.sha256()
        with open(folder / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        records[name] = [(folder / name).stat().st_size, digest.hexdigest()]
    return records


_SAID_UNVERIFIABLE: set[Path] = set()


def say_unverifiable(path: Path, where: str) -> None:
    """One line, once per folder and process (rank 0's under torchrun), that a folder written before
    saves recorded their files has shards nothing can tell from another save's of the same shapes."""
    if path.resolve() in _SAID_UNVERIFIABLE or os.environ.get("RANK", "0") != "0":
        return
    _SAID_UNVERIFIABLE.add(path.resolve())
    print(
        f"NOTE: {where} has a {SHARDED_META} without the record of its files (written before saves kept one), "
        "so its shards cannot be verified as one save's; a shard copied in from another save of the same shapes would go unseen. "
        "It is read as it is: for a folder that can be checked, resume the run once with this version (each save records its "
        "files) or consolidate it into a ckpt.pt (python scripts/consolidate.py FOLDER) from a copy you trust.",
        file=sys.stderr,
    )


def check_unrecorded_save(path: Path, meta: dict[str, Any], where: str) -> None:
    """Refuse a folder written before saves recorded their files where what torch.distributed.checkpoint
    itself wrote (torch 2.x, its torch_save format; torch/distributed/checkpoint/filesystem.py) shows
    files of another save:

    - the index places each entry at an offset and length in a named shard file, back to back with
      nothing after them, and each save wrote into a folder of its own: a shard longer than its
      entries, or one the index names no entry in, is another save's;
    - the index records the folder the save wrote into (storage_meta.checkpoint_id), meta.pt the
      run's out_dir: `cp other/ckpt.dcp/* ckpt.dcp/` leaves the index, a dot file, behind. Either
      missing (an older torch's index) is not compared.

    A shard of another save laid out alike cannot be shown (its entries hold no id, path or time,
    and the index no digest): it loads unseen, which say_unverifiable says once.
    """
    index = _dcp_metadata(path, where)  # every file it names there and long enough
    ends = _entry_ends(index)
    for name in sorted(p.name for p in path.glob(f"*{SHARD_SUFFIX}")):
        size = (path / name).stat().st_size
        if name not in ends and size > 0:  # an empty file holds nothing of any save
            raise CheckpointError(
                f"{where} holds {name}, which its index ({DCP_METADATA}) names no entry in: the file is from another save; "
                "remove it, or copy the whole folder of one save."
            )
        if name in ends and size != ends[name]:
            raise CheckpointError(
                f"{where} holds a {name} of {size} bytes where its index places its entries in the first {ends[name]}: "
                "the file is from another save or damaged; copy the whole folder of one save."
            )
    written = getattr(getattr(index, "storage_meta", None), "checkpoint_id", None)
    config = meta.get("train_config")
    out_dir = config.get("out_dir") if isinstance(config, dict) else None
    if written and isinstance(out_dir, str) and out_dir and Path(written).parent != Path(out_dir):
        raise CheckpointError(
            f"{where} has a {DCP_METADATA} written by a save into {str(Path(written).parent)!r} and a {SHARDED_META} of the run "
            f"in {out_dir!r}: its files are of different saves; copy the whole folder of one save."
        )


def check_save_files(path: Path, meta: dict[str, Any], where: str, digests: bool = True) -> None:
    """Refuse a folder whose files are not all of the save its meta.pt records: each recorded file
    there with its size and digest, and no other shard. A folder written before saves recorded them
    is checked for what torch's own index can show (check_unrecorded_save), and said unverifiable."""
    recorded = meta.get("files")
    if recorded is None:
        check_unrecorded_save(path, meta, where)
        say_unverifiable(path, where)
        return
    save = f"save {meta.get('save_id')!r}"
    if not isinstance(recorded, dict):
        raise CheckpointError(f"{where} has a {SHARDED_META} whose record of its files is damaged; its {save} cannot be checked.")
    for name in sorted(p.name for p in path.glob(f"*{SHARD_SUFFIX}")):
        if name not in recorded:
            raise CheckpointError(f"{where} holds {name}, which its {save} did not write; remove that file, or copy the whole folder of one save.")
    for name, record in sorted(recorded.items()):
        if not (path / name).is_file():
            raise CheckpointError(f"{where} is damaged: its shard file {name} is missing.")
        size = (path / name).stat().st_size
        if size != record[0]:
            raise CheckpointError(f"{where} is damaged: its file {name} has {size} bytes where its {save} wrote {record[0]}.")
        if digests and file_records(path, [name])[name] != list(record):
            raise CheckpointError(
                f"{where} holds a {name} that its {save} did not write (its digest differs): the file is from another save "
                "or damaged; copy the whole folder of one save."
            )


def dcp_errors() -> tuple[type[BaseException], ...]:
    """What torch.distributed.checkpoint raises on a failed read or write: its CheckpointException
    (a BaseException, which gathers every rank's own) and whatever it did not wrap."""
    from torch.distributed.checkpoint import CheckpointException

    return (Exception, CheckpointException)


def dcp_cause(exc: BaseException) -> BaseException:
    """The first rank's own exception inside a CheckpointException (an OSError of a full disk, say)."""
    failures = getattr(exc, "failures", None)
    return next(iter(failures.values()))[0] if failures else exc


@contextlib.contextmanager
def one_process_dcp() -> Iterator[None]:
    """torch.distributed.checkpoint without a process group: its warning that it then loads in one
    process is silenced, since that is the point (sample.py, the exports, consolidation)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def read_sharded_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The whole model's weights of a sharded folder, in this process on the CPU, whatever the
    number of ranks that wrote it (no process group needed)."""
    path = Path(path)
    state = {k: torch.empty(v.shape, dtype=v.dtype) for k, v in sharded_shapes(path, _where(path)).items()}
    _load_safely({"model": state}, path, True, "it is damaged")
    return state
