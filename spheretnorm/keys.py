"""
The model's keys: how they are declared, registered and checked, apart from the model itself.

A connection (model.py), an optimizer (optim.py) or a loss term (runtime/loss_terms.py) declares
its own keys as MethodParam; check_registration keeps each registered name to one class and each
key to one owner; GPTConfig (model.py) checks its values with check_model_config. Every field of
GPTConfig and TrainConfig says what it is to a run's identity with the constants NEUTRAL,
RESTART_FREE and RESUME_FIXED.

model.py imports this module, never the other way round: what only the model knows (GPTConfig's
fields, which connections move on a sphere) it hands over, into MODEL_KEYS and as an argument of
check_model_config. Like model.py, this module imports torch, the standard library and the core
modules beside it only, relatively: a Hugging Face export ships it beside model.py unchanged.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass, fields, replace
from typing import Any, Callable

from .kernels import SPHERE_IMPLS
from .retractions import ALPHA_CAP_GRADS

# -----------------------------------------------------------------------------
# What a key is to a run, and what each of GPTConfig's choice keys accepts

# What a config key is to a run's identity, declared where the key is defined (field metadata
# "run", in model.py's GPTConfig and runtime/config's TrainConfig; runtime/config derives
# every list of keys from it). A key without it changes what a run computes: it is part of the
# run's folder name when set otherwise, and a run folder holding another value is another run.
NEUTRAL = {"run": "neutral"}  # changes nothing a run computes: where and how it runs and logs
RESTART_FREE = {"run": "restart_free"}  # computes, but a restart or an extension may change it
RESUME_FIXED = {"run": "resume_fixed"}  # computes, and a resume may not change it (the state would not fit)

ALPHA_DECAYS = ("sqrt", "harmonic", "linear", "none")
ALPHA_INDICES = ("block", "sublayer")
BLOCKS = ("gpt2", "llama")

# The widest MLP a key may ask for: 2^20, twenty times the widest of any released model (LLaMA 3
# 405B: 53,248); past it a typo would be a many-terabyte allocation.
MAX_MLP_WIDTH = 1 << 20

# The keys that open a choice the paper fixed (docs/CONNECTIONS.md, "Not in the paper"), in
# GPTConfig's field order; all but mlp_width are read by the sphere connections only.
SPHERE_KEYS = ("alpha_cap", "alpha_cap_grad", "radius_cap", "sphere_input_gain")
OPENED_KEYS = (*SPHERE_KEYS, "mlp_width")


# -----------------------------------------------------------------------------
# A declared key


@dataclass(frozen=True)
class MethodParam:
    """A model key that a connection class declares, such as p of p-SpheretNorm (spheret_p): set as
    --key=value, kept in GPTConfig.connection_params, read as config.key.

    in_key: the value is part of the method key ('p_spheret:0.5'), and so of the run folder, W&B
    name and table row, and --methods sets it; else a changed value is a folder suffix
    ('+dyt_alpha=0.3'). any_connection: the other connections accept the key and ignore it (as
    when the paper's keys were GPTConfig fields); else they refuse it.
    """

    key: str
    default: Any
    help: str
    kind: type | None = None  # the values' type; None: the default's (a None default needs it)
    check: Callable[[Any], bool] | None = None  # a test of every value but None
    must: str = ""  # what check asks, as the error says it: 'spheret_p must be > 0, got 0.0.'
    in_key: bool = True
    any_connection: bool = False

    def checked(self, value: Any) -> Any:
        """value, if it has the key's type (an int for a float key becomes a float; None only
        where the default is None) and passes check; else a ValueError naming the key."""
        kind = self.kind or type(self.default)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if value is None and self.default is None:
            return value
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{self.key} must be a {kind.__name__}{' or None' if self.default is None else ''}, got {value!r}.")
        if self.check is not None and not self.check(value):
            raise ValueError(f"{self.key} must be {self.must}, got {value}.")
        return value


# -----------------------------------------------------------------------------
# The registries of classes that declare keys

# name -> Connection subclass, in registration order: model.py's @register_connection fills it
# (and re-exports it as model.CONNECTIONS); it lives here because the checks below read it.
CONNECTIONS: dict[str, type] = {}

# The registries of classes that declare keys (MethodParam), by kind: CONNECTIONS above, optim.py
# adds OPTIMIZERS. check_registration keeps each name to one class and each key to one kind, so
# that a user's module can neither replace a built-in nor capture another entry's key.
KEYED_REGISTRIES: dict[str, dict[str, type]] = {"connection": CONNECTIONS}
TRAIN_CONFIG_MODULE = "spheretnorm.runtime.config"
# GPTConfig's fields, which no entry may declare; model.py puts them here once GPTConfig exists
# (this module cannot import model.py, which imports it).
MODEL_KEYS: list[str] = []


def check_registration(kind: str, name: str, cls: type, home: str) -> None:
    """Refuse, in one sentence naming cls's module, to register cls as `kind` `name` where the
    name is another class's (a built-in one: defined in `home`, the registry's module) or a key
    it declares is the model's, training's or another entry's. The same class registered again
    (its module imported again) replaces itself."""
    registry = KEYED_REGISTRIES[kind]
    taken = registry.get(name)
    if taken is not None and not same_class(taken, cls):
        whose = "a built-in name" if taken.__module__ == home else f"taken by {taken.__qualname__} of module {taken.__module__!r}"
        raise ValueError(f"Module {cls.__module__!r} is refused: {kind} name {name!r} is {whose}; register yours under a name of its own.")
    owners = key_owners(kind, name, cls.params)
    clash = [param.key for param in cls.params if param.key in owners]
    if clash:
        raise ValueError(
            f"Module {cls.__module__!r} is refused: {kind} {name!r} declares {clash}, already keys of {owners[clash[0]]}; "
            "give yours names of their own."
        )


def same_class(old: type, new: type) -> bool:
    """Whether `new` is `old` as its module defines it when imported again (under the same name,
    or from the same file under another): the same qualified name, module or file."""
    if old is new:
        return True
    return old.__qualname__ == new.__qualname__ and (old.__module__ == new.__module__ or module_file(old) == module_file(new) is not None)


def module_file(cls: type) -> str | None:
    return getattr(sys.modules.get(cls.__module__), "__file__", None)


def key_owners(kind: str, name: str, params: tuple[MethodParam, ...]) -> dict[str, str]:
    """{key: its owner, as the refusal says it} of every key an entry `name` of `kind` declaring
    `params` may not declare: the model's fields, training's keys, another kind's keys and
    another entry's of its kind unless declared alike (muon and muonh share muon_momentum)."""
    mine = {param.key: param for param in params}
    training = f"training ({TRAIN_CONFIG_MODULE}.TrainConfig)"
    owners = {**{key: "the model (GPTConfig)" for key in MODEL_KEYS}, **{key: training for key in training_keys() if key not in MODEL_KEYS}}
    for other_kind, registry in KEYED_REGISTRIES.items():
        for other, other_cls in registry.items():
            owner = f"the model (connection {other!r})" if other_kind == "connection" else f"{other_kind} {other!r}"
            for param in other_cls.params:
                shared = other_kind == kind and (other == name or alike(param, mine.get(param.key)))
                if not shared:
                    owners.setdefault(param.key, owner)
    return owners


