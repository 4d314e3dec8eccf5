"""
Train a GPT with a chosen deep connection, on one CPU/GPU or many GPUs with DDP.

    python train.py config/shakespeare_char.py                          # a laptop, minutes
    python train.py config/openwebtext_s.py --connection=p_spheret --spheret_p=0.5
    torchrun --standalone --nproc_per_node=8 train.py config/fineweb_edu_m.py --connection=geonorm
    python train.py config/openwebtext_s.py --connection=geonorm --init_from=resume

Every key of GPTConfig (model.py) and TrainConfig (trainconfig.py) can be set in a config file
or as --key=value. The global batch (global_batch_size sequences) is fixed; the number of
micro-steps per optimizer step follows from batch_size and the number of processes, and the
sequences of step k are a function of (seed, k) only, so neither the GPU count nor a resume
changes the optimisation.

Outputs in out_dir: ckpt.pt (written atomically), metrics.jsonl (one JSON object per line, see
README), config.json. SIGTERM or SIGUSR1 saves a checkpoint at the next step and exits 0.
Exit status: 0 done or signalled, 1 crash, 2 bad config, 3 collapse (final_cosine above
collapse_cosine for collapse_evals evaluations in a row), 4 non-finite loss; every early end
also writes a {"kind": "stop", "reason": ...} row to metrics.jsonl.
--init_from=auto resumes when out_dir holds a checkpoint and starts from scratch otherwise;
--init_from=scratch refuses to replace an existing checkpoint unless --overwrite=true.
`python train.py --help` lists every key with its default.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import netrc
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import numpy as np
import torch
import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel as DDP

from common import (
    DeviceError,
    DistInfo,
    atomic_torch_save,
    autocast_context,
    enable_tf32,
    get_device,
    init_distributed,
    peak_flops_for,
    print0,
    resolve_dtype,
    rng_state,
    seed_everything,
    set_rng_state,
)
from data.common import PrepareError, load_meta, open_split
from hf_folder import HF_INIT_ADJUSTABLE, HF_PREFIX, folder_model_config, load_folder_weights
from model import DIAGNOSTIC_SERIES, EXECUTION_KEYS, GPT, GPTConfig, config_from_dict, load_checkpoint
from trainconfig import (
    RUN_NEUTRAL_KEYS,
    ConfigError,
    ParsedConfig,
    TrainConfig,
    config_help,
    default_out_dir,
    grad_accum_steps,
    method_key,
    model_key_conflicts,
    parse_config,
    resolve_paths,
    resolve_wandb_names,
    run_suffix,
    wants_help,
)

CKPT_NAME = "ckpt.pt"
METRICS_NAME = "metrics.jsonl"
AVG_WINDOW = 200  # the paper reports the train loss averaged over the last 200 iterations
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
SPLITS = ("train", "val")
# Independent random streams of the data sampler: (seed, stream, index) seeds one draw.
TRAIN_STREAM, EVAL_STREAM = 0, 1


# Exit statuses of train.py, one per way a run can end (README, "Training"). A stopped or
# crashed run also writes a {"kind": "stop", "reason": ...} row to metrics.jsonl.
EXIT_OK = 0  # finished, or stopped by SIGTERM/SIGUSR1 with a checkpoint to resume from
EXIT_CRASH = 1  # an unexpected exception (a bug, out of memory, a lost file): traceback on stderr
EXIT_CONFIG = 2  # a bad config or device, refused before any training
EXIT_COLLAPSE = 3  # representation collapse: final_cosine above collapse_cosine for collapse_evals evaluations
EXIT_NON_FINITE = 4  # the loss or gradient norm became nan/inf


class RunStopped(RuntimeError):
    """The run stopped itself for a reason its stop row and exit status name."""

    reason = ""
    exit_code = EXIT_CRASH


class NonFiniteLossError(RunStopped):
    """The loss (or gradient norm) became nan/inf; the run stops without saving."""

    reason = "non_finite"
    exit_code = EXIT_NON_FINITE


class CollapseError(RunStopped):
    """Every token's final state has become one point; the run stops without saving."""

    reason = "collapse"
    exit_code = EXIT_COLLAPSE


# -----------------------------------------------------------------------------
# Data: flat uint16 token files, sampled at random offsets


@dataclass
class TokenData:
    data_dir: Path
    meta: dict[str, Any]

    def split(self, name: str) -> np.ndarray:
        # A fresh memmap per batch keeps the mapped pages from piling up in the RSS.
        return open_split(self.data_dir, name, self.meta)

    def num_tokens(self, name: str) -> int:
        return int(self.meta[f"{name}_tokens"])


