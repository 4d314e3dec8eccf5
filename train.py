"""
Train a GPT with a chosen deep connection, on one CPU/GPU or many GPUs with DDP, or sharded
with FSDP2 past one GPU's memory (--parallel=fsdp, spheretnorm/runtime/parallel.py).

    python train.py config/shakespeare_char.py                          # a laptop, minutes
    python train.py config/openwebtext_s.py --connection=p_spheret --spheret_p=0.5
    torchrun --standalone --nproc_per_node=8 train.py config/fineweb_edu_m.py --connection=geonorm
    python train.py config/openwebtext_s.py --connection=geonorm --init_from=resume

Every key of GPTConfig (spheretnorm/model.py) and TrainConfig (spheretnorm/runtime/config/train_config.py) can be
set in a config file or as --key=value. The global batch (global_batch_size sequences) is fixed;
the number of micro-steps per optimizer step follows from batch_size and the number of
processes, and the sequences of step k are a function of (seed, k) only (spheretnorm/runtime/batches.py),
so neither the GPU count nor a resume changes the optimisation.

Outputs in out_dir: ckpt.pt (written atomically; under fsdp the sharded folder ckpt.dcp),
metrics.jsonl (one JSON object per line, see README), config.json. SIGTERM or SIGUSR1 saves a checkpoint at the next step and exits 0
(in a collapse-alarm streak: ckpt.stop.pt/.dcp beside the healthy one; auto resumes from it).
Exit status: 0 done or signalled, 1 crash, 2 bad config, 3 collapse (final_cosine above
collapse_cosine for collapse_evals evaluations in a row), 4 non-finite loss; every early end
also writes a {"kind": "stop", "reason": ...} row to metrics.jsonl.
--init_from=auto resumes when out_dir holds a checkpoint and starts from scratch otherwise;
--init_from=scratch refuses to replace an existing checkpoint unless --overwrite=true, and every new
run (auto without a checkpoint too) another run's metrics.jsonl, config.json or zero-shot results.
`python train.py --help` lists every key with its default.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from spheretnorm.runtime.cli import explain_missing_packages, survive_closed_console

explain_missing_packages(__file__)  # before torch: a missing package is one line, not a traceback

import torch
import torch.distributed as torch_dist

from spheretnorm.runtime.batches import TRAIN_STREAM, TokenData, batch_offsets, get_batch, load_data
from spheretnorm.runtime.schedule import apply_schedule, learning_rate_at
from spheretnorm.runtime.device import (DeviceError, autocast_context, cpu_threads_in_use, enable_tf32, estimate_mfu, get_device,
                                        peak_flops_for, resolve_dtype, set_rng_state)
from spheretnorm.runtime.distributed import DistInfo, init_distributed, print0
from spheretnorm.runtime.checkpoint import (check_newest_is_own, load_checkpoint, read_resume_meta, restore_run_config,
                                             restore_training_state, resume_checkpoint, rng_from_plain, settle_at_start,
                                             write_run_checkpoint)
from spheretnorm.runtime.parallel import build_model, grad_sync, init_process_group_for, wrap_model
from spheretnorm.runtime.step import backward_step, check_terms_finite
from spheretnorm.runtime.loss_terms import active_loss_terms, with_recorded_loss_terms
from spheretnorm.runtime.config import (
    HF_PREFIX, ConfigError, ParsedConfig, TrainConfig, config_from_dict, train_help,
    grad_accum_steps, model_key_conflicts, parse_config, wants_help,
)
from spheretnorm.runtime.identity import changes_text, check_resume_keys, resume_changes, run_neutral_keys, run_settings, run_suffix
from spheretnorm.runtime.methods import default_out_dir, method_key, resolve_paths, resolve_wandb_names
from spheretnorm.optim import build_optimizer
from spheretnorm.runtime.validation import EvalAbandoned, Evaluator
from spheretnorm.runtime.distributed import all_reduce_sum, any_rank, leave_process_group, report_stop
from spheretnorm.runtime.start_notes import announce_start, settle_derived_keys
from spheretnorm.hf.folder import HF_INIT_ADJUSTABLE, folder_model_config, load_folder_weights, read_folder_config
from spheretnorm.model import CONNECTIONS, EXECUTION_KEYS, GPTConfig
from spheretnorm.kernels import compile_mode_text, impl_unavailable, kernel_path_text, sphere_kernel_path
from spheretnorm.runtime.stopping import StartupStopped, StopSignal, clean_stop_line
from spheretnorm.runtime.run_folder import (
    EXIT_CONFIG, EXIT_CRASH, EXIT_OK, NonFiniteLossError, OutDirError, RunStopped, check_no_earlier_run, check_out_dir, checkpoint_path,
    check_checkpoint_kind, has_checkpoint, missing_resume_text, remove_stop_checkpoint, stop_checkpoint_path, evaluated_at, machine_failure,
)
from spheretnorm.runtime.token_files import SPLITS
from spheretnorm.runtime.imports import keep_recorded_imports
from spheretnorm.runtime.tracking import Progress, RunLog, check_wandb

# -----------------------------------------------------------------------------
# Set-up: the model configuration, from the command line or the checkpoint


# What a resume reads besides the model (Trainer._restore, Progress.restore).
RESUME_KEYS = ("optimizer", "rng", "train_config", "iter_num", "best_val_loss", "recent_losses", "elapsed_s")


def load_resume_checkpoint(train: TrainConfig, path: Path) -> dict[str, Any]:
    """The checkpoint at `path` (resume_checkpoint's choice), with what a resume reads besides the model."""
    if not path.exists():
        raise ConfigError(missing_resume_text(path))
    # On the CPU first: loading straight to the GPU would hold two copies of the optimizer state.
    try:  # a sharded folder: its tensors are read by every rank's own shards (Trainer._restore)
        if path.is_dir():  # every rank's verdict gathered: a shard only rank 0's digests see is refused by all
            return read_resume_meta(path, RESUME_KEYS)
        return load_checkpoint(path, map_location="cpu", require=RESUME_KEYS)
    except ValueError as e:  # not a checkpoint of this project, or one with disallowed objects
        raise ConfigError(str(e)) from None


def resolve_init_from(train: TrainConfig, wanted: dict[str, Any] | None = None) -> TrainConfig:
    """init_from=auto becomes resume or scratch; a new run never silently replaces a checkpoint, nor
    another run's files (run_folder.earlier_run; `wanted`: the new run's settings);
    eval_only evaluates the checkpoint in out_dir (or a hf:DIR folder), never fresh weights."""
    settle_at_start(train)
    check_checkpoint_kind(train)
    if checkpoint_path(train).exists() and (train.eval_only or train.init_from in ("resume", "auto")) and not train.init_from.startswith(HF_PREFIX):
        check_newest_is_own(train)
    exists = has_checkpoint(train)  # a stop's checkpoint too: a pre-empted run resumes from it
    if train.eval_only and not train.init_from.startswith(HF_PREFIX):
        if not exists:
            raise ConfigError(
                f"eval_only=true evaluates the checkpoint in out_dir, and there is none at {checkpoint_path(train)}; "
                "check out_dir, or give --init_from=hf:DIR to evaluate a model folder."
            )
        return replace(train, init_from="resume")
    if train.init_from != "resume" and not exists:
        check_no_earlier_run(train, wanted)
    if train.init_from == "auto":
        return replace(train, init_from="resume" if exists else "scratch")
    if train.init_from != "resume" and exists and not (train.overwrite or train.eval_only):
        raise ConfigError(
            f"{checkpoint_path(train)} already exists and init_from={train.init_from} would overwrite it; "
            "continue it with --init_from=resume (or auto), or start again with --overwrite=true."
        )
    return train


def hf_folder_of(train: TrainConfig) -> str | None:
    """DIR of init_from=hf:DIR, else None."""
    return train.init_from.removeprefix(HF_PREFIX) if train.init_from.startswith(HF_PREFIX) else None


def hf_init_model_keys(parsed: ParsedConfig, folder: str) -> dict[str, Any]:
    """The model keys of a run that starts from a Hugging Face folder: the folder's.

    Explicit keys must agree with them, except dropout, and block_size, which may shrink.
    """
    try:
        saved = folder_model_config(folder)
    except ValueError as e:  # not a model folder, or one whose config is not a valid GPTConfig
        raise ConfigError(str(e)) from None
    fixed = {k: v for k, v in parsed.model_keys.items() if k not in HF_INIT_ADJUSTABLE}
    conflicts = model_key_conflicts(fixed, saved, source="the folder")
    if conflicts:
        raise ConfigError(
            f"Refusing to start from {HF_PREFIX}{folder} with a different model: " + "; ".join(conflicts)
            + ". Drop these keys (the folder's values are used)."
        )
    block_size = parsed.model_keys.get("block_size", saved["block_size"])
    if block_size > saved["block_size"]:
        raise ConfigError(
            f"block_size={block_size} exceeds the {saved['block_size']} positions the model in {folder} "
            f"has learned; choose block_size <= {saved['block_size']}."
        )
    return {**saved, **parsed.model_keys}


def announce_out_dir(parsed: ParsedConfig, explicit_out_dir: bool) -> None:
    """Say loudly when changed settings moved the run out of its config's usual folder."""
    if explicit_out_dir or not run_suffix(parsed.overrides):
        return
    base = default_out_dir(parsed.train.config_name, parsed.model_config())  # without the suffix
    changed = ", ".join(f"{k}={v}" for k, v in sorted(parsed.overrides.items()) if k not in run_neutral_keys())
    source = " and ".join(parsed.config_files) or "the defaults"
    print0(
        f"NOTE: settings differ from {source} ({changed}), so this run writes to "
        f"{parsed.train.out_dir}, not {base}; set --out_dir to choose the folder."
    )


def build_model_config(parsed: ParsedConfig, data: TokenData, ckpt: dict[str, Any] | None, device_type: str) -> GPTConfig:
    """The checkpoint's config when resuming (explicit keys must agree), else a new one; its
    sphere_impl must run on device_type (checked here, not in the first step)."""
    if ckpt is not None:
        conflicts = model_key_conflicts(parsed.model_keys, ckpt["model_config"])
        if conflicts:
            raise ConfigError(
                "Refusing to resume with a different model: "
                + "; ".join(conflicts)
                + ". Drop these keys (the checkpoint's values are used) or use another out_dir."
            )
        execution = {k: v for k, v in parsed.model_keys.items() if k in EXECUTION_KEYS}
        model_cfg = config_from_dict({**ckpt["model_config"], **execution})
    else:
        derived = {}
        if data.meta.get("tokenizer") != "gpt2" and "vocab_size" in data.meta:
            derived["vocab_size"] = int(data.meta["vocab_size"])  # gpt2 keeps the padded 50304
        elif data.meta.get("tokenizer") == "char" and "vocab_size" not in parsed.model_keys:
            # A character vocabulary is the dataset's own: GPT-2's padded 50304 would be taken silently.
            raise ConfigError(
                f"{data.data_dir / 'meta.json'} has no vocab_size, which a char dataset needs to size the model; "
                "re-run data/prepare.py, or give --vocab_size."
            )
        model_cfg = parsed.model_config(**derived)
    if int(data.meta.get("vocab_size", 0)) > model_cfg.vocab_size:
        raise ConfigError(
            f"The dataset's vocab_size {data.meta['vocab_size']} exceeds the model's "
            f"vocab_size {model_cfg.vocab_size}."
        )
    if impl_unavailable(model_cfg.sphere_impl, device_type):
        raise ConfigError(impl_unavailable(model_cfg.sphere_impl, device_type))
    for split in SPLITS:
        if data.num_tokens(split) <= model_cfg.block_size:
            raise ConfigError(
                f"The {split} split of {data.data_dir} has {data.num_tokens(split)} tokens, too "
                f"few for block_size={model_cfg.block_size}."
            )
    return model_cfg


# -----------------------------------------------------------------------------
# The trainer: the model, the optimizer and the loop (validation loss: spheretnorm/runtime/validation.py,
# the rows it writes: spheretnorm/runtime/tracking.py)


class Trainer:
    """One training run on this process: built from the parsed config, driven by run()."""

    def __init__(self, parsed: ParsedConfig, dist: DistInfo, device: str):
        train = parsed.train
        self.dist = dist
        self.device = device
        self.device_type = device.split(":")[0]
        self.dtype = resolve_dtype(train.dtype, self.device_type)
        self.autocast = autocast_context(self.device_type, self.dtype)
        self.data = load_data(train.data_dir)
        # The checkpoint a resume starts from, by the readers' rule, and the line that names it when there was a choice.
        self.resume_from, self.resume_note = resume_checkpoint(train)
        ckpt = load_resume_checkpoint(train, self.resume_from) if train.init_from == "resume" else None
        if ckpt is not None:
            if not train.eval_only:  # the loss terms it trained with, with consent (an evaluation computes none)
                train = with_recorded_loss_terms(train, ckpt["train_config"], f"Checkpoint {str(self.resume_from)!r}", ConfigError)
            check_resume_keys(train, ckpt["train_config"])
        train = settle_derived_keys(train, parsed.derived, ckpt and ckpt["train_config"])  # a resume keeps the schedule it recorded
        self.model_cfg = build_model_config(parsed, self.data, ckpt, self.device_type)
        self.cfg = resolve_wandb_names(keep_recorded_imports(train, ckpt and ckpt["train_config"]), self.model_cfg)
        self.accum = grad_accum_steps(self.cfg.global_batch_size, self.cfg.batch_size, dist.world_size)
        self.tokens_per_step = self.cfg.global_batch_size * self.model_cfg.block_size

        # Identical initial weights on every rank (sharded under fsdp); then each rank its own dropout stream.
        hf_folder = hf_folder_of(train)
        prepare = (lambda model: load_folder_weights(model, hf_folder)) if hf_folder is not None else None
        self.raw_model = build_model(self.model_cfg, self.cfg, dist, device, self.dtype, prepare)
        self.progress = Progress(checkpoint_path(self.cfg), self.tokens_per_step)
        if ckpt is not None and self.resume_from != self.progress.checkpoint:
            self.progress.latest = self.resume_from
        try:  # an optimizer that cannot train this model (a resumed μP model under Muon) refuses it
            self.optimizer = build_optimizer(self.raw_model, self.cfg, self.device_type)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=self.dtype == "float16")
        if ckpt is not None:
            self._restore(ckpt)
            del ckpt

        self.model, self.fwd_model = wrap_model(self.raw_model, self.cfg, dist, self.device_type, dist.local_rank)
        self.peak_flops = self.cfg.peak_flops or peak_flops_for(device)
        self.evaluator = Evaluator(
            self.cfg, self.data, dist, device, self.autocast, self.progress,
            model=self.model, fwd_model=self.fwd_model, raw_model=self.raw_model,
        )
        self.outputs = RunLog(self.cfg, dist.is_master, self.progress, lambda: self.optimizer.param_groups)  # rows show each group's rate
        self.last_line = ""  # said once the outputs are closed (a clean stop's, stop_for_signal)

    def _restore(self, ckpt: dict[str, Any]) -> None:
        restore_training_state(self.cfg, ckpt, self.raw_model, self.optimizer, self.resume_from)  # the current settings' groups
        if ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        self.progress.restore(ckpt)
        if len(ckpt["rng"]) == self.dist.world_size:
            set_rng_state(rng_from_plain(ckpt["rng"][self.dist.rank]))
        else:
            print0(
                f"NOTE: the checkpoint was written by {len(ckpt['rng'])} process(es), this run has "
                f"{self.dist.world_size}; dropout random streams restart from the seed."
            )
        self.progress.resumed_with(changed := resume_changes(self.cfg, ckpt, cpu_threads_in_use(self.device)))
        if changed:  # kept in the run's settings history (config.json, checkpoints) and a metrics row
            print0("NOTE: resuming with training keys changed from the checkpoint's: " + changes_text(changed))
        if ckpt.get("data_meta") and ckpt["data_meta"].get("tokenizer") != self.data.meta.get("tokenizer"):
            print0("WARNING: the dataset's tokenizer differs from the one the checkpoint was trained on.")

    # -- one optimizer step ------------------------------------------------------

    def train_step(self, step: int, stop: StopSignal) -> tuple[float, float, bool, bool]:
        """Run optimizer step `step`; returns (mean loss, grad norm, stop requested on any rank,
        metrics write failed on any rank)."""
        cfg = self.cfg
        apply_schedule(self.optimizer.param_groups, step, cfg)  # each group's own peak rate, scaled
        block = self.model_cfg.block_size
        offsets = batch_offsets(cfg.seed, TRAIN_STREAM, step, cfg.global_batch_size, self.data.num_tokens("train"), block)
        mine = offsets.reshape(self.dist.world_size, self.accum, cfg.batch_size)[self.dist.rank]
        tokens = self.data.split("train")
        grads = backward_step(
            self.model, lambda micro: get_batch(tokens, mine[micro], block, self.device), cfg, accum=self.accum, autocast=self.autocast,
            scaler=self.scaler, sync=lambda last: grad_sync(self.model, last, self.dist), loss_hook=lambda loss: debug_faults(cfg, step, loss),
            clip=self.raw_model, optimizer=self.optimizer)
        # One all-reduce for the five things every rank must agree on.
        flag = torch.tensor(float(stop.requested), device=self.device)
        failed = torch.tensor(float(self.outputs.write_error is not None), device=self.device)
        stats = all_reduce_sum(torch.stack([grads.loss, grads.grad_norm.float(), flag, failed, grads.total]), self.dist)
        loss_val, norm_val, stop_val, failed_val, self.total_loss = (v / self.dist.world_size for v in stats.tolist())
        # fp16's GradScaler skips steps with inf gradients by design; elsewhere they are fatal.
        if not math.isfinite(loss_val):
            raise NonFiniteLossError.at("loss", loss_val, step + 1, self.progress.kept_checkpoint_text())
        check_terms_finite(grads, self.total_loss, step, self.progress)  # a loss term's nan/inf, named (fp16 too)
        if self.dtype != "float16" and not math.isfinite(norm_val):
            raise NonFiniteLossError.at("gradient norm", norm_val, step + 1, self.progress.kept_checkpoint_text())
        self.scaler.step(self.optimizer)
        # The connections' after-step hooks (e.g. a renormalisation of weights kept on a sphere).
        self.raw_model.after_optimizer_step()
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_val, norm_val, stop_val > 0, failed_val > 0

    # -- checkpoints -------------------------------------------------------------------

    def save_checkpoint(self, stop_state: bool = False) -> None:
        """All ranks call this. stop_state: a stop's state during a collapse-alarm streak, written
        beside the last healthy checkpoint (which stays as it was); a healthy save removes it."""
        progress = self.progress
        path = stop_checkpoint_path(self.cfg) if stop_state else progress.checkpoint
        extra = {
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
            "train_config": asdict(self.cfg),
            **progress.checkpoint_fields(self.cfg.seed, self.cfg.global_batch_size),
            "data_meta": self.data.meta, "cpu_threads": cpu_threads_in_use(self.device),
        }
        started = time.perf_counter()
        write_run_checkpoint(path, self.raw_model, self.optimizer, extra, self.cfg.parallel == "fsdp", self.dist, self.device)
        progress.note_checkpoint_write(time.perf_counter() - started)
        if not stop_state and self.dist.is_master:
            remove_stop_checkpoint(self.cfg)
        progress.saved_iter, progress.latest = progress.iter_num, (path if stop_state else None)

    # -- the loop ------------------------------------------------------------------------------

    def eval_and_maybe_save(self) -> None:
        progress = self.progress
        row = self.evaluator.evaluate()
        self.outputs.log_eval(row)
        suspect = self.evaluator.collapse_suspect(row)
        improved = row["val_loss"] < progress.best_val_loss
        progress.best_val_loss = min(progress.best_val_loss, row["val_loss"])
        if saves_this_state(self.cfg, progress, suspect, improved):
            self.save_checkpoint()
        self.evaluator.stop_if_collapsed()  # an alarm at the final evaluation: after the save

    def log_train(self, loss: float, grad_norm: float, lr: float, step_time: float, row: bool = True) -> None:
        """The train row and its console line; row=False: the console line only (a session's first step).
        train_loss stays the cross-entropy; with a loss term on, the total is train_loss_total."""
        mfu = None
        if self.peak_flops:
            mfu = estimate_mfu(self.raw_model, self.cfg.batch_size * self.accum, step_time, self.peak_flops)
        if row:
            self.outputs.log_train(loss, grad_norm, lr, step_time, mfu, {"train_loss_total": self.total_loss} if active_loss_terms(self.cfg) else None)
        else:
            self.outputs.show_first_step(loss, grad_norm, lr, step_time, mfu)

    def run(self, stop: StopSignal) -> None:
        """The training loop, with a stop row for every way it can end early."""
        try:
            try:
                self._run(stop)
            except (OSError, RuntimeError) as e:  # a full disk, a stopped peer: one line, resumable
                failure = machine_failure(e, self.cfg.dist_timeout, self.progress.kept_checkpoint_text(), self.dist.rank, self.dist.world_size)
                if failure is None:
                    raise
                raise failure from None
        except RunStopped as e:
            with contextlib.suppress(OSError):  # the stop row may not fit on a full disk either
                self.outputs.log_stop(e.reason, str(e), e.exit_code)
            raise
        except Exception as e:
            self.outputs.log_stop("crash", f"{type(e).__name__}: {e}", EXIT_CRASH)
            raise

    def _run(self, stop: StopSignal) -> None:
        cfg, progress = self.cfg, self.progress
        resumed = cfg.init_from == "resume"
        stop.training_started()
        self.evaluator.stop_requested = lambda: any_rank(stop.requested, self.dist, self.device)
        progress.start()
        print0(summary_line(self))
        if resumed and self.resume_note:  # which checkpoint, when there was a choice (an evaluation's too)
            print0(self.resume_note)
        if resumed and not cfg.eval_only:
            print0(f"resumed from iter {progress.iter_num} ({progress.latest or progress.checkpoint})")
        if cfg.eval_only:
            try:
                row = self.evaluator.evaluate()
            except EvalAbandoned:
                print0(f"Stopped by {stop.cause()} during the evaluation; nothing was written.")
                return
            if self.dist.is_master:
                print(json.dumps(row))
            return
        self.outputs.open(run_config(self), resumed)
        try:
            self._train(stop, resumed)
        except EvalAbandoned:  # the stop waits for no evaluation: the weights are this iteration's
            stop_for_signal(self, stop)

    def _train(self, stop: StopSignal, resumed: bool) -> None:
        cfg, progress = self.cfg, self.progress
        if not resumed or (progress.iter_num >= cfg.max_iters and not evaluated_at(cfg.out_dir, progress.iter_num)):  # cut short
            self.eval_and_maybe_save()
        window_time, window_steps = 0.0, 0
        while progress.iter_num < cfg.max_iters:
            t0 = time.time()
            loss, grad_norm, stop_now, log_failed = self.train_step(progress.iter_num, stop)
            window_time += time.time() - t0
            window_steps += 1
            lr = learning_rate_at(progress.iter_num, cfg)
            progress.iter_num += 1
            progress.recent_losses.append(loss)
            if progress.iter_num % cfg.log_interval == 0 or progress.iter_num == cfg.max_iters:
                self.log_train(loss, grad_norm, lr, window_time / window_steps)
                window_time, window_steps = 0.0, 0
            elif progress.iter_num == progress.start_iter + 1:  # seen at once, not after log_interval steps
                self.log_train(loss, grad_norm, lr, window_time / window_steps, row=False)
            if progress.iter_num % cfg.eval_interval == 0 or progress.iter_num == cfg.max_iters:
                self.eval_and_maybe_save()
            elif cfg.checkpoint_interval and progress.iter_num % cfg.checkpoint_interval == 0 and not progress.collapse_streak:
                self.save_checkpoint()
            if log_failed:
                self.stop_for_log_failure()
            if stop_now:
                stop_for_signal(self, stop)
                return
        if any_rank(self.outputs.write_error is not None, self.dist, self.device):  # at the final row
            self.stop_for_log_failure()
        print0(done_line(self))

    def save_unsaved_state(self) -> None:
        """Checkpoint the current iteration if a step ran since the last save (in a collapse-alarm streak, beside the healthy one)."""
        if self.progress.iter_num > 0 and self.progress.saved_iter != self.progress.iter_num:
            self.save_checkpoint(stop_state=bool(self.progress.collapse_streak))

    def stop_for_log_failure(self) -> None:
        """metrics.jsonl could not take a row (a full disk): checkpoint where the disk still allows, then stop in one line."""
        with contextlib.suppress(OSError):  # a checkpoint that does not fit either keeps the last one
            self.save_unsaved_state()
        raise self.outputs.write_failure()

    def close(self) -> None:
        self.outputs.close()
        if self.last_line:  # after W&B's closing lines: the run's own last line (torchrun's report may follow)
            print0(self.last_line)


