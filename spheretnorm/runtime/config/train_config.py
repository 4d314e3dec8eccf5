"""The keys of a run: the TrainConfig dataclass (with model.GPTConfig, the one source of truth for
every key), the tables derived from both (MODEL_KEYS, TRAIN_KEYS, the keys with a role in a run's
identity), the keys that registered entries declare, and what the command line's parse returns
(ParsedConfig).

The defaults of both dataclasses are the paper's shared hyperparameters (arXiv 2608.02668,
Tables 6 and 7) at the S scale, so a config file only sets what differs.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, get_type_hints

from spheretnorm.model import (
    ALPHA_DECAYS, ALPHA_INDICES, BLOCKS, CONNECTIONS, MODEL_FIELDS, NEUTRAL, RESTART_FREE, RESUME_FIXED, GPTConfig, MethodParam,
    declared_keys_as_keywords, declared_params,
)
from spheretnorm.optim import OPTIMIZERS, optimizer_params, resolve_optimizer_params
from spheretnorm.runtime.loss_terms import loss_term_params, resolve_loss_params

INIT_FROM = ("scratch", "resume", "auto")
HF_PREFIX = "hf:"  # --init_from=hf:DIR, a Hugging Face model folder (spheretnorm.hf.folder)
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
WANDB_MODES = ("online", "offline", "disabled")
PARALLEL_MODES = ("ddp", "fsdp")  # spheretnorm/runtime/parallel.py
COMPILE_SCOPES = ("auto", "blocks", "model")  # runtime/parallel.py's compile_model; auto: TrainConfig.resolved_compile_scope
FSDP_STARTS = ("auto", "full", "meta")
_DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
SEED_MAX = 2**32 - 1  # np.random.seed's largest seed


class ConfigError(ValueError):
    """A bad key or value in a config file or on the command line."""


def _choices(*values: str, forms: tuple[str, ...] = (), run: dict[str, str] | None = None) -> dict[str, Any]:
    """Field metadata: the valid values, and forms such as 'hf:DIR' (a prefix, then any text);
    run: the key's role in a run's identity (model.NEUTRAL, ...), where it has one."""
    return {"choices": values, "forms": forms, **(run or {})}


def _choice_text(metadata: dict[str, tuple[str, ...]]) -> str:
    return ", ".join(c if c else '""' for c in (*metadata["choices"], *metadata.get("forms", ())))


def _is_choice(value: Any, metadata: dict[str, tuple[str, ...]]) -> bool:
    prefixes = tuple(form.split(":")[0] + ":" for form in metadata.get("forms", ()))
    return value in metadata["choices"] or (isinstance(value, str) and bool(prefixes) and value.startswith(prefixes))


# A key left unset (None) takes another key's value: lr_decay_iters ends the cosine where the run ends, whatever
# --max_iters says. It defaulted to 50,000 before (2,000 in config/shakespeare_char.py), so a shortened run never
# decayed; an earlier run's config.json and checkpoints record the value it trained with, which a resume keeps.
FOLLOWS = {"lr_decay_iters": "max_iters"}


@dataclass
class TrainConfig:
    # -- your own code
    # modules imported before any other key is read (a connection of your own: docs/ARCHITECTURE.md);
    # found on sys.path, then in the current folder; recorded in config.json and the checkpoints
    imports: list[str] = field(default_factory=list, metadata=NEUTRAL)
    # import the modules that a run folder's config.json or a checkpoint records under imports
    # (a resume of your own run): this runs their code, so only for files you trust (README)
    trust_recorded_imports: bool = field(default=False, metadata=NEUTRAL)
    # -- output and checkpoints
    out_dir: str = field(default="", metadata=NEUTRAL)  # "" means out/<config_name>/<method>, plus a suffix when keys differ from the config files
    config_name: str = field(default="", metadata=NEUTRAL)  # "" means the stem of the last config file, else the dataset name
    # auto: resume if out_dir has ckpt.pt; hf:DIR: fine-tune a Hugging Face folder (scripts/export_hf.py, GPT-2)
    init_from: str = field(default="scratch", metadata=_choices(*INIT_FROM, forms=(f"{HF_PREFIX}DIR",), run=NEUTRAL))
    overwrite: bool = field(default=False, metadata=NEUTRAL)  # let a new run (init_from=scratch or hf:DIR) replace an existing out_dir/ckpt.pt
    # with init_from=resume: drop the checkpoint's optimizer state and start a new one (the way to
    # resume under another optimizer; weights, progress and schedule carry on)
    fresh_optimizer: bool = field(default=False, metadata=NEUTRAL)
    always_save_checkpoint: bool = field(default=True, metadata=NEUTRAL)  # at every evaluation; False keeps only the best val loss
    checkpoint_interval: int = field(default=0, metadata=NEUTRAL)  # also save every N iterations (0: only at evaluations)
    # -- evaluation and logging
    eval_interval: int = field(default=1000, metadata=NEUTRAL)  # evaluate (and checkpoint) every N iterations and at max_iters
    eval_iters: int = 200  # micro-batches per split per evaluation, shared among all ranks
    eval_only: bool = field(default=False, metadata=NEUTRAL)  # evaluate once and exit, writing nothing
    # at max_iters (and with eval_only) also the loss over the whole val split in non-overlapping
    # windows, the same for every seed and method: val_loss_full, what the studies' tables read
    full_val_eval: bool = field(default=True, metadata=NEUTRAL)
    log_interval: int = field(default=10, metadata=NEUTRAL)  # print and log the train loss every N iterations
    # -- collapse alarm: stop when every token's final state has become one point
    collapse_cosine: float = field(default=0.95, metadata=NEUTRAL)  # final_cosine above this at an evaluation counts towards a stop
    collapse_evals: int = field(default=3, metadata=NEUTRAL)  # stop after this many such evaluations in a row (iter 0 not counted); 0: never
    # -- data
    dataset: str = "openwebtext"  # the prepared dataset, data/<dataset> (see data/prepare.py)
    data_dir: str = field(default="", metadata=NEUTRAL)  # "" means data/<dataset> in the repository
    # sequences per micro-batch on each GPU (paper: 16); it splits the global batch, as the GPU count
    # does, so it changes no run (up to float rounding): a neutral key
    batch_size: int = field(default=16, metadata=NEUTRAL)
    global_batch_size: int = 128  # sequences per optimizer step, over all GPUs (paper: 128)
    # -- optimizer: AdamW by default (spheretnorm/optim.py), linear warm-up then cosine decay to min_lr
    optimizer: str = field(default="adamw", metadata=RESUME_FIXED)  # a key of spheretnorm.optim.OPTIMIZERS
    # The values of the keys the optimizer declares (muon_lr, ...), read as attributes (train.muon_lr).
    optimizer_params: dict[str, Any] = field(default_factory=dict)
    # The values of the keys registered loss terms declare (z_loss, ...: runtime/loss_terms.py), read likewise.
    loss_params: dict[str, Any] = field(default_factory=dict)
    learning_rate: float = 6e-4  # peak learning rate, reached after warmup_iters
    min_lr: float = 6e-5  # learning rate at and after lr_decay_iters
    weight_decay: float = 0.1  # AdamW weight decay of the matrices (not of gains and biases)
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.95  # AdamW beta2
    grad_clip: float = 1.0  # 0 disables clipping (the norm is still logged)
    max_iters: int = field(default=50_000, metadata=RESTART_FREE)  # optimizer steps of the run
    decay_lr: bool = True  # False keeps learning_rate constant (no warm-up, no decay)
    warmup_iters: int = 2_000  # linear warm-up steps from 0 to learning_rate
    # the cosine reaches min_lr here; None (not given): max_iters, so a shortened run decays too (a resume keeps its checkpoint's)
    lr_decay_iters: int | None = None
    # -- system
    device: str = field(default="auto", metadata=NEUTRAL)  # auto | cpu | cuda | cuda:N | mps
    dtype: str = field(default="auto", metadata=_choices(*DTYPE_CHOICES))  # auto: bf16 on CUDA, else fp32
    compile: bool = field(default=False, metadata=NEUTRAL)  # torch.compile the model (the paper trains without it); under fsdp each block
    # what one torch.compile covers: blocks compiles one block (every layer reuses its graph: the compile
    # costs about one block's at any depth) and the modules around the blocks; model traces the whole
    # model as one graph (its compile grows with depth; a CPU step measured 7-10% faster, docs/LOG.md
    # 2026-12-07); auto: what each layout did before the key existed, model under ddp, blocks under fsdp
    compile_scope: str = field(default="auto", metadata=_choices(*COMPILE_SCOPES, run=NEUTRAL))
    # ddp: a whole model per process; fsdp: FSDP2 shards of it (weights, gradients, AdamW), sharded checkpoints
    parallel: str = field(default="ddp", metadata=_choices(*PARALLEL_MODES, run=NEUTRAL))
    # fsdp only: full builds the whole model and shards it (DDP's initial weights); meta builds it on the
    # meta device and initialises each shard; auto: meta when the whole model would not fit (parallel.py)
    fsdp_init: str = field(default="auto", metadata=_choices(*FSDP_STARTS, run=NEUTRAL))
    activation_checkpointing: bool = field(default=False, metadata=NEUTRAL)  # recompute each block in backward: memory for time
    backend: str = field(default="", metadata=NEUTRAL)  # process-group backend; "" means nccl on CUDA, gloo otherwise
    seed: int = 1337  # seeds the weights, the data order and dropout
    dist_timeout: float = field(default=600.0, metadata=NEUTRAL)  # seconds a collective waits for the other processes (one stopped or dead) before the run stops
    peak_flops: float | None = field(default=None, metadata=NEUTRAL)  # per-device peak FLOP/s for MFU; None: look the GPU up
    # -- Weights & Biases
    # An empty key takes W&B's own environment variable (WANDB_PROJECT, WANDB_ENTITY, WANDB_RUN_GROUP,
    # WANDB_MODE), then the default named; WANDB_DIR, when set, holds W&B's files instead of out_dir.
    wandb_log: bool = field(default=False, metadata=NEUTRAL)  # log to W&B (online needs an API key: wandb login or WANDB_API_KEY)
    wandb_project: str = field(default="", metadata=NEUTRAL)  # "" means $WANDB_PROJECT, else spheretnorm
    wandb_entity: str = field(default="", metadata=NEUTRAL)  # "" means $WANDB_ENTITY, else your W&B account's default
    wandb_run_name: str = field(default="", metadata=NEUTRAL)  # "" means <config_name>/<the run folder's name>, e.g. openwebtext_s/p_spheret-0.5
    wandb_group: str = field(default="", metadata=NEUTRAL)  # "" means $WANDB_RUN_GROUP, else <config_name> (a scale and dataset)
    wandb_mode: str = field(default="", metadata=_choices("", *WANDB_MODES, run=NEUTRAL))  # "" means $WANDB_MODE, else online; offline needs no key
    # -- testing only
    debug_nan_at_iter: int = field(default=-1, metadata=RESTART_FREE)  # make the loss NaN in the step that completes this iteration
    debug_crash_at_iter: int = field(default=-1, metadata=RESTART_FREE)  # raise an exception in the step that completes this iteration

    def resolved_compile_scope(self) -> str:
        """compile_scope with auto resolved: blocks under fsdp (it compiles each block it wraps),
        model otherwise (the whole-model graph every DDP run compiled before compile_scope existed)."""
        if self.compile_scope != "auto":
            return self.compile_scope
        return "blocks" if self.parallel == "fsdp" else "model"

    def __post_init__(self) -> None:
        for key, source in FOLLOWS.items():  # the parse knows which were not given (ParsedConfig.derived); the config holds the value
            if getattr(self, key) is None:
                setattr(self, key, getattr(self, source))
        for f in fields(self):
            if "choices" in f.metadata and not _is_choice(getattr(self, f.name), f.metadata):
                raise ConfigError(f"{f.name}={getattr(self, f.name)!r} is not valid; choose one of: {_choice_text(f.metadata)}.")
        try:
            self.optimizer_params = resolve_optimizer_params(self.optimizer, self.optimizer_params)
            self.loss_params = resolve_loss_params(self.loss_params)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if not _DEVICE_PATTERN.match(self.device):
            raise ConfigError(f"device={self.device!r} is not valid; use auto, cpu, cuda, cuda:N or mps.")
        for name in ("batch_size", "global_batch_size", "eval_interval", "eval_iters", "log_interval"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}.")
        for name in ("max_iters", "warmup_iters", "lr_decay_iters", "checkpoint_interval"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}.")
        for name in ("learning_rate", "min_lr", "weight_decay", "grad_clip"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got {getattr(self, name)}.")
        if self.compile_scope == "model" and self.parallel == "fsdp":  # FSDP2 wraps and so compiles block by block
            raise ConfigError("compile_scope=model traces the whole model as one graph, which parallel=fsdp cannot run (it shards "
                              "and compiles block by block); use compile_scope=blocks, or parallel=ddp.")
        if self.fsdp_init != "auto" and self.parallel != "fsdp":  # it would be ignored without a word
            raise ConfigError(f"fsdp_init={self.fsdp_init} applies to --parallel=fsdp only, and this run has parallel={self.parallel}; drop it or add --parallel=fsdp.")
        if not (math.isfinite(self.dist_timeout) and self.dist_timeout > 0):
            raise ConfigError(f"dist_timeout must be a positive number of seconds, got {self.dist_timeout}.")
        if not 0 < self.collapse_cosine <= 1:
            raise ConfigError(f"collapse_cosine must lie in (0, 1], got {self.collapse_cosine}.")
        if self.collapse_evals < 0:
            raise ConfigError(f"collapse_evals must be >= 0 (0 turns the collapse stop off), got {self.collapse_evals}.")
        if self.fresh_optimizer and self.init_from not in ("resume", "auto"):
            raise ConfigError(
                f"fresh_optimizer=true drops a resumed checkpoint's optimizer state, but init_from={self.init_from!r} "
                "resumes nothing; use it with init_from=resume or auto, or leave it out."
            )
        if self.min_lr > self.learning_rate:
            raise ConfigError(f"min_lr={self.min_lr} exceeds learning_rate={self.learning_rate}.")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:  # NaN fails too
                raise ConfigError(f"{name}={getattr(self, name)} is not valid; AdamW needs 0 <= {name} < 1.")
        # seed_everything gives the seed (plus the rank) to numpy's np.random.seed, which takes 0..2**32 - 1.
        if not 0 <= self.seed <= SEED_MAX:
            raise ConfigError(f"seed={self.seed} is not valid; use an integer from 0 to {SEED_MAX} (2**32 - 1, numpy's seed range).")

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not fields: the optimizer's and the loss terms' declared keys.
        params = {**(self.__dict__.get("optimizer_params") or {}), **(self.__dict__.get("loss_params") or {})}
        if name in params:
            return params[name]
        raise AttributeError(f"TrainConfig has no key {name!r} (its optimizer's and loss terms' keys: {', '.join(params) or 'none'})")


# TrainConfig(optimizer="muon", muon_lr=0.01): an optimizer's key joins optimizer_params.
TrainConfig.__init__ = declared_keys_as_keywords("optimizer_params", optimizer_params)(TrainConfig.__init__)
# TrainConfig(z_loss=1e-4): a loss term's key joins loss_params.
TrainConfig.__init__ = declared_keys_as_keywords("loss_params", loss_term_params)(TrainConfig.__init__)


# connection_params, optimizer_params and loss_params are set through the keys they hold (--muon_lr=0.01), never as a whole.
KEY_HOLDERS = ("connection_params", "optimizer_params", "loss_params")
MODEL_KEYS = tuple(k for k in MODEL_FIELDS if k not in KEY_HOLDERS)
TRAIN_KEYS = tuple(f.name for f in fields(TrainConfig) if f.name not in KEY_HOLDERS)
assert not set(MODEL_KEYS) & set(TRAIN_KEYS), "a key may belong to one dataclass only"
_FIELD_TYPES = {**get_type_hints(GPTConfig), **get_type_hints(TrainConfig)}
_FIELD_DEFAULTS = {f.name: f.default if f.default is not MISSING else f.default_factory() for cls in (GPTConfig, TrainConfig) for f in fields(cls)}


def param_keys() -> tuple[str, ...]:
    """The parameters that connection classes declare (Connection.params), kept in
    GPTConfig.connection_params (read at call time, so a connection registered after import counts)."""
    return tuple(declared_params())


def config_keys() -> frozenset[str]:
    """Every key train.py takes: the model's and training fields, the connections' and the
    optimizers' declared keys (read at call time, so an entry registered after import counts)."""
    return frozenset({*MODEL_KEYS, *TRAIN_KEYS, *param_keys(), *optimizer_params(), *loss_term_params()})