def load_data(data_dir: str) -> TokenData:
    """The one place that knows the on-disk layout (data/common.py's readers)."""
    try:
        meta = load_meta(data_dir)
        for split in SPLITS:
            open_split(data_dir, split, meta)  # checks that the bins exist and match meta.json
    except (PrepareError, KeyError) as e:
        raise ConfigError(f"Dataset in {data_dir} is not usable: {e}") from None
    return TokenData(Path(data_dir), meta)


def batch_offsets(seed: int, stream: int, index: int, count: int, n_tokens: int, block_size: int) -> np.ndarray:
    """`count` random start offsets, a pure function of (seed, stream, index).

    Step k of training draws all its global_batch_size offsets here at once and each rank takes
    its own slice: the batch of a step does not depend on the world size, and resuming at step k
    needs no sampler state beyond k.
    """
    rng = np.random.default_rng([seed, stream, index])
    return rng.integers(0, n_tokens - block_size, size=count)


def get_batch(tokens: np.ndarray, offsets: np.ndarray, block_size: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets (B, T) at the given offsets."""
    rows = np.stack([tokens[i : i + block_size + 1] for i in offsets]).astype(np.int64)
    # One (2, B, T) tensor: a single host-to-device copy, and x, y are contiguous views.
    xy = torch.from_numpy(np.stack([rows[:, :-1], rows[:, 1:]]))
    if device.startswith("cuda"):
        xy = xy.pin_memory().to(device, non_blocking=True)  # overlaps with the running step
    else:
        xy = xy.to(device)
    return xy[0], xy[1]


# -----------------------------------------------------------------------------
# Schedule, metrics, signals


def learning_rate_at(step: int, cfg: TrainConfig) -> float:
    """LR of optimizer step `step` (0-based): linear warm-up from 0, cosine to min_lr, then flat."""
    if not cfg.decay_lr:
        return cfg.learning_rate
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / cfg.warmup_iters
    if step >= cfg.lr_decay_iters:
        return cfg.min_lr
    progress = (step - cfg.warmup_iters) / max(1, cfg.lr_decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


def format_duration(seconds: float) -> str:
    """'2h05m', '3m07s' or '42s': short enough for every console line."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class EvalProgress:
    """The console progress of an evaluation, one split at a time.

    On a terminal one line updates in place ("eval val 3/20 batches"); either way each split
    ends with one line that gives its time. Cluster logs are files, where an updating line
    would pile up, so there only the per-split lines appear.
    """

    def __init__(self, enabled: bool, stream: TextIO | None = None):
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout
        self.tty = enabled and self.stream.isatty()
        self.split, self.total, self.started = "", 0, 0.0

    def start(self, split: str, total: int) -> None:
        self.split, self.total, self.started = split, total, time.time()
        self.update(0)

    def update(self, done: int) -> None:
        if self.tty and done < self.total:
            self.stream.write(f"\reval {self.split} {done}/{self.total} batches")
            self.stream.flush()

    def finish(self) -> None:
        if not self.enabled:
            return
        line = f"eval {self.split} {self.total}/{self.total} batches in {time.time() - self.started:.1f} s"
        self.stream.write(("\r" + line.ljust(40) if self.tty else line) + "\n")
        self.stream.flush()


class MetricsLog:
    """metrics.jsonl: one JSON object per line, flushed at once so a crash loses nothing.

    A resumed run first drops the rows past the checkpoint's iteration (they belong to the
    abandoned tail of the previous attempt), so every iteration appears once, and every stop row
    (the previous attempt's ending, which the resume abandons).
    """

    def __init__(self, path: Path, resume_iter: int | None):
        self.path = path
        kept = self._rows_up_to(resume_iter) if resume_iter is not None else []
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
        os.replace(tmp, path)
        self._file = open(path, "a", encoding="utf-8")

    def _rows_up_to(self, last_iter: int) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        rows = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a crash
                continue
            if row.get("iter", 0) <= last_iter and row.get("kind") != "stop":
                rows.append(row)
        return rows

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


# W&B names of the per-layer diagnostics: rms[i] -> diag/rms/layer_03 and so on.
DIAG_SERIES = {**DIAGNOSTIC_SERIES, "step_sizes": "sublayer"}


def wandb_payload(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row as flat W&B keys (lists become one series per layer)."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if key in ("kind", "iter"):
            continue
        if key in DIAG_SERIES:
            for i, v in enumerate(value):
                out[f"diag/{key}/{DIAG_SERIES[key]}_{i:02d}"] = v
        elif key == "final_cosine":
            out["diag/final_cosine"] = value
        elif value is not None:
            out[key] = value
    return out


def start_wandb(train: TrainConfig, run_config: dict[str, Any], run_id: str | None) -> Any:
    """A W&B run (resumed when the checkpoint knows its id), or None if W&B cannot start."""
    import wandb

    try:
        return wandb.init(
            project=train.wandb_project,
            group=train.wandb_group,
            name=train.wandb_run_name,
            config=run_config,
            mode=train.wandb_mode,
            dir=train.out_dir,
            id=run_id,
            resume="allow" if run_id else None,
        )
    except Exception as e:  # a logging outage must not cost a training run
        print(f"WARNING: W&B did not start ({e}); training continues without it.", file=sys.stderr)
        return None


WANDB_DEFAULT_URL = "https://api.wandb.ai"


def _netrc_path() -> Path:
    """The netrc file wandb reads: $NETRC, else ~/.netrc, else ~/_netrc (Windows)."""
    if os.environ.get("NETRC"):
        return Path(os.environ["NETRC"]).expanduser()
    unix = Path("~/.netrc").expanduser()
    windows = Path("~/_netrc").expanduser()
    return windows if not unix.exists() and windows.exists() else unix


def wandb_key_source() -> str | None:
    """Where a W&B API key is configured, None if nowhere; reads no network.

    wandb looks in the same places, in this order: WANDB_API_KEY (or an identity token file),
    then the netrc entry of the W&B host ($WANDB_BASE_URL, default api.wandb.ai).
    """
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if os.environ.get(name):
            return name
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or WANDB_DEFAULT_URL).netloc
    path = _netrc_path()
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    return str(path) if entry and entry[2] else None


def check_wandb(train: TrainConfig) -> None:
    """Stop before training when W&B logging could not work, instead of a warning lost in a log."""
    if not train.wandb_log or train.wandb_mode == "disabled":
        return
    if "wandb" not in sys.modules and importlib.util.find_spec("wandb") is None:
        raise ConfigError("wandb_log=true but the wandb package is not installed; pip install wandb, or pass --wandb_log=false.")
    if train.wandb_mode == "online" and wandb_key_source() is None:
        host = urlsplit(os.environ.get("WANDB_BASE_URL") or WANDB_DEFAULT_URL).netloc
        raise ConfigError(
            f"wandb_log=true with wandb_mode=online needs a W&B API key, and none is configured "
            f"(no WANDB_API_KEY, no netrc entry for {host} in {_netrc_path()}); run `wandb login` "
            "or set WANDB_API_KEY, or pass --wandb_mode=offline (upload later with `wandb sync`) "
            "or --wandb_log=false."
        )


class StopSignal:
    """Records SIGTERM/SIGUSR1 (cluster pre-emption); the loop checks it between steps."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum

    @property
    def requested(self) -> bool:
        return self.signum is not None


# -----------------------------------------------------------------------------
# Set-up: the model configuration, from the command line or the checkpoint


def checkpoint_path(train: TrainConfig) -> Path:
    return Path(train.out_dir) / CKPT_NAME


def load_resume_checkpoint(train: TrainConfig) -> dict[str, Any]:
    path = checkpoint_path(train)
    if not path.is_file():
        raise ConfigError(
            f"init_from=resume but there is no checkpoint at {path}; check out_dir (the "
            "connection and any key that differs from the config file name the default out_dir), "
            "start with --init_from=scratch, or use --init_from=auto."
        )
    # On the CPU first: loading straight to the GPU would hold two copies of the optimizer state.
    try:
        return load_checkpoint(path, map_location="cpu")
    except ValueError as e:  # not a checkpoint of this project, or one with disallowed objects
        raise ConfigError(str(e)) from None


def resolve_init_from(train: TrainConfig) -> TrainConfig:
    """init_from=auto becomes resume or scratch; a new run never silently replaces a checkpoint."""
    exists = checkpoint_path(train).is_file()
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
    changed = ", ".join(f"{k}={v}" for k, v in sorted(parsed.overrides.items()) if k not in RUN_NEUTRAL_KEYS)
    source = " and ".join(parsed.config_files) or "the defaults"
    print0(
        f"NOTE: settings differ from {source} ({changed}), so this run writes to "
        f"{parsed.train.out_dir}, not {base}; set --out_dir to choose the folder."
    )


def build_model_config(parsed: ParsedConfig, data: TokenData, ckpt: dict[str, Any] | None) -> GPTConfig:
    """The checkpoint's config when resuming (explicit keys must agree), else a new one."""
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
        model_cfg = parsed.model_config(**derived)
    if int(data.meta.get("vocab_size", 0)) > model_cfg.vocab_size:
        raise ConfigError(
            f"The dataset's vocab_size {data.meta['vocab_size']} exceeds the model's "
            f"vocab_size {model_cfg.vocab_size}."
        )
    for split in SPLITS:
        if data.num_tokens(split) <= model_cfg.block_size:
            raise ConfigError(
                f"The {split} split of {data.data_dir} has {data.num_tokens(split)} tokens, too "
                f"few for block_size={model_cfg.block_size}."
            )
    return model_cfg


def warn_changed_train_keys(train: TrainConfig, saved: dict[str, Any]) -> None:
    changed = [
        f"{k}: {saved[k]!r} -> {v!r}"
        for k, v in asdict(train).items()
        if k in saved and saved[k] != v and k not in ("init_from", "eval_only", "overwrite")
    ]
    if changed:
        print0("NOTE: resuming with training keys changed from the checkpoint's: " + "; ".join(changed))


# -----------------------------------------------------------------------------
# The trainer


class Trainer:
    def __init__(self, parsed: ParsedConfig, dist: DistInfo, device: str):
        train = parsed.train
        self.dist = dist
        self.device = device
        self.device_type = "cuda" if device.startswith("cuda") else device.split(":")[0]
        self.dtype = resolve_dtype(train.dtype, self.device_type)
        self.autocast = autocast_context(self.device_type, self.dtype)
        self.data = load_data(train.data_dir)
        ckpt = load_resume_checkpoint(train) if train.init_from == "resume" else None
        self.model_cfg = build_model_config(parsed, self.data, ckpt)
        self.cfg = resolve_wandb_names(train, self.model_cfg)
        self.accum = grad_accum_steps(self.cfg.global_batch_size, self.cfg.batch_size, dist.world_size)
        self.tokens_per_step = self.cfg.global_batch_size * self.model_cfg.block_size

        # Identical initial weights on every rank; then each rank its own dropout stream.
        torch.manual_seed(self.cfg.seed)
        self.raw_model = GPT(self.model_cfg)
        if hf_folder_of(train) is not None:
            load_folder_weights(self.raw_model, hf_folder_of(train))
        seed_everything(self.cfg.seed + dist.rank)
        self.iter_num = 0
        self.best_val_loss = math.inf
        self.collapse_streak = 0  # evaluations in a row with final_cosine above collapse_cosine
        self.recent_losses: deque[float] = deque(maxlen=AVG_WINDOW)
        self.prior_elapsed = 0.0
        self.wandb_run_id: str | None = None
        self.raw_model.to(device)
        self.optimizer = self.raw_model.configure_optimizers(
            self.cfg.weight_decay, self.cfg.learning_rate, (self.cfg.beta1, self.cfg.beta2), self.device_type
        )
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=self.dtype == "float16")
        if ckpt is not None:
            self._restore(ckpt)
            del ckpt

        self.fwd_model = torch.compile(self.raw_model) if self.cfg.compile else self.raw_model
        self.model = (
            DDP(self.fwd_model, device_ids=[dist.local_rank] if self.device_type == "cuda" else None)
            if dist.enabled
            else self.fwd_model
        )
        self.peak_flops = self.cfg.peak_flops or peak_flops_for(device)
        self.saved_iter = self.iter_num if train.init_from == "resume" else -1
        self.metrics: MetricsLog | None = None
        self.wandb = None

    def _restore(self, ckpt: dict[str, Any]) -> None:
        self.raw_model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        self.iter_num = ckpt["iter_num"]
        self.best_val_loss = ckpt["best_val_loss"]
        self.collapse_streak = ckpt.get("collapse_streak", 0)
        self.recent_losses.extend(ckpt["recent_losses"])
        self.prior_elapsed = ckpt["elapsed_s"]
        self.wandb_run_id = ckpt.get("wandb_run_id")
        if len(ckpt["rng"]) == self.dist.world_size:
            set_rng_state(ckpt["rng"][self.dist.rank])
        else:
            print0(
                f"NOTE: the checkpoint was written by {len(ckpt['rng'])} process(es), this run has "
                f"{self.dist.world_size}; dropout random streams restart from the seed."
            )
        warn_changed_train_keys(self.cfg, ckpt["train_config"])
        if ckpt.get("data_meta") and ckpt["data_meta"].get("tokenizer") != self.data.meta.get("tokenizer"):
            print0("WARNING: the dataset's tokenizer differs from the one the checkpoint was trained on.")

    # -- helpers ---------------------------------------------------------------

    @property
    def is_master(self) -> bool:
        return self.dist.is_master

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.dist.enabled:
            torch_dist.all_reduce(t, op=torch_dist.ReduceOp.SUM)
        return t

    def run_config(self) -> dict[str, Any]:
        """What W&B and config.json record: both configs, the paper's method name, the layout."""
        return {
            **asdict(self.cfg),
            **asdict(self.model_cfg),
            "method": method_key(self.model_cfg),
            "world_size": self.dist.world_size,
            "grad_accum_steps": self.accum,
            "tokens_per_step": self.tokens_per_step,
            "num_params": self.raw_model.get_num_params(),
            "resolved_dtype": self.dtype,
        }

    def elapsed(self) -> float:
        return self.prior_elapsed + time.time() - self.start_time

    def eta(self) -> str:
        """Time left at this session's pace so far, evaluations included."""
        done = self.iter_num - self.start_iter
        if done <= 0:
            return "?"
        per_iter = (time.time() - self.start_time) / done
        return format_duration(per_iter * (self.cfg.max_iters - self.iter_num))

    # -- one optimizer step ------------------------------------------------------

    def train_step(self, step: int, stop: StopSignal) -> tuple[float, float, bool]:
        """Run optimizer step `step`; returns (mean loss, grad norm, stop requested on any rank)."""
        cfg = self.cfg
        lr = learning_rate_at(step, cfg)
        for group in self.optimizer.param_groups:
            # μP's per-kind factor (model.configure_optimizers); absent in older checkpoints.
            group["lr"] = lr * group.get("lr_scale", 1.0)
        block = self.model_cfg.block_size
        offsets = batch_offsets(cfg.seed, TRAIN_STREAM, step, cfg.global_batch_size, self.data.num_tokens("train"), block)
        mine = offsets.reshape(self.dist.world_size, self.accum, cfg.batch_size)[self.dist.rank]
        tokens = self.data.split("train")
        x, y = get_batch(tokens, mine[0], block, self.device)
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(self.accum):
            last = micro == self.accum - 1
            # DDP all-reduces gradients only on the last micro-step.
            sync = contextlib.nullcontext() if last or not self.dist.enabled else self.model.no_sync()
            with sync:
                with self.autocast:
                    _, loss = self.model(x, y)
                if step + 1 == cfg.debug_nan_at_iter:
                    loss = loss * float("nan")
                if step + 1 == cfg.debug_crash_at_iter:
                    raise RuntimeError(f"debug_crash_at_iter={cfg.debug_crash_at_iter}: a deliberate crash for the tests")
                loss = loss / self.accum
                if not last:
                    x, y = get_batch(tokens, mine[micro + 1], block, self.device)  # while the GPU works
                self.scaler.scale(loss).backward()
            loss_sum += loss.detach().float()
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.raw_model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else math.inf
        )
        # One all-reduce for the three things every rank must agree on.
        flag = torch.tensor(float(stop.requested), device=self.device)
        stats = self.all_reduce_sum(torch.stack([loss_sum, grad_norm.float(), flag]))
        loss_val, norm_val, stop_val = (v / self.dist.world_size for v in stats.tolist())
        # fp16's GradScaler skips steps with inf gradients by design; elsewhere they are fatal.
        if not math.isfinite(loss_val):
            self._fail_non_finite("loss", loss_val, step + 1)
        if self.dtype != "float16" and not math.isfinite(norm_val):
            self._fail_non_finite("gradient norm", norm_val, step + 1)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_val, norm_val, stop_val > 0

    def _kept_checkpoint_text(self) -> str:
        path = checkpoint_path(self.cfg)
        if path.is_file():
            at = f" (iter {self.saved_iter})" if self.saved_iter >= 0 else ""
            return f"the last good checkpoint {path}{at} is untouched"
        return "no checkpoint had been written"

    def _fail_non_finite(self, what: str, value: float, iteration: int) -> None:
        raise NonFiniteLossError(
            f"{what} became {value} at iter {iteration}; stopping without saving: {self._kept_checkpoint_text()}."
        )

    def _fail_collapse(self, cosine: float) -> None:
        cfg = self.cfg
        raise CollapseError(
            f"final_cosine {cosine:.3f} stayed above collapse_cosine={cfg.collapse_cosine} for "
            f"{self.collapse_streak} evaluations in a row (iter {self.iter_num}): every token's final "
            f"state is nearly the same point (representation collapse); stopping without saving: "
            f"{self._kept_checkpoint_text()}. Try a longer warm-up (e.g. --warmup_iters="
            f"{max(4 * cfg.warmup_iters, 100)}) or a lower peak learning rate (e.g. --learning_rate="
            f"{cfg.learning_rate / 3:.1e}); --collapse_evals=0 turns this stop off."
        )

    def collapse_suspect(self, row: dict[str, Any]) -> bool:
        """Whether this evaluation counts towards a collapse stop; updates the streak on every rank.

        Only rank 0 computes the diagnostics, so its final_cosine is shared first: every rank
        must take the same save and stop decisions. The untrained model at iter 0 never counts.
        """
        if not self.cfg.collapse_evals or self.iter_num == 0:
            return False
        mine = row.get("final_cosine", 0.0) if self.is_master else 0.0
        cosine = self.all_reduce_sum(torch.tensor(float(mine), device=self.device)).item()
        suspect = cosine > self.cfg.collapse_cosine
        self.collapse_streak = self.collapse_streak + 1 if suspect else 0
        if self.collapse_streak >= self.cfg.collapse_evals:
            self._fail_collapse(cosine)
        if suspect:
            print0(
                f"WARNING: final_cosine {cosine:.3f} > collapse_cosine={self.cfg.collapse_cosine} "
                f"({self.collapse_streak} of {self.cfg.collapse_evals} evaluations before the collapse stop); "
                "this state is not checkpointed."
            )
        return suspect

    # -- evaluation ----------------------------------------------------------------

    @torch.no_grad()
    def estimate_loss(self) -> dict[str, float]:
        """Mean loss over eval_iters fixed batches per split, shared among the ranks.

        The batches come from their own stream, so they are the same at every evaluation and
        never move the training sampler or the dropout generators.
        """
        self.model.eval()
        block = self.model_cfg.block_size
        out = {}
        progress = EvalProgress(enabled=self.is_master)
        for split_id, split in enumerate(SPLITS):
            tokens = self.data.split(split)
            total = torch.zeros((), device=self.device)
            mine = range(self.dist.rank, self.cfg.eval_iters, self.dist.world_size)
            progress.start(split, len(mine))
            for done, i in enumerate(mine, start=1):
                x, y = get_batch(tokens, self._eval_offsets(split_id, i), block, self.device)
                with self.autocast:
                    _, loss = self.fwd_model(x, y)
                total += loss.float()
                progress.update(done)
            out[split] = self.all_reduce_sum(total).item() / self.cfg.eval_iters
            progress.finish()
        self.model.train()
        return out

    def _eval_offsets(self, split_id: int, index: int) -> np.ndarray:
        n_tokens = self.data.num_tokens(SPLITS[split_id])
        return batch_offsets(self.cfg.seed, EVAL_STREAM + split_id, index, self.cfg.batch_size, n_tokens, self.model_cfg.block_size)

    @torch.no_grad()
    def diagnostics(self) -> dict[str, Any]:
        """Per-layer RMS, rotation angles, final-token cosine and sphere step sizes (one val batch)."""
        x, _ = get_batch(self.data.split("val"), self._eval_offsets(1, 0), self.model_cfg.block_size, self.device)
        self.raw_model.eval()
        with self.autocast:
            diag = self.raw_model.diagnostics(x)
        self.raw_model.train()
        return {**diag, "step_sizes": self.raw_model.step_sizes()}

    def evaluate(self) -> dict[str, Any]:
        started = time.perf_counter()
        losses = self.estimate_loss()
        eval_s = time.perf_counter() - started
        if not math.isfinite(losses["val"]):
            self._fail_non_finite("val loss", losses["val"], self.iter_num)
        row = {
            "kind": "eval",
            "iter": self.iter_num,
            "tokens": self.iter_num * self.tokens_per_step,
            "train_eval_loss": losses["train"],
            "val_loss": losses["val"],
            "val_ppl": math.exp(losses["val"]) if losses["val"] < 700 else None,
            "elapsed_s": round(self.elapsed(), 3),
            "eval_s": round(eval_s, 4),  # the two loss estimates, so diag_s can be weighed against them
        }
        if self.is_master:
            started = time.perf_counter()
            row.update(self.diagnostics())
            row["diag_s"] = round(time.perf_counter() - started, 4)
        return row

    # -- checkpoints -------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        """All ranks call this (their RNG states are gathered); rank 0 writes."""
        rng = [rng_state()]
        if self.dist.enabled:
            rng = [None] * self.dist.world_size
            torch_dist.all_gather_object(rng, rng_state())
        if self.is_master:
            state = {
                **self.raw_model.checkpoint_state(),
                "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
                "train_config": asdict(self.cfg),
                "iter_num": self.iter_num,
                "best_val_loss": self.best_val_loss,
                "collapse_streak": self.collapse_streak,
                "rng": rng,
                # The sampler is stateless: step k's batch is drawn from (seed, k) alone.
                "sampler": {"seed": self.cfg.seed, "next_step": self.iter_num, "global_batch_size": self.cfg.global_batch_size},
                "recent_losses": list(self.recent_losses),
                "elapsed_s": self.elapsed(),
                "world_size": self.dist.world_size,
                "data_meta": self.data.meta,
                "wandb_run_id": self.wandb_run_id,
            }
            atomic_torch_save(state, checkpoint_path(self.cfg))
        self.saved_iter = self.iter_num

    # -- logging ---------------------------------------------------------------------------

    def log(self, row: dict[str, Any]) -> None:
        if not self.is_master:
            return
        if self.metrics is not None:
            self.metrics.write(row)
        if self.wandb is not None:
            self.wandb.log(wandb_payload(row), step=row["iter"])

    def log_eval(self, row: dict[str, Any]) -> None:
        if self.is_master:
            ppl = f"{row['val_ppl']:.2f}" if row["val_ppl"] is not None else "inf"
            print(
                f"eval iter {row['iter']} | train {row['train_eval_loss']:.4f} | val {row['val_loss']:.4f} "
                f"(ppl {ppl}) | final cosine {row['final_cosine']:.3f} | "
                f"rms {row['rms'][0]:.2f} -> {row['rms'][-1]:.2f}"
            )
        self.log(row)

    def log_train(self, loss: float, grad_norm: float, lr: float, step_time: float) -> None:
        tokens_per_s = self.tokens_per_step / step_time
        mfu = None
        if self.peak_flops:
            mfu = self.raw_model.estimate_mfu(self.cfg.batch_size * self.accum, step_time, self.peak_flops)
        row = {
            "kind": "train",
            "iter": self.iter_num,
            "tokens": self.iter_num * self.tokens_per_step,
            "train_loss": loss,
            "train_loss_avg200": sum(self.recent_losses) / len(self.recent_losses),
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens_per_s": tokens_per_s,
            "mfu": mfu,
            "elapsed_s": round(self.elapsed(), 3),
        }
        if self.is_master:
            mfu_text = f"{100 * mfu:.1f}%" if mfu is not None else "n/a"
            print(
                f"iter {self.iter_num}/{self.cfg.max_iters} | loss {loss:.4f} | avg{AVG_WINDOW} "
                f"{row['train_loss_avg200']:.4f} | lr {lr:.1e} | grad {grad_norm:.2f} | "
                f"{tokens_per_s:,.0f} tok/s | mfu {mfu_text} | {step_time:.2f} s/it | ETA {self.eta()}",
                flush=True,
            )
        self.log(row)

    # -- the loop ------------------------------------------------------------------------------

    def open_outputs(self, resumed: bool) -> None:
        if not self.is_master:
            return
        out = Path(self.cfg.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if not resumed and (out / CKPT_NAME).is_file():
            print(f"NOTE: overwrite=true: starting from scratch in {out}; its old checkpoint will be replaced.")
        (out / "config.json").write_text(json.dumps(self.run_config(), indent=2) + "\n")
        self.metrics = MetricsLog(out / METRICS_NAME, self.iter_num if resumed else None)
        if self.cfg.wandb_log:
            self.wandb = start_wandb(self.cfg, self.run_config(), self.wandb_run_id)
            if self.wandb is not None:
                self.wandb_run_id = self.wandb.id

    def print_summary(self) -> None:
        print0(
            f"{method_key(self.model_cfg)} | {self.raw_model.get_num_params() / 1e6:.2f}M params | "
            f"{self.dist.world_size} process(es) x {self.cfg.batch_size} seqs x {self.accum} micro-steps = "
            f"{self.cfg.global_batch_size} seqs ({self.tokens_per_step:,} tokens) per step | "
            f"{self.device} {self.dtype} | compile={self.cfg.compile} | out_dir {self.cfg.out_dir}"
        )

    def eval_and_maybe_save(self) -> None:
        row = self.evaluate()
        self.log_eval(row)
        # A state that may be collapsing is never saved: the checkpoint stays the last good one.
        suspect = self.collapse_suspect(row)
        improved = row["val_loss"] < self.best_val_loss
        self.best_val_loss = min(self.best_val_loss, row["val_loss"])
        if self.iter_num > 0 and not suspect and (self.cfg.always_save_checkpoint or improved):
            self.save_checkpoint()

    def log_stop(self, reason: str, message: str, exit_code: int) -> None:
        """The metrics row that says why a run ended before max_iters (scripts/runs.py reads it)."""
        self.log({
            "kind": "stop",
            "iter": self.iter_num,
            "reason": reason,
            "exit_code": exit_code,
            "message": message,
            "checkpoint_iter": self.saved_iter if self.saved_iter >= 0 else None,
            "elapsed_s": round(self.elapsed(), 3),
        })

    def run(self, stop: StopSignal) -> None:
        """The training loop, with a stop row for every way it can end early."""
        try:
            self._run(stop)
        except RunStopped as e:
            self.log_stop(e.reason, str(e), e.exit_code)
            raise
        except Exception as e:
            self.log_stop("crash", f"{type(e).__name__}: {e}", EXIT_CRASH)
            raise

    def _run(self, stop: StopSignal) -> None:
        cfg = self.cfg
        resumed = cfg.init_from == "resume"
        self.start_time = time.time()
        self.start_iter = self.iter_num
        self.print_summary()
        if cfg.eval_only:
            row = self.evaluate()
            if self.is_master:
                print(json.dumps(row))
            return
        self.open_outputs(resumed)
        if not resumed:
            self.eval_and_maybe_save()
        window_time, window_steps = 0.0, 0
        while self.iter_num < cfg.max_iters:
            t0 = time.time()
            loss, grad_norm, stop_now = self.train_step(self.iter_num, stop)
            window_time += time.time() - t0
            window_steps += 1
            lr = learning_rate_at(self.iter_num, cfg)
            self.iter_num += 1
            self.recent_losses.append(loss)
            if self.iter_num % cfg.log_interval == 0 or self.iter_num == cfg.max_iters:
                self.log_train(loss, grad_norm, lr, window_time / window_steps)
                window_time, window_steps = 0.0, 0
            if self.iter_num % cfg.eval_interval == 0 or self.iter_num == cfg.max_iters:
                self.eval_and_maybe_save()
            elif cfg.checkpoint_interval and self.iter_num % cfg.checkpoint_interval == 0 and not self.collapse_streak:
                self.save_checkpoint()
            if stop_now:
                if self.saved_iter != self.iter_num:
                    self.save_checkpoint()
                if self.dist.enabled:
                    # No rank may exit before rank 0 has written: a launcher that sees one
                    # worker leave (torchrun >= 2.10 after a forwarded signal, srun
                    # --kill-on-bad-exit) may kill the others mid-write.
                    torch_dist.barrier()
                name = signal.Signals(stop.signum).name if stop.signum else "a signal on another rank"
                message = f"Stopped by {name} at iter {self.iter_num}; checkpoint saved to {checkpoint_path(cfg)}."
                self.log_stop("signal", message, EXIT_OK)
                print0(message)
                return
        print0(f"Done: iter {self.iter_num}, best val loss {self.best_val_loss:.4f}.")

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.wandb is not None:
            self.wandb.finish()


def pick_device(train: TrainConfig, dist: DistInfo) -> str:
    device = get_device(train.device)
    if device == "cuda" and dist.enabled:
        device = f"cuda:{dist.local_rank}"  # one GPU per process
    return device


def main(argv: list[str] | None = None) -> None:
    """Train as the command line says; raises ConfigError before any work on a bad config."""
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv):
        print(config_help(), end="")
        return
    parsed = parse_config(argv)
    hf_folder = hf_folder_of(parsed.train)
    if hf_folder is not None:  # the folder's model names the run folder, as a resume's checkpoint does
        parsed.model_keys = hf_init_model_keys(parsed, hf_folder)
    # Paths first: the checkpoint to resume from lives in out_dir. The method and the changed
    # keys in its default name come from the keys given, so resuming needs the same ones.
    explicit_out_dir = bool(parsed.train.out_dir)
    parsed.train = resolve_init_from(resolve_paths(parsed.train, parsed.model_config(), parsed.overrides))
    announce_out_dir(parsed, explicit_out_dir)
    check_wandb(parsed.train)
    device_type = get_device(parsed.train.device).split(":")[0]
    backend = parsed.train.backend or ("nccl" if device_type == "cuda" else "gloo")
    dist = init_distributed(backend)
    try:
        device = pick_device(parsed.train, dist)
        if device.startswith("cuda"):
            enable_tf32()
        with StopSignal() as stop:
            trainer = Trainer(parsed, dist, device)
            try:
                trainer.run(stop)
            finally:
                trainer.close()
    finally:
        if dist.enabled:
            torch_dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except (ConfigError, DeviceError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    except RunStopped as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except Exception:
        traceback.print_exc()
        sys.exit(EXIT_CRASH)
