"""Training configuration: the TrainConfig dataclass and the command-line / config-file parser.

There is one source of truth for every key: the fields of ``TrainConfig`` (below) and of
``model.GPTConfig``. A run is configured as

    python train.py [config/NAME.py ...] [--key=value ...]

Config files are Python files, mostly ``key = value`` assignments, that run as code (as
nanoGPT's do: only trusted files belong there). They are run into a private namespace (never
into this module's globals), and every public name they define must be a field of one of the
two dataclasses. ``--key=value`` strings are converted by the field's
type. Any unknown key or badly typed value raises ``ConfigError`` before a run does any work.

The defaults of both dataclasses are the paper's shared hyperparameters (arXiv 2608.02668,
Tables 6 and 7) at the S scale, so a config file only sets what differs: AdamW (0.9, 0.95),
weight decay 0.1, gradient clip 1.0, 50,000 iterations, 2,000 warm-up iterations, cosine decay
to min_lr at 50,000, 16 sequences per GPU, 128 sequences per optimizer step, seed 1337, bf16 on
CUDA, no torch.compile; GPTConfig adds block 1024, vocab 50304, bias on, dropout 0.
"""

from __future__ import annotations

import difflib
import inspect
import io
import math
import os
import re
import runpy
import textwrap
import tokenize
import types
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from spheretnorm.runtime.imports import KEY as IMPORTS_KEY, TRUST_KEY, comma_list, own_module_hint, consent_to_recorded_imports, import_modules, import_recorded
from spheretnorm.runtime.token_files import read_json_object
from spheretnorm.model import (
    ALPHA_DECAYS, ALPHA_INDICES, BLOCKS, CONNECTIONS, EXECUTION_KEYS, MODEL_FIELDS, NEUTRAL, RESTART_FREE,
    RESUME_FIXED, GPTConfig, MethodParam, declared_keys_as_keywords, declared_params,
)
from spheretnorm.optim import OPTIMIZERS, optimizer_params, resolve_optimizer_params
from spheretnorm.runtime.loss_terms import LOSS_TERMS, loss_term_params, resolve_loss_params

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
                raise ConfigError(
                    f"{f.name}={getattr(self, f.name)!r} is not valid; choose one of: "
                    f"{_choice_text(f.metadata)}."
                )
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


def param_type(param: MethodParam) -> Any:
    """A declared parameter's type as a field's hint: float | None for keel_alpha (default None)."""
    kind = param.kind or type(param.default)
    return kind | None if param.default is None else kind


def declared_keys() -> dict[str, MethodParam]:
    """The keys that registered entries declare rather than the dataclasses: the connections'
    parameters, the optimizers' and the loss terms' keys (read at call time, so one registered after import counts)."""
    return {**declared_params(), **optimizer_params(), **loss_term_params()}


def _key_type(key: str) -> Any:
    if key in _FIELD_TYPES:
        return _FIELD_TYPES[key]
    return param_type(declared_keys()[key])


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
    """What the command line asked for, before any data or checkpoint is read.

    model_keys holds only the model keys that a config file or the command line set: the rest
    come from the dataset (vocab_size) or, when resuming, from the checkpoint.
    """

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
# Values


def _unknown_key_error(key: str, where: str) -> ConfigError:
    valid = MODEL_KEYS + TRAIN_KEYS + tuple(declared_keys())
    close = difflib.get_close_matches(key, valid, n=3)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    return ConfigError(
        f"Unknown config key {key!r} ({where}).{hint} Valid keys: {', '.join(sorted(valid))}."
    )


