"""What train.py writes at a checkpoint and restores on a resume, in either format: the run's
checkpoint (write_run_checkpoint), a run folder's lost config.json (restore_run_config), the
leftovers of an interrupted sharded save settled before any rank looks (settle_at_start), a sharded folder's meta.pt decided by every rank together
(read_resume_meta), and the weights and optimizer state trained on under the current settings
(restore_training_state).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from spheretnorm.optim import Optimizers, apply_group_settings, group_settings, refused_resume_change
from spheretnorm.runtime.checkpoint.sharded import load_sharded, read_sharded_meta, save_sharded, settle_interrupted_save, wait_for_settled
from spheretnorm.runtime.checkpoint.run_choice import newest_run_checkpoint, read_without_tensors
from spheretnorm.runtime.checkpoint.single_file import (
    CheckpointError, atomic_torch_save, check_checkpoint, checkpoint_state, describe_error, rng_to_plain,
)
from spheretnorm.runtime.config import ConfigError, TrainConfig, resume_record, split_argv
from spheretnorm.runtime.config.recorded import import_first
from spheretnorm.runtime.device import rng_state
from spheretnorm.runtime.distributed import DistInfo, every_rank, print0
from spheretnorm.runtime.imports import import_recorded
from spheretnorm.runtime.loss_terms import unregistered_loss_keys
from spheretnorm.runtime.run_folder import SHARDED_CKPT_NAME, OutDirError, write_json_atomic


def restore_run_config(argv: list[str]) -> str | None:
    """Before the command line is parsed: a resume of a run folder named by --out_dir alone starts
    from the settings its config.json records (config.resumed_run_config). A folder that holds a
    checkpoint but no config.json (copied in part, the file deleted) would start from train.py's
    defaults instead (another data set, rates, batch), each then a "changed key" of the resume: its
    config.json is written back from the settings the checkpoint it resumes records (both configs,
    as train.py wrote them). Every rank may call it: the same bytes, written atomically. The NOTE
    line, or None where there was nothing to restore (a resume of an empty folder says so later)."""
    files, pairs = split_argv(argv)
    record = None if files else resume_record(pairs)
    if record is None or record.is_file():
        return None
    import_first([], pairs)  # --imports and the consent to a run's recorded modules, which the check below may need
    try:
        chosen, _ = newest_run_checkpoint(record.parent)
        if chosen is None:
            return None
        # Checked as a resume checks it, without reading its tensors (a sharded folder's sizes only).
        if chosen.is_dir():
            meta = read_sharded_meta(chosen, digests=False)
        else:
            meta = read_without_tensors(chosen)
            check_checkpoint(meta, repr(str(chosen)))
        train_config = meta.get("train_config")
        if not isinstance(train_config, dict):
            return None
        if unregistered_loss_keys(train_config):  # a loss term's keys: its module imported with consent, as a resume does
            import_recorded(train_config, repr(str(chosen)), CheckpointError, needed=True)
    except (CheckpointError, OSError, ValueError):
        return None  # damaged, or a run of modules not consented to: the resume refuses it, saying why
    if unregistered_loss_keys(train_config):
        return None  # keys no module declares: the resume names them (loss_terms.with_recorded_loss_terms)
    write_json_atomic(record, {**train_config, **meta["model_config"]})
    return (f"NOTE: {record.parent} had no {record.name}; wrote it from the settings {chosen.name} records (iteration "
            f"{meta.get('iter_num')}), so this resume starts from the run's own settings, not train.py's defaults.")


def write_run_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: Optimizers, extra: dict[str, Any], sharded: bool, dist: DistInfo, device: str
) -> None:
    """All ranks call this; `extra` is what a resume reads besides the model and the optimizer."""
    extra = {**extra, "rng": every_rank(rng_to_plain(rng_state())), "world_size": dist.world_size}  # every rank's RNG, by rank
    if sharded:  # every rank writes its shards
        save_sharded(path, model, optimizer, {**checkpoint_state(model, weights=False), **extra}, dist, device)
    elif dist.is_master:
        atomic_torch_save({**checkpoint_state(model), "optimizer": optimizer.state_dict(), **extra}, path)


def settle_at_start(train: TrainConfig) -> None:
    """What an interrupted sharded save left in out_dir (ckpt.dcp.tmp, .old) is settled by rank 0
    (settle_interrupted_save) before any rank looks for the checkpoint (train.py, before the process
    group exists); the others wait for it, so that every rank sees the same folder."""
    folder = Path(train.out_dir) / SHARDED_CKPT_NAME
    if int(os.environ.get("RANK", "0")) != 0:
        wait_for_settled(folder, train.dist_timeout)
        return
    try:
        note = settle_interrupted_save(folder)
    except OSError as e:
        raise OutDirError(str(e)) from None
    except ValueError as e:  # a CheckpointError: which folder to remove
        raise ConfigError(str(e)) from None
    if note:
        print(note)


def read_resume_meta(path: Path, require: tuple[str, ...]) -> dict[str, Any]:
    """meta.pt of the sharded folder a resume reads (read_sharded_meta), decided by every rank
    together: rank 0 reads every byte once (its digests), the others check sizes only, and they
    gather their verdicts before any goes on. A folder any rank refuses is refused by every rank
    with the lowest refusing rank's sentence (a foreign shard of its save's size is seen by rank 0
    alone), which train.py says once, by rank 0, with exit status 2 and no traceback."""
    rank = torch_dist.get_rank() if torch_dist.is_initialized() else int(os.environ.get("RANK", "0"))
    meta: dict[str, Any] = {}
    error: CheckpointError | None = None
    try:
        meta = read_sharded_meta(path, require, digests=rank == 0)
    except CheckpointError as e:
        error = e
    except OSError as e:  # this rank's view of the folder: said by all the same
        error = CheckpointError(f"Sharded checkpoint {str(path)!r} cannot be read ({describe_error(e)}).")
    verdicts = every_rank(None if error is None else str(error))
    first = next((verdict for verdict in verdicts if verdict is not None), None)
    if first is not None and (error is None or str(error) != first):
        raise CheckpointError(first)
    if error is not None:
        raise error
    return meta


def restore_training_state(cfg: TrainConfig, ckpt: dict[str, Any], model: torch.nn.Module, optimizer: Optimizers, path: Path) -> None:
    """The checkpoint's weights and optimizer state (read from `path`), trained on under the current
    settings: the saved param groups give way to those cfg built (rates, betas, weight decay, every
    optimizer key), and a changed key the state fixes is refused. With fresh_optimizer the weights
    only: the optimizer, perhaps another one, starts anew."""
    refusal = None if cfg.fresh_optimizer else refused_resume_change(cfg, ckpt["train_config"].get("optimizer_params") or {})
    if refusal:
        raise ConfigError(refusal)
    fresh = group_settings(optimizer)
    keep = None if cfg.fresh_optimizer else optimizer
    if cfg.parallel == "fsdp":  # each rank reads its own shards, from any number of ranks' files
        load_sharded(path, model, keep)
    else:
        model.load_state_dict(ckpt["model"])
        if keep is not None:
            saved = ckpt["optimizer"]
            try:
                keep.load_state_dict(saved)
            except (ValueError, KeyError, TypeError, RuntimeError) as e:
                raise ConfigError(f"The optimizer state in {path} does not fit the model ({e}); the checkpoint is damaged.") from None
    if keep is None:
        was = ckpt["train_config"].get("optimizer", "adamw")
        print0(f"NOTE: fresh_optimizer=true: the checkpoint's {was} state is dropped; {cfg.optimizer} starts a new one at iteration {ckpt['iter_num']}.")
    apply_group_settings(optimizer, fresh)
