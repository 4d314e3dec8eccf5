"""Prepare a dataset for training: ``python data/prepare.py DATASET [options]``.

Writes ``data/DATASET/{train.bin,val.bin,meta.json}`` (or ``--out_dir``). Examples:

  python data/prepare.py shakespeare_char          # the embedded copy in data/, offline
  python data/prepare.py shakespeare_char --download   # fetched from its URL instead
  python data/prepare.py openwebtext --input ../shared/data/openwebtext_sample.jsonl   # offline
  python data/prepare.py openwebtext --num_proc 8                                       # from the hub
  python data/prepare.py fineweb_edu --max_tokens 100_000_000                           # streams
  python data/prepare.py --make_openwebtext_sample openwebtext_sample.jsonl   # the studies' sample, network
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from spheretnorm.runtime.cli import REPO_ROOT
from spheretnorm.data.pipeline import (
    DATASETS, DEFAULT_SEED, AtomicSplitWriter, BernoulliSplitter, DatasetSpec, FixedSplitter, PermutationSplitter, SplitCounts,
    Splitter, TextEncoder, limit_docs, char_encoder, check_val_fraction, contiguous_split, get_spec, gpt2_encoder, sha256_file,
    tokenize_and_write, utc_now_iso
)
from spheretnorm.runtime.token_files import SPLITS, TOKEN_DTYPE, PrepareError, load_meta
from spheretnorm.data.sources import DocumentSource, embedded_source, hub_source, local_source, url_source
from spheretnorm.data.tokenizer import TokenizerUnavailableError
from spheretnorm.data.web_sample import SAMPLE_DOCS, make_openwebtext_sample


def default_num_proc() -> int:
    """CPUs this process may use (affinity-aware, unlike os.cpu_count in containers)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass
class PrepareOptions:
    """Everything the CLI can set; ``None`` means the dataset table's default."""

    dataset: str
    input: list[str] | None = None
    out_dir: str | None = None
    num_proc: int | None = None
    max_docs: int | None = None
    max_tokens: int | None = None
    val_fraction: float | None = None
    seed: int = DEFAULT_SEED
    hub_id: str | None = None
    hub_config: str | None = None
    revision: str | None = None
    data_files: list[str] | None = None
    streaming: bool | None = None
    text_field: str | None = None
    download: bool = False
    batch_size: int = 512
    progress: bool = True


def _resolve(opts: PrepareOptions, spec: DatasetSpec) -> PrepareOptions:
    """Fill table defaults and validate numbers, so later code sees complete, valid options."""
    for name in ("num_proc", "max_docs", "max_tokens", "batch_size"):
        value = getattr(opts, name)
        if value is not None and value < 1:
            raise PrepareError(f"--{name} must be a positive integer, got {value}.")
    hub_options = [f"--{name}" for name in ("hub_id", "hub_config", "revision", "data_files") if getattr(opts, name)]
    if opts.input and hub_options:
        raise PrepareError(f"--input prepares local files and cannot be combined with {', '.join(hub_options)}; drop one.")
    if opts.download and (opts.input or not spec.url):
        with_url = ", ".join(name for name, other in DATASETS.items() if other.url)
        raise PrepareError(
            f"--download fetches the text of a dataset with a download URL ({with_url}) and takes no --input; "
            f"drop it for {spec.name!r}{' with --input' if opts.input else ''}."
        )
    uses_hub = not opts.input and (opts.hub_id is not None or spec.hub_id is not None)
    return replace(
        opts,
        out_dir=opts.out_dir or str(REPO_ROOT / "data" / spec.name),
        num_proc=opts.num_proc or default_num_proc(),
        val_fraction=check_val_fraction(spec.val_fraction if opts.val_fraction is None else opts.val_fraction),
        hub_id=(opts.hub_id or spec.hub_id) if uses_hub else None,
        # The table's config/revision belong to the table's hub id, not to a user-chosen one.
        hub_config=opts.hub_config if opts.hub_id else (opts.hub_config or spec.hub_config),
        revision=opts.revision if opts.hub_id else (opts.revision or spec.hub_revision),
        streaming=spec.streaming if opts.streaming is None else opts.streaming,
        text_field=opts.text_field or spec.text_field,
    )