def _optional_inner(tp: Any) -> tuple[Any, bool]:
    """(T, True) for Optional[T] / T | None, else (tp, False)."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return args[0], True
    return tp, False


def parse_value(key: str, raw: str) -> Any:
    """Convert a command-line string to the type of the field `key`."""
    tp, optional = _optional_inner(_key_type(key))
    text = raw.strip()
    if optional and text.lower() in ("none", "null"):
        return None
    try:
        if tp is bool:
            lowered = text.lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if tp is int:
            try:
                return int(text)
            except ValueError:
                as_float = float(text)  # allows 5e4 for an integer key, when it is whole
                if not as_float.is_integer():
                    raise
                return int(as_float)
        if tp is float:
            return float(text)
        if tp is str:
            return raw
        if get_origin(tp) is list:  # imports: comma-separated
            return comma_list(text)
    except ValueError:
        pass
    else:
        raise TypeError(f"no parser for the type {tp!r} of {key}")
    raise ConfigError(f"--{key}={raw!r}: expected {type_text(_key_type(key))}.")


def check_value(key: str, value: Any, where: str) -> Any:
    """Check a Python value from a config file against the field type (int -> float allowed)."""
    if value_fits(value, _key_type(key)):  # the model's own check of values read from files
        tp, _ = _optional_inner(_key_type(key))
        return float(value) if tp is float and value is not None else value
    raise ConfigError(
        f"{key} = {value!r} ({where}): expected {type_text(_key_type(key))}, "
        f"got {type(value).__name__}."
    )


def _check_choice(key: str, value: Any) -> None:
    allowed = _MODEL_CHOICES.get(key)
    if allowed and value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        own = f"; {own_module_hint(key)}" if key in ("connection", "optimizer") else ""
        raise ConfigError(f"{key}={value!r} is not valid.{hint} Choose one of: {', '.join(allowed)}{own}.")


# -----------------------------------------------------------------------------
# Files and command line


# What a run folder's config.json records besides the config keys (train.py's run_config): read
# back as a config file, these are skipped, not refused as unknown keys.
DEBUG_PREFIX = "debug_"  # the fault-injection switches (debug_nan_at_iter, debug_crash_at_iter)
RUN_RECORD_KEYS = ("method", "world_size", "grad_accum_steps", "tokens_per_step", "num_params", "resolved_dtype", "sphere_kernels", "kernel_path",
                   "cpu_threads", "data_source", "settings_history")
CONFIG_SUFFIXES = (".py", ".json")


def read_run_config(path: str) -> dict[str, Any]:
    """The config keys of a run folder's config.json (train.py writes it): both configs, with the
    connection's parameters as keys of their own; what it records besides (RUN_RECORD_KEYS) is left
    out, so that `train.py out/RUN/config.json --eval_only=true` evaluates the run as it was trained.
    Its out_dir is the folder holding it, not the one it records: a run folder moved (or read from
    another working folder) is still the run evaluated, never another that took its old place."""
    values = read_json_object(path, ConfigError, "give the config.json that train.py wrote into a run folder.")
    nested = {}
    for holder in KEY_HOLDERS:
        params = values.pop(holder, None) or {}
        if not isinstance(params, dict):
            raise ConfigError(f"{path!r} has {holder}={params!r:.60}, where an object of keys belongs.")
        nested.update(params)
    if "out_dir" in values:  # the run is the folder this config.json is in, wherever that folder has moved
        values["out_dir"] = str(Path(path).parent)
    # Consent to its recorded imports is the user's to give on the command line, never the file's;
    # a fault injected once (debug_nan_at_iter, ...) is not injected again by reading the run back.
    return {**{k: v for k, v in values.items() if k not in (*RUN_RECORD_KEYS, TRUST_KEY) and not k.startswith(DEBUG_PREFIX)}, **nested}


def read_config_file(path: str) -> dict[str, Any]:
    """The public assignments of a config file (names starting with _ and imports are skipped), or
    the keys of a run folder's config.json (read_run_config)."""
    if not Path(path).is_file():
        raise ConfigError(f"Config file {path!r} does not exist.")
    if path.endswith(".json"):
        return read_run_config(path)
    try:
        namespace = runpy.run_path(path)
    except SyntaxError as e:
        raise ConfigError(f"Config file {path!r} is not valid Python (line {e.lineno}: {e.msg}).") from None
    except Exception as e:  # a config file is Python that runs: any error in it is the file's
        raise ConfigError(f"Config file {path!r} failed when run ({type(e).__name__}: {e}).") from None
    return {
        k: v
        for k, v in namespace.items()
        if not k.startswith("_")
        and not isinstance(v, (types.ModuleType, types.FunctionType, type))
    }


