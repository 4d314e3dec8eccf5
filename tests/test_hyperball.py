"""The Hyperball optimizers (adamh, muonh) and μP's rule for every optimizer, against equations
written here: Adam's and Muon's directions by hand (Muon's through torch.optim.Muon's own
Newton-Schulz), the sphere's radius after many steps, and each optimizer's group rates under μP
from the exponents docs/MUP.md derives. FSDP2 (whole-matrix norms over shards, a sharded
checkpoint's radii): tests/test_fsdp.py."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch.optim._muon import _zeropower_via_newtonschulz

from spheretnorm.model import GPT, GPTConfig
from spheretnorm.optim import AdamH, MuonH, build_optimizer
from spheretnorm.runtime.config import parse_config

SHAPES = [(48, 16), (16, 40)]


def frob(x: torch.Tensor) -> torch.Tensor:
    return x.pow(2).sum().sqrt()


def on_sphere(w: torch.Tensor, direction: torch.Tensor, radius: float, lr: float) -> torch.Tensor:
    """W' = R (W - lr R D/||D||) / ||W - lr R D/||D|||| (the paper's Hyperball step)."""
    moved = w - lr * radius * direction / frob(direction)
    return radius * moved / frob(moved)


def grads(step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(*shape, generator=gen, dtype=torch.float64) for shape in SHAPES]


def start() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return [0.1 * torch.randn(*shape, generator=gen, dtype=torch.float64) for shape in SHAPES]


def test_adamh_follows_adams_direction_on_the_sphere() -> None:
    lr, b1, b2, eps = 0.05, 0.9, 0.95, 1e-8
    params = [torch.nn.Parameter(w.clone()) for w in start()]
    opt = AdamH(params, lr=lr, betas=(b1, b2), eps=eps, radius=0.0)
    expected = start()
    radii = [frob(w).item() for w in expected]
    m = [torch.zeros_like(w) for w in expected]
    v = [torch.zeros_like(w) for w in expected]
    for t in range(1, 5):
        for i, g in enumerate(grads(t)):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            u = (m[i] / (1 - b1**t)) / ((v[i] / (1 - b2**t)).sqrt() + eps)
            expected[i] = on_sphere(expected[i], u, radii[i], lr)
            params[i].grad = g.clone()
        opt.step()
    for p, w, r in zip(params, expected, radii):
        torch.testing.assert_close(p.detach(), w, atol=1e-12, rtol=0)
        assert frob(p.detach()).item() == pytest.approx(r, rel=1e-12)


def test_muonh_follows_muons_direction_on_the_sphere() -> None:
    """Nesterov momentum as torch's Muon, its Newton-Schulz (bf16, as on CUDA), no shape factor."""
    lr, mu = 0.03, 0.95
    params = [torch.nn.Parameter(w.clone().float()) for w in start()]
    opt = MuonH(params, lr=lr, momentum=mu, nesterov=True, ns_steps=5, radius=0.0, ns_dtype=torch.bfloat16)
    expected = [w.float() for w in start()]
    radii = [frob(w).item() for w in expected]
    buf = [torch.zeros_like(w) for w in expected]
    for t in range(1, 4):
        for i, g in enumerate(grads(t)):
            g = g.float()
            buf[i] = mu * buf[i] + (1 - mu) * g
            o = _zeropower_via_newtonschulz((1 - mu) * g + mu * buf[i], (3.4445, -4.7750, 2.0315), 5, 1e-7)
            expected[i] = on_sphere(expected[i], o.float(), radii[i], lr)
            params[i].grad = g.clone()
        opt.step()
    for p, w in zip(params, expected):
        torch.testing.assert_close(p.detach(), w, atol=2e-6, rtol=0)