def embedded_note(spec: DatasetSpec) -> str:
    """The line that says a dataset was prepared from the copy shipped in the checkout."""
    shown = spec.embedded.path.relative_to(REPO_ROOT) if spec.embedded.path.is_relative_to(REPO_ROOT) else spec.embedded.path
    return (
        f"{spec.name}: using the embedded copy {shown.as_posix()} (sha256 {spec.embedded.sha256[:12]}... checked; "
        f"from {spec.embedded.url}); --download fetches it, --input PATH takes another file"
    )


def check_earlier_download(spec: DatasetSpec, cached: Path) -> None:
    """A PrepareError when the data folder's input.txt, taken as an earlier --download, is not the
    text the dataset records (its sha256): a text of the user's own there would be prepared, and
    named in meta.json, the tables and the run folders, as Tiny Shakespeare. Refused rather than
    renamed: --input prepares one's own text and records it as such."""
    if spec.embedded is None or not cached.is_file():
        return
    digest = sha256_file(cached)
    if digest != spec.embedded.sha256:
        raise PrepareError(
            f"{cached} is not the text of {spec.name!r} (sha256 {digest[:12]}..., not {spec.embedded.sha256[:12]}... of "
            f"{spec.embedded.url}); prepare a text of your own with --input {cached} --out_dir FOLDER, or remove it to use the embedded copy."
        )


def open_source(spec: DatasetSpec, opts: PrepareOptions) -> DocumentSource:
    """--input files if given, else the hub dataset, else an earlier download or the embedded
    copy (no network needed), else the dataset's download URL."""
    if opts.input:
        return local_source(opts.input, opts.text_field, opts.batch_size)
    if opts.hub_id:
        return hub_source(opts.hub_id, config=opts.hub_config, revision=opts.revision, data_files=opts.data_files, split=spec.hub_split,
                          text_field=opts.text_field, streaming=opts.streaming, num_proc=opts.num_proc, batch_size=opts.batch_size)
    cached = Path(opts.out_dir) / "input.txt"  # where --download keeps the text
    check_earlier_download(spec, cached)
    if spec.embedded is not None and not opts.download and not cached.is_file():
        print(embedded_note(spec), flush=True)
        return embedded_source(spec.embedded, opts.batch_size)
    if spec.url:
        return url_source(spec.url, cached, opts.text_field, opts.batch_size)
    raise PrepareError(f"Dataset {spec.name!r} has no default source; pass --input PATH or --hub_id ID.")


@dataclass
class _Plan:
    """What the write loop consumes for one run."""

    batches: Any
    encoder: TextEncoder
    splitter: Splitter
    total_docs: int | None
    max_docs: int | None
    max_tokens: int | None


def _plan_contiguous(spec: DatasetSpec, opts: PrepareOptions, source: DocumentSource) -> _Plan:
    """Shakespeare: one text (documents joined by newlines), its last val_fraction goes to val."""
    if opts.max_tokens is not None:
        raise PrepareError(f"--max_tokens applies to document datasets, not to {spec.name!r}; use --max_docs.")
    text = "\n".join(itertools.chain.from_iterable(limit_docs(source.batches, opts.max_docs)))
    if not text:
        raise PrepareError(f"The corpus for {spec.name!r} is empty; check the --input file.")
    train_text, val_text = contiguous_split(text, opts.val_fraction)
    encoder = char_encoder(text) if spec.tokenizer == "char" else gpt2_encoder(opts.num_proc)
    return _Plan([[train_text], [val_text]], encoder, FixedSplitter([False, True]), 2, None, None)


def _plan_documents(spec: DatasetSpec, opts: PrepareOptions, source: DocumentSource) -> _Plan:
    """Web corpora: a seeded document-level split, exact when the document count is known up front."""
    known = source.num_docs
    if known is not None and opts.max_docs is not None:
        known = min(known, opts.max_docs)
    if known == 0:
        raise PrepareError(f"The corpus for {spec.name!r} is empty (0 documents); check the input.")
    if known is not None and opts.max_tokens is None:
        splitter: Splitter = PermutationSplitter(known, opts.val_fraction, opts.seed)
    else:  # streaming or a token budget: how many documents will be read is unknown
        splitter = BernoulliSplitter(opts.val_fraction, opts.seed)
    return _Plan(source.batches, gpt2_encoder(opts.num_proc), splitter, known, opts.max_docs, opts.max_tokens)


