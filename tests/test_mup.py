"""Tests of spherical μP (mup.py): off and at the base width it is today's model and optimizer
exactly; at another width every parameter follows the table; the schedule, checkpoints and
resume keep it; and a tiny coordinate check shows what the rules are for.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from spheretnorm.optim import build_optimizer
from spheretnorm.runtime.config import TrainConfig
from spheretnorm import mup
import train
from spheretnorm.runtime.batches import EVAL_STREAM, TRAIN_STREAM, batch_offsets, get_batch
from spheretnorm.runtime.schedule import learning_rate_at
from spheretnorm.runtime.token_files import open_split
from spheretnorm.model import CONNECTIONS, GPT, GPTConfig
from spheretnorm.runtime.checkpoint import load_checkpoint, load_model
from spheretnorm.experiments import lr_transfer as mup_transfer
from spheretnorm.experiments.coordinates import Setup, coord_check
from tests.test_train import VOCAB, data_dir, tiny_args  # noqa: F401  (data_dir is a fixture)
from spheretnorm.runtime.config import ConfigError, TrainConfig, parse_config

BASE_LR = 1e-2
HIDDEN_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def config(width: int, base: int = 0, connection: str = "p_spheret") -> GPTConfig:
    return GPTConfig(
        n_layer=2, n_head=width // 16, n_embd=width, vocab_size=40, block_size=16,
        connection=connection, mup_base_width=base,
    )


def build(cfg: GPTConfig, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(cfg)


def optimizer(model: GPT) -> torch.optim.AdamW:
    return build_optimizer(model, TrainConfig(weight_decay=0.1, learning_rate=BASE_LR, min_lr=0.0, beta1=0.9, beta2=0.95), "cpu")


def group_layout(model: GPT, opt: torch.optim.Optimizer) -> list[tuple]:
    """Each group as (parameter names, lr, weight decay, lr_scale), comparable across models."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [
        (tuple(names[id(p)] for p in g["params"]), g["lr"], g["weight_decay"], g.get("lr_scale", 1.0))
        for g in opt.param_groups
    ]


def lr_of(opt: torch.optim.Optimizer) -> dict[int, float]:
    return {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}


def batch(vocab: int = 40, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, vocab, (4, 16), generator=torch.Generator().manual_seed(seed))
    return x, torch.roll(x, -1, dims=1)


# -----------------------------------------------------------------------------
# Off, and at the base width: today's model exactly


def takes_mup(connection: str) -> bool:
    """Whether a connection runs under μP at all (nGPT refuses it: its scales are its own)."""
    try:
        GPTConfig(n_embd=32, n_head=2, mup_base_width=32, connection=connection)
    except ValueError:
        return False
    return True


def test_ngpt_refuses_mup_with_the_key_named() -> None:
    assert not takes_mup("ngpt")
    with pytest.raises(ValueError, match="mup_base_width=0"):
        GPTConfig(n_embd=32, n_head=2, mup_base_width=32, connection="ngpt")


@pytest.mark.parametrize("connection", [c for c in CONNECTIONS if takes_mup(c)])
def test_base_width_is_todays_model_and_optimizer(connection: str) -> None:
    today, at_base = build(config(32, 0, connection)), build(config(32, 32, connection))
    for (name, a), (_, b) in zip(today.state_dict().items(), at_base.state_dict().items()):
        assert torch.equal(a, b), name
    opt_today, opt_base = optimizer(today), optimizer(at_base)
    assert group_layout(today, opt_today) == group_layout(at_base, opt_base)
    assert len(opt_today.param_groups) == 2  # decayed matrices, undecayed vectors: as before μP

    # Two optimizer steps: same losses and weights, bit for bit.
    x, y = batch()
    for model, opt in ((today, opt_today), (at_base, opt_base)):
        for _ in range(2):
            _, loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    assert torch.equal(today(x, y)[1], at_base(x, y)[1])
    for (name, a), (_, b) in zip(today.state_dict().items(), at_base.state_dict().items()):
        assert torch.equal(a, b), name


