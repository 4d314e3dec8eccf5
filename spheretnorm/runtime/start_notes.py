"""The lines train.py prints as a run starts, about choices a first run easily gets wrong: how
many CPU threads run (and the thread default itself), a warm-up as long as the run, a sphere
connection under a Hyperball optimizer at its initial radius, and a key not given that follows
another (lr_decay_iters: max_iters, or on a resume the checkpoint's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spheretnorm.model import CONNECTIONS, GPTConfig, SphereConnection
from spheretnorm.optim import OPTIMIZERS, Hyperball
from spheretnorm.runtime.config import FOLLOWS, TrainConfig
from spheretnorm.runtime.identity import keep_recorded_keys
from spheretnorm.runtime.distributed import print0
from spheretnorm.runtime.device import set_cpu_threads


def warmup_note(train: TrainConfig) -> str | None:
    """A warning when the warm-up lasts the whole run: the peak rate is never reached."""
    if train.eval_only or train.warmup_iters < train.max_iters:
        return None
    return (
        f"warning: warmup_iters={train.warmup_iters} >= max_iters={train.max_iters}: the learning rate never reaches its "
        f"peak and the collapse alarm never counts; for a short run set --warmup_iters below {train.max_iters}."
    )


def hyperball_note(train: TrainConfig, model: GPTConfig) -> str | None:
    """A note when a sphere connection runs a Hyperball optimizer at the matrices' initial radius,
    which holds every sphere step at its init size (docs/OPTIMIZERS.md, "With a sphere connection")."""
    recipe, connection = OPTIMIZERS.get(train.optimizer), CONNECTIONS.get(model.connection)
    if recipe is None or connection is None or not issubclass(recipe, Hyperball) or not issubclass(connection, SphereConnection):
        return None
    if train.optimizer_params.get("hyperball_radius", 0) != 0:
        return None
    return (
        f"note: {train.optimizer} keeps each block matrix at its initial norm (hyperball_radius=0), which holds "
        f"{model.connection}'s sphere steps small and barely trains it; --hyperball_radius=1 is what docs/OPTIMIZERS.md measured best."
    )


def announce_start(train: TrainConfig, model: GPTConfig, device: str) -> None:
    """Set the CPU threads and print (rank 0) the lines above that apply to this run."""
    for line in (set_cpu_threads(device), warmup_note(train), hyperball_note(train, model)):
        if line:
            print0(line)


def settle_derived_keys(train: TrainConfig, derived: Sequence[str], saved_train: dict[str, Any] | None) -> TrainConfig:
    """train with its derived keys (ParsedConfig.derived) at a resumed checkpoint's values
    (identity.keep_recorded_keys), and the line (rank 0) naming the value each took: the key it
    follows', or the checkpoint's; none for an evaluation, which follows no schedule."""
    train = keep_recorded_keys(train, derived, saved_train)
    if train.eval_only or not derived:
        return train
    if saved_train is not None:
        told = [f"{k}={getattr(train, k)}, as the checkpoint records (a resume keeps its schedule)" for k in derived]
    else:
        told = [f"{k}={getattr(train, k)}, following {FOLLOWS[k]}" for k in derived]
    print0(f"NOTE: not given, so {'; '.join(told)}; set {', '.join(f'--{k}' for k in derived)} to choose.")
    return train