def debug_faults(cfg: TrainConfig, step: int, loss: torch.Tensor) -> torch.Tensor:
    """The tests' fault injection in step `step` (debug_* keys): its loss made NaN, or a crash."""
    if step + 1 == cfg.debug_crash_at_iter:
        raise RuntimeError(f"debug_crash_at_iter={cfg.debug_crash_at_iter}: a deliberate crash for the tests")
    return loss * float("nan") if step + 1 == cfg.debug_nan_at_iter else loss


def saves_this_state(cfg: TrainConfig, progress: Progress, suspect: bool, improved: bool) -> bool:
    """Whether an evaluation's state is checkpointed (the same on every rank).

    A state that may be collapsing (suspect) is not saved mid-run: the checkpoint stays the last
    good one. The final state (max_iters) is saved whatever the collapse alarm says: the alarm
    decides whether a run stops, not whether a run that reached its end leaves a checkpoint.
    always_save_checkpoint=false keeps the best state, and the final one when there is none yet.
    """
    final = progress.iter_num >= cfg.max_iters
    wanted = cfg.always_save_checkpoint or improved or (final and progress.saved_iter < 0)
    return progress.iter_num > 0 and (final or not suspect) and wanted


def run_config(t: Trainer) -> dict[str, Any]:
    """What W&B and config.json record: both configs, the paper's method name, the layout."""
    return {
        **asdict(t.cfg), **asdict(t.model_cfg), "method": method_key(t.model_cfg), "world_size": t.dist.world_size,
        "grad_accum_steps": t.accum, "tokens_per_step": t.tokens_per_step, "num_params": t.raw_model.get_num_params(),
        "resolved_dtype": t.dtype, "sphere_kernels": sphere_kernels(t), "kernel_path": kernel_path_text(t.dtype, t.cfg.compile, sphere_kernels(t), t.cfg.resolved_compile_scope()),
        "cpu_threads": cpu_threads_in_use(t.device), "data_source": t.data.meta.get("source"), "settings_history": t.progress.settings_history}


