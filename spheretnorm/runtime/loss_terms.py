"""Extra loss terms: a loss idea is one function, registered by name with the keys it reads.

    import torch
    from spheretnorm.model import MethodParam
    from spheretnorm.runtime.loss_terms import register_loss_term

    @register_loss_term("z_loss", MethodParam("z_loss", 0.0, "weight of the logit z-loss (0: off)"))
    def z_loss(logits, targets, train):
        return train.z_loss * torch.logsumexp(logits.float(), dim=-1).pow(2).mean()

A term takes the step's logits (B, T, V), its targets (B, T) and the run's TrainConfig (its keys
read as attributes, train.z_loss) and returns a scalar tensor (shape (), a floating dtype) added to
the cross-entropy. Its keys are training keys like an optimizer's; the first is its switch: the term
is on only where that key is not at its default, so a run that does not set it computes exactly
what it computed before the term existed. docs/ARCHITECTURE.md ("Adding a loss term") says the
rest: the checks of a term's value, its keys in checkpoints, and its tests
(tests/test_loss_term_contract.py).
"""

from __future__ import annotations

import dataclasses
import traceback
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch

from spheretnorm.model import KEYED_REGISTRIES, MethodParam, check_registration
from spheretnorm.runtime.imports import import_recorded

Config = TypeVar("Config")  # config.TrainConfig, not imported here: config.py imports this module

# (logits, targets, train config) -> a scalar tensor added to the cross-entropy
LossTerm = Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor]

LOSS_TERMS: dict[str, LossTerm] = {}
KEYED_REGISTRIES["loss term"] = LOSS_TERMS  # its names and keys checked with the connections' and optimizers'


def register_loss_term(name: str, *params: MethodParam, contract_value: Any = None) -> Callable[[LossTerm], LossTerm]:
    """Function decorator: add the function to every training step as loss term `name` where its
    first key (params[0], the switch) is not at its default; a name or key another entry has is
    refused (model.check_registration). contract_value: the switch's value that the contract tests
    train with; None: one they derive from the default (a text switch has none without must='one of: ...')."""
    if not params:
        raise TypeError(f"@register_loss_term({name!r}) needs at least one MethodParam: the key that switches the term on.")
    if contract_value is not None:
        check_contract_value(name, params[0], contract_value)

    def wrap(fn: LossTerm) -> LossTerm:
        fn.params = params  # type: ignore[attr-defined]  # what check_registration and the config read
        fn.contract_value = contract_value  # type: ignore[attr-defined]
        check_registration("loss term", name, fn, __name__)  # type: ignore[arg-type]
        LOSS_TERMS[name] = fn
        return fn

    return wrap


def check_contract_value(name: str, switch: MethodParam, value: Any) -> None:
    """Refuse, in one sentence, a contract_value that would not switch term `name` on: the contract
    tests would train it off and find it changes nothing."""
    try:
        on = switch.checked(value) != switch.default
    except ValueError:
        on = False
    if not on:
        raise ValueError(
            f"@register_loss_term({name!r}): contract_value={value!r} is no value that switches the term on; "
            f"give a valid value of {switch.key} other than its default {switch.default!r}."
        )


def loss_term_params() -> dict[str, MethodParam]:
    """Every registered loss term's keys, by key (read at call time: a term registered later counts)."""
    return {p.key: p for fn in LOSS_TERMS.values() for p in fn.params}  # type: ignore[attr-defined]


def resolve_loss_params(given: dict[str, Any]) -> dict[str, Any]:
    """The loss_params of a training config: every registered term's keys, given values checked,
    the rest at their defaults; a key no registered term declares is refused in one sentence."""
    declared = loss_term_params()
    unknown = sorted(k for k in given if k not in declared)
    if unknown:
        raise ValueError(
            f"loss_params {unknown} are no registered loss term's keys (registered: {', '.join(declared) or 'none'}); "
            "a loss term of your own module needs --imports=MODULE."
        )
    return {key: param.checked(given.get(key, param.default)) for key, param in declared.items()}


def active_loss_terms(train: Any) -> list[str]:
    """The terms that are on for a training config: those whose switch (first key) is not at its default."""
    values = getattr(train, "loss_params", None) or {}
    return [name for name, fn in LOSS_TERMS.items() if values.get(fn.params[0].key, fn.params[0].default) != fn.params[0].default]  # type: ignore[attr-defined]


