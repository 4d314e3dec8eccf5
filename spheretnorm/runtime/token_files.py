"""The prepared token files a run reads: data/<name>/{train,val}.bin (uint16 token ids) and
meta.json (counts, vocabulary, tokenizer). data/prepare.py writes them (spheretnorm.data);
train.py, the studies and sampling read them through this module."""

from __future__ import annotations

import json
import os
from pathlib import Path
from collections.abc import Iterable
from typing import Any

import numpy as np


TOKEN_DTYPE = np.uint16
MAX_VOCAB_SIZE = int(np.iinfo(TOKEN_DTYPE).max) + 1  # every id a token file can hold
SPLITS = ("train", "val")
META_FILE = "meta.json"
MAX_TOKEN_KEY = "max_token"  # meta.json's train_max_token / val_max_token: the largest id in each bin
MTIME_KEY = "mtime_ns"  # meta.json's train_mtime_ns / val_mtime_ns: each bin's st_mtime_ns when prepare.py wrote it
# meta.json keys that are counts: an integer >= 0 wherever present.
META_COUNTS = ("vocab_size", "train_tokens", "val_tokens", f"train_{MAX_TOKEN_KEY}", f"val_{MAX_TOKEN_KEY}")
SCAN_CHUNK = 1 << 24  # tokens per step of check_token_ids' scan: 32 MB of uint16


class PrepareError(ValueError):
    """A user-facing problem with the inputs or options; the CLI prints it without a traceback."""


def decode_char(ids: Iterable[int], meta: dict[str, Any]) -> str:
    """Decode char-level ids with the vocabulary stored in meta.json."""
    itos = meta["itos"]
    return "".join(itos[int(i)] for i in ids)


def char_vocabulary(meta: dict[str, Any]) -> list[str] | None:
    """meta.json's 'itos' (the text of each char-level id) when it is a non-empty list of strings, else None."""
    itos = meta.get("itos")
    if isinstance(itos, list) and itos and all(isinstance(ch, str) for ch in itos):
        return itos
    return None


