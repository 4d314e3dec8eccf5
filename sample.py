"""
Sample text from a trained model, as in nanoGPT.

    python sample.py out/shakespeare_char/p_spheret-0.5                  # an out_dir holding ckpt.pt
    python sample.py out/shakespeare_char/p_spheret-0.5/ckpt.safetensors # a safetensors export
    python sample.py out/openwebtext_s/geonorm/ckpt.pt --start="The meaning of life is"
    python sample.py CKPT --start=FILE:prompt.txt --num_samples=1 --temperature=0   # greedy

The tokenizer is the one the model was trained with: the dataset's meta.json, which train.py
stores in the checkpoint (GPT-2 BPE, built offline if need be, or the character vocabulary of
a char-level dataset). Older checkpoints without it fall back to the meta.json in the run's
data_dir, or --meta. Each sample is printed (prompt, then continuation) followed by a line of
dashes. An out_dir is sampled from the newer of its ckpt.pt and ckpt.dcp (a --parallel=fsdp run's
folder, which may also be given itself), else from its ckpt.safetensors (scripts/export_hf.py
--format safetensors), with a line on stderr saying which when that is not its only checkpoint. --sphere_impl changes how the sphere
update runs, not the samples (default: the checkpoint's, usually auto; a checkpoint's triton on a
machine without a GPU samples with auto, with a line on stderr saying so). A --meta must be the
training data's: another tokenizer or character vocabulary than the one the checkpoint records,
or more tokens than its vocab_size, is refused in one line, as is a --start=FILE: that is not
UTF-8 text.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before torch: a missing package is one line, not a traceback

import torch

from spheretnorm.runtime.device import DTYPES, DeviceError, announce_cpu_threads, autocast_context, get_device, resolve_dtype
from spheretnorm.runtime.token_files import META_FILE, PrepareError, char_vocabulary, decode_char, load_meta, read_meta
from spheretnorm.data.tokenizer import EOT_TOKEN, GPT2_VOCAB_SIZE, TOKENIZERS, TokenizerUnavailableError, get_gpt2_encoding, tokenizer_of
from spheretnorm.data.sources import first_bad_byte
from spheretnorm.kernels import SPHERE_IMPLS, impl_unavailable, triton_available, triton_interpreted
from spheretnorm.model import GPT
from spheretnorm.runtime.checkpoint import checkpoint_for, load_checkpoint, load_model
from spheretnorm.runtime.imports import add_import_options, use_import_options
FILE_PREFIX = "FILE:"
SEPARATOR = "---------------"


class SampleError(ValueError):
    """A user-facing problem with the arguments or the checkpoint; printed without a traceback."""


# -----------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sample.py",
        description="Generate text from a spheretnorm checkpoint.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("checkpoint", nargs="?", default=None,
                        help="a ckpt.pt (or .safetensors) file, a ckpt.dcp folder, or an out_dir that holds one "
                        "(the newer of ckpt.pt and ckpt.dcp, else ckpt.safetensors)")
    parser.add_argument("--out_dir", default=None, help="nanoGPT-style alternative to the positional checkpoint")
    parser.add_argument("--start", default="\n", help="prompt text, or FILE:path to read it from a file (default: %(default)r)")
    parser.add_argument("--num_samples", type=int, default=3, help="number of samples to draw")
    parser.add_argument("--max_new_tokens", type=int, default=500, help="tokens generated per sample")
    parser.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 is greedy (argmax)")
    parser.add_argument("--top_k", type=int, default=200, help="sample among the k likeliest tokens only; 0 for all")
    parser.add_argument("--seed", type=int, default=1337, help="random seed (same seed, same samples)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
    parser.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16 (auto: bf16 on CUDA)")
    parser.add_argument("--meta", default=None, help="meta.json (or its dataset directory) to take the tokenizer from, "
                        "instead of the one recorded in the checkpoint")
    parser.add_argument("--sphere_impl", default=None,
                        help=f"how the sphere update runs ({' | '.join(SPHERE_IMPLS)}); it changes no sample; "
                        "None: the checkpoint's (auto compiles nothing on a CPU for sampling)")
    add_import_options(parser)
    return parser


@dataclass(frozen=True)
class SampleArgs:
    checkpoint: Path
    start: str
    num_samples: int
    max_new_tokens: int
    temperature: float
    top_k: int | None
    seed: int
    device: str
    dtype: str
    meta: str | None
    sphere_impl: str | None = None  # None: the checkpoint's


def parse_args(argv: list[str]) -> SampleArgs:
    ns = build_parser().parse_args(argv)
    use_import_options(ns, SampleError)  # before the checkpoint names a connection of the user's
    if (ns.checkpoint is None) == (ns.out_dir is None):
        raise SampleError("Give the checkpoint once: either a ckpt.pt path / out_dir as the argument, or --out_dir.")
    for name in ("num_samples", "max_new_tokens"):
        if getattr(ns, name) < 1:
            raise SampleError(f"--{name} must be a positive integer, got {getattr(ns, name)}.")
    if not ns.temperature >= 0:  # also refuses nan
        raise SampleError(f"--temperature must be >= 0 (0 is greedy), got {ns.temperature}.")
    if ns.top_k < 0:
        raise SampleError(f"--top_k must be >= 0 (0 keeps every token), got {ns.top_k}.")
    if ns.dtype not in ("auto", *DTYPES):
        raise SampleError(f"--dtype={ns.dtype!r} is not valid; choose one of: auto, {', '.join(DTYPES)}.")
    if ns.sphere_impl is not None and ns.sphere_impl not in SPHERE_IMPLS:
        raise SampleError(f"--sphere_impl={ns.sphere_impl!r} is not valid; choose one of: {', '.join(SPHERE_IMPLS)}.")
    return SampleArgs(
        checkpoint=Path(ns.checkpoint if ns.checkpoint is not None else ns.out_dir),
        start=read_start(ns.start),
        num_samples=ns.num_samples,
        max_new_tokens=ns.max_new_tokens,
        temperature=ns.temperature,
        top_k=ns.top_k or None,
        seed=ns.seed,
        device=ns.device,
        dtype=ns.dtype,
        meta=ns.meta,
        sphere_impl=ns.sphere_impl,
    )


def read_start(start: str) -> str:
    """The prompt: the text itself, or the contents of the file named after FILE:."""
    if not start.startswith(FILE_PREFIX):
        return start
    path = Path(start[len(FILE_PREFIX) :])
    if not path.is_file():
        raise SampleError(f"--start={start!r}: the file {str(path)!r} does not exist.")
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise SampleError(f"--start={start!r}: the file {str(path)!r} cannot be read ({e.strerror}).") from None
    except UnicodeDecodeError:
        offset, byte = first_bad_byte(path)
        raise SampleError(
            f"--start={start!r}: the file {str(path)!r} is not UTF-8 text (byte 0x{byte:02x} at offset {offset}); "
            "give a text file as the prompt."
        ) from None


# -----------------------------------------------------------------------------
# Checkpoint and tokenizer


def checkpoint_file(path: Path) -> Path:
    """The checkpoint file or sharded folder itself, or the one a run folder's samples come from
    (runtime.checkpoint.resolve_checkpoint: the newer of ckpt.pt and ckpt.dcp, else ckpt.safetensors).

    When the out_dir's choice is not its only checkpoint, or is the export, one line on stderr
    says which one the samples come from.
    """
    return checkpoint_for(path, "sample.py", "sample from", "sampling from", SampleError)


def with_sphere_impl(ckpt: dict[str, Any], impl: str | None, device_type: str) -> dict[str, Any]:
    """The checkpoint with its model config's sphere_impl replaced by `impl` (None: kept).

    sphere_impl is an execution key (model.EXECUTION_KEYS): it changes how the model runs,
    never what it computes, so any checkpoint takes any value that can run on the device.
    """
    saved = ckpt["model_config"].get("sphere_impl", "auto")
    if impl is None and impl_unavailable(saved, device_type):  # a checkpoint trained with triton, sampled on a CPU
        problem = impl_unavailable(saved, device_type).rstrip(".")
        print(f"sample.py: the checkpoint's {problem}; sampling with sphere_impl='auto' instead (the same samples).", file=sys.stderr)
        impl = "auto"
    if impl is None:
        return ckpt
    if impl == "triton" and not (triton_available() and (device_type == "cuda" or triton_interpreted())):
        raise SampleError(
            f"--sphere_impl=triton needs a CUDA device and the triton package (here: {device_type}, "
            f"triton {'installed' if triton_available() else 'missing'}); use one of: auto, reference, fused."
        )
    return {**ckpt, "model_config": {**ckpt["model_config"], "sphere_impl": impl}}


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint dict, through model.load_checkpoint, which checks that it is one of ours
    and that its model can be built (a CheckpointError, a ValueError, naming the file if not)."""
    try:
        return load_checkpoint(path, map_location="cpu")
    except ValueError as e:
        raise SampleError(str(e)) from None