# -----------------------------------------------------------------------------
# Another width: the table


@pytest.mark.parametrize("connection", ["pre_ln", "p_spheret", "pre_dyt"])
def test_non_base_width_follows_the_table(connection: str) -> None:
    width, base = 128, 32
    ratio = base / width
    standard, scaled = build(config(width, 0, connection)), build(config(width, base, connection))
    opt_std, opt_mup = optimizer(standard), optimizer(scaled)
    lr_std, lr_mup = lr_of(opt_std), lr_of(opt_mup)
    kinds = {"hidden": 0, "embedding": 0, "vector": 0}
    for (name, p_std), (_, p_mup) in zip(standard.named_parameters(), scaled.named_parameters()):
        hidden = name.endswith(HIDDEN_SUFFIXES)
        embedding = name in ("transformer.wte.weight", "transformer.wpe.weight")
        kind = "hidden" if hidden else "embedding" if embedding else "vector"
        assert mup.param_kind(name, p_mup) == kind, name
        kinds[kind] += 1
        # Init: the same draw, with the hidden std times sqrt(n0 / n) (0.02 -> 0.01 here).
        init = math.sqrt(ratio) if hidden else 1.0
        assert torch.allclose(p_mup, p_std * init, rtol=0, atol=1e-9), name
        # LR: hidden matrices n0 / n, everything else the base LR.
        assert lr_mup[id(p_mup)] == pytest.approx(BASE_LR * (ratio if hidden else 1.0), rel=1e-12), name
        assert lr_std[id(p_std)] == BASE_LR
    assert kinds["hidden"] == 4 * 2 and kinds["embedding"] == 2 and kinds["vector"] > 0
    fc = torch.cat([b.mlp.c_fc.weight.flatten() for b in scaled.transformer.h])
    assert fc.std().item() == pytest.approx(0.02 * math.sqrt(ratio), rel=0.05)


def test_logits_get_the_output_multiplier() -> None:
    """Tied head: same weights, logits times n0 / n (the embedding itself is not rescaled)."""
    standard, scaled = build(config(64, 0)), build(config(64, 16))
    scaled.load_state_dict(standard.state_dict())
    x, _ = batch()
    assert torch.allclose(scaled(x)[0], standard(x)[0] * 0.25, atol=1e-6)
    assert scaled.transformer.wte.weight is scaled.lm_head.weight  # still one tied matrix


def test_an_unknown_matrix_must_join_the_table() -> None:
    with pytest.raises(ValueError, match=r"'transformer.h.0.extra.weight'.*hidden, embedding, vector"):
        mup.param_kind("transformer.h.0.extra.weight", torch.zeros(2, 2))


def test_negative_base_width_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"^mup_base_width must be 0 \(μP off\) or a positive base width, got -8\.$"):
        parse_config(["--mup_base_width=-8"], world_size=1)


# -----------------------------------------------------------------------------
# Training: the schedule keeps each group's factor; checkpoints and resume keep the key