def read_json_object(path: str | os.PathLike, error: type[Exception], fix: str) -> dict[str, Any]:
    """The JSON object (a dict) in `path`; a file that is not JSON, or holds another JSON value,
    is `error` naming it, its message ending in `fix` (what to do about it)."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{str(path)!r} is not valid JSON ({exc}); {fix}") from None
    if not isinstance(value, dict):
        raise error(f"{str(path)!r} holds a JSON {type(value).__name__}, not an object of keys; {fix}")
    return value


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """A meta.json file: a JSON object whose counts (META_COUNTS) are integers >= 0; else a
    PrepareError that names it, never a JSONDecodeError or a TypeError later in a reader."""
    meta = read_json_object(path, PrepareError, "re-run data/prepare.py to write it again.")
    for key in META_COUNTS:
        value = meta.get(key)
        if key in meta and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise PrepareError(f"{str(path)!r} has {key}={value!r:.40}, which must be an integer >= 0; re-run data/prepare.py.")
    # The bins hold uint16 ids: a larger vocabulary cannot be a dataset's, and a model of it would
    # be an allocation the machine refuses with a traceback.
    if meta.get("vocab_size", 0) > MAX_VOCAB_SIZE:
        raise PrepareError(
            f"{str(path)!r} has vocab_size={meta['vocab_size']}, more than the {MAX_VOCAB_SIZE} ids its "
            f"{np.dtype(TOKEN_DTYPE).name} token files can hold; re-run data/prepare.py."
        )
    return meta


def load_meta(data_dir: str | os.PathLike) -> dict[str, Any]:
    """meta.json of a prepared dataset directory (PrepareError if the directory is not prepared)."""
    path = Path(data_dir) / META_FILE
    if not path.is_file():
        raise PrepareError(
            f"No {META_FILE} in {data_dir}: the dataset is not prepared there; run `python data/prepare.py "
            f"{Path(data_dir).name} --out_dir {data_dir}` (`python data/prepare.py --help` lists the names) first."
        )
    return read_meta(path)


def open_split(data_dir: str | os.PathLike, split: str, meta: dict[str, Any] | None = None) -> np.memmap:
    """Read-only uint16 memmap of ``split`` ("train" or "val"), checked against meta.json: its token
    count, and that no id lies beyond its vocab_size (check_token_ids)."""
    if split not in SPLITS:
        raise PrepareError(f"Unknown split {split!r}; choose one of: {', '.join(SPLITS)}.")
    meta = load_meta(data_dir) if meta is None else meta
    path = Path(data_dir) / f"{split}.bin"
    if f"{split}_tokens" not in meta:
        raise PrepareError(f"{Path(data_dir) / META_FILE} has no {split}_tokens count; re-run data/prepare.py for {data_dir}.")
    expected = meta[f"{split}_tokens"]
    stat = path.stat() if path.is_file() else None
    itemsize = np.dtype(TOKEN_DTYPE).itemsize
    if stat is not None and stat.st_size % itemsize:  # numpy's memmap would refuse it with a traceback
        raise PrepareError(
            f"{path} is {stat.st_size} bytes, not a whole number of {itemsize}-byte token ids: it is damaged "
            f"(cut or appended to); re-run data/prepare.py for {data_dir}."
        )
    actual = stat.st_size // itemsize if stat is not None else None
    if actual != expected:
        raise PrepareError(
            f"{path} holds {actual} tokens but {META_FILE} says {expected}; re-run data/prepare.py for {data_dir}."
        )
    if actual == 0:  # numpy cannot map an empty file ("cannot mmap an empty file", a traceback)
        raise PrepareError(
            f"{path} holds no tokens: the {split} split is empty; prepare the dataset again from a text long enough "
            f"for both splits (data/prepare.py for {data_dir})."
        )
    tokens = np.memmap(path, dtype=TOKEN_DTYPE, mode="r")
    check_token_ids(path, tokens, meta, split, stat)
    return tokens


def bin_stamps(paths: dict[str, Path]) -> dict[str, int]:
    """meta.json's {split}_mtime_ns of the bins at `paths` ({split: path}), as prepare.py records them
    once they are written (a rename keeps a file's mtime): check_token_ids trusts the recorded
    maximum of a bin only while its mtime is still this one."""
    return {f"{split}_{MTIME_KEY}": Path(path).stat().st_mtime_ns for split, path in paths.items()}


# Largest id of each token file that check_token_ids had to scan, by (path, size, mtime): train.py
# opens a split afresh for every batch (batches.TokenData.split), and a scan reads the whole file.
_SCANNED_MAX: dict[tuple[str, int, int], int] = {}


def check_token_ids(path: Path, tokens: np.ndarray, meta: dict[str, Any], split: str, stat: os.stat_result | None = None) -> None:
    """A PrepareError naming `path` if a token id in it is not below meta.json's vocab_size (it would
    stop training mid-run: an IndexError on a CPU, a device-side assert on CUDA).

    prepare.py records each split's largest id and each bin's mtime (bin_stamps), so the check costs
    nothing while the bin is the one prepare.py wrote. A bin whose mtime differs (rewritten, or
    copied without its times), or whose meta.json has no maximum (a hand-made dataset), is scanned
    instead, in SCAN_CHUNK steps, once per process. A maximum without mtimes (prepared before they
    were recorded) is trusted; a meta.json without a vocab_size gives nothing to check against.
    """
    vocab_size = meta.get("vocab_size")
    if vocab_size is None or not len(tokens):
        return
    top = meta.get(f"{split}_{MAX_TOKEN_KEY}")
    stat = stat or path.stat()  # open_split's, when it called: one stat per batch, not two
    stamp = meta.get(f"{split}_{MTIME_KEY}", stat.st_mtime_ns)  # none recorded: the maximum is trusted
    if top is None or stamp != stat.st_mtime_ns:
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        if key not in _SCANNED_MAX:
            _SCANNED_MAX[key] = max(int(tokens[i : i + SCAN_CHUNK].max()) for i in range(0, len(tokens), SCAN_CHUNK))
        top = _SCANNED_MAX[key]
    if top >= vocab_size:
        raise PrepareError(
            f"{path} holds token id {top}, beyond the {vocab_size} tokens of the vocabulary its {META_FILE} "
            f"declares (valid ids are 0..{vocab_size - 1}); the file is damaged or from another tokenizer: "
            f"re-run data/prepare.py for {path.parent}."
        )