def split_argv(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Config file paths and (key, raw value) pairs, in command-line order."""
    files, pairs = [], []
    for arg in argv:
        if arg.startswith("--"):
            key, eq, raw = arg[2:].partition("=")
            if not eq:
                raise ConfigError(f"{arg!r}: write options as --key=value.")
            pairs.append((key, raw))
        elif arg.endswith(CONFIG_SUFFIXES):
            files.append(arg)
        else:
            raise ConfigError(f"{arg!r}: expected a config file (NAME.py, or a run folder's config.json) or --key=value.")
    return files, pairs


def grad_accum_steps(global_batch_size: int, batch_size: int, world_size: int) -> int:
    """Micro-steps per optimizer step so that the global batch does not depend on the GPU count."""
    per_micro_step = batch_size * world_size
    if global_batch_size % per_micro_step:
        raise ConfigError(
            f"global_batch_size={global_batch_size} is not divisible by batch_size * world_size = "
            f"{batch_size} * {world_size} = {per_micro_step}; choose a batch_size or GPU count "
            "whose product divides it."
        )
    return global_batch_size // per_micro_step


def _keys_of_the_named_optimizer(values: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """A config file's optimizer keys follow its optimizer: where the command line names another
    optimizer (a resume of a Muon run with --optimizer=muonh --fresh_optimizer=true), the file's
    keys that the named one does not declare (muon_lr) are dropped, not refused; a key given on the
    command line is the user's and is checked as always."""
    if "optimizer" not in given or values.get("optimizer") not in OPTIMIZERS:
        return values
    own = {p.key for p in OPTIMIZERS[values["optimizer"]].params}
    others = set(optimizer_params()) - own
    return {k: v for k, v in values.items() if k in given or k not in others}


def resumed_run_config(pairs: list[tuple[str, str]]) -> list[str]:
    """[out_dir/config.json] for a resume of a run folder named by --out_dir alone (no config
    file): one rule for both forms, `train.py RUN/config.json --init_from=resume` and `train.py
    --out_dir=RUN --init_from=resume` start from the run's own settings, and the command line
    changes only the keys it names (before, the second resumed under the defaults: another data
    set, rates and batch). [] otherwise, or where the folder has no config.json. An evaluation
    (eval_only) keeps reading the command's keys: it computes no loss term, so a run trained with
    one of a module of its own is evaluated without consent to import it."""
    def last(key: str) -> str:
        return next((raw for k, raw in reversed(pairs) if k == key), "")

    record = Path(last("out_dir"), "config.json")  # run_folder.CONFIG_NAME (which imports this module)
    evaluating = bool(last("eval_only") and parse_value("eval_only", last("eval_only")))
    return [str(record)] if last("init_from") == "resume" and not evaluating and last("out_dir") and record.is_file() else []


def _import_first(file_values: list[tuple[str, dict[str, Any]]], pairs: list[tuple[str, str]]) -> None:
    """Import the modules of the imports key (the last one given wins, as for any key) before any
    other key is checked: they register the connections and parameters those keys may name. A run
    folder's config.json records its modules rather than gives them: they are imported only with
    --trust_recorded_imports=true (imports.import_recorded), and only asked for when its connection
    or optimizer is no registered one."""
    trust = [check_value(TRUST_KEY, read[TRUST_KEY], f"in {path}") for path, read in file_values if TRUST_KEY in read]
    trust += [parse_value(TRUST_KEY, raw) for key, raw in pairs if key == TRUST_KEY]
    consent_to_recorded_imports(bool(trust and trust[-1]))
    given: list[tuple[str, Any]] = [(path, read) for path, read in file_values if IMPORTS_KEY in read]
    given += [("", {IMPORTS_KEY: parse_value(IMPORTS_KEY, raw)}) for key, raw in pairs if key == IMPORTS_KEY]
    path, read = given[-1] if given else ("", {})
    if path.endswith(".json"):
        import_recorded(read, repr(path), ConfigError, _names_unregistered(read))
    else:
        import_modules(check_value(IMPORTS_KEY, read[IMPORTS_KEY], f"in {path}") if path else read.get(IMPORTS_KEY, []), error=ConfigError)
    _import_resumed_run(file_values, pairs)


def _import_resumed_run(file_values: list[tuple[str, dict[str, Any]]], pairs: list[tuple[str, str]]) -> None:
    """A run that continues a model (a resume or evaluation of a run folder, --out_dir=RUN
    --init_from=resume; a fine-tune of a folder, --init_from=hf:DIR) whose command line names a
    connection, optimizer or key that no imported module registered: import the modules the
    config.json it continues records (the same its checkpoints record), with the user's consent,
    so that it needs --trust_recorded_imports=true at most, never the module list; without consent,
    one sentence naming them and both ways to consent. Runs before any key is checked: otherwise
    the named connection is refused as unknown before the folder that registers it is read."""
    def last(key: str) -> Any:  # the value the full parse will give key: the command line's, else the files' last
        given = [parse_value(key, raw) for k, raw in pairs if k == key] or [read[key] for _, read in file_values if key in read]
        return given[-1] if given else None

    named = {**dict.fromkeys(k for k, _ in pairs), "connection": last("connection"), "optimizer": last("optimizer")}
    record = _continued_record(last("init_from"), last("out_dir"), bool(last("eval_only")))
    if record is not None and _names_unregistered(named) and record.is_file():
        values = read_json_object(record, ConfigError, "give --imports=MODULE for the modules the run needs.")
        import_recorded(values, repr(str(record)), ConfigError)


def _continued_record(init_from: Any, out_dir: Any, eval_only: bool) -> Path | None:
    """The config.json that records the modules of the model a run continues: its run folder's
    on a resume or evaluation, the folder's of --init_from=hf:DIR; None for a new model."""
    if isinstance(init_from, str) and init_from.startswith(HF_PREFIX) and init_from.removeprefix(HF_PREFIX):
        return Path(init_from.removeprefix(HF_PREFIX), "config.json")  # the export's config.json (spheretnorm.hf.folder)
    if (init_from in ("resume", "auto") or eval_only) and out_dir:
        return Path(out_dir, "config.json")  # run_folder.CONFIG_NAME (which imports this module)
    return None


def _names_unregistered(values: dict[str, Any]) -> bool:
    """Whether a run's config names a connection or an optimizer that no imported module registered,
    or a key that none declares (a loss term's)."""
    named = [(values.get("connection"), CONNECTIONS), (values.get("optimizer"), OPTIMIZERS)]
    return any(isinstance(name, str) and name not in registry for name, registry in named) or not all(map(_is_key, values))


def parse_config(argv: list[str], world_size: int | None = None) -> ParsedConfig:
    """Parse `[config.py ...] [--key=value ...]`; files first, then the options, later ones win.

    world_size (default: $WORLD_SIZE, else 1) is checked to divide the global batch; 0 skips
    that check (for tools that run single micro-batches, such as bench.py).
    """
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", 1))
    files, pairs = split_argv(argv)
    files = files or resumed_run_config(pairs)
    file_values = [(path, read_config_file(path)) for path in files]
    _import_first(file_values, pairs)
    values: dict[str, Any] = {}
    for path, read in file_values:
        for key, value in read.items():
            if not _is_key(key):
                raise _unknown_key_error(key, f"in {path}")
            values[key] = check_value(key, value, f"in {path}")
    from_files = dict(values)
    for key, raw in pairs:
        if not _is_key(key):
            raise _unknown_key_error(key, f"--{key}")
        values[key] = parse_value(key, raw)
    values = _keys_of_the_named_optimizer(values, {key for key, _ in pairs})
    overrides = {
        key: values[key] for key, _ in pairs if values[key] != from_files.get(key, key_default(key))
    }
    for key, value in values.items():
        _check_choice(key, value)

    model_keys = split_model_keys(values)
    derived = tuple(k for k in FOLLOWS if values.get(k) is None)
    train_values = {k: v for k, v in values.items() if is_train_key(k)}
    if not train_values.get("config_name"):
        train_values["config_name"] = Path(files[-1]).stem if files else train_values.get(
            "dataset", TrainConfig.dataset
        )
    try:
        train = TrainConfig(**train_values)
        model = GPTConfig(**model_keys)  # the model's own checks (n_embd % n_head, ranges) up front
        OPTIMIZERS[train.optimizer].check(model, train)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if world_size:
        grad_accum_steps(train.global_batch_size, train.batch_size, world_size)
    return ParsedConfig(train=train, model_keys=model_keys, config_files=files, overrides=overrides, derived=derived)


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
    """The W&B mode a run uses: its key, else $WANDB_MODE (wandb's older names too), else online.

    A $WANDB_MODE that is no mode is refused only when W&B logs: with wandb_log=false it is not
    this run's setting.
    """
    mode = train.wandb_mode or os.environ.get("WANDB_MODE", "") or WANDB_DEFAULT_MODE
    mode = WANDB_MODE_ALIASES.get(mode, mode)
    if mode in WANDB_MODES:
        return mode
    if not train.wandb_log:
        return WANDB_DEFAULT_MODE
    names = ", ".join([*WANDB_MODES, *(f"{old} (= {new})" for old, new in WANDB_MODE_ALIASES.items())])
    raise ConfigError(f"WANDB_MODE={mode!r} is not valid; choose one of: {names}.")


def model_key_conflicts(explicit: dict[str, Any], saved: dict[str, Any], source: str = "checkpoint") -> list[str]:
    """'key: <source> has X, ... asks for Y' for every explicitly set model key that differs.

    Both sides are compared as model_values gives them (a config saved by older code, with the
    parameters at the top level, as well): a parameter that the connection does not declare
    changes nothing, so it is no conflict either. Execution keys (model.EXECUTION_KEYS, e.g.
    sphere_impl) change no result: never a conflict.
    """
    have = model_values(saved, connection=GPTConfig.connection)  # a config without the key has the default
    wanted = model_values(explicit, connection=have.get("connection"))
    return [
        f"{k}: {source} has {have[k]!r}, the config/command line asks for {v!r}"
        for k, v in sorted(wanted.items())
        if k in have and have[k] != v and k not in EXECUTION_KEYS
    ]


# -----------------------------------------------------------------------------
# --help, generated from the dataclasses
#
# A key's one-line help is the trailing comment of its field (model.py for GPTConfig, above
# for TrainConfig), so the help cannot drift from the code. The fields of GPTConfig that carry
# no comment in model.py get theirs here.

_MODEL_HELP_GAPS = {
    "block_size": "context length in tokens",
    "n_layer": "transformer blocks",
    "n_head": "attention heads per block",
    "n_embd": "width of the hidden states (a multiple of n_head)",
    "dropout": "dropout probability (the paper trains without dropout)",
}
TRAIN_USAGE = "usage: python train.py [config/NAME.py ...] [--key=value ...]"
TRAIN_DESCRIPTION = (
    "Train a GPT with a chosen deep connection. Config files are read first, in order, then the\n"
    "--key=value options; later ones win. Every key below can be set either way; the defaults are\n"
    "the paper's shared hyperparameters at the S scale. A config file is Python that runs, as in\n"
    "nanoGPT (its public names become keys): only trusted files belong there."
)
_FIELD_LINE = re.compile(r"^    (\w+)\s*:")
_SECTION_LINE = re.compile(r"^    #\s*--\s*(.+)$")
_HELP_COLUMN = 32


def field_comments(cls: type) -> tuple[dict[str, str], dict[str, str]]:
    """({field: its trailing comment}, {field: the '# -- section' above it}) from the source.

    Empty when the source is not available (a frozen install): --help then lists the keys and
    defaults without the comments.
    """
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}, {}
    # Comments come from the tokenizer, so a '#' inside a string default is never one.
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    comment_at = {t.start[0]: t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT}
    names = {f.name for f in fields(cls)}
    comments, sections, section, above = {}, {}, "", []
    for line_no, line in enumerate(source.splitlines(), start=1):
        header = _SECTION_LINE.match(line)
        match = _FIELD_LINE.match(line)
        if header:
            section, above = header.group(1).strip(), []
        elif match and match.group(1) in names:
            name = match.group(1)
            sections[name] = section
            # A trailing comment, else the comment lines right above the field.
            text = comment_at.get(line_no) or " ".join(above)
            if text:
                comments[name] = text
            above = []
        elif line.strip().startswith("#") and line_no in comment_at:
            above.append(comment_at[line_no])
        else:
            above = []
    return comments, sections


