"""Training configuration, one package with one front: this module, which every caller imports
from; docs/ARCHITECTURE.md ("The runtime") says what each module beside it holds.

There is one source of truth for every key: the fields of ``TrainConfig`` and of
``model.GPTConfig``. A run is configured as

    python train.py [config/NAME.py ...] [--key=value ...]

Config files are Python that runs (as nanoGPT's: only trusted files belong there), into a private
namespace; every public name they define must be a key, and ``--key=value`` strings are converted
by the key's type. Any unknown key or badly typed value raises ``ConfigError`` before any work.
"""

from __future__ import annotations

from spheretnorm.runtime.config.help_text import config_help, key_help, train_help, wants_help
from spheretnorm.runtime.config.parsing import grad_accum_steps, parse_config, read_config_file, split_argv
from spheretnorm.runtime.config.recorded import RUN_RECORD_KEYS, read_run_config, resume_record
from spheretnorm.runtime.config.train_config import (
    COMPILE_SCOPES, FOLLOWS, HF_PREFIX, KEY_HOLDERS, MODEL_KEYS, OPTIMIZER_FIELDS, RESTART_FREE_KEYS, RESUME_FIXED_KEYS,
    RUN_NEUTRAL_KEYS, TRAIN_KEYS, WANDB_DEFAULT_PROJECT, ConfigError, ParsedConfig, TrainConfig, config_keys, is_train_key,
    key_default, optimizer_settings, wandb_mode,
)
from spheretnorm.runtime.config.values import (
    TYPE_WORDS, check_value, config_from_dict, model_key_conflicts, model_keys_of, model_values, parse_value, type_text, value_fits,
)

__all__ = [
    "COMPILE_SCOPES", "FOLLOWS", "HF_PREFIX", "KEY_HOLDERS", "MODEL_KEYS", "OPTIMIZER_FIELDS", "RESTART_FREE_KEYS",
    "RESUME_FIXED_KEYS", "RUN_NEUTRAL_KEYS", "RUN_RECORD_KEYS", "TRAIN_KEYS", "TYPE_WORDS", "WANDB_DEFAULT_PROJECT",
    "ConfigError", "ParsedConfig", "TrainConfig", "check_value", "config_from_dict", "config_help", "config_keys",
    "grad_accum_steps", "is_train_key", "key_default", "key_help", "model_key_conflicts", "model_keys_of", "model_values",
    "optimizer_settings", "parse_config", "parse_value", "read_config_file", "read_run_config", "resume_record", "split_argv", "train_help",
    "type_text", "value_fits", "wandb_mode", "wants_help",
]
