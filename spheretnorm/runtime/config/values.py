"""Values: a command-line string typed by its key's field (parse_value), a config file's value
checked against it (check_value), how every error of the project names a type (type_text), and a
model config rebuilt from a file's dict (config_from_dict) or compared with another
(model_values, model_key_conflicts).
"""

from __future__ import annotations

import difflib
import types
from typing import Any, Union, get_args, get_origin, get_type_hints

from spheretnorm.model import CONNECTIONS, EXECUTION_KEYS, MODEL_FIELDS, GPTConfig
from spheretnorm.runtime.config.train_config import (
    _MODEL_CHOICES, MODEL_KEYS, TRAIN_KEYS, ConfigError, _key_type, declared_keys, param_keys,
)
from spheretnorm.runtime.imports import comma_list, own_module_hint


def _unknown_key_error(key: str, where: str) -> ConfigError:
    valid = MODEL_KEYS + TRAIN_KEYS + tuple(declared_keys())
    close = difflib.get_close_matches(key, valid, n=3)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    return ConfigError(f"Unknown config key {key!r} ({where}).{hint} Valid keys: {', '.join(sorted(valid))}.")


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
    raise ConfigError(f"{key} = {value!r} ({where}): expected {type_text(_key_type(key))}, got {type(value).__name__}.")


def _check_choice(key: str, value: Any) -> None:
    allowed = _MODEL_CHOICES.get(key)
    if allowed and value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        own = f"; {own_module_hint(key)}" if key in ("connection", "optimizer") else ""
        raise ConfigError(f"{key}={value!r} is not valid.{hint} Choose one of: {', '.join(allowed)}{own}.")


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

    The values come from files, so each is checked against its field's type first (GPTConfig's own
    checks would fail with a TypeError on a string): a ValueError names the key, its type and the
    value. Configs saved up to commit 3ab3f93 hold the connections' parameters at the top level, for
    every connection: one the connection declares joins connection_params, another's is checked and
    dropped (no connection but its own ever read it).
    """
    if not isinstance(d, dict):
        raise ValueError(f"A model config must be a dict of keys and values, got {type(d).__name__} {d!r:.80}.")
    known = set(MODEL_FIELDS) | set(param_keys())
    unknown = sorted(set(d) - known, key=str)
    if unknown:
        raise ValueError(f"Unknown model config keys {unknown}; valid keys are: {', '.join(sorted(known))}.")
    for key, value in d.items():
        hint = _MODEL_FIELD_TYPES[key] if key in _MODEL_FIELD_TYPES else _key_type(key)
        if not value_fits(value, hint):
            raise ValueError(f"{key} must be {type_text(hint)}, got {value!r:.80}.")
    return GPTConfig(**d)  # the parameters at the top level join connection_params (GPTConfig's keywords)


def model_keys_of(d: dict[str, Any]) -> dict[str, Any]:
    """The model keys of a dict that holds other keys too (an exported folder's config.json), as
    config_from_dict reads them."""
    return {k: v for k, v in d.items() if k in MODEL_FIELDS or k in param_keys()}


def model_values(d: dict[str, Any], connection: str | None = None) -> dict[str, Any]:
    """The model keys of a saved or requested config, flat and in today's form, for comparing two of
    them: every key of GPTConfig but connection_params, then the parameters the connection (d's own,
    else `connection`) declares, from connection_params or the top level. No value is checked."""
    connection = d.get("connection", connection)
    declares = {p.key for p in CONNECTIONS[connection].params} if connection in CONNECTIONS else set()
    nested = d.get("connection_params")
    params = {**d, **(nested if isinstance(nested, dict) else {})}
    return {
        **{k: v for k, v in d.items() if k in MODEL_KEYS},
        **{k: v for k, v in params.items() if k in declares},
    }


def model_key_conflicts(explicit: dict[str, Any], saved: dict[str, Any], source: str = "checkpoint") -> list[str]:
    """'key: <source> has X, ... asks for Y' for every explicitly set model key that differs, both
    sides as model_values gives them; execution keys (model.EXECUTION_KEYS) change no result: never a conflict."""
    have = model_values(saved, connection=GPTConfig.connection)  # a config without the key has the default
    wanted = model_values(explicit, connection=have.get("connection"))
    return [
        f"{k}: {source} has {have[k]!r}, the config/command line asks for {v!r}"
        for k, v in sorted(wanted.items())
        if k in have and have[k] != v and k not in EXECUTION_KEYS
    ]