def key_help() -> dict[str, str]:
    """The one-line help of every config key, with its choices where it has any."""
    model_comments, _ = field_comments(GPTConfig)
    train_comments, _ = field_comments(TrainConfig)
    helps = {**_MODEL_HELP_GAPS, **model_comments, **{k: p.help for k, p in declared_params().items()}, **train_comments}
    choices = {**_MODEL_CHOICES, **{f.name: (*f.metadata["choices"], *f.metadata["forms"]) for f in fields(TrainConfig) if "choices" in f.metadata}}
    for key, allowed in choices.items():
        helps[key] = f"{helps.get(key, '')} [one of: {', '.join(allowed)}]".strip()
    return helps


def _default_text(value: Any) -> str:
    if isinstance(value, list):  # as the command line writes it
        value = ",".join(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if value == "":
        return '""'
    return str(value)


def _help_entry(option: str, text: str) -> str:
    if len(option) + 2 >= _HELP_COLUMN:
        return f"  {option}\n{' ' * _HELP_COLUMN}{text}"
    return f"  {option.ljust(_HELP_COLUMN - 2)}{text}"


def _key_entries(cls: type, helps: dict[str, str]) -> list[str]:
    lines, section = [], None
    _, sections = field_comments(cls)
    for f in fields(cls):
        if f.name in KEY_HOLDERS:
            continue  # their keys are listed one by one (_param_entries, _optimizer_entries)
        if sections.get(f.name) and sections[f.name] != section:
            section = sections[f.name]
            lines.append(f" {section}:")
        lines.append(_help_entry(f"--{f.name}={_default_text(key_default(f.name))}", helps.get(f.name, "")))
    return lines


def _param_entries() -> list[str]:
    """The parameters that connection classes declare, with the connections that use them; one
    in the method key (in_key) says so, as a launcher's --methods sets it."""
    params = declared_params()
    owners = {k: [c for c, cls in CONNECTIONS.items() if any(p.key == k for p in cls.params)] for k in param_keys()}
    return [
        _help_entry(
            f"--{k}={_default_text(params[k].default)}",
            f"{params[k].help} (connection {', '.join(owners[k])}{'; in the method key' if params[k].in_key else ''})",
        )
        for k in param_keys()
    ]


def _optimizer_entries() -> list[str]:
    """The keys that optimizers and loss terms declare (spheretnorm/optim.py, runtime/loss_terms.py), each with its owner."""
    owners = [("optimizer", OPTIMIZERS), ("loss term", LOSS_TERMS)]
    return [
        _help_entry(f"--{p.key}={_default_text(p.default)}", f"{p.help} ({kind} {name})")
        for kind, registry in owners
        for name, entry in registry.items()
        for p in entry.params
    ]


# The training keys an optimizer is built from (optim.OptimizerSettings).
OPTIMIZER_FIELDS = ("optimizer", "optimizer_params", "learning_rate", "min_lr", "weight_decay", "beta1", "beta2")


def optimizer_settings(saved_train: dict[str, Any]) -> TrainConfig:
    """The optimizer's keys of a checkpoint's train_config, as build_optimizer takes them (a
    train_config saved before the optimizer key existed is AdamW's)."""
    return TrainConfig(**{k: saved_train[k] for k in OPTIMIZER_FIELDS if k in saved_train})


def config_help(
    extra_options: dict[str, str] | None = None,
    *,
    usage: str = TRAIN_USAGE,
    description: str = TRAIN_DESCRIPTION,
    train_keys: bool = True,
) -> str:
    """The --help text of a program configured by GPTConfig (and TrainConfig) keys.

    extra_options maps a program's own options, written as '--name=DEFAULT', to their one-line
    help; they are listed first. train_keys=False leaves out the training keys (for a tool
    that only builds models).
    """
    helps = key_help()
    parts = [usage, "", description]
    if extra_options:
        parts += ["", "Options of this program:", *(_help_entry(k, v) for k, v in extra_options.items())]
    parts += ["", "Model keys (model.GPTConfig), as --key=DEFAULT:", *_key_entries(GPTConfig, helps), *_param_entries()]
    if train_keys:
        parts += ["", "Training keys (spheretnorm.runtime.config.TrainConfig), as --key=DEFAULT:", *_key_entries(TrainConfig, helps), *_optimizer_entries()]
    return "\n".join(parts) + "\n"


def train_help(argv: list[str]) -> str:
    """train.py's --help, with the keys of the modules --imports names (their connections',
    optimizers' and loss terms' keys): imported first, as a run would (issue 65, item 5)."""
    named = [raw for key, raw in split_argv([a for a in argv if a not in ("-h", "--help")])[1] if key == IMPORTS_KEY]
    if named:
        import_modules(parse_value(IMPORTS_KEY, named[-1]), error=ConfigError)
    return config_help()


def wants_help(argv: list[str]) -> bool:
    """True when the command line asks for --help (or -h) anywhere."""
    return any(arg in ("-h", "--help") for arg in argv)


# The type of each GPTConfig field, for config_from_dict's checks of values read from files.
_MODEL_FIELD_TYPES = get_type_hints(GPTConfig)


def _type_options(hint: Any) -> tuple[type, ...]:
    """The classes a field's type hint allows: (float, NoneType) for float | None, (dict,) for dict[str, Any]."""
    options = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
    return tuple(get_origin(option) or option for option in options)


def value_fits(value: Any, hint: Any) -> bool:
    """isinstance as a config means it: an int is a float too, a bool is no number."""
    options = _type_options(hint)
    if isinstance(value, bool):
        return bool in options
    return isinstance(value, options) or (float in options and isinstance(value, int))


# How every error of the project names a type: config keys, model configs read from files, and
# the JSON files of the evaluation and the tables (zeroshot/errors.py).
TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "an object",
              list: "a list", type(None): "None"}