@pytest.mark.parametrize("kind", ["adamh", "muonh"])
def test_a_set_radius_holds_after_many_steps(kind: str) -> None:
    """hyperball_radius r puts a (fan_out x fan_in) matrix on the sphere of radius r sqrt(fan_out)
    at its first step and keeps it there; each step turns it by at most asin(lr)."""
    r, lr = 0.7, 0.02
    params = [torch.nn.Parameter(w.clone()) for w in start()]
    if kind == "adamh":
        opt = AdamH(params, lr=lr, betas=(0.9, 0.95), eps=1e-8, radius=r)
    else:
        opt = MuonH(params, lr=lr, momentum=0.95, nesterov=True, ns_steps=5, radius=r)
    for t in range(60):
        before = [p.detach().clone() for p in params]
        for p, g in zip(params, grads(t)):
            p.grad = g
        opt.step()
        for p, w in zip(params, before):
            cos = (p.detach() * w).sum() / (frob(p.detach()) * frob(w))
            # A move of length lr R from a point at distance R turns it by at most asin(lr) (a tangent
            # move), less the more D points along W; random directions are nearly tangent here.
            angle = math.acos(min(1.0, cos.item()))
            assert 0.9 * lr < angle <= math.asin(lr) * (1 + 1e-6)
    for p, (fan_out, _) in zip(params, SHAPES):
        assert frob(p.detach()).item() == pytest.approx(r * math.sqrt(fan_out), rel=1e-12)
        assert opt.state[p]["radius"].item() == pytest.approx(r * math.sqrt(fan_out), rel=1e-12)


# -----------------------------------------------------------------------------
# μP: each optimizer's rate of the hidden matrices at width n, base n0 (docs/MUP.md)

# The exponents e of the hidden rate's factor (n0 / n)^e, from the derivations in docs/MUP.md:
# AdamW 1 (entries move ~lr, coherently over n inputs); Muon with Jordan's shape factor 0 (its
# spectral norm lr sqrt(out/in) is μP's as it is), with Moonlight's 1/2 (0.2 sqrt(max(out, in))
# grows as sqrt(n)); MuonH 0 (an angle lr of a matrix whose norm follows the init); AdamH 1/2.
EXPECTED_EXPONENT = {
    ("adamw", ()): 1.0,
    ("muon", ()): 0.0,
    ("muon", ("--muon_shape_scale=match_rms_adamw",)): 0.5,
    ("muon", ("--muon_shape_scale=none",)): 0.0,
    ("adamh", ()): 0.5,
    ("muonh", ()): 0.0,
}
PEAK = {"adamw": "learning_rate", "muon": "muon_lr", "adamh": "hyperball_lr", "muonh": "hyperball_lr"}


@pytest.mark.parametrize("optimizer,extra", list(EXPECTED_EXPONENT))
def test_mup_scales_each_optimizers_hidden_rate_by_its_own_exponent(optimizer: str, extra: tuple[str, ...]) -> None:
    n, n0, lr = 64, 16, 4e-3
    parsed = parse_config([f"--optimizer={optimizer}", f"--learning_rate={lr}", "--min_lr=0", *extra], world_size=0)
    peak = parsed.train.learning_rate if optimizer == "adamw" else getattr(parsed.train, PEAK[optimizer])
    rates = {}
    for base in (0, n0):
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=n, block_size=16, vocab_size=64, mup_base_width=base))
        opt = build_optimizer(model, parsed.train)
        names = {id(p): name for name, p in model.named_parameters()}
        rates[base] = {names[id(p)]: g["peak_lr"] for g in opt.param_groups for p in g["params"]}
    for name, rate in rates[n0].items():
        if re.fullmatch(r"transformer\.h\.\d+\.(attn|mlp)\.c_\w+\.weight", name):  # the blocks' matrices
            assert rates[0][name] == pytest.approx(peak), name  # standard: the optimizer's own peak rate
            assert rate == pytest.approx(peak * (n0 / n) ** EXPECTED_EXPONENT[(optimizer, extra)]), name
        else:  # embeddings, gains, biases: AdamW's part, whose μP factor is 1
            assert rate == pytest.approx(lr) and rates[0][name] == pytest.approx(lr), name