def alike(param: MethodParam, other: MethodParam | None) -> bool:
    """Whether two declarations of a key mean the same: equal but for their check's function
    object, which a module imported again makes anew (`must` says what it checks)."""
    return other is not None and replace(param, check=None) == replace(other, check=None)


def training_keys() -> tuple[str, ...]:
    """TrainConfig's keys, where runtime/config is loaded. It imports the model core, so it is
    looked up, not imported: every command loads it before it imports a user's module (the readers
    of --imports do); where it is not loaded (tests/conftest.py's --imports option, an exported
    folder's copy of this file) a key of training alone goes unchecked."""
    return tuple(getattr(sys.modules.get(TRAIN_CONFIG_MODULE), "TRAIN_KEYS", ()))


# -----------------------------------------------------------------------------
# A connection's parameters in a config


def declared_params() -> dict[str, MethodParam]:
    """Every registered connection's method parameters, by key."""
    return {param.key: param for cls in CONNECTIONS.values() for param in cls.params}


def resolve_connection_params(connection: str, given: dict[str, Any]) -> dict[str, Any]:
    """connection_params of a config: the parameters `connection` declares, given values checked
    (MethodParam.checked), the rest at their defaults. Another connection's key is refused,
    unless it is any_connection: that is checked too, then left out, as it changes nothing."""
    own = {p.key: p for p in CONNECTIONS[connection].params}
    declared = declared_params()
    unknown = sorted(k for k in given if k not in own and not (k in declared and declared[k].any_connection))
    if unknown:
        raise ValueError(
            f"connection_params {unknown} are not parameters of connection {connection!r}; its parameters are: {', '.join(own) or 'none'}."
        )
    for key, value in given.items():
        if key not in own:
            declared[key].checked(value)
    return {key: param.checked(given.get(key, param.default)) for key, param in own.items()}


