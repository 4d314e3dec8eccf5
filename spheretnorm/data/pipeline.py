"""Shared data logic: the dataset table, tokenisers, the one tokenise-and-write loop, and readers.

Output layout of a prepared dataset directory (read by train.py through ``load_meta`` and
``open_split``):

  train.bin, val.bin  flat uint16 token ids; with the GPT-2 tokenizer every document is
                      followed by the end-of-text token (50256)
  meta.json           tokenizer, vocab size, token/document counts, source, split seed, ...
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from spheretnorm.data.tokenizer import EOT_TOKEN, get_gpt2_encoding
from spheretnorm.runtime.cli import REPO_ROOT
from spheretnorm.runtime.token_files import MAX_TOKEN_KEY, META_FILE, SPLITS, TOKEN_DTYPE, PrepareError, bin_stamps

UINT16_LIMIT = 2**16
DEFAULT_SEED = 2357  # nanoGPT's split seed, so val sets are comparable with its runs


# --------------------------------------------------------------------------------------------
# The dataset table
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddedText:
    """A public-domain text shipped in the checkout, compressed (gzip): the default input of the
    datasets built on it when nothing was downloaded, so the quick start works offline."""

    path: Path  # the .gz file, in the checkout's data/ folder (tracked; data/*/ is not)
    url: str  # where the text was taken from
    sha256: str  # of the uncompressed text, checked on every use


@dataclass(frozen=True)
class DatasetSpec:
    """Where a dataset comes from and how it is tokenised and split.

    split_mode "documents": a seeded document-level split (web corpora);
    split_mode "contiguous": the whole text is cut once, the tail going to val (Shakespeare).
    """

    name: str
    tokenizer: str  # "gpt2" or "char"
    split_mode: str  # "documents" or "contiguous"
    val_fraction: float
    hub_id: str | None = None
    hub_config: str | None = None
    hub_revision: str | None = None
    hub_split: str = "train"
    text_field: str = "text"
    streaming: bool = False
    url: str | None = None
    embedded: EmbeddedText | None = None  # used when no input is given and nothing was downloaded


_TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
# nanoGPT's default data set (karpathy/char-rnn @6f9487a6, 1,115,394 bytes), public-domain text.
TINY_SHAKESPEARE = EmbeddedText(
    path=REPO_ROOT / "data" / "tinyshakespeare.txt.gz",
    url=_TINY_SHAKESPEARE_URL,
    sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
)

DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        # Skylion007/openwebtext is the hub home of OpenWebText. Its old loading script is refused
        # by datasets>=4; sources.py turns that refusal into an error naming the workarounds.
        DatasetSpec("openwebtext", "gpt2", "documents", 0.0005, hub_id="Skylion007/openwebtext"),
        # Streaming by default: --max_tokens / --max_docs then need no full download.
        DatasetSpec("fineweb_edu", "gpt2", "documents", 0.0005, hub_id="HuggingFaceFW/fineweb-edu", hub_config="sample-10BT", streaming=True),
        DatasetSpec("shakespeare", "gpt2", "contiguous", 0.1, url=_TINY_SHAKESPEARE_URL, embedded=TINY_SHAKESPEARE),
        DatasetSpec("shakespeare_char", "char", "contiguous", 0.1, url=_TINY_SHAKESPEARE_URL, embedded=TINY_SHAKESPEARE),
    )
}


def get_spec(name: str) -> DatasetSpec:
    """The table entry for a dataset name, or PrepareError naming the valid ones."""
    if name not in DATASETS:
        raise PrepareError(f"Unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}.")
    return DATASETS[name]


# --------------------------------------------------------------------------------------------
# Tokenisers
# --------------------------------------------------------------------------------------------


@dataclass
class TextEncoder:
    """What the write loop needs from a tokenizer, whatever its kind."""

    name: str
    vocab_size: int
    eot_token: int | None
    encode_batch: Callable[[list[str]], list[list[int]]]
    meta: dict[str, Any] = field(default_factory=dict)  # extra meta.json fields (char vocab)


def gpt2_encoder(num_threads: int = 1) -> TextEncoder:
    """GPT-2 BPE; documents are encoded as plain text (special-token strings are not special)."""
    enc = get_gpt2_encoding()
    threads = max(1, num_threads)
    return TextEncoder(name="gpt2", vocab_size=enc.n_vocab, eot_token=EOT_TOKEN,
                       encode_batch=lambda texts: enc.encode_ordinary_batch(texts, num_threads=threads))


def char_encoder(text: str) -> TextEncoder:
    """Character-level vocabulary: the sorted distinct characters of ``text``, no end-of-text token."""
    itos = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(itos)}

    def encode_batch(texts: list[str]) -> list[list[int]]:
        try:
            return [[stoi[ch] for ch in t] for t in texts]
        except KeyError as exc:  # only possible if a caller encodes text the vocab was not built on
            raise PrepareError(f"Character {exc.args[0]!r} is not in the character vocabulary.") from None

    return TextEncoder(name="char", vocab_size=len(itos), eot_token=None, encode_batch=encode_batch, meta={"stoi": stoi, "itos": itos})


# --------------------------------------------------------------------------------------------
# Validation split
# --------------------------------------------------------------------------------------------


class FixedSplitter:
    """A precomputed assignment, handed out document by document in corpus order (True = val);
    the contiguous split's is [False, True] (document 0 = train part, 1 = val part)."""

    def __init__(self, is_val: Sequence[bool]):
        self._is_val = np.asarray(is_val, dtype=bool)
        self._next = 0

    def assign(self, count: int) -> np.ndarray:
        """Boolean mask (True = val) for the next ``count`` documents."""
        mask = self._is_val[self._next : self._next + count]
        if len(mask) < count:
            raise RuntimeError("the source yielded more documents than it announced")
        self._next += count
        return mask


