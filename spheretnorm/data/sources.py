"""Where documents come from: local files (--input), the Hugging Face hub, or a URL.

Every source yields batches (lists) of document texts for the one write loop in pipeline.py, plus
the document count when it is known up front (it selects the exact, permutation-based split) and
a description for meta.json's ``source`` field.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import itertools
import json
import os
import re
import sys
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spheretnorm.runtime.atomic import replace_file
from spheretnorm.runtime.token_files import PrepareError
from spheretnorm.data.pipeline import EmbeddedText, sha256_file

INPUT_FORMATS = {".jsonl": "jsonl", ".txt": "txt", ".parquet": "parquet"}

# In a txt input, documents are separated by the GPT-2 end-of-text marker, optionally on its own
# line ("doc\n<|endoftext|>\ndoc", as in TinyStories-style dumps); a file without it is one document.
TXT_DOC_SEPARATOR = re.compile(r"\n?<\|endoftext\|>\n?")


@dataclass
class DocumentSource:
    batches: Iterable[list[str]]
    num_docs: int | None
    info: dict[str, Any] = field(default_factory=dict)


def batched(texts: Iterable[str], batch_size: int) -> Iterator[list[str]]:
    iterator = iter(texts)
    while batch := list(itertools.islice(iterator, batch_size)):
        yield batch


def _as_text(value: Any, text_field: str, where: str) -> str:
    if not isinstance(value, str):
        raise PrepareError(f"{where}: field {text_field!r} should be a string, got {type(value).__name__}.")
    return value


# --------------------------------------------------------------------------------------------
# Local files
# --------------------------------------------------------------------------------------------


def input_format(path: Path) -> str:
    fmt = INPUT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise PrepareError(
            f"Input file {path} has an unsupported extension {path.suffix!r}; use one of: {', '.join(INPUT_FORMATS)}."
        )
    return fmt


def first_bad_byte(path: Path, chunk_size: int = 1 << 20) -> tuple[int, int]:
    """(offset, value) of the first byte of `path` that is not UTF-8."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(chunk_size)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                pending = len(exc.object) - len(chunk)  # bytes the decoder held back from the last chunk
                return offset - pending + exc.start, exc.object[exc.start]
            if not chunk:
                return offset, 0
            offset += len(chunk)


def not_text(path: Path, fmt: str) -> PrepareError:
    """The error for an input file that is not UTF-8 text (a binary file given as --input)."""
    offset, byte = first_bad_byte(path)
    return PrepareError(
        f"Input file {path} is not UTF-8 text (byte 0x{byte:02x} at offset {offset}); "
        f"a .{fmt} input must be UTF-8 text: convert it, or give the right file."
    )


def _utf8_lines(path: Path, fmt: str) -> Iterator[str]:
    """The lines of a text file; PrepareError naming it if it is not UTF-8."""
    try:
        with open(path, encoding="utf-8") as f:
            yield from f
    except UnicodeDecodeError:
        raise not_text(path, fmt) from None


def _jsonl_texts(path: Path, text_field: str) -> Iterator[str]:
    for line_no, line in enumerate(_utf8_lines(path, "jsonl"), 1):
        if not line.strip():
            continue
        where = f"{path}:{line_no}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PrepareError(f"{where} is not valid JSON ({exc.msg}).") from None
        if not isinstance(record, dict) or text_field not in record:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise PrepareError(f"{where} has no {text_field!r} field (found: {keys}); set --text_field.")
        yield _as_text(record[text_field], text_field, where)


def _split_txt(text: str) -> list[str]:
    return [doc for doc in TXT_DOC_SEPARATOR.split(text) if doc]


def _parquet_file(path: Path, text_field: str):
    import pyarrow
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pyarrow.ArrowException, OSError) as exc:
        raise PrepareError(f"Input file {path} is not a readable parquet file ({str(exc).splitlines()[0]}); give a .parquet file with a text column.") from None
    columns = parquet.schema_arrow.names
    if text_field not in columns:
        raise PrepareError(f"{path} has no {text_field!r} column (found: {columns}); set --text_field.")
    return parquet


def _parquet_texts(path: Path, text_field: str) -> Iterator[str]:
    parquet = _parquet_file(path, text_field)
    for record_batch in parquet.iter_batches(batch_size=4096, columns=[text_field]):
        for value in record_batch.column(0).to_pylist():
            yield _as_text(value, text_field, f"{path} (a row of column {text_field!r})")


