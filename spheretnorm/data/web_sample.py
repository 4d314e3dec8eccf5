"""The web-text sample of the CPU studies, rebuilt from its public source.

The studies read ``../shared/data/openwebtext_sample.jsonl``: the first 831 documents of the
openwebtext-10k sample that bigscience-workshop/Megatron-DeepSpeed keeps as test data, as an
indexed dataset (Megatron's MMIDIDX format: GPT-2 BPE ids per document, each closed by one
end-of-document id). A clone has no ../shared, so
``python data/prepare.py --make_openwebtext_sample OUT.jsonl`` rebuilds the file where a network
exists: it downloads the two files at a pinned commit, decodes the documents, writes one
``{"text": ...}`` per line and checks the sha256, so the result is the studies' file byte for
byte or a one-line refusal.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from spheretnorm.runtime.atomic import replace_file
from spheretnorm.runtime.token_files import PrepareError

MEGATRON_COMMIT = "8387ae17c4704f6579f88a84500b535d19d7fbbf"
SOURCE_URL = (
    f"https://raw.githubusercontent.com/bigscience-workshop/Megatron-DeepSpeed/{MEGATRON_COMMIT}"
    "/tests/data/gpt2/meg-gpt2-openwebtext_text_document"
)
SAMPLE_DOCS = 831
SAMPLE_SHA256 = "155a49e557562f7da4eb19286426193679bcac1dcae7cb3d1a8520d671ab3331"
# Seconds a download may wait on one connect or read: without network the command ends in
# seconds instead of hanging on a dead route.
DOWNLOAD_TIMEOUT_S = 10.0

MMIDIDX_MAGIC = b"MMIDIDX\x00\x00"
# Megatron's dtype codes (megatron/data/indexed_dataset.py) for the integer ids a corpus holds.
MMIDIDX_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, document-index entries


def read_indexed_documents(index: bytes, tokens: bytes) -> list[np.ndarray]:
    """The token ids of each document of a Megatron MMIDIDX dataset (its .idx and .bin contents), in order.

    A document is the run of sequences between two entries of the document index (one
    sequence each unless the corpus was split into sentences).
    """
    if len(index) < _HEADER.size or index[:9] != MMIDIDX_MAGIC:
        raise PrepareError("The index file is not a Megatron MMIDIDX index (its first bytes are not 'MMIDIDX').")
    _, version, code, n_seq, n_doc_idx = _HEADER.unpack_from(index)
    if version != 1 or code not in MMIDIDX_DTYPES:
        raise PrepareError(f"The MMIDIDX index has version {version} and dtype code {code}; only version 1 with integer ids is read.")
    dtype = np.dtype(MMIDIDX_DTYPES[code])
    offset = _HEADER.size
    sizes = np.frombuffer(index, np.int32, n_seq, offset)
    pointers = np.frombuffer(index, np.int64, n_seq, offset + 4 * n_seq)  # byte offsets into the .bin
    doc_idx = np.frombuffer(index, np.int64, n_doc_idx, offset + 12 * n_seq)
    ids = np.frombuffer(tokens, dtype)
    sequences = [ids[p // dtype.itemsize : p // dtype.itemsize + s] for p, s in zip(pointers.tolist(), sizes.tolist())]
    return [np.concatenate(sequences[a:b]) for a, b in zip(doc_idx[:-1].tolist(), doc_idx[1:].tolist())]


def decode_documents(documents: Sequence[np.ndarray], count: int, decode: Callable[[list[int]], str]) -> list[str]:
    """The text of the first ``count`` documents: each one's closing end-of-document id dropped, the rest decoded."""
    if len(documents) < count:
        raise PrepareError(f"The indexed dataset holds {len(documents)} documents, fewer than the {count} the sample takes.")
    return [decode(doc[:-1].tolist()) for doc in documents[:count]]


def jsonl_bytes(texts: Iterable[str]) -> bytes:
    """The sample file's bytes: one ``{"text": ...}`` per line, non-ASCII characters kept as UTF-8, as the recipe wrote it."""
    return "".join(json.dumps({"text": text}, ensure_ascii=False) + "\n" for text in texts).encode("utf-8")


def download(url: str, timeout_s: float = DOWNLOAD_TIMEOUT_S) -> bytes:
    """The bytes at url; any failure to fetch them is one PrepareError naming the URL and what the command needs."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.read()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise PrepareError(
            f"Cannot download {url} ({reason}); --make_openwebtext_sample needs network access to "
            "raw.githubusercontent.com (the sample's public source), so run it on a machine with network and copy the file here."
        ) from None


def write_checked(data: bytes, out: Path, expected_sha256: str) -> None:
    """Write data to out only when its sha256 is the expected one; a mismatch is refused with both digests and writes nothing."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected_sha256:
        raise PrepareError(
            f"The rebuilt sample has sha256 {digest}, not the expected {expected_sha256}, so {out} was not written "
            "(the source or the GPT-2 decoding differs from the recipe's)."
        )
    replace_file(out, lambda partial: partial.write_bytes(data), temp=out.with_name(out.name + ".partial"))  # a reader never sees half a file


def make_openwebtext_sample(
    out: str | os.PathLike,
    source_url: str | None = None,
    count: int = SAMPLE_DOCS,
    expected_sha256: str = SAMPLE_SHA256,
    decode: Callable[[list[int]], str] | None = None,
) -> str:
    """Build the studies' openwebtext_sample.jsonl at out from source_url's .idx/.bin; returns its sha256.

    The defaults are the recipe (source_url None: SOURCE_URL); the others let the tests build a
    small sample from local files (file:// URLs).
    """
    out, source_url = Path(out), source_url or SOURCE_URL
    if not out.parent.is_dir():
        raise PrepareError(f"The folder of {out} does not exist; create it or give another OUT.jsonl.")
    index, tokens = download(source_url + ".idx"), download(source_url + ".bin")
    if decode is None:
        from spheretnorm.data.tokenizer import get_gpt2_encoding

        decode = get_gpt2_encoding().decode
    texts = decode_documents(read_indexed_documents(index, tokens), count, decode)
    write_checked(jsonl_bytes(texts), out, expected_sha256)
    return expected_sha256