class PermutationSplitter(FixedSplitter):
    """Exactly max(1, round(n * fraction)) val documents, drawn by a seeded permutation of n."""

    def __init__(self, num_docs: int, fraction: float, seed: int):
        num_val = max(1, round(num_docs * fraction))
        if num_docs - num_val < 1:
            raise PrepareError(
                f"The corpus has {num_docs} document(s), too few to split into train and val; "
                "provide at least 2 documents."
            )
        is_val = np.zeros(num_docs, dtype=bool)
        is_val[np.random.default_rng(seed).permutation(num_docs)[:num_val]] = True
        super().__init__(is_val)


class BernoulliSplitter:
    """Each document goes to val with probability ``fraction``, from one seeded stream.

    Used when the document count is not known in advance (streaming, --max_tokens). The stream of
    float64 draws does not depend on batch boundaries, so the split is reproducible.
    """

    def __init__(self, fraction: float, seed: int):
        self._fraction = fraction
        self._rng = np.random.default_rng(seed)

    def assign(self, count: int) -> np.ndarray:
        return self._rng.random(count) < self._fraction


# What decides, document by document in corpus order, which ones go to val.
Splitter = FixedSplitter | BernoulliSplitter


def check_val_fraction(fraction: float) -> float:
    if not 0.0 < fraction < 1.0:
        raise PrepareError(f"--val_fraction must be strictly between 0 and 1, got {fraction}.")
    return fraction


