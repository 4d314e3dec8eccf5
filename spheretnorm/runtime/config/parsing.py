"""The command line and config files: `train.py [config/NAME.py ...] [--key=value ...]` parsed into
a checked TrainConfig and the model keys it set (parse_config).
"""

from __future__ import annotations

import os
import runpy
import types
from pathlib import Path
from typing import Any

from spheretnorm.model import GPTConfig
from spheretnorm.optim import OPTIMIZERS, optimizer_params
from spheretnorm.runtime.config.recorded import import_first, read_run_config, resumed_run_config
from spheretnorm.runtime.config.train_config import (
    FOLLOWS, ConfigError, ParsedConfig, TrainConfig, _is_key, is_train_key, key_default, split_model_keys,
)
from spheretnorm.runtime.config.values import _check_choice, _unknown_key_error, check_value, parse_value
from spheretnorm.runtime.loss_terms import active_loss_terms

CONFIG_SUFFIXES = (".py", ".json")


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
    return {k: v for k, v in namespace.items() if not k.startswith("_") and not isinstance(v, (types.ModuleType, types.FunctionType, type))}


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
    (--optimizer=muonh --fresh_optimizer=true), the file's keys the named one does not declare
    (muon_lr) are dropped, not refused; a key given on the command line is checked as always."""
    if "optimizer" not in given or values.get("optimizer") not in OPTIMIZERS:
        return values
    own = {p.key for p in OPTIMIZERS[values["optimizer"]].params}
    others = set(optimizer_params()) - own
    return {k: v for k, v in values.items() if k in given or k not in others}


def parse_config(argv: list[str], world_size: int | None = None) -> ParsedConfig:
    """Parse `[config.py ...] [--key=value ...]`; files first, then the options, later ones win.
    world_size (default: $WORLD_SIZE, else 1) is checked to divide the global batch; 0 skips it (bench.py)."""
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", 1))
    files, pairs = split_argv(argv)
    files = files or resumed_run_config(pairs)
    file_values = [(path, read_config_file(path)) for path in files]
    import_first(file_values, pairs)
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
    overrides = {key: values[key] for key, _ in pairs if values[key] != from_files.get(key, key_default(key))}
    for key, value in values.items():
        _check_choice(key, value)

    model_keys = split_model_keys(values)
    derived = tuple(k for k in FOLLOWS if values.get(k) is None)
    train_values = {k: v for k, v in values.items() if is_train_key(k)}
    if not train_values.get("config_name"):
        train_values["config_name"] = Path(files[-1]).stem if files else train_values.get("dataset", TrainConfig.dataset)
    try:
        train = TrainConfig(**train_values)
        model = GPTConfig(**model_keys)  # the model's own checks (n_embd % n_head, ranges) up front
        OPTIMIZERS[train.optimizer].check(model, train)
        if model.loss_chunk_tokens and active_loss_terms(train):
            raise ConfigError(
                f"loss_chunk_tokens={model.loss_chunk_tokens} never forms the logits, which the loss terms that are on "
                f"({', '.join(active_loss_terms(train))}) read; set loss_chunk_tokens=0 or turn the terms off."
            )
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if world_size:
        grad_accum_steps(train.global_batch_size, train.batch_size, world_size)
    return ParsedConfig(train=train, model_keys=model_keys, config_files=files, overrides=overrides, derived=derived)