def declared_keys_as_keywords(holder: str, declared: Callable[[], dict[str, Any]]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A dataclass __init__ wrapper: a key that `declared()` names, given as a keyword, joins the
    dict field `holder`, winning over a value there. GPTConfig(connection="p_spheret", spheret_p=0.25)
    (as configs saved up to commit 3ab3f93 hold it) and TrainConfig(optimizer="muon", muon_lr=0.01)."""

    def wrap(init: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **keys: Any) -> None:
            names = declared()  # read at call time: an entry registered later counts (never a field)
            params = {k: keys.pop(k) for k in [k for k in keys if k in names]}
            if params:
                keys[holder] = {**keys.get(holder, {}), **params}
            init(self, *args, **keys)

        return __init__

    return wrap


# -----------------------------------------------------------------------------
# GPTConfig's checks


def check_model_config(config: Any, sphere_connections: Callable[[], tuple[str, ...]]) -> None:
    """GPTConfig.__post_init__: raise a ValueError naming the key of the first value `config` (a
    GPTConfig) cannot take, in this order; on the way set config.connection_params (checked, the
    rest at their defaults) and config.bias (None resolved), which the later checks read.
    sphere_connections() names the connections that read SPHERE_KEYS (model.py's)."""
    if config.connection not in CONNECTIONS:
        raise ValueError(f"Unknown connection {config.connection!r}; valid connections are: {', '.join(CONNECTIONS)}.")
    config.connection_params = resolve_connection_params(config.connection, config.connection_params)
    if config.block not in BLOCKS:
        raise ValueError(f"Unknown block {config.block!r}; valid blocks are: {', '.join(BLOCKS)}.")
    config.bias = resolved_bias(config)
    for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
        if getattr(config, name) < 1:  # before the division below (n_head=0)
            raise ValueError(f"{name} must be a positive integer, got {getattr(config, name)}.")
    CONNECTIONS[config.connection].check_config(config)
    if config.n_embd % config.n_head != 0:
        raise ValueError(f"n_embd={config.n_embd} is not divisible by n_head={config.n_head}; choose n_embd as a multiple of n_head.")
    # LLaMA's block turns q and k by RoPE, whose rotate-half pairs dimension i with i + hs/2.
    # GPT-2's block (nGPT included: it normalises q and k per head) takes any head size.
    if config.block == "llama" and (config.n_embd // config.n_head) % 2:
        raise ValueError(
            f"block='llama' needs an even head size for RoPE's rotate-half, but n_embd={config.n_embd} / "
            f"n_head={config.n_head} gives {config.n_embd // config.n_head}; choose n_embd / n_head even (2 or more)."
        )
    if not 0 < config.angle_max <= math.pi:
        raise ValueError(f"angle_max must lie in (0, pi], got {config.angle_max}.")
    for name, valid in (("alpha_decay", ALPHA_DECAYS), ("sphere_impl", SPHERE_IMPLS), ("alpha_index", ALPHA_INDICES),
                        ("alpha_cap_grad", ALPHA_CAP_GRADS)):
        if getattr(config, name) not in valid:
            raise ValueError(f"Unknown {name} {getattr(config, name)!r}; valid values are: {', '.join(valid)}.")
    if not 0.0 <= config.dropout < 1.0:
        raise ValueError(f"dropout must lie in [0, 1), got {config.dropout}.")
    if config.mup_base_width < 0:
        raise ValueError(f"mup_base_width must be 0 (μP off) or a positive base width, got {config.mup_base_width}.")
    if not 0 <= config.mlp_width <= MAX_MLP_WIDTH:  # bounded: a typo must not be an allocator's traceback
        raise ValueError(f"mlp_width must be 0 (the block's own width) or a positive width up to {MAX_MLP_WIDTH}, got {config.mlp_width}.")
    if config.loss_chunk_tokens < 0:
        raise ValueError(f"loss_chunk_tokens must be 0 (the whole logits at once) or a positive number of tokens, got {config.loss_chunk_tokens}.")
    check_sphere_keys(config, sphere_connections)


def check_sphere_keys(config: Any, sphere_connections: Callable[[], tuple[str, ...]]) -> None:
    """The keys only the sphere connections read: valid values, and their defaults elsewhere."""
    if config.alpha_cap is not None and not config.alpha_cap > 0:
        raise ValueError(f"alpha_cap must be > 0 (or None for no cap), got {config.alpha_cap}.")
    if config.alpha_cap is None and config.alpha_cap_grad != "stop":
        raise ValueError(f"alpha_cap_grad={config.alpha_cap_grad!r} says how a learns above the cap, but alpha_cap is None "
                         "(no cap); set a cap or leave alpha_cap_grad at 'stop'.")
    if config.radius_cap is not None and not config.radius_cap * math.sqrt(config.n_embd) >= 1.0:
        raise ValueError(
            f"radius_cap must be at least 1 / sqrt(n_embd) = {1 / math.sqrt(config.n_embd):.4g} (the radius floor is 1), "
            f"or None for no cap; got {config.radius_cap}."
        )
    if config.connection in sphere_connections():
        return
    defaults = {f.name: f.default for f in fields(config) if f.name in SPHERE_KEYS}  # in field order
    changed = [k for k, default in defaults.items() if getattr(config, k) != default]
    if changed:
        raise ValueError(
            f"{', '.join(changed)} {'applies' if len(changed) == 1 else 'apply'} only to the sphere connections ({', '.join(sphere_connections())}), "
            f"not to connection {config.connection!r}; leave {'it at its default' if len(changed) == 1 else 'them at their defaults'}."
        )


def resolved_bias(config: Any) -> bool:
    """config.bias with None resolved: the block's own choice (on in GPT-2's), off for a connection
    without biases; bias=True for such a connection is refused."""
    allowed = CONNECTIONS[config.connection].biases
    if config.bias is None:
        return config.block == "gpt2" and allowed
    if config.bias and not allowed:
        raise ValueError(f"Connection {config.connection!r} has no biases; set bias=False (or leave it unset).")
    return bool(config.bias)