def declared_keys() -> dict[str, MethodParam]:
    """The keys that registered entries declare rather than the dataclasses: the connections'
    parameters, the optimizers' and the loss terms' keys (read at call time, so one registered after import counts)."""
    return {**declared_params(), **optimizer_params(), **loss_term_params()}


def _key_type(key: str) -> Any:
    """A key's type hint: its field's, or a declared parameter's (float | None for keel_alpha, default None)."""
    if key in _FIELD_TYPES:
        return _FIELD_TYPES[key]
    param = declared_keys()[key]
    kind = param.kind or type(param.default)
    return kind | None if param.default is None else kind


def key_default(key: str) -> Any:
    """A key's default: its field's, or its declaring connection's, optimizer's or loss term's."""
    return _FIELD_DEFAULTS[key] if key in _FIELD_DEFAULTS else declared_keys()[key].default


def _is_key(key: str) -> bool:
    return key in MODEL_KEYS or key in TRAIN_KEYS or key in declared_keys()


def is_train_key(key: str) -> bool:
    """A key of TrainConfig: one of its fields, or a key an optimizer or a loss term declares."""
    return key in TRAIN_KEYS or key in optimizer_params() or key in loss_term_params()


def split_model_keys(values: dict[str, Any]) -> dict[str, Any]:
    """The model keys among parsed keys, as GPTConfig keyword arguments: its fields and the
    declared parameters, which GPTConfig puts into connection_params itself."""
    return {k: v for k, v in values.items() if k in MODEL_KEYS or k in param_keys()}