def load_meta_file(path: str) -> dict[str, Any]:
    """A meta.json given by path, or the one in a dataset directory (PrepareError naming it if damaged)."""
    p = Path(path)
    if p.is_dir():
        return load_meta(p)
    if not p.is_file():
        raise SampleError(f"--meta={path!r} does not exist; give a meta.json file or the dataset directory holding one.")
    return read_meta(p)


def find_meta(ckpt: dict[str, Any], override: str | None, ckpt_path: Path) -> tuple[dict[str, Any], str]:
    """(the dataset meta.json the model was trained on, where it came from)."""
    if override is not None:
        return load_meta_file(override), override
    if ckpt.get("data_meta"):
        return ckpt["data_meta"], f"the checkpoint {str(ckpt_path)!r}"
    data_dir = (ckpt.get("train_config") or {}).get("data_dir")
    if isinstance(data_dir, str) and data_dir and (Path(data_dir) / META_FILE).is_file():
        return load_meta(data_dir), str(Path(data_dir) / META_FILE)
    raise SampleError(
        "The checkpoint records no dataset meta.json and its data_dir has none; pass --meta=path/to/meta.json."
    )


@dataclass(frozen=True)
class Tokenizer:
    name: str
    vocab_size: int  # ids at or above this have no text (GPT-2's embedding is padded to 50304)
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    empty_prompt: list[int]  # what to condition on when the start text is empty


