"""Exports of a training checkpoint: a Hugging Face model folder with its model card, or
weights-only safetensors (scripts/export_hf.py is the command)."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import Any

from spheretnorm.hf.folder import HFFolderError, check_new_folder, export_hf, plain_model_class
from spheretnorm.runtime.atomic import apply_umask, folder_mode, remove_written, write_failure
from spheretnorm.runtime.checkpoint import load_checkpoint, load_model, save_safetensors_checkpoint
from spheretnorm.runtime.config import config_from_dict
from spheretnorm.runtime.methods import display_name, method_key, scale_of
from spheretnorm.runtime.run_folder import METRICS_NAME, read_metrics

FORMATS = ("hf", "safetensors")
NATIVE_NAME = "ckpt.safetensors"


def last_evaluation(ckpt_path: Path, iter_num: int | None) -> dict[str, Any] | None:
    """The last eval row, at or before the checkpoint's iteration, of the metrics.jsonl beside it (None without one)."""
    path = ckpt_path.with_name(METRICS_NAME)
    evals = [r for r in read_metrics(path) if r.get("kind") == "eval"] if path.is_file() else []
    evals = [r for r in evals if iter_num is None or r.get("iter", 0) <= iter_num]
    return evals[-1] if evals else None


def iterations_text(iter_num: Any, max_iters: Any) -> str:
    """'600', '600 of 600', or '161 of 2,000: the run stopped before its end' (a card must not
    read as a finished run's when it is not)."""
    if not isinstance(iter_num, int):
        return "not recorded"
    if not isinstance(max_iters, int):
        return str(iter_num)
    short = ": the run stopped before its end" if iter_num < max_iters else ""
    return f"{iter_num:,} of {max_iters:,}{short}"


def model_card(ckpt: dict[str, Any], ckpt_path: Path) -> str:
    """README.md of the exported folder: what the model is and how it was trained."""
    cfg = config_from_dict(ckpt["model_config"])
    train = ckpt.get("train_config") or {}
    method = method_key(cfg)
    last = last_evaluation(ckpt_path, ckpt.get("iter_num"))
    n_params = load_model(ckpt).get_num_params()
    plain = plain_model_class(cfg)
    load_args = ', trust_remote_code=True' if plain is None else ''
    style = "LLaMA" if cfg.block == "llama" else "GPT-2"
    rows = {
        "connection": f"{display_name(method)} (`{method}`)",
        "scale": f"{scale_of(ckpt['model_config'])}: {cfg.n_layer} layers, {cfg.n_head} heads, width {cfg.n_embd}, {n_params / 1e6:.1f}M parameters",
        "context": f"{cfg.block_size} tokens",
        "dataset": train.get("dataset", "not recorded"),
        "iterations": iterations_text(ckpt.get("iter_num"), train.get("max_iters")),
        "last val loss": (f"{last['val_loss']:.4f} (the evaluation at iteration {last.get('iter', '?')})" if last is not None
                          else f"not recorded (no evaluation in a {METRICS_NAME} beside the checkpoint)"),
    }
    table = "\n".join(f"| {k} | {v} |" for k, v in rows.items())
    return f"""---
library_name: transformers
tags:
- spheretnorm
- {cfg.connection}
---

# {display_name(method)} GPT ({rows['scale'].split(':')[0]}, {rows['dataset']})

A {style}-style language model trained with the spheretnorm codebase (paper: "Sphere Retraction
Normalizations", arXiv 2608.02668), exported from `{ckpt_path.name}`.

| | |
|---|---|
{table}

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("PATH/TO/THIS/FOLDER"{load_args})
tokenizer = AutoTokenizer.from_pretrained("PATH/TO/THIS/FOLDER"{load_args})
```
{"This connection is not part of transformers: the folder carries its code (`modeling_spheretnorm.py`), which needs only torch and transformers." if plain is None else f"Pre-LN is {style}'s own block, so this is a plain `{plain}`."}
"""


def _created_parents(folder: Path) -> list[Path]:
    """The folders above `folder` that do not exist yet, innermost first (mkdir(parents=True) would make them)."""
    missing = []
    for parent in folder.absolute().parents:
        if parent.exists():
            break
        missing.append(parent)
    return missing


def _as_write_failure(out: Path, exc: BaseException, written: Path | None) -> HFFolderError | None:
    """A failed write (a full disk, or an OSError on a file of the export) as one sentence; None for other errors.

    Safetensors reports a full disk in its own error type, read from its message.
    """
    if isinstance(exc, OSError):
        ours = exc.filename is not None and str(exc.filename).startswith(str(written or out.parent))
        if ours or exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            return HFFolderError(str(write_failure(out, exc)))
        return None
    text = " ".join(str(exc).split())
    for code, words in ((errno.ENOSPC, "No space left"), (errno.EFBIG, "File too large"), (errno.EDQUOT, "quota exceeded")):
        if words.lower() in text.lower():
            return HFFolderError(str(write_failure(out, OSError(code, os.strerror(code)))))
    return None


def export(ckpt_path: Path, out: Path, fmt: str) -> Path:
    """Write the export into `out`, a new or empty folder in every format; returns the folder or file written.

    Everything is written into a temporary folder beside `out`, which is renamed to `out` only
    when the export is complete: a failure mid-export (a full disk, a refused connection)
    removes what this export wrote, folders it made above `out` included, and an OSError is one
    HFFolderError naming `out`.
    """
    check_new_folder(out)
    ckpt = load_checkpoint(ckpt_path)
    made = _created_parents(out)
    stage: Path | None = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
        if fmt == "safetensors":
            save_safetensors_checkpoint(ckpt, stage / NATIVE_NAME)
        else:
            export_hf(ckpt, stage, source=f"the checkpoint {str(ckpt_path)!r}")
            (stage / "README.md").write_text(model_card(ckpt, ckpt_path), encoding="utf-8")
            apply_umask(stage / "README.md")
        os.chmod(stage, folder_mode())  # mkdtemp makes it 0700; an export is readable like any output
        if out.is_dir():
            out.rmdir()  # empty (check_new_folder): the complete export takes its place
        os.replace(stage, out)
        stage = None
    except BaseException as exc:
        if stage is not None:
            remove_written(stage)
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if still empty
        failure = _as_write_failure(out, exc, stage) if isinstance(exc, Exception) else None
        if failure is not None:
            raise failure from None
        raise
    return out / NATIVE_NAME if fmt == "safetensors" else out