# Choices of the model's string keys, for the same error message as the training keys.
_MODEL_CHOICES = {
    "connection": CONNECTIONS,  # the registry itself, so a connection registered later counts
    "alpha_decay": ALPHA_DECAYS,
    "alpha_index": ALPHA_INDICES,
    "block": BLOCKS,
    "optimizer": OPTIMIZERS,  # likewise: an optimizer registered later counts
}


@dataclass
class ParsedConfig:
    """What the command line asked for, before any data or checkpoint is read. model_keys holds only
    the model keys that a config file or the command line set: the rest come from the dataset
    (vocab_size) or, when resuming, from the checkpoint."""

    train: TrainConfig
    model_keys: dict[str, Any]
    config_files: list[str]
    # Command-line keys whose value differs from what the config files (or the defaults) give.
    overrides: dict[str, Any] = field(default_factory=dict)
    # The keys of FOLLOWS that neither a file nor the command line gave: train holds the key they follow's
    # value, a resume the checkpoint's (identity.keep_recorded_keys).
    derived: tuple[str, ...] = ()

    def model_config(self, **derived: Any) -> GPTConfig:
        """GPTConfig of a new model: explicit keys win over derived ones (e.g. vocab_size)."""
        return GPTConfig(**{**derived, **self.model_keys})


