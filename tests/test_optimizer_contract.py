"""The optimizer contract (issue 47): every group's rate is its own peak scaled by the schedule,
a resume trains under the current settings (or refuses a key the state fixes), checkpoints load
with plain torch.load, and tests generated for every registered optimizer (a user's module too:
`python -m pytest tests/test_optimizer_contract.py --imports=my_module`) check that its rate key
moves the loss and that a 2+2 resume is bit-exact.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import lion_optimizer  # noqa: F401 (registers lion, with its own rate key lion_lr)
import train
from markov_data import write_markov_data
from spheretnorm.experiments import launcher
from spheretnorm.model import CONNECTIONS, GPT, GPTConfig
from spheretnorm.mup import lr_scale, param_kind
from spheretnorm.optim import OPTIMIZERS, build_optimizer
from spheretnorm.runtime.checkpoint import load_checkpoint, rng_from_plain, rng_to_plain
from spheretnorm.runtime.cli import UsageError
from spheretnorm.runtime.config import ConfigError, TrainConfig, parse_config
from spheretnorm.runtime.device import rng_state, set_rng_state
from spheretnorm.runtime.schedule import apply_schedule, learning_rate_at

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ("--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4", "--global_batch_size=8",
        "--eval_iters=1", "--log_interval=1", "--warmup_iters=2", "--lr_decay_iters=40", "--learning_rate=3e-3",
        "--min_lr=3e-4", "--device=cpu", "--dtype=float32", "--wandb_log=false", "--eval_interval=100")
# Keys an optimizer needs in these tests beyond its defaults (MuonH at its initial radius barely moves a tiny model).
EXTRA = {"muonh": ("--hyperball_radius=1",)}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_markov_data(tmp_path_factory.mktemp("contract_data"))


def run(data_dir: Path, out: Path, *extra: str) -> list[float]:
    """Train in this process; the train losses it logged (this session's and earlier ones')."""
    train.main([f"--data_dir={data_dir}", f"--out_dir={out}", *TINY, *extra])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["train_loss"] for r in rows if r["kind"] == "train"]


def saved_groups(out: Path, inner: int | None = None) -> list[dict[str, Any]]:
    """The optimizer's param groups in the checkpoint (those the run trained with last); inner:
    those of one inner optimizer only (Muon's: 0)."""
    state = load_checkpoint(out / "ckpt.pt")["optimizer"]
    states = state.get("optimizers", [state])
    return [g for s in (states if inner is None else states[inner:inner + 1]) for g in s["param_groups"]]


# -----------------------------------------------------------------------------
# 1. Each group scales its own peak rate


def test_a_users_optimizer_trains_at_its_own_rate_key(data_dir: Path, tmp_path: Path) -> None:
    slow = run(data_dir, tmp_path / "slow", "--optimizer=lion", "--lion_lr=1e-5", "--max_iters=3")
    fast = run(data_dir, tmp_path / "fast", "--optimizer=lion", "--lion_lr=3e-2", "--max_iters=3")
    assert slow[0] == fast[0] and slow[2] != fast[2]  # the same start, then lion_lr decides
    factor = learning_rate_at(2, TrainConfig(learning_rate=3e-3, min_lr=3e-4, warmup_iters=2, lr_decay_iters=40)) / 3e-3
    assert all(g["lr"] == pytest.approx(3e-2 * factor, rel=1e-12) for g in saved_groups(tmp_path / "fast"))


def old_rate(group: dict[str, Any], names: dict[int, str], step: int, cfg: TrainConfig, model: GPT, hidden_peak: float | None) -> float:
    """A group's rate by the schedule of earlier commits: learning_rate_at(step) * lr_scale, with
    lr_scale the μP factor of an AdamW group, or (peak * μP factor) / learning_rate of a hidden one."""
    ratio, p = model.config.mup_ratio, group["params"][0]
    kind = param_kind(names[id(p)], p)
    if hidden_peak is not None:
        step_rule = OPTIMIZERS[cfg.optimizer].hidden_step(cfg.optimizer_params)
        scale = hidden_peak * (lr_scale("hidden", ratio, step_rule) if ratio != 1.0 else 1.0) / cfg.learning_rate
    else:
        rule = CONNECTIONS[model.config.connection].optimizer_rule(names[id(p)], p)
        scale = (lr_scale(kind, ratio) if ratio != 1.0 else 1.0) * rule.lr_factor
    return learning_rate_at(step, cfg) * scale


@pytest.mark.parametrize("optimizer", ["adamw", "muon", "adamh", "muonh"])
@pytest.mark.parametrize("width,base", [(32, 0), (72, 8)])  # μP at 1/9: (lr / 9) / lr is not 1/9 at lr 1.1e-3
def test_built_in_optimizers_keep_every_rate_of_earlier_commits_bit_for_bit(optimizer: str, width: int, base: int) -> None:
    cfg = parse_config([f"--optimizer={optimizer}", "--learning_rate=1.1e-3", "--min_lr=1.1e-4", "--warmup_iters=10",
                        "--lr_decay_iters=100"], world_size=0).train
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=width, block_size=16, vocab_size=64, mup_base_width=base))
    opt = build_optimizer(model, cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    inner = list(opt)
    for step in (0, 3, 9, 10, 37, 99, 150):
        apply_schedule(opt.param_groups, step, cfg)
        for i, o in enumerate(inner):
            peak = cfg.optimizer_params.get(OPTIMIZERS[optimizer].rate_key) if i == 0 and len(inner) > 1 else None
            assert [g["lr"] for g in o.param_groups] == [old_rate(g, names, step, cfg, model, peak) for g in o.param_groups]


# -----------------------------------------------------------------------------
# 2. A resume applies the current settings, or refuses


def test_a_resume_applies_changed_weight_decay_and_beta2(data_dir: Path, tmp_path: Path) -> None:
    run(data_dir, tmp_path, "--max_iters=2")
    run(data_dir, tmp_path, "--max_iters=4", "--init_from=resume", "--weight_decay=0.5", "--beta2=0.5")
    groups = saved_groups(tmp_path)
    assert sorted(g["weight_decay"] for g in groups) == [0.0, 0.5] and {tuple(g["betas"]) for g in groups} == {(0.9, 0.5)}
    recorded = json.loads((tmp_path / "config.json").read_text())
    assert recorded["weight_decay"] == 0.5 and recorded["beta2"] == 0.5


def test_a_changed_learning_rate_on_resume_leaves_muons_rate_at_muon_lr(data_dir: Path, tmp_path: Path) -> None:
    run(data_dir, tmp_path, "--optimizer=muon", "--max_iters=2")
    run(data_dir, tmp_path, "--optimizer=muon", "--max_iters=4", "--init_from=resume", "--learning_rate=6e-3", "--muon_momentum=0.8")
    muon = saved_groups(tmp_path, inner=0)
    factor = learning_rate_at(3, TrainConfig(learning_rate=6e-3, min_lr=3e-4, warmup_iters=2, lr_decay_iters=40)) / 6e-3
    assert [g["lr"] for g in muon] == pytest.approx([0.02 * factor] * len(muon), rel=1e-12)  # not doubled with learning_rate
    assert {g["momentum"] for g in muon} == {0.8}


def test_a_resume_refuses_a_radius_the_optimizer_state_holds(data_dir: Path, tmp_path: Path) -> None:
    run(data_dir, tmp_path, "--optimizer=adamh", "--max_iters=2")
    with pytest.raises(ConfigError, match=r"^Refusing to resume with hyperball_radius=1\.0: .* pass --hyperball_radius=0\.0"):
        run(data_dir, tmp_path, "--optimizer=adamh", "--max_iters=4", "--init_from=resume", "--hyperball_radius=1")


# -----------------------------------------------------------------------------
# 4. Generated for every registered optimizer (a user's module: --imports=MODULE)


def rate_values(optimizer: str) -> tuple[str, float]:
    """The optimizer's rate key and a valid value of it (the sweep's key: OptimizerRecipe.rate_key)."""
    key = OPTIMIZERS[optimizer].rate_key
    if key == "learning_rate":
        return key, 3e-3
    return key, next(p.default for p in OPTIMIZERS[optimizer].params if p.key == key)


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_the_rate_key_moves_the_loss_within_3_steps(optimizer: str, data_dir: Path, tmp_path: Path) -> None:
    key, value = rate_values(optimizer)
    common = (f"--optimizer={optimizer}", "--max_iters=3", *EXTRA.get(optimizer, ()))
    base = run(data_dir, tmp_path / "base", *common, f"--{key}={value}")
    faster = run(data_dir, tmp_path / "faster", *common, f"--{key}={value * 4}")
    assert base[:3] != faster[:3], f"{key} changed nothing in 3 steps of {optimizer}"


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_a_2_plus_2_resume_is_bit_exact(optimizer: str, data_dir: Path, tmp_path: Path) -> None:
    common = (f"--optimizer={optimizer}", "--dropout=0.1", *EXTRA.get(optimizer, ()))  # dropout: the RNG streams too
    whole = run(data_dir, tmp_path / "whole", *common, "--max_iters=4")
    run(data_dir, tmp_path / "split", *common, "--max_iters=2")
    split = run(data_dir, tmp_path / "split", *common, "--max_iters=4", "--init_from=resume")
    assert split == whole
    a, b = (load_checkpoint(tmp_path / d / "ckpt.pt")["model"] for d in ("whole", "split"))
    assert all(torch.equal(a[k], b[k]) for k in a)


# -----------------------------------------------------------------------------
# 7. Checkpoints load with plain torch.load


def test_a_checkpoint_loads_with_torch_load_weights_only(data_dir: Path, tmp_path: Path) -> None:
    run(data_dir, tmp_path, "--max_iters=1")
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 1 and isinstance(ckpt["rng"][0]["numpy"]["keys"], torch.Tensor)


def test_the_plain_rng_state_restores_every_stream() -> None:
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.standard_normal()  # a cached Gaussian in numpy's state
    saved = rng_to_plain(rng_state())
    draws = (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist())
    set_rng_state(rng_from_plain(saved))
    assert (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist()) == draws


# -----------------------------------------------------------------------------
# 8. The launcher without torchrun on PATH


def test_the_launcher_says_in_one_line_when_torchrun_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no torchrun
    job = launcher.Job(None, "train", ["torchrun", "--standalone", "train.py"])  # type: ignore[arg-type]
    with pytest.raises(UsageError) as refused:
        launcher.execute([job], "local")
    message = str(refused.value)
    assert message.startswith("torchrun was not found on PATH;") and "torch.distributed.run" in message and "\n" not in message