def sphere_kernels(t: Trainer) -> str | None:
    """The path of the sphere update (kernels.sphere_kernel_path); None for a model off the sphere."""
    if not CONNECTIONS[t.model_cfg.connection].on_sphere:
        return None
    return sphere_kernel_path(t.model_cfg.sphere_impl, t.device.split(":")[0], t.cfg.compile)


def summary_line(t: Trainer) -> str:
    """The run at a glance, printed when training starts."""
    path = sphere_kernels(t)
    kernels = f" | sphere update {path}" if path else ""
    return (
        f"{method_key(t.model_cfg)} | {t.raw_model.get_num_params() / 1e6:.2f}M params | "
        f"{t.dist.world_size} process(es) x {t.cfg.batch_size} seqs x {t.accum} micro-steps = "
        f"{t.cfg.global_batch_size} seqs ({t.tokens_per_step:,} tokens) per step | "
        f"{t.device} {t.dtype} | {compile_mode_text(t.cfg.compile, t.cfg.resolved_compile_scope())}{kernels} | out_dir {t.cfg.out_dir}"
    )


def stop_for_signal(t: Trainer, stop: StopSignal) -> None:
    """Write a checkpoint of the current iteration (if a step ran since the last one), then stop."""
    t.save_unsaved_state()
    if t.dist.enabled:  # no rank may exit before rank 0 has written: a launcher that sees
        torch_dist.barrier()  # one worker leave (torchrun, srun --kill-on-bad-exit) kills the rest
    message = t.progress.stop_text(stop.cause())
    t.outputs.log_stop("signal", message, EXIT_OK)
    t.last_line = clean_stop_line(message, EXIT_OK, stop.under_torchrun)


