"""Method keys, the one home of their code: the paper's names of model variants, and the run
folders and W&B names derived from them, as train.py, the launcher, tables and exports write them.

A *method key* is a key of ``model.CONNECTIONS`` followed by the values of the parameters its
class declares with ``in_key`` (``method_params``), each after a ':' (``p_spheret:0.5``, the
paper's 0.5-SpheretNorm), then each choice the paper fixed that is set otherwise as ``+key=value``.
A run's folder is its method key's (``method_dirname``) plus ``identity.run_suffix``; its W&B
name is ``<config_name>/<folder>`` (``resolve_wandb_names``).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from spheretnorm.model import CONNECTIONS, OPENED_DEFAULTS, GPTConfig, MethodParam
from spheretnorm.runtime.cli import REPO_ROOT, UsageError
from spheretnorm.runtime.imports import OWN_CONNECTION_HINT
from spheretnorm.runtime.config import WANDB_DEFAULT_PROJECT, ConfigError, TrainConfig, parse_value, wandb_mode
from spheretnorm.runtime.identity import earlier_run_suffixes, param_text, run_suffix

REFERENCE_PATH = REPO_ROOT / "reference" / "paper_results.json"
# The paper's methods in its tables' row order (the grid's default --methods paper).
PAPER_METHODS = ("pre_ln", "pre_dyt", "peri_ln", "keel", "geonorm", "p_spheret:0.5", "proj_spheret", "cay_spheret")


# -----------------------------------------------------------------------------
# A method key and the names derived from it: run folders and W&B names


def method_key(cfg: GPTConfig) -> str:
    """The paper's method name of a model config (the module's docstring says its form):
    'p_spheret:0.5', 'pre_ln', 'p_spheret:0.5+alpha_cap=none'."""
    base = ":".join([cfg.connection, *(param_text(getattr(cfg, p.key)) for p in method_params(cfg.connection))])
    return base + "".join(f"+{k}={param_text(v)}" for k, v in opened_settings(cfg).items())


def opened_settings(cfg: GPTConfig) -> dict[str, Any]:
    """The choices the paper fixed that cfg sets otherwise, in model.OPENED_DEFAULTS' order."""
    return {k: getattr(cfg, k) for k, default in OPENED_DEFAULTS.items() if getattr(cfg, k) != default}


def method_dirname(key: str) -> str:
    """The run folder name of a method key ('p_spheret:0.5' -> 'p_spheret-0.5'): ':' is awkward in paths."""
    return key.replace(":", "-")


def method_params(connection: str) -> tuple[MethodParam, ...]:
    """The parameters of a connection that its method key holds (in_key), in declared order."""
    return tuple(p for p in CONNECTIONS[connection].params if p.in_key)


def default_out_dir(config_name: str, model_cfg: GPTConfig, overrides: dict[str, Any] | None = None) -> str:
    """out/<config_name>/<method>[<suffix>]: a run with changed settings never shares the paper run's folder
    (found_run_folder: a folder an earlier form of the name gave the same settings is found again)."""
    return found_run_folder(os.path.join("out", config_name, method_dirname(method_key(model_cfg))), overrides or {})


def found_run_folder(stem: str, overrides: dict[str, Any], root: Path = Path(".")) -> str:
    """stem + run_suffix(overrides), or the folder of an earlier form of that suffix
    (identity.earlier_run_suffixes: '+overrides-<hash>' alone) where only that one exists under root
    (stem is relative to it): a run started before the name changed is resumed, not begun again."""
    current = stem + run_suffix(overrides)
    earlier = [stem + suffix for suffix in earlier_run_suffixes(overrides)]
    if (root / current).exists():
        return current
    return next((folder for folder in earlier if (root / folder).is_dir()), current)


def resolve_paths(train: TrainConfig, model_cfg: GPTConfig, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Fill out_dir (default_out_dir) and data_dir (data/<dataset>) when left empty."""
    return replace(
        train,
        out_dir=train.out_dir or default_out_dir(train.config_name, model_cfg, overrides),
        data_dir=train.data_dir or str(REPO_ROOT / "data" / train.dataset),
    )


def resolve_wandb_names(train: TrainConfig, model_cfg: GPTConfig) -> TrainConfig:
    """The W&B keys a run uses: a key set in a config file or on the command line wins, then W&B's
    environment variable, then the default. The run's name is its folder's: a smoke run with
    changed settings never shares a name with the paper run."""
    env = os.environ.get
    folder = os.path.basename(os.path.normpath(train.out_dir)) if train.out_dir else method_dirname(method_key(model_cfg))
    mode = wandb_mode(train)
    return replace(
        train,
        wandb_run_name=train.wandb_run_name or f"{train.config_name}/{folder}",
        wandb_group=train.wandb_group or env("WANDB_RUN_GROUP", "") or train.config_name,
        wandb_project=train.wandb_project or env("WANDB_PROJECT", "") or WANDB_DEFAULT_PROJECT,
        wandb_entity=train.wandb_entity or env("WANDB_ENTITY", ""),
        wandb_mode=mode,
    )


# -----------------------------------------------------------------------------
# Method keys as commands write them


def method_form(name: str) -> str:
    """How a method key of connection `name` is written: 'p_spheret:P' for one with a parameter."""
    params = method_params(name)
    return ":".join([name, *(p.key.upper() if len(params) > 1 else "P" for p in params)])


def valid_methods_text() -> str:
    return ", ".join(method_form(k) for k in CONNECTIONS)


def method_model_keys(key: str) -> dict[str, Any]:
    """The model keys of a method key ('p_spheret:0.5' -> connection p_spheret, spheret_p 0.5); a
    parameter left out takes its default."""
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
    """The key train.py records for this method (method_key), e.g. 'p_spheret:0.5'."""
    return method_key(method_config(key))


def method_args(key: str) -> list[str]:
    """train.py arguments of a method: ['--connection=p_spheret', '--spheret_p=0.5']."""
    cfg = method_config(key)
    return [
        f"--connection={cfg.connection}",
        *(f"--{p.key}={getattr(cfg, p.key)}" for p in method_params(cfg.connection)),
        *(f"--{k}={param_text(v)}" for k, v in opened_settings(cfg).items()),
    ]


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


def sort_methods(methods: Iterable[str]) -> list[str]:
    """The paper's row order first, then any other method alphabetically."""
    order = {m: i for i, m in enumerate(PAPER_METHODS)}
    return sorted(set(methods), key=lambda m: (order.get(m, len(order)), m))


def parse_methods(spec: str) -> list[str]:
    """'paper' (the paper's 8), 'all' (every registered connection) or a comma-separated list."""
    if spec.strip() == "paper":
        return list(PAPER_METHODS)
    if spec.strip() == "all":
        return [canonical_method(k) for k in CONNECTIONS]
    keys = [canonical_method(k) for k in spec.split(",") if k.strip()]
    if not keys:
        raise UsageError(f"--methods {spec!r} names no method; valid methods are: paper, all, {valid_methods_text()}.")
    return list(dict.fromkeys(keys))
