"""Which checkpoint of a run folder every reader and resume takes: the one decision
(newest_run_checkpoint), for a resume (resume_checkpoint) and for the readers (resolve_checkpoint,
checkpoint_for: sample.py, zero-shot, the exports).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

from spheretnorm.runtime.checkpoint.sharded import DCP_METADATA, SHARDED_META
from spheretnorm.runtime.checkpoint.single_file import SAFETENSORS_SUFFIX, CheckpointError, describe_error, read_torch_file
from spheretnorm.runtime.config import ConfigError, TrainConfig
from spheretnorm.runtime.run_folder import (
    CKPT_NAME, CONFIG_NAME, SHARDED_CKPT_NAME, SHARDED_STOP_CKPT_NAME, STOP_CKPT_NAME, checkpoint_path, stop_checkpoint_path,
)

EXPORT_NAME = "ckpt" + SAFETENSORS_SUFFIX  # what scripts/export_hf.py --format safetensors writes


def read_without_tensors(path: str | Path) -> Any:
    """A ckpt.pt or a sharded folder's meta.pt as torch.load gives it, its tensors not read: a zip
    archive (what torch.save writes) is mapped; an older file is read whole."""
    path = Path(path)
    return read_torch_file(path / SHARDED_META) if path.is_dir() else read_torch_file(path, mmap=zipfile.is_zipfile(path))


def checkpoint_iter(path: str | Path) -> int:
    """The iteration a ckpt.pt or a sharded folder holds, read without its tensors (mapped, not read)."""
    path = Path(path)
    meta = read_without_tensors(path)
    iteration = meta.get("iter_num") if isinstance(meta, dict) else None
    if not isinstance(iteration, int) or isinstance(iteration, bool):
        raise CheckpointError(f"Checkpoint {str(path)!r} records no iter_num, which train.py writes; it is damaged.")
    return iteration


HEALTHY_NAMES = (CKPT_NAME, SHARDED_CKPT_NAME)
STOP_NAMES = (STOP_CKPT_NAME, SHARDED_STOP_CKPT_NAME)


def newest_run_checkpoint(run_dir: str | Path, prefer: str = CKPT_NAME, max_iters: int | None = None) -> tuple[Path | None, str]:
    """The one rule for which checkpoint of a run folder a resume and every reader takes: of its
    ckpt.pt and ckpt.dcp (and a stop's ckpt.stop.pt or ckpt.stop.dcp), the one holding the latest
    iteration; on a tie a healthy one before a stop's, then `prefer`. A stop's file that cannot be
    read, or claims an iteration past `max_iters`, is not taken, and said. Returns the file taken
    (None when none can be) and a phrase on why ('' when it is the folder's only one). A run
    consolidated and resumed under the other parallel mode leaves both healthy ones: the newer wins."""
    run_dir = Path(run_dir)
    found = [run_dir / name for name in (*HEALTHY_NAMES, *STOP_NAMES) if (run_dir / name).exists()]
    if len(found) == 1 and found[0].name in HEALTHY_NAMES:
        return found[0], ""  # the usual case: nothing to compare, nothing read
    iters, refused = {}, []
    for path in found:
        iteration, why_not = _stop_state_iter(path, max_iters) if path.name in STOP_NAMES else (checkpoint_iter(path), "")
        if why_not:
            refused.append(why_not)
        else:
            iters[path] = iteration
    aside = "".join(f"; {why_not}, so it is not taken" for why_not in refused)
    if not iters:
        return None, aside.removeprefix("; ")
    chosen = max(iters, key=lambda path: (iters[path], path.name in HEALTHY_NAMES, path.name == prefer))
    if len(iters) == 1:
        return chosen, f"holds {chosen.name} (iter {iters[chosen]}){aside}" if aside else ""
    both = " and ".join(f"{path.name} (iter {iters[path]})" for path in iters)
    which = f"; {chosen.name} is the newer" if len(set(iters.values())) > 1 else f", the same iteration; {chosen.name} is taken"
    return chosen, f"holds {both}{which}{aside}"


def _stop_state_iter(path: Path, max_iters: int | None) -> tuple[int, str]:
    """The iteration of a stop's checkpoint, or why it cannot be taken: damaged (its reader's own
    error, in short), or past `max_iters`. A damaged stop file must not make a good run unreadable."""
    if path.is_dir() and not (path / SHARDED_META).is_file():
        return -1, f"{path.name} beside it is damaged (a folder without the {SHARDED_META} of a sharded checkpoint)"
    try:
        iteration = checkpoint_iter(path)
    except (CheckpointError, OSError) as exc:
        return -1, f"{path.name} beside it is damaged ({_short_reason(exc, path)})"
    if max_iters is not None and iteration > max_iters:
        return -1, f"{path.name} claims iter {iteration}, past the run's max_iters={max_iters}"
    return iteration, ""


def _short_reason(exc: BaseException, path: Path) -> str:
    """A reader's error about `path` in a few words, for a phrase inside another line: the file
    called 'it', the detail in its last parentheses left out."""
    text = str(exc) if isinstance(exc, CheckpointError) else describe_error(exc)
    for name in (f"Checkpoint {str(path)!r}", repr(str(path))):
        text = text.replace(name, "it")
    return re.sub(r"\s*\([^()]*\)\.?$", "", text).rstrip(".").removesuffix("; it is damaged")[:160]


def run_max_iters(run_dir: Path) -> int | None:
    """The max_iters a run folder's config.json records (None when it has no readable one): past
    it, a stop's checkpoint claims an iteration the run could not reach."""
    try:
        value = json.loads((run_dir / CONFIG_NAME).read_text(encoding="utf-8")).get("max_iters")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_newest_is_own(train: TrainConfig) -> None:
    """Refuse, before any process group exists, a resume or evaluation that resume_checkpoint
    would refuse (the other parallel mode's checkpoint is the newer, or none can be taken); init_from
    may still be auto here."""
    resume_checkpoint(dataclasses.replace(train, init_from="resume"))


def resume_checkpoint(train: TrainConfig) -> tuple[Path, str | None]:
    """The checkpoint a resume (or --eval_only) starts from, by the rule every reader follows
    (newest_run_checkpoint), and the line that names it when out_dir holds more than one, or when
    it is a stop's. The other parallel mode's newer state is refused, saying how on."""
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


def resolve_checkpoint(path: str | Path) -> tuple[Path, str]:
    """The checkpoint that `path` names for a reader (sample.py, zero-shot, the exports): a checkpoint
    file or sharded folder itself; in a run folder newest_run_checkpoint's, else its ckpt.safetensors
    export; and '' or a phrase on why that one, for the caller to print after the folder's name.
    Nothing there is a FileNotFoundError naming `path`, worded to follow "No checkpoint: "."""
    path = Path(path)
    if not path.is_dir() or is_sharded_checkpoint(path):
        if not path.exists():
            raise FileNotFoundError(f"{str(path)!r} does not exist; give a ckpt.pt file, a ckpt.dcp folder or an out_dir that holds one.")
        return path, ""
    chosen, why = newest_run_checkpoint(path, max_iters=run_max_iters(path))
    export = path / EXPORT_NAME
    if chosen is None and export.is_file():
        return export, f"has no {CKPT_NAME} or {SHARDED_CKPT_NAME}"
    if chosen is None:
        refused = f" ({why})" if why else ""
        raise FileNotFoundError(
            f"the out_dir {str(path)!r} has no {CKPT_NAME}, {SHARDED_CKPT_NAME} or {EXPORT_NAME}{refused}; give a checkpoint or an out_dir that holds one."
        )
    if not why and export.is_file():
        why = f"holds {chosen.name} and {EXPORT_NAME}"
    return chosen, why


def checkpoint_for(path: str | Path, program: str, purpose: str, doing: str, error: type[Exception]) -> Path:
    """resolve_checkpoint for a command that reads one: why that one, when there is a why, is a line
    on stderr ("sample.py: 'out/RUN' holds ...; sampling from out/RUN/ckpt.dcp"), and no checkpoint,
    or one whose iteration cannot be read, is `error` of one sentence ('No checkpoint to sample from: ...')."""
    try:
        chosen, why = resolve_checkpoint(path)
    except FileNotFoundError as e:
        raise error(f"No checkpoint to {purpose}: {e}") from None
    except ValueError as e:
        raise error(str(e)) from None
    if why:
        print(f"{program}: {str(path)!r} {why}; {doing} {chosen}", file=sys.stderr)
    return chosen


def is_sharded_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a folder that claims to be a sharded checkpoint (load_checkpoint then checks it)."""
    path = Path(path)
    return path.is_dir() and ((path / SHARDED_META).is_file() or (path / DCP_METADATA).is_file())
