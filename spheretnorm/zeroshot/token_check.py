"""Whether a checkpoint's model reads GPT-2 BPE tokens, the only ones the zero-shot benchmarks
give it: asked of its small header first, before lm-eval and its task index load (half a
minute), and again of the loaded checkpoint (harness.load_eval_model)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from spheretnorm.data.tokenizer import GPT2_VOCAB_SIZE, tokenizer_of
from spheretnorm.runtime.checkpoint import SHARDED_META, CheckpointError, checkpoint_for, read_torch_file
from spheretnorm.zeroshot.errors import EvalError


def resolve_checkpoint_path(path: str | Path) -> Path:
    """The checkpoint to evaluate (runtime.checkpoint.resolve_checkpoint: a file, a sharded folder,
    or a run folder's newer of ckpt.pt and ckpt.dcp, with a line on stderr saying which when both
    are there), or an EvalError saying why there is none."""
    return checkpoint_for(path, "zero_shot", "evaluate", "evaluating", EvalError)


def check_gpt2_tokenizer(ckpt: dict[str, Any], source: str) -> None:
    """Refuse checkpoints whose token ids are not GPT-2 BPE ids (e.g. char-level models)."""
    vocab_size = ckpt["model_config"].get("vocab_size", 0)
    tokenizer = tokenizer_of(ckpt.get("data_meta"), vocab_size)
    if tokenizer is not None and tokenizer != "gpt2":
        raise EvalError(
            f"{source} was trained with the {tokenizer!r} tokenizer, but zero-shot benchmarks need "
            "a model trained on GPT-2 BPE tokens."
        )
    if vocab_size < GPT2_VOCAB_SIZE:
        raise EvalError(
            f"{source} has vocab_size {vocab_size}, smaller than GPT-2's {GPT2_VOCAB_SIZE}, so it "
            "cannot score GPT-2 BPE tokens."
        )


def checkpoint_header(path: Path) -> dict[str, Any] | None:
    """A checkpoint's dict with its tensors mapped, not read (a sharded folder's meta.pt); None for
    what this cannot read cheaply (a .safetensors file, a damaged one): the full load judges those."""
    try:
        if path.is_dir():
            header = read_torch_file(path / SHARDED_META)
        elif zipfile.is_zipfile(path):
            header = read_torch_file(path, mmap=True)
        else:
            return None
    except CheckpointError:
        return None
    return header if isinstance(header, dict) and isinstance(header.get("model_config"), dict) else None


def refuse_other_tokenizers(path: Path) -> None:
    """check_gpt2_tokenizer of the checkpoint at `path` from its header, when it has one."""
    header = checkpoint_header(path)
    if header is not None:
        check_gpt2_tokenizer(header, f"Checkpoint {str(path)!r}")