def _check_counts(spec: DatasetSpec, counts: SplitCounts, encoder: TextEncoder, opts: PrepareOptions) -> None:
    eot_per_doc = 0 if encoder.eot_token is None else 1
    text_tokens = counts.total_tokens - eot_per_doc * sum(counts.docs.values())
    if text_tokens == 0:
        raise PrepareError(f"The corpus for {spec.name!r} is empty (no text tokens); check the input.")
    if counts.docs["val"] == 0 or counts.docs["train"] == 0:
        raise PrepareError(
            f"The split of {sum(counts.docs.values())} documents left "
            f"{'val' if counts.docs['val'] == 0 else 'train'} empty with --val_fraction {opts.val_fraction}; "
            "raise --max_docs/--max_tokens or change --val_fraction."
        )


# A val split of fewer documents than this measures the loss on a handful of texts: prepare
# still writes it, with one line of warning.
FEW_VAL_DOCS = 5


def small_val_warning(spec: DatasetSpec, counts: SplitCounts, opts: PrepareOptions) -> str | None:
    """The warning line for a document split whose val part holds fewer than FEW_VAL_DOCS documents."""
    val, total = counts.docs["val"], sum(counts.docs.values())
    if spec.split_mode != "documents" or val >= FEW_VAL_DOCS:
        return None
    return (
        f"warning: the val split holds only {val} document{'s' if val != 1 else ''} of {total:,} "
        f"(--val_fraction {opts.val_fraction}), so the val loss measures {'that text' if val == 1 else 'those texts'} alone; "
        f"raise --val_fraction (about {FEW_VAL_DOCS / max(total, 1):.2g} gives {FEW_VAL_DOCS}) or prepare more documents."
    )


def _build_meta(
    spec: DatasetSpec, opts: PrepareOptions, source: DocumentSource, encoder: TextEncoder, counts: SplitCounts, seconds: float
) -> dict[str, Any]:
    return {
        "dataset": spec.name,
        "tokenizer": encoder.name,
        "vocab_size": encoder.vocab_size,
        "eot_token": encoder.eot_token,
        "dtype": "uint16",
        "train_tokens": counts.tokens["train"],
        "val_tokens": counts.tokens["val"],
        "train_docs": counts.docs["train"],
        "val_docs": counts.docs["val"],
        "split": spec.split_mode,
        "split_seed": opts.seed,
        "val_fraction": opts.val_fraction,
        "max_docs": opts.max_docs,
        "max_tokens": opts.max_tokens,
        "source": source.info,
        "created": utc_now_iso(),
        "prepare_seconds": round(seconds, 3),
        **encoder.meta,
    }


def prepare(dataset: str, **options: Any) -> dict[str, Any]:
    """Prepare ``dataset`` (keyword options as in PrepareOptions / the CLI); returns the meta.json dict."""
    spec = get_spec(dataset)
    opts = _resolve(PrepareOptions(dataset=dataset, **options), spec)
    started = time.perf_counter()
    source = open_source(spec, opts)
    plan = (_plan_contiguous if spec.split_mode == "contiguous" else _plan_documents)(spec, opts, source)
    with AtomicSplitWriter(Path(opts.out_dir)) as writer:
        counts = tokenize_and_write(plan.batches, plan.encoder, plan.splitter, writer, max_docs=plan.max_docs, max_tokens=plan.max_tokens,
                                    total_docs=plan.total_docs, progress=opts.progress, desc=f"{spec.name}: tokenizing")
        _check_counts(spec, counts, plan.encoder, opts)
        warning = small_val_warning(spec, counts, opts)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        meta = _build_meta(spec, opts, source, plan.encoder, counts, time.perf_counter() - started)
        writer.commit(meta)
    return meta


