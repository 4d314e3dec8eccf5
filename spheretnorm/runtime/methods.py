"""Method keys: the paper's names of model variants, as the launcher, tables and exports write them.

A *method key* is a key of ``model.CONNECTIONS`` followed by the values of the parameters its
class declares with ``in_key`` (``Connection.params``, ``config.method_params``), each after a
':': ``p_spheret:0.5`` is p-SpheretNorm with ``spheret_p = 0.5``, the paper's 0.5-SpheretNorm
(``dyt_alpha``, ``keel_alpha`` and ``peri_embed_ln`` are no part of it). Keys map to train.py arguments, run
folders and W&B names through ``spheretnorm.runtime.config`` (``method_key``,
``method_dirname``, ``resolve_wandb_names``), so every command names a run as train.py does.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Mapping

from spheretnorm.model import CONNECTIONS, GPTConfig
from spheretnorm.runtime.cli import REPO_ROOT, UsageError
from spheretnorm.runtime.imports import OWN_CONNECTION_HINT
from spheretnorm.model import OPENED_DEFAULTS
from spheretnorm.runtime.config import (
    ConfigError,
    TrainConfig,
    method_key,
    method_params,
    opened_settings,
    param_text,
    parse_value,
    resolve_wandb_names,
)

REFERENCE_PATH = REPO_ROOT / "reference" / "paper_results.json"


def method_form(name: str) -> str:
    """How a method key of connection `name` is written: 'p_spheret:P' for one with a parameter."""
    params = method_params(name)
    return ":".join([name, *(p.key.upper() if len(params) > 1 else "P" for p in params)])



def valid_methods_text() -> str:
    return ", ".join(method_form(k) for k in CONNECTIONS)



def method_model_keys(key: str) -> dict[str, Any]:
    """The model keys of a method key: the connection, then one value per parameter its class
    declares with in_key (method_params): 'p_spheret:0.5' -> connection p_spheret, spheret_p 0.5.
    A parameter left out takes its default. '+key=value' parts set choices the paper fixed
    (model.OPENED_DEFAULTS): 'p_spheret:0.5+alpha_cap=none'."""
    base, *settings = key.strip().split("+")
    connection, *values = base.split(":")
    if connection not in CONNECTIONS:
        raise UsageError(f"Unknown method {key!r}; valid methods are: {valid_methods_text()}; {OWN_CONNECTION_HINT}.")
    params = method_params(connection)
    if len(values) > len(params):
        raise UsageError(f"Method {key!r}: {connection} takes the form {method_form(connection)}; valid methods are: {valid_methods_text()}.")
    keys: dict[str, Any] = {"connection": connection}
    for param, text in zip(params, values):
        try:
            keys[param.key] = parse_value(param.key, text)
        except ConfigError:
            raise UsageError(f"Method {key!r}: {param.key} must be a {(param.kind or type(param.default)).__name__}, as in {method_form(connection)}.") from None
    for setting in settings:
        name, eq, text = setting.partition("=")
        if name not in OPENED_DEFAULTS or not eq:
            raise UsageError(
                f"Method {key!r}: '+{setting}' is no setting of a method key; valid ones are "
                f"{', '.join(f'+{k}=VALUE' for k in OPENED_DEFAULTS)}."
            )
        try:
            keys[name] = parse_value(name, text)
        except ConfigError as e:
            raise UsageError(f"Method {key!r}: {e}") from None
    return keys



def method_config(key: str) -> GPTConfig:
    try:
        return GPTConfig(**method_model_keys(key))
    except ValueError as e:
        if isinstance(e, UsageError):
            raise
        raise UsageError(f"Method {key!r}: {e}") from None



def canonical_method(key: str) -> str:
    """The key train.py records for this method (spheretnorm.runtime.config.method_key), e.g. 'p_spheret:0.5'."""
    return method_key(method_config(key))



def method_args(key: str) -> list[str]:
    """train.py arguments of a method: ['--connection=p_spheret', '--spheret_p=0.5']."""
    cfg = method_config(key)
    return [
        f"--connection={cfg.connection}",
        *(f"--{p.key}={getattr(cfg, p.key)}" for p in method_params(cfg.connection)),
        *(f"--{k}={param_text(v)}" for k, v in opened_settings(cfg).items()),
    ]



def run_name(config_name: str, key: str) -> str:
    """The run's name, also its W&B name: '<config_name>/<run folder>', e.g. 'openwebtext_s/p_spheret-0.5'."""
    return resolve_wandb_names(TrainConfig(config_name=config_name), method_config(key)).wandb_run_name



def display_name(key: str) -> str:
    """The paper's name of a method: 'p_spheret:0.5' -> '0.5-SpheretNorm', and the settings that
    are not the paper's after it: '0.5-SpheretNorm (alpha_cap=none)'."""
    try:
        cfg = method_config(key)
    except UsageError:
        return key
    connection = CONNECTIONS[cfg.connection]
    values = {p.key: getattr(cfg, p.key) for p in method_params(cfg.connection)}
    name = connection.title.format(**values) if connection.title else cfg.connection
    settings = ", ".join(f"{k}={param_text(v)}" for k, v in opened_settings(cfg).items())
    return f"{name} ({settings})" if settings else name



def is_sphere_method(key: str) -> bool:
    """Whether the method keeps every hidden state on a sphere (SpheretNorm, GeoNorm, nGPT)."""
    connection = CONNECTIONS.get(key.partition("+")[0].partition(":")[0])
    return connection is not None and connection.on_sphere



@functools.lru_cache(maxsize=4)
def load_reference(path: Path = REFERENCE_PATH) -> dict[str, Any]:
    """paper_results.json: the paper's Tables 2-7 (a copy of ../shared/reference)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))



def scale_of(config: Mapping[str, Any]) -> str:
    """'S', 'M' or 'L' for the paper's model shapes, else '<n_layer>x<n_embd>' (e.g. '24x128')."""
    shape = (config["n_layer"], config["n_head"], config["n_embd"])
    for name, s in load_reference()["scales"].items():
        if shape == (s["n_layer"], s["n_head"], s["n_embd"]):
            return name
    return f"{config['n_layer']}x{config['n_embd']}"