def done_line(t: Trainer) -> str:
    """The last line of a run that reached max_iters: its checkpoint, and a warning when its
    final state was suspect (saved all the same: the collapse alarm only stops runs)."""
    progress = t.progress
    saved = f"checkpoint {progress.checkpoint} (iter {progress.saved_iter})" if progress.saved_iter >= 0 else "no checkpoint"
    line = f"Done: iter {progress.iter_num}, best val loss {progress.best_val_loss:.4f}; {saved}; {progress.checkpoint_writes_text()}."
    if t.evaluator.final_suspect:
        line += (
            f" Its final_cosine is above collapse_cosine={t.cfg.collapse_cosine}: the final state is saved all the "
            "same (a run that reaches max_iters always saves it); check it for collapse before using it."
        )
    return line


def pick_device(train: TrainConfig, dist: DistInfo) -> str:
    device = get_device(train.device)
    if device == "cuda" and dist.enabled:
        device = f"cuda:{dist.local_rank}"  # one GPU per process
    return device


def main(argv: list[str] | None = None) -> None:
    """Train as the command line says; raises ConfigError before any work on a bad config."""
    argv = sys.argv[1:] if argv is None else argv
    survive_closed_console()  # a console reader that goes away (| tee, Ctrl-C) never ends a run
    if wants_help(argv):
        print(train_help(argv), end="")
        return
    # Stop signals are caught from here on: during start-up they end the process at once,
    # with nothing written; once training runs, at the next step with a checkpoint.
    with StopSignal() as stop:
        if restored := restore_run_config(argv):  # a resume by --out_dir alone of a folder that lost its config.json
            print0(restored)
        parsed = parse_config(argv)
        hf_folder = hf_folder_of(parsed.train)
        if hf_folder is not None:  # the folder's model names the run folder, as a resume's checkpoint does
            parsed.model_keys = hf_init_model_keys(parsed, hf_folder)
            parsed.train = keep_recorded_imports(parsed.train, read_folder_config(hf_folder))  # checked just above
        # Paths first: the checkpoint to resume from lives in out_dir. The method and the changed
        # keys in its default name come from the keys given, so resuming needs the same ones.
        explicit_out_dir = bool(parsed.train.out_dir)
        parsed.train = resolve_init_from(resolve_paths(parsed.train, parsed.model_config(), parsed.overrides), run_settings(parsed))
        announce_out_dir(parsed, explicit_out_dir)
        if not parsed.train.eval_only:  # an evaluation writes nothing
            check_out_dir(parsed.train)
        check_wandb(parsed.train)
        device_type = get_device(parsed.train.device).split(":")[0]
        backend = parsed.train.backend or ("nccl" if device_type == "cuda" else "gloo")
        dist = init_distributed(backend, parsed.train.dist_timeout)
        init_process_group_for(parsed.train, dist, backend)
        try:
            device = pick_device(parsed.train, dist)
            announce_start(parsed.train, parsed.model_config(), device)
            if device.startswith("cuda"):
                enable_tf32()
            trainer = Trainer(parsed, dist, device)
            try:
                trainer.run(stop)
            finally:
                trainer.close()
        finally:
            leave_process_group(sys.exc_info()[1])  # after a stop all ranks took, they leave together


if __name__ == "__main__":
    try:
        main()
    except ConfigError as e:  # the same on every rank of a torchrun job: rank 0 says it, once
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"error: {e}", file=sys.stderr)
        else:  # torchrun ends every rank when one exits: give rank 0 the time to say it
            time.sleep(3.0)
        sys.exit(EXIT_CONFIG)
    except (DeviceError, OutDirError) as e:  # may be one rank's own (its GPU, its view of the folder)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    except RunStopped as e:  # a stop all ranks took together is said once, by rank 0
        sys.exit(report_stop(e))
    except StartupStopped as e:
        print(f"Stopped by {e} during start-up; nothing was written.", file=sys.stderr)
        sys.exit(EXIT_OK)
    except Exception:
        traceback.print_exc()
        sys.exit(EXIT_CRASH)