def prepared_already(dataset: str, inputs: list[str], out_dir: str | os.PathLike) -> dict[str, Any] | None:
    """out_dir's meta.json where ``prepare(dataset, input=inputs, out_dir=out_dir)`` made it, with the
    table's defaults, from files of the same content (sha256), and both splits hold their recorded
    sizes; else None. Preparing again would write the same tokens and would replace the files under
    any run training from them, so a caller that finds them may keep them."""
    try:
        meta = load_meta(out_dir)
    except (PrepareError, OSError, ValueError):
        return None
    spec = get_spec(dataset)
    opts = _resolve(PrepareOptions(dataset=dataset, input=list(inputs), out_dir=str(out_dir)), spec)
    source = meta.get("source") or {}
    wanted = {"dataset": spec.name, "split_seed": opts.seed, "val_fraction": opts.val_fraction, "max_docs": opts.max_docs,
              "max_tokens": opts.max_tokens}
    if any(meta.get(key) != value for key, value in wanted.items()):
        return None
    if source.get("kind") != "local" or source.get("text_field") != opts.text_field:
        return None
    if [f.get("sha256") for f in source.get("files") or []] != [sha256_file(Path(path)) for path in inputs]:
        return None
    itemsize = np.dtype(TOKEN_DTYPE).itemsize
    for split in SPLITS:
        path = Path(out_dir) / f"{split}.bin"
        if not path.is_file() or path.stat().st_size != meta.get(f"{split}_tokens", -1) * itemsize:
            return None
    return meta


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python data/prepare.py", description="Tokenise a dataset into train.bin / val.bin (uint16) and meta.json.")
    parser.add_argument("dataset", metavar="DATASET", nargs="?", choices=list(DATASETS), help=f"one of: {', '.join(DATASETS)}")
    parser.add_argument("--make_openwebtext_sample", metavar="OUT.jsonl",
                        help="instead of preparing a DATASET, rebuild the studies' openwebtext_sample.jsonl (831 documents, sha256 checked) "
                        "from its public source; needs network (see ../shared/data/PROVENANCE.md)")
    parser.add_argument("--input", nargs="+", metavar="PATH", help="local .jsonl (with a text field), .txt or .parquet files; works offline")
    parser.add_argument("--download", action="store_true", help="shakespeare, shakespeare_char: fetch the text from its URL (kept as "
                        "DATASET/input.txt) instead of using the embedded copy in data/")
    parser.add_argument("--out_dir", help="output directory (default: data/DATASET in the repo)")
    parser.add_argument("--num_proc", type=int, help="tokenizer threads and hub download processes (default: all CPUs)")
    parser.add_argument("--max_docs", type=int, help="stop after this many documents (default: all)")
    parser.add_argument("--max_tokens", type=int, help="stop once this many tokens are written, document datasets only (default: no limit)")
    parser.add_argument("--val_fraction", type=float, help="fraction of documents (or of the text) for val (default: the dataset's, e.g. 0.0005 for openwebtext)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"split seed (default {DEFAULT_SEED})")
    parser.add_argument("--hub_id", help="Hugging Face dataset id, or a builder such as 'json' with --data_files (default: the dataset's)")
    parser.add_argument("--hub_config", help="hub dataset config, e.g. sample-100BT for fineweb_edu")
    parser.add_argument("--revision", help="hub revision, e.g. refs/convert/parquet")
    parser.add_argument("--data_files", nargs="+", help="data_files passed to datasets.load_dataset")
    parser.add_argument("--streaming", action=argparse.BooleanOptionalAction, default=None, help="stream from the hub (default: the dataset's; on for fineweb_edu)")
    parser.add_argument("--text_field", help="name of the text field/column (default: text)")
    parser.add_argument("--batch_size", type=int, default=512, help="documents per tokenizer batch (default: %(default)s)")
    parser.add_argument("--no_progress", dest="progress", action="store_false", help="hide progress bars")
    return parser


def _make_sample(out: str) -> int:
    try:
        digest = make_openwebtext_sample(out)
    except (PrepareError, TokenizerUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}: the first {SAMPLE_DOCS} documents of the openwebtext-10k sample, sha256 {digest} as expected")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    dataset = args.pop("dataset")
    sample_out = args.pop("make_openwebtext_sample")
    if sample_out is not None:
        if dataset is not None:
            parser.error(f"--make_openwebtext_sample writes one file and prepares no DATASET; drop {dataset!r} or the option.")
        return _make_sample(sample_out)
    if dataset is None:
        parser.error(f"give a DATASET ({', '.join(DATASETS)}) or --make_openwebtext_sample OUT.jsonl.")
    try:
        meta = prepare(dataset, **args)
    except (PrepareError, TokenizerUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    total = meta["train_tokens"] + meta["val_tokens"]
    seconds = meta["prepare_seconds"]
    print(
        f"{dataset}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens "
        f"({meta['train_docs']:,} + {meta['val_docs']:,} docs) in {seconds:.1f} s "
        f"({total / max(seconds, 1e-9):,.0f} tokens/s) -> {args['out_dir'] or REPO_ROOT / 'data' / dataset}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