def contiguous_split(text: str, val_fraction: float) -> tuple[str, str]:
    """Cut one text so the last ``val_fraction`` of its characters form the val part."""
    cut = int(len(text) * (1.0 - check_val_fraction(val_fraction)))
    if cut == 0 or cut == len(text):
        raise PrepareError(f"The text has {len(text)} characters, too few to split with val_fraction={val_fraction}.")
    return text[:cut], text[cut:]


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def flatten_tokens(docs: Sequence[Sequence[int]], eot_token: int | None) -> np.ndarray:
    """Concatenate token lists (each followed by eot_token if any) into a uint16 array.

    Raises PrepareError if an id does not fit uint16, before anything is written.
    """
    pieces: list[np.ndarray] = []
    eot = None if eot_token is None else np.array([eot_token], dtype=np.int64)
    for doc in docs:  # per-document array conversion runs in C; a flat Python iterator is slower
        pieces.append(np.asarray(doc, dtype=np.int64))
        if eot is not None:
            pieces.append(eot)
    ids = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= UINT16_LIMIT):
        bad = int(ids.max()) if ids.max() >= UINT16_LIMIT else int(ids.min())
        raise PrepareError(
            f"Token id {bad} does not fit in uint16 (valid ids are 0..{UINT16_LIMIT - 1}); "
            "use a tokenizer with a vocabulary of at most 65536 tokens."
        )
    return ids.astype(TOKEN_DTYPE)


class UnwritableFolder(PrepareError):
    """The folder the prepared files go to cannot be made or written to. It keeps the folder and
    the reason, so that a caller whose option for that folder is not --out_dir (a study's
    --data_dir) can name its own option instead of data/prepare.py's."""

    def __init__(self, folder: Path, reason: str):
        super().__init__(f"Cannot write the prepared files into {folder} ({reason}); choose a writable --out_dir.")
        self.folder = folder
        self.reason = reason


class AtomicSplitWriter:
    """Writes train.bin / val.bin / meta.json to temp files and renames them only on success.

    Re-running therefore never leaves old and new files mixed: meta.json is removed before the
    bins are swapped in and written last, and readers refuse a directory without it.
    """

    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self._tmp: dict[str, Path] = {}
        self._files: dict[str, Any] = {}
        self._max_token = dict.fromkeys(SPLITS, -1)  # -1: no token yet
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            for split in SPLITS:
                self._tmp[split] = self._temp_path(f"{split}.bin")
                self._files[split] = open(self._tmp[split], "xb")
        except OSError as exc:
            self.abort()
            raise UnwritableFolder(self.out_dir, str(exc.strerror or exc)) from None

    def _write_failed(self, path: Path, exc: OSError) -> PrepareError:
        """A write that failed (a full disk, a file-size limit): the temporary files go, and the
        error says that the folder's earlier files are as they were."""
        self.abort()
        return PrepareError(
            f"Could not write {path} ({exc.strerror or exc}; is the disk full?); nothing was written to "
            f"{self.out_dir}: its earlier {', '.join(f'{s}.bin' for s in SPLITS)} and {META_FILE}, if any, are untouched."
        )

    def _temp_path(self, name: str) -> Path:
        # Unique per run (not tempfile.mkstemp, whose 0600 mode would survive the rename).
        return self.out_dir / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"

    def write(self, split: str, ids: np.ndarray) -> None:
        try:
            ids.tofile(self._files[split])
        except OSError as exc:
            raise self._write_failed(self.out_dir / f"{split}.bin", exc) from None
        if ids.size:
            self._max_token[split] = max(self._max_token[split], int(ids.max()))

    def commit(self, meta: dict[str, Any]) -> None:
        """Write meta.json, adding the largest token id of each split to `meta` (in place, so the
        caller's dict is what the file holds), and each bin's mtime: open_split checks the maximum
        against the vocabulary without reading a bin that is still the one written here
        (check_token_ids). A write that fails is a PrepareError and leaves no file behind."""
        for split, f in self._files.items():
            try:
                f.flush()
                os.fsync(f.fileno())  # a full disk shows here, not after the rename
                f.close()
            except OSError as exc:
                raise self._write_failed(self.out_dir / f"{split}.bin", exc) from None
        meta.update({f"{split}_{MAX_TOKEN_KEY}": top for split, top in self._max_token.items() if top >= 0})
        meta.update(bin_stamps({split: self._tmp[split] for split in SPLITS}))
        meta_tmp = self._tmp["meta"] = self._temp_path(META_FILE)
        try:
            with open(meta_tmp, "x", encoding="utf-8") as f:
                json.dump(meta, f, indent=2, ensure_ascii=False)
                f.write("\n")
        except OSError as exc:
            raise self._write_failed(self.out_dir / META_FILE, exc) from None
        (self.out_dir / META_FILE).unlink(missing_ok=True)
        for split in SPLITS:
            os.replace(self._tmp[split], self.out_dir / f"{split}.bin")
        os.replace(meta_tmp, self.out_dir / META_FILE)
        self._tmp.clear()

    def abort(self) -> None:
        for f in self._files.values():
            try:
                f.close()
            except OSError:  # a buffer that cannot be flushed (the disk is full): the file goes anyway
                pass
        for path in self._tmp.values():
            path.unlink(missing_ok=True)
        self._tmp.clear()

    def __enter__(self) -> AtomicSplitWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._tmp:  # not committed: an error happened, leave the old outputs untouched
            self.abort()