def loss_term_values(logits: torch.Tensor, targets: torch.Tensor, train: Any, error: type[Exception]) -> dict[str, torch.Tensor]:
    """The value of each term that is on, by name ({} when none is: the loss is the cross-entropy
    alone, untouched), checked (called_term)."""
    return {name: called_term(name, logits, targets, train, error) for name in active_loss_terms(train)}


def called_term(name: str, logits: torch.Tensor, targets: torch.Tensor, train: Any, error: type[Exception]) -> torch.Tensor:
    """Loss term `name`'s value on one micro-batch. A term that raises, or returns anything but a
    scalar tensor of a floating dtype, is one `error` naming it: without this, an exception is a
    traceback through the step, a (B, T) tensor torch's "grad can be implicitly created only for
    scalar outputs", and None no term at all. The checks read the shape and dtype only: no GPU sync."""
    fn = LOSS_TERMS[name]
    try:
        value = fn(logits, targets, train)
    except torch.OutOfMemoryError:
        raise  # the machine's limit, not the term's fault: the crash it is without a term
    except Exception as e:
        first_line = next((line for line in str(e).splitlines() if line.strip()), "")  # torch's messages run to many lines
        said = f"{type(e).__name__}: {first_line}" if first_line else type(e).__name__
        raise error(f"loss term {name!r} raised {said} (at {raised_at(fn, e)}); fix it, or turn it off with {switch_off(name)}.") from e
    if not (isinstance(value, torch.Tensor) and value.dim() == 0 and value.is_floating_point()):
        raise error(
            f"loss term {name!r} returned {described(value)}, not the scalar tensor (shape (), a floating dtype) that is added "
            f"to the cross-entropy; return one (a mean over the batch, say), or turn the term off with {switch_off(name)}."
        )
    return value


def switch_off(name: str) -> str:
    """'--z_loss=0.0': the setting that turns loss term `name` off (its switch at its default)."""
    switch = LOSS_TERMS[name].params[0]  # type: ignore[attr-defined]
    return f"--{switch.key}={switch.default}"


def described(value: Any) -> str:
    """What a term returned, as its error says it: 'None', 'a tensor of shape (8, 64)', 'a float'."""
    if value is None:
        return "None"
    if not isinstance(value, torch.Tensor):
        return f"a {type(value).__name__}"
    return f"a tensor of dtype {value.dtype}" if value.dim() == 0 else f"a tensor of shape {tuple(value.shape)}"


def raised_at(fn: LossTerm, error: BaseException) -> str:
    """'zloss_term.py:12': the deepest line of the term's own file that `error` passed through (its
    traceback is not printed), else the module that registered the term."""
    source = getattr(getattr(fn, "__code__", None), "co_filename", None)
    lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__) if frame.filename == source]
    return f"{Path(source).name}:{lines[-1]}" if lines and source else str(getattr(fn, "__module__", "its module"))


def unregistered_loss_keys(saved_train: Any) -> list[str]:
    """The keys a saved training config (a checkpoint's train_config) holds in its loss_params that
    no registered loss term declares, sorted ([] when none)."""
    held = saved_train.get("loss_params") if isinstance(saved_train, dict) else None
    declared = loss_term_params()
    return sorted(str(key) for key in held if key not in declared) if isinstance(held, dict) else []


def with_recorded_loss_terms(train: Config, saved_train: dict[str, Any], source: str, error: type[Exception]) -> Config:
    """The training config of a resume (`train`), knowing every loss term its checkpoint records
    (saved_train: its train_config; `source` names the file). A recorded term is recorded code: its
    modules are imported with the user's consent only (imports.import_recorded). The terms' keys
    then join train's loss_params at the command line's values, else their defaults, so that a
    resume applies and says a changed key as any other (identity.resume_changes). A recorded key
    that no module declares even then is one `error`."""
    keys = unregistered_loss_keys(saved_train)
    if keys:
        import_recorded(saved_train, f"{source} (its loss_params {', '.join(keys)})", error, needed=True)
    missing = unregistered_loss_keys(saved_train)
    if missing:
        raise error(
            f"{source} records loss_params {missing}, which no registered loss term declares (the registered terms' keys: "
            f"{', '.join(loss_term_params()) or 'none'}); pass --imports=MODULE for the module of that loss term, "
            "without which a resume can neither keep nor change its keys."
        )
    if set(train.loss_params) == set(loss_term_params()):
        return train
    # Terms registered since `train` was parsed (here, or by the checkpoint's reader with consent): resolved again.
    return dataclasses.replace(train, loss_params=dict(train.loss_params))
