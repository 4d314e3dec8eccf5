"""Checkpoints: the single-file format (ckpt.pt), what both formats share, and which checkpoint of
a run folder every reader and resume takes.

A checkpoint (format spheretnorm-ckpt-v1) is a dict: format, model_config (GPTConfig as a dict),
model (the state dict), and what train.py adds (optimizer, iter_num, train_config, data_meta,
RNG state in plain values: rng_to_plain, gathered_rng). Here: writing one atomically, reading one
safely (read_torch_file), checking that the model it describes can be built from the weights it
holds (check_checkpoint), its safetensors form, and the one decision on which of a run folder's
checkpoints is taken (newest_run_checkpoint, and for a resume resume_checkpoint).

A sharded checkpoint (train.py --parallel=fsdp, format spheretnorm-dcp-v1) is a folder that
torch.distributed.checkpoint wrote (model.* and optimizer.* by parameter name, one file per
rank) plus meta.pt, the rest of the dict above: runtime/sharded_checkpoint.py writes, reads and
reshards them, and holds what reads or writes either format (load_checkpoint, load_model,
write_run_checkpoint), since those call both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pickle
import re
import sys
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as torch_dist

from spheretnorm.model import CONNECTIONS, GPT, GPTConfig
from spheretnorm.runtime.atomic import apply_umask, replace_file
from spheretnorm.runtime.config import ConfigError, TrainConfig, config_from_dict
from spheretnorm.runtime.device import rng_state
from spheretnorm.runtime.distributed import DistInfo
from spheretnorm.runtime.imports import import_recorded, recorded_imports
from spheretnorm.runtime.run_folder import (
    CKPT_NAME, CONFIG_NAME, SHARDED_CKPT_NAME, SHARDED_STOP_CKPT_NAME, STOP_CKPT_NAME, checkpoint_path, stop_checkpoint_path,
)

CHECKPOINT_FORMAT = "spheretnorm-ckpt-v1"
SAFETENSORS_SUFFIX = ".safetensors"  # weights and config only, no pickle (save_safetensors_checkpoint)
# What marks a sharded folder (runtime/sharded_checkpoint.py), read here to tell a run's checkpoints apart:
SHARDED_META = "meta.pt"  # a sharded folder's config, progress and RNG: everything but the tensors
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of the folder's tensors


def atomic_torch_save(obj: object, path: str | Path) -> None:
    """torch.save to a temp file beside `path`, then rename: a crash never leaves half a file.

    A write that fails (a full disk, a quota, a read-only file system) removes its temp file, so
    that it does not keep the disk full, leaves `path` as it was, and raises an OSError that
    names the file: torch reports a full disk as a RuntimeError from its zip writer.
    """
    path = Path(path)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            torch.save(obj, f)

    try:
        replace_file(path, write, temp=path.with_name(path.name + ".tmp"), durable=True)
    except (OSError, RuntimeError) as e:
        raise OSError(getattr(e, "errno", None) or 0, f"could not write {path} ({write_failure_reason(e)})") from None


def write_failure_reason(e: BaseException) -> str:
    """Why a write failed, in words: the OS's, or what torch's zip writer means by its own."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    # torch's zip writer: "[enforce fail at inline_container.cc:...] unexpected pos ..."
    return f"the file system took less than was written: a full disk or a quota? torch: {str(e).splitlines()[0][:160]}"