@dataclass
class SplitCounts:
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    docs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens.values())


def limit_docs(batches: Iterable[list[str]], max_docs: int | None) -> Iterator[list[str]]:
    """Cut the batch stream after max_docs documents."""
    remaining = max_docs
    for batch in batches:
        if remaining is not None:
            batch = batch[:remaining]
            remaining -= len(batch)
        if batch:
            yield batch
        if remaining == 0:
            return


def _docs_within_token_budget(token_lists: list[list[int]], per_doc_extra: int, budget: int) -> int:
    """How many leading documents to keep so the total reaches ``budget`` (the last one kept whole)."""
    lengths = np.fromiter((len(t) + per_doc_extra for t in token_lists), dtype=np.int64, count=len(token_lists))
    return int(np.searchsorted(np.cumsum(lengths), budget)) + 1


def tokenize_and_write(
    batches: Iterable[list[str]],
    encoder: TextEncoder,
    splitter: Splitter,
    writer: AtomicSplitWriter,
    *,
    max_docs: int | None = None,
    max_tokens: int | None = None,
    total_docs: int | None = None,
    progress: bool = True,
    desc: str = "tokenizing",
) -> SplitCounts:
    """The one tokenise-and-write loop shared by every dataset and source.

    Each batch of document texts is encoded, assigned to train/val by ``splitter`` and appended to
    the writer's temp files. Stops after ``max_docs`` documents or once ``max_tokens`` tokens
    (end-of-text included) are written; the document crossing the token budget is kept whole.
    """
    from tqdm.auto import tqdm

    counts = SplitCounts()
    per_doc_extra = 0 if encoder.eot_token is None else 1
    known_totals = [n for n in (total_docs, max_docs) if n is not None]
    bar_total = min(known_totals) if known_totals else None
    with tqdm(total=bar_total, desc=desc, unit="doc", disable=not progress, dynamic_ncols=True) as bar:
        for texts in limit_docs(batches, max_docs):
            token_lists = encoder.encode_batch(texts)
            if max_tokens is not None:
                token_lists = token_lists[: _docs_within_token_budget(token_lists, per_doc_extra, max_tokens - counts.total_tokens)]
            is_val = splitter.assign(len(token_lists))
            for split, wanted in (("train", False), ("val", True)):
                docs = [t for t, v in zip(token_lists, is_val) if v == wanted]
                ids = flatten_tokens(docs, encoder.eot_token)
                writer.write(split, ids)
                counts.tokens[split] += len(ids)
                counts.docs[split] += len(docs)
            bar.update(len(token_lists))
            bar.set_postfix(tokens=f"{counts.total_tokens:,}", refresh=False)
            if max_tokens is not None and counts.total_tokens >= max_tokens:
                break
    return counts


# --------------------------------------------------------------------------------------------
# Meta and readers (used by train.py)
# --------------------------------------------------------------------------------------------


def sha256_file(path: Path, chunk_size: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