def test_schedule_scales_each_group_and_resume_keeps_mup(data_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    # tiny_args: width 32, learning_rate 3e-3, warm-up 2; base 8 puts hidden matrices at lr / 4.
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=4", "--eval_interval=4", "--mup_base_width=8"))
    ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    assert ckpt["model_config"]["mup_base_width"] == 8
    lr_last = learning_rate_at(3, TrainConfig(learning_rate=3e-3, min_lr=3e-4, warmup_iters=2, lr_decay_iters=40))
    scales = sorted(g["lr_scale"] for g in ckpt["optimizer"]["param_groups"])
    assert scales == [0.25, 1.0, 1.0]
    for group in ckpt["optimizer"]["param_groups"]:
        assert group["lr"] == pytest.approx(lr_last * group["lr_scale"], rel=1e-12)
    assert load_model(ckpt).config.mup_ratio == 0.25

    with pytest.raises(ConfigError, match=r"mup_base_width: checkpoint has 8, the config/command line asks for 16"):
        train.main(tiny_args(data_dir, tmp_path, "--max_iters=6", "--init_from=resume", "--mup_base_width=16"))
    # Without the key the checkpoint's μP is used.
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=6", "--eval_interval=2", "--init_from=resume"))
    resumed = load_checkpoint(tmp_path / "ckpt.pt")
    assert resumed["iter_num"] == 6 and resumed["model_config"]["mup_base_width"] == 8
    assert sorted(g["lr_scale"] for g in resumed["optimizer"]["param_groups"]) == [0.25, 1.0, 1.0]


def test_mup_off_model_ignores_the_table() -> None:
    """mup_base_width 0 at any width: ratio 1, no lr_scale other than 1, today's init stds."""
    cfg = replace(config(128), mup_base_width=0)
    assert cfg.mup_ratio == 1.0
    model = build(cfg)
    assert all(g["lr_scale"] == 1.0 for g in optimizer(model).param_groups)
    fc = torch.cat([b.mlp.c_fc.weight.flatten() for b in model.transformer.h])
    assert fc.std().item() == pytest.approx(0.02, rel=0.05)


# -----------------------------------------------------------------------------
# A tiny coordinate check: what the rules are for


def coordinate_check(connection: str, data_dir: Path, optimizer: str = "adamw", widths: tuple[int, ...] = (32, 128, 512)) -> dict[str, Any]:  # noqa: F811
    """Per-layer angular velocity and update size at `widths`: 2 layers, 3 steps at lr 3e-3 (Muon's
    and the Hyperball's own rates at their defaults)."""
    setup = Setup(n_layer=2, head_dim=16, block_size=32, batch_size=4, steps=3, lr=3e-3)
    tokens = open_split(data_dir, "train")

    def draw(stream: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        offsets = batch_offsets(0, stream, index, setup.batch_size, len(tokens), setup.block_size)
        return get_batch(tokens, offsets, setup.block_size, "cpu")

    batches = [draw(TRAIN_STREAM, i) for i in range(setup.steps)]
    probe, _ = draw(EVAL_STREAM, 0)
    results = coord_check([connection], list(widths), setup, VOCAB, batches, probe, optimizers=(optimizer,))
    return next(iter(results.values()))


@pytest.mark.parametrize("connection", ["p_spheret", "pre_ln"])
def test_coordinate_check_mup_keeps_angular_velocity_flat(connection: str, data_dir: Path) -> None:  # noqa: F811
    results = coordinate_check(connection, data_dir)
    blocks = range(1, 3)  # the blocks' outputs: embed (index 0) follows no hidden matrix
    for layer in blocks:
        mup_angles = [results["mup"][w]["angle"][layer] for w in (32, 128, 512)]
        std_angles = [results["standard"][w]["angle"][layer] for w in (32, 128, 512)]
        # μP: within 25% over a 16x range of widths (measured: within 10%).
        assert max(mup_angles) < 1.25 * min(mup_angles), (layer, mup_angles)
        # Standard: the same LR turns the features more than twice as fast at 16x the width
        # (measured: 3x to 6x).
        assert std_angles[-1] > 2.0 * std_angles[0], (layer, std_angles)
        assert std_angles[0] < std_angles[1] < std_angles[2], (layer, std_angles)


@pytest.mark.parametrize("optimizer,standard_trend", [("muon", "falls"), ("adamh", "grows")])
def test_each_optimizers_mup_rule_keeps_its_update_width_free(optimizer: str, standard_trend: str, data_dir: Path) -> None:  # noqa: F811
    """The step's own size, ||dW x|| / ||W x||, at widths 32 and 256 (8x): under μP within 35% for
    Muon (e = 0: measured 4%) and AdamH (e = 1/2: measured 20%). Standard, without the rule, Muon's
    falls below half (std 0.02 makes ||W||_2 grow as sqrt(n); measured 0.37x) and AdamH's more than
    doubles (measured 2.2x). MuonH's rule (e = 0) holds for updates of full rank only: docs/MUP.md."""
    results = coordinate_check("p_spheret", data_dir, optimizer, widths=(32, 256))
    for layer in (1, 2):
        mup = [results["mup"][w]["update"][layer] for w in (32, 256)]
        std = [results["standard"][w]["update"][layer] for w in (32, 256)]
        assert max(mup) < 1.35 * min(mup), (layer, mup)
        assert (std[1] < 0.5 * std[0]) if standard_trend == "falls" else (std[1] > 1.8 * std[0]), (layer, std)


# -----------------------------------------------------------------------------
# The transfer study's bookkeeping


def test_transfer_study_trains_the_base_width_once() -> None:
    from spheretnorm.experiments.study import Place, default_grid, grid_points, point, train_argv

    sweep = mup_transfer.transfer_sweep(["pre_ln"], [64, 256], {"adamw": (1e-3, 2e-3), "muonh": (0.01, 0.02, 0.04)}, 3, 32, 100)
    points = grid_points(sweep)
    adamw = [p for p in points if p["optimizer"] == "adamw"]
    assert len(adamw) == 8 and len({sweep.folder(p) for p in adamw}) == 6  # the base width's μP points: no runs of their own
    assert len(points) == 8 + 12  # each optimizer its own grid
    base_mup = point(method="pre_ln", optimizer="adamw", width=64, param="mup", lr=1e-3)
    assert sweep.folder(base_mup) == sweep.folder(base_mup.but(param="standard")) == "pre_ln/w64_standard/lr0.001"
    args = train_argv(sweep, point(method="pre_ln", optimizer="adamw", width=256, param="mup", lr=2e-3), Place(Path("out"), Path("data")))
    assert {"--n_embd=256", "--n_head=8", "--mup_base_width=64", "--learning_rate=0.002", "--min_lr=0.0002"} <= set(args)
    # Another optimizer sweeps its own rate key; its AdamW part stays at the base rate.
    muonh = point(method="pre_ln", optimizer="muonh", width=256, param="mup", lr=0.04)
    assert sweep.folder(muonh) == "pre_ln/muonh/w256_mup/lr0.04"
    args = train_argv(sweep, muonh, Place(Path("out"), Path("data")))
    assert {"--optimizer=muonh", "--hyperball_lr=0.04", "--learning_rate=0.004", "--min_lr=0.0004", "--mup_base_width=64"} <= set(args)
    assert default_grid("muon") == (0.005, 0.01, 0.02, 0.04, 0.08)


def test_transfer_study_measures_the_optimum_move_in_grid_steps() -> None:
    lrs = [1e-3, 2e-3, 4e-3, 8e-3]

    def row(param: str, width: int, lr: float, loss: float | None, status: str = "ok") -> dict[str, Any]:
        return {"method": "pre_ln", "param": param, "width": width, "lr": lr, "val_loss": loss, "status": status}

    rows = [
        row("standard", 64, 1e-3, 2.5), row("standard", 64, 4e-3, 2.2), row("standard", 64, 8e-3, 2.3),
        row("standard", 256, 1e-3, 2.1), row("standard", 256, 4e-3, 2.3), row("standard", 256, 8e-3, None, "diverged"),
        row("mup", 64, 4e-3, 2.2), row("mup", 256, 4e-3, 2.0), row("mup", 256, 8e-3, 1.9, "stuck at unigram"),
    ]
    moves = {m["param"]: m for m in mup_transfer.optimum_moves(rows, {"adamw": tuple(lrs)})}
    assert moves["standard"]["grid_steps"] == -2 and moves["standard"]["best_lr"] == {"64": 4e-3, "256": 1e-3}
    assert moves["mup"]["grid_steps"] == 0  # a run stuck at unigram is never the optimum