def gpt2_tokenizer() -> Tokenizer:
    enc = get_gpt2_encoding()
    return Tokenizer(
        name="gpt2",
        vocab_size=enc.n_vocab,
        encode=lambda text: enc.encode(text, allowed_special={"<|endoftext|>"}),
        decode=enc.decode,
        empty_prompt=[EOT_TOKEN],  # GPT-2's documents start after an end-of-text token
    )


def char_tokenizer(meta: dict[str, Any], source: str) -> Tokenizer:
    itos = char_vocabulary(meta)
    if itos is None:
        raise SampleError(
            f"The char-level meta.json from {source} has no 'itos' vocabulary (a list of the characters of the ids); "
            "re-run data/prepare.py."
        )
    stoi = {ch: i for i, ch in enumerate(itos)}

    def encode(text: str) -> list[int]:
        unknown = sorted({ch for ch in text if ch not in stoi})
        if unknown:
            shown = ", ".join(repr(ch) for ch in unknown[:10]) + (", ..." if len(unknown) > 10 else "")
            raise SampleError(
                f"The start text has characters outside the model's {len(itos)}-character vocabulary: "
                f"{shown}; use only characters of the training text."
            )
        return [stoi[ch] for ch in text]

    return Tokenizer(
        name="char",
        vocab_size=len(itos),
        encode=encode,
        decode=lambda ids: decode_char(ids, meta),
        empty_prompt=[],
    )


def vocabulary_of(meta: dict[str, Any], vocab_size: int) -> tuple[str | None, int | None]:
    """(the tokenizer a meta.json names, how many tokens it has) as tokenizer_for would build it,
    without building it; the size is None where it is unknown (an unknown tokenizer, no itos)."""
    kind = tokenizer_of(meta, vocab_size)
    if kind == "gpt2":
        return kind, GPT2_VOCAB_SIZE
    itos = char_vocabulary(meta) if kind == "char" else None
    return kind, None if itos is None else len(itos)