class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or whose model cannot be built from it.

    Damaged files (truncated, empty, text, a zip archive that is not torch's), foreign ones (no
    spheretnorm format tag), pickles carrying code, and checkpoints whose model_config is
    invalid or does not describe the weights they hold. The message is one sentence that names
    the file; train.py, sample.py and scripts/export_hf.py print it without a traceback. A
    ValueError, which load_checkpoint raised before this class existed, so callers that catch
    ValueError keep working.
    """



class RecordedImportsError(CheckpointError):
    """A checkpoint whose connection is defined by modules it records, which cannot be imported
    here (no consent, or a module that fails): the file may be whole, so it is never taken for
    damage (sharded_checkpoint._whole_iter)."""


def needs_recorded_code(model_config: Any) -> bool:
    """Whether a model config names a connection that no imported module registered (only the
    modules a file records could define it)."""
    name = model_config.get("connection", "pre_ln") if isinstance(model_config, dict) else None
    return isinstance(name, str) and name not in CONNECTIONS


# Keys besides the weights and their config that a checkpoint may hold, and the type each must
# have where present (train.py writes them; sample.py and the export read them).
_OPTIONAL_KEYS: dict[str, type] = {"data_meta": dict, "train_config": dict, "iter_num": int}



def describe_error(exc: BaseException) -> str:
    """An exception's type and the first sentence of its message, short enough for one line
    (torch's messages run over paragraphs, after a "[enforce fail at file.cc:180] ." prefix)."""
    text = re.sub(r"^\[[^\]]*\][\s.]*", "", str(exc).strip())
    text = text.splitlines()[0].split(". ")[0].rstrip(".")[:160] if text else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__



def rng_to_plain(state: dict[str, Any]) -> dict[str, Any]:
    """device.rng_state() in tensors and plain values only, so that a checkpoint loads with plain
    torch.load(path) (weights_only=True since torch 2.6): numpy's state holds an ndarray."""
    name, keys, pos, has_gauss, cached = state["numpy"]
    numpy = {"bit_generator": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
             "has_gauss": has_gauss, "cached_gaussian": cached}
    return {**state, "numpy": numpy}


def rng_from_plain(state: dict[str, Any]) -> dict[str, Any]:
    """What rng_to_plain wrote, back in device.set_rng_state's form; an earlier commit's state
    (numpy's as the tuple numpy gives) is that form already."""
    numpy = state["numpy"]
    if not isinstance(numpy, dict):
        return state
    keys = np.asarray(numpy["keys"].numpy(), dtype=np.uint32)
    return {**state, "numpy": (numpy["bit_generator"], keys, numpy["pos"], numpy["has_gauss"], numpy["cached_gaussian"])}


def gathered_rng(dist: DistInfo) -> list[Any]:
    """Every rank's RNG state, by rank (a collective: all ranks call it)."""
    if not dist.enabled:
        return [rng_to_plain(rng_state())]
    states: list[Any] = [None] * dist.world_size
    torch_dist.all_gather_object(states, rng_to_plain(rng_state()))
    return states


def read_torch_file(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> Any:
    """What torch.save wrote to `path`, unpickled safely; any failure is a CheckpointError naming it.

    Unpickling runs with weights_only=True: besides tensors and plain Python values, only the
    allow-list below may be rebuilt: numpy's RNG state as earlier commits saved it, an ndarray
    (rng_to_plain now saves plain values). A file carrying anything else, such as a pickled
    callable, is refused before any of it runs. mmap=True maps the tensors' storage instead of reading it,
    for a look at their names and shapes (torch.save's zip archives only).
    """
    path = Path(path)
    allowed = [
        np.zeros(1).__reduce__()[0],  # numpy's array rebuilder, under this numpy's module path
        np.ndarray,
        np.dtype,
        type(np.dtype(np.uint32)),  # the dtype class that newer numpy versions pickle
    ]
    if hasattr(torch.serialization, "safe_globals"):
        allow = torch.serialization.safe_globals(allowed)
    else:  # torch 2.4 has only the process-wide list
        torch.serialization.add_safe_globals(allowed)
        allow = contextlib.nullcontext()
    try:
        with allow:
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        found = sorted(set(re.findall(r"GLOBAL ([\w.]+)", str(exc))))
        # torch.save writes zip archives; anything else failing here is no checkpoint at all.
        if not found and not zipfile.is_zipfile(path):
            raise CheckpointError(f"{str(path)!r} is not a PyTorch checkpoint file (not the zip archive torch.save writes).") from None
        found = found or ["an unsupported pickle instruction"]
        raise CheckpointError(
            f"Checkpoint {str(path)!r} contains disallowed objects ({', '.join(found)}) that "
            "could run code when unpickled, so it was not loaded; spheretnorm checkpoints hold "
            "only tensors, plain Python values and numpy RNG state."
        ) from None
    except MemoryError:
        raise  # a file too large for this machine is not a damaged one
    except Exception as exc:  # noqa: BLE001 - torch.load's failures on damaged bytes share no type
        # (RuntimeError from the zip reader, EOFError, KeyError, OSError, ... depending on where
        # the bytes stop making sense), and every one of them means the same to the user.
        raise CheckpointError(
            f"{str(path)!r} cannot be read as a PyTorch checkpoint: it is truncated, damaged or another program's file "
            f"({describe_error(exc)})."
        ) from None



def check_checkpoint(ckpt: Any, where: str = "The checkpoint") -> GPTConfig:
    """The model config of a checkpoint dict whose model can be built; else a CheckpointError.

    `where` starts each message ("Checkpoint 'out/ckpt.pt'"). Checked: the format tag, the
    model config's keys and values, the types of the optional keys (_OPTIONAL_KEYS), and that
    the weights have the names and shapes of the model the config describes (check_weights).
    The tensors may be on the meta device: only their shapes are read.
    """
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        found = ckpt.get("format") if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(f"{where} is not a spheretnorm checkpoint (format {found!r}, expected {CHECKPOINT_FORMAT!r}).")
    missing = [key for key in ("model_config", "model") if key not in ckpt]
    if missing:
        raise CheckpointError(f"{where} lacks {' and '.join(missing)}, which every spheretnorm checkpoint holds; it is damaged.")
    for key, kind in _OPTIONAL_KEYS.items():
        value = ckpt.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise CheckpointError(f"{where} holds a {type(value).__name__} as {key}, where a {kind.__name__} belongs; it is damaged.")
    # The user's modules that define its connection: imported with consent, and only when its connection needs them.
    import_recorded(ckpt.get("train_config"), where, RecordedImportsError, needs_recorded_code(ckpt["model_config"]))
    try:
        config = config_from_dict(ckpt["model_config"])
    except ValueError as exc:
        raise CheckpointError(f"{where} has an invalid model_config: {exc}") from None
    check_weights(ckpt["model"], config, where, "its model_config")
    return config



def check_weights(state: Any, config: GPTConfig, where: str, config_where: str) -> None:
    """A CheckpointError unless `state` holds exactly the weights of GPT(config), by name and shape.

    Nothing the config sizes is allocated: the expected shapes come from the model built on the
    meta device, and only once n_layer is known to match the weights (even there, a damaged
    n_layer of 10^9 would take hours to build). `where` names the weights' file and
    `config_where` the config's ("its model_config", or the config.json of a folder).
    """
    if not is_state_dict(state):
        found = "a dict with other values" if isinstance(state, dict) else f"a {type(state).__name__}"
        raise CheckpointError(f"{where} does not hold its weights as a dict of tensors by name (found {found}); it is damaged.")
    shapes = {k: tuple(v.shape) for k, v in clean_state_dict(state).items()}
    blocks = {k.split(".")[2] for k in shapes if k.startswith("transformer.h.")}
    if len(blocks) != config.n_layer:
        raise CheckpointError(f"{where} holds the weights of {len(blocks)} blocks, but {config_where} says n_layer={config.n_layer}.")
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in GPT(config).state_dict().items()}
    problems = [f"{k} is missing" for k in expected if k not in shapes]
    problems += [f"{k} is not a weight of that model" for k in shapes if k not in expected]
    problems += [
        f"{k} has shape {list(shapes[k])} where the config needs {list(shape)}"
        for k, shape in expected.items()
        if k in shapes and shapes[k] != shape
    ]
    if problems:
        more = f", and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise CheckpointError(
            f"{where} does not hold the weights of the model {config_where} describes ({'; '.join(problems[:3])}{more})."
        )



