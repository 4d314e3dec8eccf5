"""Checkpoints, in one package with one front: this module. Every caller (train.py, sample.py,
the exports, zero-shot, consolidation, the tests) imports from here; the modules beside it hold
the parts along their seams:

- single_file.py: ckpt.pt (format spheretnorm-ckpt-v1) and its .safetensors export, and what both
  formats share: the errors, atomic writes, safe reads, the check that a checkpoint's config
  describes its weights (check_checkpoint), RNG state in plain values;
- sharded.py: ckpt.dcp (train.py --parallel=fsdp, format spheretnorm-dcp-v1), a folder that
  torch.distributed.checkpoint writes (by parameter name, one file per rank) plus meta.pt, the rest
  of a checkpoint's dict: written by every rank, read back on any number, each save's files tied
  to it, an interrupted save settled;
- run_choice.py: which checkpoint of a run folder a resume and every reader takes;
- resume.py: what train.py writes at a checkpoint and restores on a resume;
- consolidation.py: scripts/consolidate.py, a sharded folder as one ckpt.pt (it imports this
  front; nothing here imports it).

Here: reading a checkpoint of either format by its form (load_checkpoint, load_model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from spheretnorm.model import GPT
from spheretnorm.runtime.checkpoint.resume import (
    read_resume_meta, restore_training_state, settle_at_start, write_run_checkpoint,
)
from spheretnorm.runtime.checkpoint.run_choice import (
    EXPORT_NAME, check_newest_is_own, checkpoint_for, checkpoint_iter, is_sharded_checkpoint, newest_run_checkpoint,
    resolve_checkpoint, resume_checkpoint,
)
from spheretnorm.runtime.checkpoint.sharded import (
    DCP_METADATA, SHARDED_FORMAT, SHARDED_META, load_sharded, read_sharded_meta, read_sharded_weights, save_sharded,
    settle_interrupted_save,
)
from spheretnorm.runtime.checkpoint.single_file import (
    CHECKPOINT_FORMAT, SAFETENSORS_SUFFIX, CheckpointError, RecordedImportsError, atomic_torch_save, check_checkpoint,
    check_weights, checkpoint_state, clean_state_dict, is_state_dict, load_safetensors_checkpoint, needs_recorded_code,
    read_safetensors, read_torch_file, rng_from_plain, rng_to_plain, save_safetensors_checkpoint, tie_head, untie_head,
)
from spheretnorm.runtime.config import config_from_dict

__all__ = [
    "CHECKPOINT_FORMAT", "DCP_METADATA", "EXPORT_NAME", "SAFETENSORS_SUFFIX", "SHARDED_FORMAT", "SHARDED_META",
    "CheckpointError", "RecordedImportsError",
    # reading and writing, either format
    "load_checkpoint", "load_model", "atomic_torch_save", "read_torch_file", "save_safetensors_checkpoint",
    "load_safetensors_checkpoint", "read_safetensors", "save_sharded", "load_sharded", "read_sharded_meta",
    "read_sharded_weights", "settle_interrupted_save",
    # what a checkpoint holds
    "check_checkpoint", "check_weights", "checkpoint_state", "clean_state_dict", "is_state_dict", "needs_recorded_code",
    "rng_from_plain", "rng_to_plain", "tie_head", "untie_head",
    # which checkpoint of a run folder
    "check_newest_is_own", "checkpoint_for", "checkpoint_iter", "is_sharded_checkpoint", "newest_run_checkpoint",
    "resolve_checkpoint", "resume_checkpoint",
    # train.py's save and resume
    "read_resume_meta", "restore_training_state", "settle_at_start", "write_run_checkpoint",
]


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", require: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Load a checkpoint file (ckpt.pt, or a .safetensors export) and check that it is one of
    this project's whose model can be built (check_checkpoint).

    A missing file is a FileNotFoundError; every other failure is a CheckpointError naming the
    file. require lists further keys the caller needs (a resume needs the optimizer state).
    """
    path = Path(path)
    if path.is_dir():  # a sharded checkpoint (train.py --parallel=fsdp), read whole
        ckpt = read_sharded_meta(path, require)
        # Whole in this process, it is a ckpt.pt's dict: load_model and the exports take it as one.
        return {**ckpt, "format": CHECKPOINT_FORMAT, "model": read_sharded_weights(path)}
    if not path.is_file():
        raise FileNotFoundError(f"Checkpoint {str(path)!r} does not exist.")
    if path.suffix == SAFETENSORS_SUFFIX:
        ckpt = load_safetensors_checkpoint(path, map_location)
    else:
        ckpt = read_torch_file(path, map_location)
        check_checkpoint(ckpt, f"Checkpoint {str(path)!r}")
    missing = [key for key in require if key not in ckpt]
    if missing:
        raise CheckpointError(
            f"Checkpoint {str(path)!r} lacks {', '.join(missing)}, which train.py writes and this use "
            "of it needs; it is damaged or holds a model only."
        )
    return ckpt


def load_model(ckpt: str | Path | dict[str, Any], map_location: str | torch.device = "cpu") -> GPT:
    """The GPT of a checkpoint file (or of its loaded dict).

    A file or dict whose model cannot be built (see check_checkpoint) is a CheckpointError,
    raised before the model the config describes is allocated.
    """
    if isinstance(ckpt, dict):
        config = check_checkpoint(ckpt)
    else:
        ckpt = load_checkpoint(ckpt, map_location)  # checked as it is read
        config = config_from_dict(ckpt["model_config"])
    model = GPT(config)
    model.load_state_dict(clean_state_dict(ckpt["model"]))
    return model