# -----------------------------------------------------------------------------
# A run's identity, from what each key declares where it is defined (field metadata "run":
# model.NEUTRAL, RESTART_FREE, RESUME_FIXED; a key without one computes). Every list of keys
# below is derived from those declarations; none is kept by hand.


def keys_with_role(role: dict[str, str]) -> frozenset[str]:
    """The fields of GPTConfig and TrainConfig that declare `role` (model.NEUTRAL, ...)."""
    return frozenset(f.name for cls in (GPTConfig, TrainConfig) for f in fields(cls) if f.metadata.get("run") == role["run"])


# Keys that change nothing a run computes or records: where it runs and writes, how it logs.
# Any other key set on the command line to a value other than the config file's makes the run
# a different experiment (a folder suffix, identity.run_suffix).
RUN_NEUTRAL_KEYS = keys_with_role(NEUTRAL)
# Keys that may differ when the same run is started again or extended: its length, the
# vocabulary train.py derives from the dataset, the fault-injection switches.
RESTART_FREE_KEYS = keys_with_role(RESTART_FREE)
# Keys a resume may not change: the optimizer's state would not fit.
RESUME_FIXED_KEYS = keys_with_role(RESUME_FIXED)

WANDB_DEFAULT_PROJECT = "spheretnorm"
WANDB_DEFAULT_MODE = "online"
# wandb's older names, which wandb itself still takes from WANDB_MODE.
WANDB_MODE_ALIASES = {"dryrun": "offline", "run": "online"}


