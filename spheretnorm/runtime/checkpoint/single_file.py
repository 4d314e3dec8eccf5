"""The single-file checkpoint (ckpt.pt, and its weights-only .safetensors export), and what both
formats share: the format tag, the errors, atomic writes, safe reads (read_torch_file), the check
that a checkpoint's config describes its weights (check_checkpoint), RNG state in plain values.

A checkpoint (format spheretnorm-ckpt-v1) is a dict: format, model_config (GPTConfig as a dict),
model (the state dict), and what train.py adds (optimizer, iter_num, train_config, data_meta,
every rank's RNG state: resume.write_run_checkpoint).
"""

from __future__ import annotations

import contextlib
import json
import pickle
import re
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spheretnorm.model import CONNECTIONS, GPT, GPTConfig
from spheretnorm.runtime.atomic import apply_umask, replace_file
from spheretnorm.runtime.config import config_from_dict
from spheretnorm.runtime.imports import import_recorded, recorded_imports

CHECKPOINT_FORMAT = "spheretnorm-ckpt-v1"
SAFETENSORS_SUFFIX = ".safetensors"  # weights and config only, no pickle (save_safetensors_checkpoint)


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
    """A checkpoint that cannot be read (damaged, foreign, a pickle carrying code), or whose model
    cannot be built from it; one sentence naming the file, which the commands print without a
    traceback. A ValueError, as load_checkpoint raised before this class existed."""


class RecordedImportsError(CheckpointError):
    """A checkpoint whose connection is defined by modules it records, which cannot be imported
    here (no consent, or a module that fails): the file may be whole, so it is never taken for
    damage (sharded._whole_iter)."""


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


def read_torch_file(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> Any:
    """What torch.save wrote to `path`, unpickled safely; any failure is a CheckpointError naming it.

    Unpickling runs with weights_only=True: besides tensors and plain Python values, only the
    allow-list below (numpy's RNG state as earlier commits saved it) may be rebuilt; anything else
    is refused before any of it runs. mmap=True maps the tensors instead of reading them (zip archives only).
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
    """The model config of a checkpoint dict whose model can be built; else a CheckpointError whose
    message starts with `where` ("Checkpoint 'out/ckpt.pt'"). The tensors may be on the meta device:
    only their shapes are read (check_weights)."""
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

    The expected shapes come from the model built on the meta device, and only once n_layer is known
    to match the weights (a damaged n_layer of 10^9 would take hours to build even there). `where`
    names the weights' file and `config_where` the config's ("its model_config", a folder's config.json).
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
    """Write a checkpoint's weights and config as one safetensors file (no pickle, no optimizer),
    which load_checkpoint reads back."""
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
    """The checkpoint dict of a save_safetensors_checkpoint file; its config is checked against the
    shapes in the file's header before any tensor is read, so a damaged size allocates nothing."""
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


def read_safetensors(path: Path, shapes_only: bool = False, device: str = "cpu") -> tuple[dict[str, str], dict[str, torch.Tensor]]:
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