def is_state_dict(state: Any) -> bool:
    """Whether `state` is weights by name, as state_dict() gives them (and no other object)."""
    return isinstance(state, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())




# The checkpoint keys a safetensors checkpoint keeps besides the weights, JSON-encoded in its
# metadata (safetensors metadata holds strings only); of the train_config, only the imports key.
_SAFETENSORS_KEYS = ("model_config", "data_meta", "iter_num", "train_config")



TIED_HEAD, TIED_TO = "lm_head.weight", "transformer.wte.weight"  # one tensor, stored once



def save_safetensors_checkpoint(ckpt: dict[str, Any], path: str | Path) -> Path:
    """Write a checkpoint's weights and config as one safetensors file: no pickle, no optimizer.

    load_checkpoint (and so load_model, sample.py and the evaluator) reads it back.
    """
    from safetensors.torch import save_file

    path = Path(path)
    if path.suffix != SAFETENSORS_SUFFIX:
        raise ValueError(f"{str(path)!r} must end in {SAFETENSORS_SUFFIX}, so that load_checkpoint knows its form.")
    state = untie_head(clean_state_dict(ckpt["model"]))
    kept = {**ckpt, "train_config": {"imports": recorded_imports(ckpt)} if recorded_imports(ckpt) else None}
    metadata = {"format": CHECKPOINT_FORMAT, **{k: json.dumps(kept.get(k)) for k in _SAFETENSORS_KEYS}}
    save_file(state, str(path), metadata=metadata)
    apply_umask(path)
    return path



