"""Checkpoints, in one package with one front: this module, which every caller imports from.
docs/ARCHITECTURE.md ("The runtime") says what each module beside it holds: single_file.py
(ckpt.pt and what both formats share), sharded.py (ckpt.dcp), run_choice.py, resume.py and
consolidation.py (which imports this front; nothing here imports it).

Here: reading a checkpoint of either format by its form (load_checkpoint, load_model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from spheretnorm.model import GPT
from spheretnorm.runtime.checkpoint.resume import (
    read_resume_meta, restore_run_config, restore_training_state, settle_at_start, write_run_checkpoint,
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
    "read_resume_meta", "restore_run_config", "restore_training_state", "settle_at_start", "write_run_checkpoint",
]


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", require: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Load a checkpoint (ckpt.pt, a .safetensors export or a sharded folder, read whole) and check
    that its model can be built (check_checkpoint). A missing file is a FileNotFoundError, every
    other failure a CheckpointError naming it; require: further keys the caller needs."""
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
    """The GPT of a checkpoint file (or of its loaded dict); one whose model cannot be built is a
    CheckpointError, raised before the model the config describes is allocated."""
    if isinstance(ckpt, dict):
        config = check_checkpoint(ckpt)
    else:
        ckpt = load_checkpoint(ckpt, map_location)  # checked as it is read
        config = config_from_dict(ckpt["model_config"])
    model = GPT(config)
    model.load_state_dict(clean_state_dict(ckpt["model"]))
    return model