def type_text(hint: Any) -> str:
    """'an integer', 'a number or None', ...: a type hint (float | None) or a tuple of classes, in
    words; "a number" covers the integers, so (int, float) is "a number"."""
    options = hint if isinstance(hint, tuple) else _type_options(hint)
    words = [TYPE_WORDS.get(option, f"a {option.__name__}") for option in options if not (option is int and float in options)]
    return " or ".join(dict.fromkeys(words))


def config_from_dict(d: dict[str, Any]) -> GPTConfig:
    """The one way to rebuild a GPTConfig (checkpoints, evaluation, sampling).

    The values come from files (a checkpoint, a config.json), so each is checked against its
    field's type first: GPTConfig's own checks compare them with numbers and would fail with a
    TypeError on a string; a ValueError names the key, its type and the value found.

    Configs saved before connection_params existed have no such key (it defaults to {}); those
    saved up to commit 3ab3f93 hold spheret_p, dyt_alpha, keel_alpha and peri_embed_ln at the
    top level, for every connection. A declared parameter at the top level is read into
    connection_params when the connection declares it; another connection's (any_connection)
    is checked and dropped: no connection but its own ever read it, so it changed nothing.
    """
    if not isinstance(d, dict):
        raise ValueError(f"A model config must be a dict of keys and values, got {type(d).__name__} {d!r:.80}.")
    known = set(MODEL_FIELDS) | set(param_keys())
    unknown = sorted(set(d) - known, key=str)
    if unknown:
        raise ValueError(
            f"Unknown model config keys {unknown}; valid keys are: {', '.join(sorted(known))}."
        )
    for key, value in d.items():
        hint = _MODEL_FIELD_TYPES[key] if key in _MODEL_FIELD_TYPES else _key_type(key)
        if not value_fits(value, hint):
            raise ValueError(f"{key} must be {type_text(hint)}, got {value!r:.80}.")
    return GPTConfig(**d)  # the parameters at the top level join connection_params (GPTConfig's keywords)


def model_keys_of(d: dict[str, Any]) -> dict[str, Any]:
    """The model keys of a dict that holds other keys too (an exported folder's config.json):
    GPTConfig's fields and the declared parameters it has at the top level (written so up to
    commit 3ab3f93), as config_from_dict reads them."""
    return {k: v for k, v in d.items() if k in MODEL_FIELDS or k in param_keys()}


def model_values(d: dict[str, Any], connection: str | None = None) -> dict[str, Any]:
    """The model keys of a saved or requested config, flat and in today's form, for comparing
    two of them: every key of GPTConfig but connection_params, then the parameters of the
    connection (d's own, else `connection`) from connection_params or the top level (configs
    saved up to 3ab3f93). Parameters the connection does not declare are left out: they change
    nothing. No value is checked: a run's config.json may be anything."""
    connection = d.get("connection", connection)
    declares = {p.key for p in CONNECTIONS[connection].params} if connection in CONNECTIONS else set()
    nested = d.get("connection_params")
    params = {**d, **(nested if isinstance(nested, dict) else {})}
    return {
        **{k: v for k, v in d.items() if k in MODEL_KEYS},
        **{k: v for k, v in params.items() if k in declares},
    }