def wandb_mode(train: TrainConfig) -> str:
    """The W&B mode a run uses: its key, else $WANDB_MODE (wandb's older names too), else online; a
    $WANDB_MODE that is no mode is refused only when W&B logs (else it is not this run's setting)."""
    mode = train.wandb_mode or os.environ.get("WANDB_MODE", "") or WANDB_DEFAULT_MODE
    mode = WANDB_MODE_ALIASES.get(mode, mode)
    if mode in WANDB_MODES:
        return mode
    if not train.wandb_log:
        return WANDB_DEFAULT_MODE
    names = ", ".join([*WANDB_MODES, *(f"{old} (= {new})" for old, new in WANDB_MODE_ALIASES.items())])
    raise ConfigError(f"WANDB_MODE={mode!r} is not valid; choose one of: {names}.")


# The training keys an optimizer is built from (optim.OptimizerSettings).
OPTIMIZER_FIELDS = ("optimizer", "optimizer_params", "learning_rate", "min_lr", "weight_decay", "beta1", "beta2")


def optimizer_settings(saved_train: dict[str, Any]) -> TrainConfig:
    """The optimizer's keys of a checkpoint's train_config, as build_optimizer takes them (a
    train_config saved before the optimizer key existed is AdamW's)."""
    return TrainConfig(**{k: saved_train[k] for k in OPTIMIZER_FIELDS if k in saved_train})