def _file_texts_and_count(path: Path, fmt: str, text_field: str) -> tuple[Iterable[str], int]:
    if fmt == "jsonl":
        return _jsonl_texts(path, text_field), sum(1 for line in _utf8_lines(path, "jsonl") if line.strip())
    if fmt == "parquet":
        return _parquet_texts(path, text_field), _parquet_file(path, text_field).metadata.num_rows
    try:
        docs = _split_txt(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise not_text(path, "txt") from None
    return docs, len(docs)


def local_source(paths: Sequence[str | os.PathLike], text_field: str, batch_size: int) -> DocumentSource:
    """Documents from jsonl (one JSON object per line), txt or parquet files, in the order given."""
    resolved = [Path(p).expanduser().resolve() for p in paths]
    for path in resolved:
        if not path.is_file():
            raise PrepareError(f"Input file {path} does not exist.")
    iterables, total, files_info = [], 0, []
    for path in resolved:
        fmt = input_format(path)
        texts, count = _file_texts_and_count(path, fmt, text_field)
        iterables.append(texts)
        total += count
        files_info.append({"path": str(path), "format": fmt, "sha256": sha256_file(path), "documents": count})
    info = {"kind": "local", "files": files_info, "text_field": text_field}
    return DocumentSource(batched(itertools.chain.from_iterable(iterables), batch_size), total, info)


# --------------------------------------------------------------------------------------------
# Hugging Face hub
# --------------------------------------------------------------------------------------------


def _hub_load_error(exc: Exception, hub_id: str, desc: str) -> PrepareError:
    # datasets>=4 refuses script-based hub datasets, in one of these messages.
    if "scripts are no longer supported" in str(exc) or "loading script" in str(exc):
        return PrepareError(
            f"The hub dataset {hub_id!r} is script-based and datasets>=4 refuses loading scripts; "
            "pass `--revision refs/convert/parquet` to read the hub's parquet conversion (for big datasets the "
            "converter may keep only the first ~5 GB, as split 'partial-train'), or `--hub_id` of a parquet copy, "
            "or download the data and use `--input FILE` (or `pip install 'datasets<4'`)."
        )
    return PrepareError(
        f"Could not load the hub dataset {desc} ({type(exc).__name__}: {exc}); check --hub_id, --hub_config, "
        "--revision, --data_files and network access, or prepare local files with --input."
    )


def _pick_split(loaded: Any, split: str) -> Any:
    """The requested split; a lone other split (e.g. a parquet conversion's 'partial-train') is used with a warning."""
    available = list(loaded.keys())
    if split in loaded:
        return loaded[split]
    if len(available) == 1:
        print(f"warning: split {split!r} not found, using the only split {available[0]!r}", file=sys.stderr)
        return loaded[available[0]]
    raise PrepareError(f"The hub dataset has no split {split!r}; available splits: {', '.join(available)}.")


def hub_source(
    hub_id: str,
    *,
    config: str | None,
    revision: str | None,
    data_files: Sequence[str] | None,
    split: str,
    text_field: str,
    streaming: bool,
    num_proc: int,
    batch_size: int,
) -> DocumentSource:
    """Documents from a hub dataset; streaming reads only what the write loop consumes."""
    import datasets

    kwargs: dict[str, Any] = {"name": config, "revision": revision, "streaming": streaming}
    if data_files:
        kwargs["data_files"] = list(data_files)
    if not streaming and num_proc > 1:
        kwargs["num_proc"] = num_proc  # parallel download/preparation; streaming has no such step
    desc = f"{hub_id!r} (config={config}, revision={revision})"
    try:
        dataset = _pick_split(datasets.load_dataset(hub_id, **kwargs), split)
    except PrepareError:
        raise
    except Exception as exc:  # noqa: BLE001 - every load failure becomes one user-facing message
        raise _hub_load_error(exc, hub_id, desc) from exc
    columns = dataset.column_names
    if columns is not None and text_field not in columns:
        raise PrepareError(f"The hub dataset {desc} has no {text_field!r} column (found: {columns}); set --text_field.")
    dataset = dataset.select_columns([text_field])
    num_docs = None if streaming else len(dataset)
    batches = ([_as_text(t, text_field, desc) for t in batch[text_field]] for batch in dataset.iter(batch_size=batch_size))
    info = {
        "kind": "hub",
        "hub_id": hub_id,
        "config": config,
        "revision": revision,
        "data_files": list(data_files) if data_files else None,
        "split": split,
        "streaming": streaming,
        "text_field": text_field,
        "datasets_version": datasets.__version__,
    }
    return DocumentSource(batches, num_docs, info)


# --------------------------------------------------------------------------------------------
# URL (Tiny Shakespeare)
# --------------------------------------------------------------------------------------------


def download(url: str, dest: Path, timeout_s: float = 30.0) -> Path:
    """Fetch ``url`` to ``dest`` once (kept as a cache); PrepareError pointing to --input when offline."""
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)

    def fetch(tmp: Path) -> None:
        with urllib.request.urlopen(url, timeout=timeout_s) as response, open(tmp, "wb") as f:
            f.write(response.read())

    try:
        return replace_file(dest, fetch, temp=dest.with_name(dest.name + ".download"))
    except OSError as exc:  # URLError, timeouts and socket errors are all OSErrors
        raise PrepareError(
            f"Could not download {url} ({exc}); without network, leave out --download to use the embedded copy, "
            "or pass a local copy with --input PATH."
        ) from exc


def url_source(url: str, cache_path: Path, text_field: str, batch_size: int) -> DocumentSource:
    path = download(url, cache_path)
    source = local_source([path], text_field, batch_size)
    source.info = {**source.info, "kind": "url", "url": url}  # the file's own kind ("local") would hide the URL
    return source


# --------------------------------------------------------------------------------------------
# The copy shipped in the checkout (Tiny Shakespeare)
# --------------------------------------------------------------------------------------------


def read_embedded(embedded: EmbeddedText) -> str:
    """The embedded text, uncompressed; PrepareError when it is missing or not the recorded text."""
    try:
        data = gzip.decompress(embedded.path.read_bytes())
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise PrepareError(
            f"The embedded copy {embedded.path} cannot be read ({exc}); restore it (git checkout -- {embedded.path.name}), "
            "or pass --download or --input PATH."
        ) from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != embedded.sha256:
        raise PrepareError(
            f"The embedded copy {embedded.path} holds text of sha256 {digest}, not the recorded {embedded.sha256}; "
            "restore it, or pass --download or --input PATH."
        )
    return data.decode("utf-8")


def embedded_source(embedded: EmbeddedText, batch_size: int) -> DocumentSource:
    """Documents of the text shipped in the checkout, checked against its recorded sha256."""
    docs = _split_txt(read_embedded(embedded))
    info = {"kind": "embedded", "path": str(embedded.path), "url": embedded.url, "sha256": embedded.sha256, "documents": len(docs)}
    return DocumentSource(batched(docs, batch_size), len(docs), info)