def check_meta_fits(meta: dict[str, Any], source: str, ckpt: dict[str, Any], override: str | None) -> None:
    """A SampleError if the meta.json's tokenizer is not the one the checkpoint was trained with:
    more tokens than its vocab_size (an id past the embedding), or, for --meta, another tokenizer
    or character vocabulary than the meta.json the checkpoint records (samples spelt in the wrong
    characters)."""
    vocab_size = ckpt["model_config"]["vocab_size"]
    kind, size = vocabulary_of(meta, vocab_size)
    if kind not in TOKENIZERS:
        return  # tokenizer_for names it
    what = f"--meta={override!r}" if override is not None else f"The meta.json from {source}"
    if size is not None and size > vocab_size:
        raise SampleError(
            f"{what} describes the {kind} tokenizer with {size} tokens, more than the checkpoint's "
            f"vocab_size {vocab_size}: it is another dataset's; give the meta.json of the dataset the model was trained on."
        )
    recorded = ckpt.get("data_meta")
    if override is None or not isinstance(recorded, dict) or not recorded:
        return
    theirs, their_size = vocabulary_of(recorded, vocab_size)
    if theirs is None:
        return  # the checkpoint names no tokenizer: --meta is what says it
    if theirs != kind:
        raise SampleError(
            f"--meta={override!r} describes the {kind} tokenizer, but the checkpoint was trained with the {theirs} "
            "tokenizer (the meta.json it records); drop --meta, or give the meta.json of the dataset the model was trained on."
        )
    if kind == "char" and their_size is not None and size is not None and char_vocabulary(recorded) != char_vocabulary(meta):
        raise SampleError(
            f"--meta={override!r} describes a vocabulary of {size} characters that is not the checkpoint's "
            f"{their_size}-character one (the meta.json it records); drop --meta, or give the meta.json of the dataset "
            "the model was trained on."
        )


def tokenizer_for(meta: dict[str, Any], vocab_size: int, source: str) -> Tokenizer:
    kind = tokenizer_of(meta, vocab_size)
    if kind == "gpt2":
        return gpt2_tokenizer()
    if kind == "char":
        return char_tokenizer(meta, source)
    raise SampleError(f"Unknown tokenizer {kind!r} in the meta.json from {source}; valid ones are: {', '.join(TOKENIZERS)}.")


# -----------------------------------------------------------------------------
# Generation


def prompt_ids(tokenizer: Tokenizer, start: str) -> list[int]:
    ids = tokenizer.encode(start) or tokenizer.empty_prompt
    if not ids:
        raise SampleError("--start is empty and a char-level model needs at least one character to start from.")
    return ids


def mask_textless_ids(model: GPT, vocab_size: int) -> None:
    """Never sample ids the tokenizer cannot decode (padding rows of the output layer)."""
    if model.config.vocab_size <= vocab_size:
        return

    def hook(module: torch.nn.Module, inputs: Any, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        logits[..., vocab_size:] = -float("inf")
        return logits

    model.lm_head.register_forward_hook(hook)


def generate(args: SampleArgs) -> list[str]:
    """Draw args.num_samples texts; each is the start text followed by its continuation."""
    ckpt_path = checkpoint_file(args.checkpoint)
    ckpt = read_checkpoint(ckpt_path)
    meta, source = find_meta(ckpt, args.meta, ckpt_path)
    check_meta_fits(meta, source, ckpt, args.meta)
    tokenizer = tokenizer_for(meta, ckpt["model_config"]["vocab_size"], source)
    ids = prompt_ids(tokenizer, args.start)
    device = get_device(args.device)
    announce_cpu_threads(device)  # on stderr: stdout holds the texts
    device_type = device.split(":")[0]
    dtype = resolve_dtype(args.dtype, device_type)

    model = load_model(with_sphere_impl(ckpt, args.sphere_impl, device_type))
    del ckpt  # the optimizer state is not needed
    model.eval().to(device)
    mask_textless_ids(model, tokenizer.vocab_size)

    torch.manual_seed(args.seed)  # seeds the CPU and every CUDA generator
    prompt = torch.tensor([ids] * args.num_samples, dtype=torch.long, device=device)
    with torch.no_grad(), autocast_context(device_type, dtype):
        out = model.generate(prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k)
    return [args.start + tokenizer.decode(row[len(ids) :].tolist()) for row in out]


def main(argv: list[str] | None = None) -> list[str]:
    """Sample as the command line says, print each sample, and return them."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    samples = generate(args)
    for text in samples:
        print(text)
        print(SEPARATOR)
    return samples


def cli(argv: list[str] | None = None) -> int:
    """main() for the command line: a user-facing error is one `error: ...` line and exit code 2."""
    try:
        main(argv)
    except (SampleError, DeviceError, PrepareError, TokenizerUnavailableError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