def load_safetensors_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The checkpoint dict (format, model_config, model, ...) of a save_safetensors_checkpoint file.

    The config (from the metadata) is checked against the tensors' shapes in the file's header
    before any tensor is read, so a damaged size in the metadata allocates nothing.
    """
    where = f"Checkpoint {str(path)!r}"
    metadata, shapes = read_safetensors(path, shapes_only=True)
    if metadata.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{str(path)!r} is not a spheretnorm safetensors checkpoint (format {metadata.get('format')!r}, "
            f"expected {CHECKPOINT_FORMAT!r}); a Hugging Face folder is read with --init_from=hf:DIR."
        )
    ckpt = {"format": CHECKPOINT_FORMAT, **_decode_metadata(metadata, where), "model": tie_head(shapes)}
    check_checkpoint(ckpt, where)
    ckpt["model"] = tie_head(read_safetensors(path, device=str(map_location))[1])
    return ckpt



def read_safetensors(
    path: Path, shapes_only: bool = False, device: str = "cpu"
) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(metadata, tensors by name) of a safetensors file; a file safetensors cannot parse
    (truncated, text, ...) is a CheckpointError naming it. shapes_only: the tensors on the meta
    device, from the file's header alone (nothing read or allocated)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device=device) as f:
            if shapes_only:
                tensors = {k: torch.empty(f.get_slice(k).get_shape(), device="meta") for k in f.keys()}
            else:
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            return f.metadata() or {}, tensors
    except SafetensorError as exc:
        raise CheckpointError(f"{str(path)!r} is not a safetensors file, or a truncated or damaged one ({exc}).") from None



def _decode_metadata(metadata: dict[str, str], where: str) -> dict[str, Any]:
    """The JSON-encoded checkpoint keys of a safetensors file's metadata."""
    out = {}
    for key in _SAFETENSORS_KEYS:
        if key in metadata:
            try:
                out[key] = json.loads(metadata[key])
            except json.JSONDecodeError as exc:
                raise CheckpointError(f"{where} has metadata {key} that is not JSON ({exc}): {metadata[key]!r:.80}.") from None
    return out



def untie_head(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights to write to a file, contiguous: a head tied to the token embedding is stored
    once (safetensors refuses shared tensors); an untied head (nGPT) is kept."""
    tied = TIED_HEAD in state and TIED_TO in state and state[TIED_HEAD].data_ptr() == state[TIED_TO].data_ptr()
    return {k: v.detach().contiguous() for k, v in state.items() if not (tied and k == TIED_HEAD)}



def tie_head(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The LM head back from the token embedding it is tied to, in place (files store it once);
    a head of its own (nGPT) is kept, and a state without the embedding is left so, for
    check_weights to name it missing."""
    if TIED_TO in state and TIED_HEAD not in state:
        state[TIED_HEAD] = state[TIED_TO]
    return state



def clean_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip the prefixes that torch.compile and DDP add to parameter names."""
    out = {}
    for k, v in state.items():
        while k.startswith(("_orig_mod.", "module.")):
            k = k.split(".", 1)[1]
        out[k] = v
    return out


def checkpoint_state(model: GPT, weights: bool = True) -> dict[str, Any]:
    """The model part of a checkpoint: format tag, config and (unless weights=False: a sharded
    checkpoint keeps them apart) the weights."""
    state = {"format": CHECKPOINT_FORMAT, "model_config": asdict(model.config)}
    return {**state, "model": model.state_dict()} if weights else state


# -----------------------------------------------------------------------------
# Which checkpoint of a run folder: the one decision every reader and resume calls

EXPORT_NAME = "ckpt" + SAFETENSORS_SUFFIX  # what scripts/export_hf.py --format safetensors writes


def checkpoint_iter(path: str | Path) -> int:
    """The iteration a ckpt.pt or a sharded folder holds, read without its tensors (mapped, not read)."""
    path = Path(path)
    # A zip archive (what torch.save writes) is mapped, its tensors not read; an older file is read whole.
    meta = read_torch_file(path / SHARDED_META) if path.is_dir() else read_torch_file(path, mmap=zipfile.is_zipfile(path))
    iteration = meta.get("iter_num") if isinstance(meta, dict) else None
    if not isinstance(iteration, int) or isinstance(iteration, bool):
        raise CheckpointError(f"Checkpoint {str(path)!r} records no iter_num, which train.py writes; it is damaged.")
    return iteration


HEALTHY_NAMES = (CKPT_NAME, SHARDED_CKPT_NAME)
STOP_NAMES = (STOP_CKPT_NAME, SHARDED_STOP_CKPT_NAME)


def newest_run_checkpoint(run_dir: str | Path, prefer: str = CKPT_NAME, max_iters: int | None = None) -> tuple[Path | None, str]:
    """The one rule, by iteration, for which checkpoint of a run folder a resume and every reader
    takes: of its ckpt.pt and ckpt.dcp (and a stop's ckpt.stop.pt or ckpt.stop.dcp, the state a
    signal saved during a collapse-alarm streak), the one holding the latest iteration; on equal
    iterations a healthy one before a stop's, then `prefer`. A stop's file that cannot be read, or
    that claims an iteration past `max_iters` (the run could never reach it), is not taken, and
    said. Returns the file taken and a phrase on why ('' when it is the folder's only one; None
    and the phrase when none can be taken). A run consolidated and then resumed under the other
    parallel mode leaves both healthy ones, the older one stale: taking the newer keeps every
    reader on the run's last state."""
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
    (newest_run_checkpoint: the latest iteration; on a tie the healthy one; a stop's file
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


def resolve_checkpoint(path: str | Path) -> tuple[Path, str]:
    """The checkpoint that `path` names for a reader (sample.py, zero-shot, the exports): a checkpoint
    file or sharded folder itself; in a run folder the newer of ckpt.pt and ckpt.dcp
    (newest_run_checkpoint), else its ckpt.safetensors export. The second value is '' or a phrase on
    why that one, for the caller to print after the folder's name (another checkpoint is beside it,
    or it is an export). Nothing there is a FileNotFoundError naming `path`, worded to follow
"No checkpoint: " or the like."""
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
    """resolve_checkpoint for a command that reads one (sample.py, zero-shot, the export): why that
    one, when there is a why, is a line on stderr ('sample.py: 'out/RUN' holds ...; sampling from
    out/RUN/ckpt.dcp'), and no checkpoint, or one whose iteration cannot be read, is `error` of
    one sentence ('No checkpoint to sample from: ...')."""
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
