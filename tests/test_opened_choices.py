"""The paper's fixed choices opened up (alpha_cap, radius_cap, sphere_input_gain, mlp_width), their
diagnostics, and the fair sweep's planner (scripts/fair_sweep.py).

The maths is checked against formulas written here from docs/CONNECTIONS.md, not against the
model's own functions.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from spheretnorm.optim import build_optimizer
from spheretnorm.runtime.config import TrainConfig
from spheretnorm.diagnostics import parameter_report
from spheretnorm.experiments import fair_comparison as fair_sweep
from spheretnorm.experiments.fair_comparison import ARMS, design_sweep
from spheretnorm.experiments.study import Point, plan_points, point, swept_rates
from spheretnorm.model import GPT, GPTConfig, SphereConnection

D = 16


def tiny(**keys: object) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=D, block_size=8, vocab_size=32, **keys))


def sphere_point(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """h on the sphere of radius sqrt(d) and an F(h), in float64."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, D, generator=g, dtype=torch.float64)
    return h * math.sqrt(D) / h.norm(dim=-1, keepdim=True), torch.randn(rows, D, generator=g, dtype=torch.float64)


def p_spheret_update(h: torch.Tensor, f: torch.Tensor, alpha: torch.Tensor, p: float) -> torch.Tensor:
    """0 < p <= 1: rotate h towards the tangent part z of f by theta = p arctan(alpha ||z|| / (p ||h||))."""
    r = h.norm(dim=-1, keepdim=True)
    z = f - (h * f).sum(-1, keepdim=True) / r**2 * h
    s = z.norm(dim=-1, keepdim=True)
    theta = p * torch.atan(alpha * s / (r * p))
    return torch.cos(theta) * h + r * torch.sin(theta) * z / s


@pytest.mark.parametrize("impl", ["reference", "fused"])
@pytest.mark.parametrize("a0", [1.2, 3.0])  # softplus(a0) = 1.46, 3.05: above the paper's cap of 1
def test_an_uncapped_step_size_passes_a_gradient_above_one_and_the_cap_passes_none(impl: str, a0: float) -> None:
    h, f = sphere_point(5, 1)
    w = torch.randn(5, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for cap in (None, 1.0):
        model = tiny(connection="p_spheret", alpha_cap=cap, sphere_impl=impl).double()
        conn = model.transformer.h[1].conn_mlp  # lambda_2 = 1 / sqrt(2)
        with torch.no_grad():
            conn.a.fill_(a0)
        (conn(h, lambda u: f) * w).sum().backward()

        a = torch.tensor(a0, dtype=torch.float64, requires_grad=True)
        softplus = torch.log1p(torch.exp(a))
        alpha = (softplus if cap is None else torch.minimum(softplus, torch.tensor(cap, dtype=torch.float64))) / math.sqrt(2)
        (p_spheret_update(h, f, alpha, 0.5) * w).sum().backward()
        if cap is None:
            assert a.grad.abs() > 1e-3  # the formula's gradient is there to be passed
            torch.testing.assert_close(conn.a.grad, a.grad, rtol=1e-9, atol=1e-12)
        else:
            assert conn.a.grad.item() == 0.0 and a.grad.item() == 0.0


@pytest.mark.parametrize("impl", ["reference", "fused"])
@pytest.mark.parametrize("a0", [1.2, 3.0, -0.5])  # softplus(a0) = 1.46, 3.05 (above the cap), 0.47 (below)
def test_a_straight_through_cap_keeps_the_capped_value_and_passes_softpluss_gradient(impl: str, a0: float) -> None:
    """alpha_cap_grad=straight_through: the forward pass is the paper's clamp bit for bit; the
    gradient of a is dL/dalpha * sigmoid(a) * lambda_l, above the cap as below it."""
    h, f = sphere_point(5, 1)
    w = torch.randn(5, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    outs = {}
    for cap_grad in ("stop", "straight_through"):
        conn = tiny(connection="p_spheret", alpha_cap_grad=cap_grad, sphere_impl=impl).double().transformer.h[1].conn_mlp  # lambda_2 = 1/sqrt(2)
        with torch.no_grad():
            conn.a.fill_(a0)
        outs[cap_grad] = conn(h, lambda u: f)
        (outs[cap_grad] * w).sum().backward()
    assert torch.equal(outs["stop"], outs["straight_through"])

    softplus = math.log1p(math.exp(a0))
    alpha = torch.tensor(min(softplus, 1.0) / math.sqrt(2), dtype=torch.float64, requires_grad=True)
    (p_spheret_update(h, f, alpha, 0.5) * w).sum().backward()
    want = alpha.grad.item() / (1 + math.exp(-a0)) / math.sqrt(2)
    assert abs(want) > 1e-3
    assert conn.a.grad.item() == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_the_default_cap_is_the_papers_and_passes_the_gradient_at_its_start() -> None:
    """At init softplus(a) = 1 exactly: the clamp still passes the first step's gradient (as the
    paper's code), which is why a_l moves once and then sits above its cap."""
    model = tiny(connection="p_spheret")  # GeoNorm's angle cap would hold theta, and zero the gradient, for a large F
    conn = model.transformer.h[0].conn_attn
    assert model.config.alpha_cap == 1.0 and F.softplus(conn.a).item() == pytest.approx(1.0, abs=1e-6)
    h, f = sphere_point(3, 3)
    conn(h.float(), lambda u: f.float()).sum().backward()
    assert conn.a.grad is not None and conn.a.grad.item() != 0.0


def test_the_input_gain_scales_what_f_reads_and_leaves_the_stream_on_the_sphere() -> None:
    for block in ("gpt2", "llama"):
        model = tiny(connection="p_spheret", sphere_input_gain=True, block=block, sphere_impl="reference").double()
        conn = model.transformer.h[0].conn_attn
        g = torch.rand(D, generator=torch.Generator().manual_seed(4), dtype=torch.float64) + 0.5
        with torch.no_grad():
            conn.input_gain.copy_(g)
        h, f = sphere_point(6, 5)
        seen: list[torch.Tensor] = []

        def sublayer(u: torch.Tensor) -> torch.Tensor:
            seen.append(u)
            return f

        out = conn(h, sublayer)
        assert torch.equal(seen[0], h * g)  # F reads g * h, exactly
        torch.testing.assert_close(out.norm(dim=-1), h.norm(dim=-1), rtol=0, atol=1e-6)
        plain = tiny(connection="p_spheret", block=block, sphere_impl="reference").double().transformer.h[0].conn_attn
        torch.testing.assert_close(out, plain(h, lambda u: f), rtol=0, atol=1e-12)  # the update itself is the paper's

    # The whole model: the gain is a learned, undecayed vector of each sphere sublayer, and every state stays on the sphere.
    model = tiny(connection="geonorm", sphere_input_gain=True)
    names = [n for n, _ in model.named_parameters() if n.endswith("input_gain")]
    assert len(names) == 4 and all(model.get_parameter(n).shape == (D,) for n in names)
    decayed = {id(p) for group in build_optimizer(model, TrainConfig(weight_decay=0.1, learning_rate=1e-3, min_lr=0.0, beta1=0.9, beta2=0.99), "cpu").param_groups if group["weight_decay"] for p in group["params"]}
    assert not any(id(model.get_parameter(n)) in decayed for n in names)


def test_radius_cap_moves_the_embeddings_upper_radius_and_none_removes_it() -> None:
    for cap, want in ((1.0, math.sqrt(D)), (2.0, 2 * math.sqrt(D)), (None, 50.0)):
        norm = tiny(connection="p_spheret", radius_cap=cap).transformer.embed_norm
        with torch.no_grad():
            norm.gamma.fill_(50.0)  # softplus(50) = 50: above every cap here
        assert norm.radius().item() == pytest.approx(want, rel=1e-6)
        x = torch.randn(3, D)
        torch.testing.assert_close(norm(x).norm(dim=-1), torch.full((3,), want), rtol=1e-5, atol=0)


def test_mlp_width_sets_the_hidden_width_of_both_blocks() -> None:
    assert tiny().config.mlp_hidden == 4 * D and tiny(block="llama").config.mlp_hidden == 64  # the blocks' own
    for block, matrix in (("gpt2", 48), ("llama", 2 * 48)):
        model = tiny(block=block, mlp_width=48)
        assert model.transformer.h[0].mlp.c_fc.weight.shape == (matrix, D)
        assert model.transformer.h[0].mlp.c_proj.weight.shape == (D, 48)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"connection": "pre_ln", "alpha_cap": None}, "alpha_cap applies only to the sphere connections"),
        ({"connection": "ngpt", "sphere_input_gain": True}, "sphere_input_gain applies only to the sphere connections"),
        ({"connection": "p_spheret", "alpha_cap": 0.0}, "alpha_cap must be > 0"),
        ({"connection": "pre_ln", "alpha_cap_grad": "straight_through"}, "alpha_cap_grad applies only to the sphere connections"),
        ({"connection": "p_spheret", "alpha_cap_grad": "smooth"}, "Unknown alpha_cap_grad 'smooth'; valid values are: stop, straight_through."),
        ({"connection": "p_spheret", "alpha_cap": None, "alpha_cap_grad": "straight_through"}, "alpha_cap_grad='straight_through' says how a"),
        ({"connection": "p_spheret", "radius_cap": 0.1}, "radius_cap must be at least 1 / sqrt(n_embd) = 0.25"),
        ({"mlp_width": -1}, "mlp_width must be 0"),
    ],
)
def test_bad_values_are_one_sentence(keys: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tiny(**keys)


def test_the_defaults_keep_the_papers_model() -> None:
    """The defaults add no parameter and change no value: the same seed gives the same weights as a
    model with every new key spelled out at the paper's value."""
    for block in ("gpt2", "llama"):
        plain = tiny(connection="p_spheret", block=block).state_dict()
        spelled = tiny(connection="p_spheret", block=block, alpha_cap=1.0, alpha_cap_grad="stop", radius_cap=1.0, sphere_input_gain=False,
                       mlp_width=0).state_dict()
        assert list(plain) == list(spelled) and all(torch.equal(plain[k], spelled[k]) for k in plain)


def test_the_parameter_diagnostics_say_which_scales_sit_at_their_caps() -> None:
    model = tiny(connection="p_spheret")
    conns = [c for b in model.transformer.h for c in (b.conn_attn, b.conn_mlp)]
    with torch.no_grad():
        for conn, a in zip(conns, (0.2, 3.0, 0.6, 0.5412)):  # softplus: 0.80, 3.05, 1.04, 1.0000 - 2e-5
            conn.a.fill_(a)
    report = parameter_report(model)
    assert report["step_pinned"] == [0.0, 1.0, 1.0, 0.0]
    lam = [1.0, 1.0, 1 / math.sqrt(2), 1 / math.sqrt(2)]
    sp = [math.log1p(math.exp(a)) for a in (0.2, 3.0, 0.6, 0.5412)]
    assert report["step_sizes"] == pytest.approx([min(s, 1.0) * l for s, l in zip(sp, lam)], rel=1e-6)
    assert report["radius"] == pytest.approx(1.0, abs=1e-6) and report["radius_pinned"] == 1.0  # softplus(gamma) starts at sqrt(d)

    uncapped = parameter_report(tiny(connection="p_spheret", alpha_cap=None, radius_cap=None))
    assert uncapped["step_pinned"] == [] and uncapped["radius_pinned"] == 0.0
    euclidean = parameter_report(tiny(connection="pre_ln"))
    assert euclidean == {"step_sizes": [], "step_pinned": [], "radius": None, "radius_pinned": None}


# -----------------------------------------------------------------------------
# The fair sweep's plan


LRS = [1e-3, 2e-3, 4e-3, 8e-3]


def plan(lrs: list[float], seeds: list[int], blocks: list[str], done: dict[Point, float], arms: tuple = ARMS) -> list[Point]:
    """The fair sweep's plan (study.best_rate_follow_up) for these runs, given the finished ones' losses."""
    return plan_points(design_sweep(lrs, seeds, blocks, arms, 600, 100), done)


def test_the_plan_starts_with_every_arm_at_every_rate_with_the_first_seed() -> None:
    points = plan(LRS, [1, 2], ["gpt2", "llama"], {})
    assert len(points) == 2 * len(ARMS) * 4 and {p["seed"] for p in points} == {1}
    assert {p["arm"] for p in points} == {"pre_ln", "p_spheret-0.5", "geonorm", "ngpt", "p_spheret-0.5+alpha_cap=none",
                                       "p_spheret-0.5+alpha_decay=none", "p_spheret-0.5+sphere_input_gain",
                                       "p_spheret-0.5+alpha_cap_grad=straight_through"}


def first_seed(block: str, arm: str, losses: dict[float, float]) -> dict[Point, float]:
    return {point(block=block, arm=arm, lr=lr, seed=1): loss for lr, loss in losses.items()}


def test_a_best_inside_the_grid_adds_the_other_seeds_at_it_and_its_neighbours() -> None:
    done = first_seed("gpt2", "pre_ln", {1e-3: 2.0, 2e-3: 1.8, 4e-3: 1.9, 8e-3: 2.5})
    points = plan(LRS, [1, 2, 3], ["gpt2"], done, ARMS[:1])
    assert sorted((p["lr"], p["seed"]) for p in points if p["seed"] != 1) == [(1e-3, 2), (1e-3, 3), (2e-3, 2), (2e-3, 3), (4e-3, 2), (4e-3, 3)]
    assert [p["lr"] for p in points if p["seed"] != 1][:2] == [2e-3, 2e-3]  # the best's seeds run first


def test_a_best_at_an_end_grows_the_grid_once_then_seeds_the_best() -> None:
    losses = {1e-3: 2.5, 2e-3: 2.2, 4e-3: 2.0, 8e-3: 1.9}
    points = plan(LRS, [1, 2], ["llama"], first_seed("llama", "ngpt", losses), ARMS[3:4])
    assert [p["lr"] for p in points] == [*LRS, 0.016]  # one step beyond the top, nothing seeded while it runs
    assert swept_rates(LRS, losses) == ([*LRS, 0.016], False)
    # Still best at the new end: no second step; the best and its one neighbour get seed 2.
    done = first_seed("llama", "ngpt", {**losses, 0.016: 1.85})
    points = plan(LRS, [1, 2], ["llama"], done, ARMS[3:4])
    assert sorted(p["lr"] for p in points if p["seed"] == 2) == [8e-3, 0.016]
    # A diverged run (inf) is never the best; an arm whose every run diverged gets no seeds.
    done = first_seed("llama", "ngpt", {lr: math.inf for lr in LRS})
    assert [p["seed"] for p in plan(LRS, [1, 2], ["llama"], done, ARMS[3:4])] == [1] * 4


# -----------------------------------------------------------------------------
# The fair sweep's optimizer axis


MUON = (0.01, 0.03, 0.09)  # --grid muon=...: a factor of 3, unlike AdamW's 2, so an extension tells whose grid it steps on
MUONH = (0.005, 0.01, 0.02, 0.04, 0.08)  # hyperball_lr's default 0.02 times 1/4 .. 4


def optimizer_design(*extra: str) -> fair_sweep.Sweep:
    args, overrides = fair_sweep.parse_args(["--blocks=llama", "--arms=pre_ln,p_spheret-0.5,ngpt", "--optimizers=adamw,muon,muonh",
                                             "--grid=muon=0.09,0.01,0.03", "--seeds=1,2", *extra])
    return fair_sweep.design_of(args, overrides)


def argv_of(sweep: fair_sweep.Sweep, **p: object) -> set[str]:
    from spheretnorm.experiments.study import Place, train_argv

    return set(train_argv(sweep, point(block="llama", seed=1, **p), Place(Path("out"), Path("data"))))


def test_each_optimizer_sweeps_its_own_rate_key_and_adamws_runs_keep_their_folders() -> None:
    sweep = optimizer_design()
    points = plan_points(sweep, {})
    groups = {(p["arm"], p["optimizer"]): sorted(q["lr"] for q in points if (q["arm"], q["optimizer"]) == (p["arm"], p["optimizer"])) for p in points}
    assert groups == {**{(arm, "adamw"): LRS for arm in ("pre_ln", "p_spheret-0.5", "ngpt")},
                      **{(arm, "muon"): list(MUON) for arm in ("pre_ln", "p_spheret-0.5")},
                      **{(arm, "muonh"): list(MUONH) for arm in ("pre_ln", "p_spheret-0.5")}}  # no nGPT beside Muon or MuonH
    assert {p["seed"] for p in points} == {1} and fair_sweep.design_size(sweep) == 12 + 6 + 10 + 7 * (1 + 3)

    adamw = point(block="llama", arm="p_spheret-0.5", optimizer="adamw", lr=4e-3, seed=1)
    assert sweep.folder(adamw) == "llama/p_spheret-0.5/lr0.004_s1"  # the first design's folder
    assert sweep.folder(adamw.but(optimizer="muon", lr=0.03)) == "llama/p_spheret-0.5+muon/lr0.03_s1"
    alone = design_sweep(LRS, [1, 2], ["llama"], ARMS[1:2], 600, 100)
    assert sweep.folder(adamw) == alone.folder(point(block="llama", arm="p_spheret-0.5", lr=4e-3, seed=1))
    # AdamW's runs: the first design's settings, plus the default optimizer spelled out.
    assert argv_of(sweep, arm="p_spheret-0.5", optimizer="adamw", lr=4e-3) - argv_of(alone, arm="p_spheret-0.5", lr=4e-3) == {"--optimizer=adamw"}
    assert argv_of(alone, arm="p_spheret-0.5", lr=4e-3) - argv_of(sweep, arm="p_spheret-0.5", optimizer="adamw", lr=4e-3) == set()
    muon = argv_of(sweep, arm="p_spheret-0.5", optimizer="muon", lr=0.03)
    assert {"--optimizer=muon", "--muon_lr=0.03", "--learning_rate=0.002", "--min_lr=0.0002", "--warmup_iters=100"} <= muon
    assert not any(a.startswith("--hyperball_radius") for a in muon)
    muonh = argv_of(sweep, arm="pre_ln", optimizer="muonh", lr=0.04)
    assert {"--optimizer=muonh", "--hyperball_lr=0.04", "--hyperball_radius=1.0", "--learning_rate=0.002", "--min_lr=0.0002"} <= muonh
    assert "--learning_rate=0.001" in argv_of(optimizer_design("--base_lr=1e-3"), arm="pre_ln", optimizer="muonh", lr=0.04)


def test_an_optimizer_registered_outside_the_package_joins_the_sweep() -> None:
    """tests/toy_optimizer.py's toy_sgd (rate key learning_rate, no Hyperball radius) is an optimizer of the axis with no edit here."""
    import toy_optimizer

    args, overrides = fair_sweep.parse_args(["--blocks=llama", "--arms=pre_ln,ngpt", f"--optimizers=adamw,{toy_optimizer.NAME}",
                                             f"--grid={toy_optimizer.NAME}=0.1,0.2", "--seeds=1"])
    sweep = fair_sweep.design_of(args, overrides)
    toy = [p for p in plan_points(sweep, {}) if p["optimizer"] == toy_optimizer.NAME]
    assert sorted(p["lr"] for p in toy) == [0.1, 0.2] and {p["arm"] for p in toy} == {"pre_ln"}
    argv = argv_of(sweep, arm="pre_ln", optimizer=toy_optimizer.NAME, lr=0.2)
    assert {f"--optimizer={toy_optimizer.NAME}", "--learning_rate=0.2", "--min_lr=0.02"} <= argv  # its rate is learning_rate itself
    assert sweep.folder(toy[0]) == f"llama/pre_ln+{toy_optimizer.NAME}/lr0.1_s1"


def test_each_optimizer_extends_and_seeds_on_its_own_grid() -> None:
    sweep = optimizer_design("--arms=pre_ln")

    def firsts(optimizer: str, losses: dict[float, float]) -> dict[Point, float]:
        return {point(block="llama", arm="pre_ln", optimizer=optimizer, lr=lr, seed=1): loss for lr, loss in losses.items()}

    done = {**firsts("adamw", {1e-3: 2.0, 2e-3: 1.8, 4e-3: 1.9, 8e-3: 2.5}),  # best inside: seeds at 1e-3, 2e-3, 4e-3
            **firsts("muon", {0.01: 2.2, 0.03: 2.0, 0.09: 1.9}),  # best at the top: one step of its own x3, nothing seeded yet
            **firsts("muonh", {0.005: 2.4, 0.01: 2.1, 0.02: 2.3, 0.04: 2.6, 0.08: math.inf})}  # best at 0.01; 0.08 diverged

    def rates(optimizer: str, seed: int) -> list[float]:
        return sorted(p["lr"] for p in plan_points(sweep, done) if (p["optimizer"], p["seed"]) == (optimizer, seed))

    assert rates("adamw", 1) == LRS and rates("adamw", 2) == [1e-3, 2e-3, 4e-3]
    assert rates("muon", 1) == pytest.approx([0.01, 0.03, 0.09, 0.27]) and rates("muon", 2) == []
    assert rates("muonh", 1) == list(MUONH) and rates("muonh", 2) == [0.005, 0.01, 0.02]
    done.update(firsts("muon", {0.27: 1.95}))
    assert rates("muon", 2) == pytest.approx([0.03, 0.09, 0.27])  # the best (0.09) and its neighbours on muon's grid, the extension one of them


def test_a_grid_of_one_rate_runs_every_seed_there_and_an_arm_may_have_its_own() -> None:
    """E2's design: AdamW at 2e-3 for both arms, MuonH at 0.02 for Pre-LN and 0.01 for the sphere; nothing is chosen or extended."""
    args, overrides = fair_sweep.parse_args(["--blocks=llama", "--arms=pre_ln,p_spheret-0.5", "--optimizers=adamw,muonh", "--lrs=2e-3",
                                             "--grid=pre_ln+muonh=0.02", "--grid=p_spheret-0.5+muonh=0.01", "--seeds=1,2,3"])
    sweep = fair_sweep.design_of(args, overrides)
    cells = {("pre_ln", "adamw"): 2e-3, ("p_spheret-0.5", "adamw"): 2e-3, ("pre_ln", "muonh"): 0.02, ("p_spheret-0.5", "muonh"): 0.01}
    first = plan_points(sweep, {})
    assert sorted((p["arm"], p["optimizer"], p["lr"], p["seed"]) for p in first) == sorted((*cell, lr, 1) for cell, lr in cells.items())
    assert fair_sweep.design_size(sweep) == 4 * 3  # each cell: its one rate with every seed, no extension, no neighbours
    done = {p: 2.0 for p in first}
    later = plan_points(sweep, done)
    assert sorted((p["arm"], p["optimizer"], p["lr"], p["seed"]) for p in later) == sorted((*cell, lr, s) for cell, lr in cells.items() for s in (1, 2, 3))
    assert fair_sweep.arm_grids_of(sweep) == {"pre_ln+adamw": [2e-3], "pre_ln+muonh": [0.02], "p_spheret-0.5+adamw": [2e-3], "p_spheret-0.5+muonh": [0.01]}
    assert fair_sweep.given_rates(sweep) == "all"
    note = fair_sweep.seeds_note(fair_sweep.Seeds(1, (2, 3)), "val_loss", False, "all")
    assert note.startswith("Each arm runs at the one rate its grid gives (none is chosen), seed 1 beside the held-out seeds;")


def test_the_summary_gives_each_optimizer_its_gap_to_pre_ln_with_it_and_with_adamw() -> None:
    from spheretnorm.experiments.study import Seeds

    def run(arm: str, optimizer: str, lr: float, seed: int, loss: float | None, status: str = "ok") -> dict[str, object]:
        return {"block": "llama", "arm": arm, "optimizer": optimizer, "lr": lr, "seed": seed, "val_loss": loss, "status": status}

    rows = [run("pre_ln", "adamw", 2e-3, 1, 2.00), run("pre_ln", "adamw", 2e-3, 2, 2.10),  # seed 1 selects 2e-3; held out: 2.10
            run("pre_ln", "adamw", 4e-3, 1, 2.05), run("pre_ln", "adamw", 4e-3, 2, 2.20),
            run("pre_ln", "muon", 0.02, 1, 1.90), run("pre_ln", "muon", 0.02, 2, 1.96),  # seed 1 selects 0.02; held out: 1.96
            run("pre_ln", "muon", 0.04, 1, 1.95),
            run("p_spheret-0.5", "muon", 0.02, 1, 1.85), run("p_spheret-0.5", "muon", 0.02, 2, 1.80),
            run("p_spheret-0.5", "muon", 0.04, 1, 1.80), run("p_spheret-0.5", "muon", 0.04, 2, 1.88),  # seed 1 selects 0.04 (its 1.80)
            run("p_spheret-0.5", "muon", 0.08, 1, None, "diverged")]
    arms = [fair_sweep.ARM_BY_SLUG[s] for s in ("pre_ln", "p_spheret-0.5", "ngpt")]
    summary = fair_sweep.best_rows(rows, ["llama"], arms, Seeds(1, (2,)), "val_loss", ["adamw", "muon"])
    assert [(s["arm"], s["optimizer"]) for s in summary] == [("pre_ln", "adamw"), ("p_spheret-0.5", "adamw"), ("ngpt", "adamw"),
                                                            ("pre_ln", "muon"), ("p_spheret-0.5", "muon")]
    mine = summary[-1]
    # The held-out seed 2 at each arm's own selected rate, never the mean with the selection seed (which would pick 0.02 here):
    # with Muon 1.88 - 1.96, with AdamW 1.88 - 2.10. One held-out seed: no SD, no interval.
    assert (mine["best_lr"], mine["selection_loss"], mine["headline"], mine["unstable"]) == (0.04, 1.80, "1.880", [0.08])
    assert (mine["gap_mean"], mine["gap_sd"], mine["gap_low"]) == (pytest.approx(-0.08), None, None)
    assert mine["adamw_gap_mean"] == pytest.approx(-0.22)
    assert summary[3]["best_lr"] == 0.02 and summary[3]["adamw_gap_mean"] == pytest.approx(-0.14)  # 1.96 - 2.10
    table = fair_sweep.markdown_table(summary, fair_sweep.best_columns(True, Seeds(1, (2,)))).splitlines()
    assert ("| minus Pre-LN, same optimizer (same seed), each | mean | SD | 95% interval | minus Pre-LN AdamW (same seed), mean | 95% interval |"
            in table[0])
    assert table[-1].startswith("| LLaMA | 0.5-SpheretNorm | Muon | 0.04 | 1.800 | 2: 1.880 | 1.880 | 2: -0.080 | -0.080 | - | "
                                "no interval (1 seed; it needs 3) | -0.220 | no interval (1 seed; it needs 3) | - |")
    # A design without AdamW (E3's MuonH sweeps) has no AdamW runs to compare with: no column of "runs missing".
    alone = fair_sweep.markdown_table(summary[3:], fair_sweep.best_columns(True, Seeds(1, (2,)), with_adamw=False)).splitlines()
    assert "AdamW (same seed)" not in alone[0] and "| 95% interval | held-out failed at |" in alone[0]


@pytest.mark.parametrize("flag,valid", [("--grid=sgd=0.1,0.2", "with OPT one of --optimizers (adamw, muon)"),
                                        ("--grid=muon", "with OPT one of --optimizers (adamw, muon)"),
                                        ("--grid=ngpt+muon=0.02", "ARM+OPT=R1,R2,... with ARM one of --arms"),
                                        ("--grid=geonorm+sgd=0.02", "OPT one of --optimizers (adamw, muon) that the arm runs with"),
                                        ("--grid=muon=0.02,0.04 --refine --grid=pre_ln+muon=0.02", "a grid of one rate chooses none"),
                                        ("--optimizers=adamw,sgd", "choose from: adamw, muon, adamh, muonh")])
def test_a_bad_optimizer_or_grid_is_one_sentence(flag: str, valid: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["--optimizers=adamw,muon", *flag.split(), "--dry_run", "--out_dir", str(tmp_path / "out"), "--data_dir", str(tmp_path / "no_data")]
    assert fair_sweep.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --") and valid in err
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Characters of a small made-up play, prepared as the studies prepare Tiny Shakespeare."""
    from spheretnorm.experiments.study import ensure_data

    root = tmp_path_factory.mktemp("fair_sweep_data")
    lines = [f"{who}:\nThe {what} of the {where} is {how}.\n" for who in ("ANNE", "BEN", "CLEO") for what in ("king", "rain", "ring")
             for where in ("hill", "sea", "town") for how in ("near", "gone", "ours")]
    (root / "play.txt").write_text("\n".join(lines * 20), encoding="utf-8")
    ensure_data(root / "data", str(root / "play.txt"))
    return root / "data"


def test_figures_name_the_corpus_the_data_was_prepared_from(data_dir: Path, tmp_path: Path) -> None:
    from spheretnorm.experiments.study import corpus_title, ensure_data

    assert corpus_title(data_dir) == "play.txt characters"
    ensure_data(tmp_path / "default")  # the shared copy or the embedded one: Tiny Shakespeare either way
    assert corpus_title(tmp_path / "default") == "Tiny Shakespeare characters"
    assert corpus_title(tmp_path / "nothing_here") == "characters"


def test_the_command_runs_the_plan_and_a_rerun_reuses_every_finished_run(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "sweep"
    argv = [
        "--arms=pre_ln", "--blocks=llama", "--lrs=1e-2,3e-2", "--seeds=5,6", "--max_iters=100", "--warmup_iters=3",
        f"--out_dir={out}", f"--data_dir={data_dir}", "--jobs=2",
        "--n_layer=1", "--n_embd=16", "--n_head=2", "--block_size=16", "--batch_size=4", "--global_batch_size=4", "--eval_iters=2",
        "--compile=false",  # the studies compile by default; four tiny compiles would only slow the suite
    ]
    assert fair_sweep.main(argv) == 0
    first = capsys.readouterr().out
    record = json.loads((out / "fair_sweep.json").read_text())
    losses = {r["lr"]: r["val_loss"] for r in record["runs"] if r["seed"] == 5}
    # Every run ended and was judged: the tiny model needs 100 steps to get below the play's bigram loss (0.99) at 1e-2 and 3e-2
    # (0.83 to 0.92 and 0.39 to 0.45 when this was written); a rate it does not train at is "stalled", a failure the plan reads as one.
    assert {r["status"] for r in record["runs"]} <= {"ok", "stalled"} and any(r["status"] == "ok" for r in record["runs"])
    # Two rates: the best lies at an end, so the grid grew by one step (x3) there, then seed 6 ran at the best and its neighbour.
    rates, finished = swept_rates([1e-2, 3e-2], losses)
    assert finished and len(rates) == 3 and sorted(losses) == rates
    best = rates.index(min(rates, key=losses.get))
    assert sorted(r["lr"] for r in record["runs"] if r["seed"] == 6) == rates[max(best - 1, 0): best + 2]
    n_runs = len(record["runs"])
    assert n_runs in (5, 6) and first.count(": done in ") == n_runs
    assert len(list(out.glob("llama/pre_ln/*/config.json"))) == n_runs

    assert fair_sweep.main(argv) == 0  # again: everything is finished, nothing runs
    again = capsys.readouterr().out
    assert ": done in " not in again and again.count("already finished") == n_runs
    table = (out / "fair_sweep.md").read_text()
    assert "| LLaMA | Pre-LN |" in table and (out / "fair_sweep.png").stat().st_size > 0
    assert (record["corpus"], record["n_layer"], record["n_embd"]) == ("play.txt characters", 1, 16)


def test_a_setting_other_than_the_papers_is_part_of_the_method_key_and_the_folder() -> None:
    from spheretnorm.runtime.methods import default_out_dir, method_key
    from spheretnorm.runtime.methods import UsageError, canonical_method, display_name, method_args

    cfg = GPTConfig(connection="p_spheret", alpha_cap=None, sphere_input_gain=True)
    assert method_key(cfg) == "p_spheret:0.5+alpha_cap=none+sphere_input_gain=true"
    assert default_out_dir("c", cfg, {"alpha_cap": None, "sphere_input_gain": True, "max_iters": 9}) == \
        "out/c/p_spheret-0.5+alpha_cap=none+sphere_input_gain=true+max_iters=9"  # never twice
    assert method_key(GPTConfig(connection="p_spheret")) == "p_spheret:0.5"  # the paper's keys are today's
    key = "geonorm+mlp_width=96+radius_cap=2"
    assert canonical_method(key) == "geonorm+radius_cap=2+mlp_width=96"  # in the table's order
    assert method_args(key) == ["--connection=geonorm", "--radius_cap=2", "--mlp_width=96"]
    assert display_name("p_spheret:0.5+alpha_cap=none") == "0.5-SpheretNorm (alpha_cap=none)"
    st = "p_spheret:0.5+alpha_cap_grad=straight_through"
    assert method_key(GPTConfig(connection="p_spheret", alpha_cap_grad="straight_through")) == st
    assert method_args(st) == ["--connection=p_spheret", "--spheret_p=0.5", "--alpha_cap_grad=straight_through"]
    with pytest.raises(UsageError, match=r"'\+dyt_alpha=1' is no setting of a method key; valid ones are \+alpha_cap=VALUE"):
        canonical_method("p_spheret:0.5+dyt_alpha=1")
    with pytest.raises(UsageError, match="alpha_cap applies only to the sphere connections"):
        canonical_method("pre_ln+alpha_cap=none")


def test_the_collapse_alarm_names_the_caps_that_hold() -> None:
    from spheretnorm.diagnostics import pinned_note

    note = pinned_note({"step_pinned": [1.0, 1.0, 0.0, 1.0], "radius_pinned": 1.0})
    assert note.startswith(" The sphere step size sits at its cap in 3 of 4 sublayers and the embedding radius sits at its cap")
    assert note.endswith("(--alpha_cap=none and --radius_cap=none lift the caps).")
    assert pinned_note({"step_pinned": [0.0, 0.0], "radius_pinned": 0.0}) == "" == pinned_note({"final_cosine": 0.99})
    # alpha_cap_grad=straight_through: a step size at its cap still learns, so only the radius is named
    assert pinned_note({"step_pinned": [1.0, 1.0], "radius_pinned": 1.0}, True).startswith(" The embedding radius sits at its cap, where")
    assert pinned_note({"step_pinned": [1.0, 1.0], "radius_pinned": 0.0}, True) == ""


def test_the_share_below_the_cap_is_read_at_every_evaluation(tmp_path: Path) -> None:
    """step_size_record: 1 minus the mean of step_pinned per eval row, alpha at the end over its start; the summary averages the seeds."""
    lam = [1.0, 1.0, 0.5, 0.5]
    rows = [{"kind": "eval", "iter": 0, "step_pinned": [1.0, 1.0, 1.0, 1.0], "step_sizes": lam}, {"kind": "train", "iter": 1, "loss": 3.0},
            {"kind": "eval", "iter": 5, "step_pinned": [1.0, 0.0, 1.0, 0.0], "step_sizes": [1.0, 0.9, 0.5, 0.4]},
            {"kind": "eval", "iter": 10, "step_pinned": [0.0, 0.0, 0.0, 1.0], "step_sizes": [0.8, 0.9, 0.3, 0.5]}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record = fair_sweep.step_size_record(tmp_path)
    assert record["below_cap"] == [0.0, 0.5, 0.75]
    assert record["step_ratio"] == pytest.approx([0.6, 1.0])  # 0.3 / 0.5 and 0.5 / 0.5
    assert fair_sweep.step_size_record(tmp_path / "absent") == {"below_cap": [], "step_ratio": []}
    assert fair_sweep.ratio_span([{"step_ratio": [0.6, 1.0]}, {"step_ratio": [0.5, 0.9]}, {"step_ratio": []}]) == [0.5, 1.0]
    assert fair_sweep.mean_history([{"below_cap": [0.0, 0.5, 0.75]}, {"below_cap": [0.5, 0.25]}, {"below_cap": []}]) == [0.25, 0.375]


def test_compare_refuses_a_record_that_holds_only_the_declaration_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A fair_sweep.json written before the runs (the declaration, as a run record may ship it) has no runs to draw."""
    for name, record in (("done", {"shape": "12 x 64", "unigram_loss": 3.3, "runs": []}), ("declared", {"declared": {"rules": ["r"]}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "fair_sweep.json").write_text(json.dumps(record))
    assert fair_sweep.main(["--compare", f"{tmp_path / 'done'},{tmp_path / 'declared'}", "--out_dir", str(tmp_path / "fig")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no tabulated runs" in err and f"run --table_only in {tmp_path / 'declared'}" in err


def test_compare_draws_finished_sweeps_side_by_side_and_refuses_a_missing_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def record(width: int, losses: dict[float, float]) -> dict:
        runs = [{"block": "llama", "arm": arm, "lr": lr, "seed": 1337, "val_loss": loss + d, "status": "ok"}
                for arm, d in (("pre_ln", 0.0), ("p_spheret-0.5", 0.05)) for lr, loss in losses.items()]
        runs += [{**r, "optimizer": "muon", "lr": 10 * r["lr"]} for r in runs]  # an optimizer axis: AdamW's rows name none
        return {"shape": f"12 x {width}, 600 iterations", "unigram_loss": 3.3, "runs": runs}

    for width in (64, 128):
        (tmp_path / f"w{width}").mkdir()
        (tmp_path / f"w{width}" / "fair_sweep.json").write_text(json.dumps(record(width, {1e-3: 2.0, 2e-3: 1.9})))
    assert fair_sweep.main(["--compare", f"{tmp_path / 'w64'},{tmp_path / 'w128'}", "--out_dir", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig" / "fair_sweep_compare.png").stat().st_size > 0
    assert fair_sweep.main(["--compare", f"{tmp_path / 'w64'},{tmp_path / 'absent'}", "--out_dir", str(tmp_path / "fig")]) == 2
    fig, drawn = tmp_path / "fig_muon", []
    draw = fair_sweep.panel_figure
    monkeypatch.setattr(fair_sweep, "panel_figure", lambda panels, *a: drawn.append(panels) or draw(panels, *a))
    assert fair_sweep.main(["--compare", f"{tmp_path / 'w64'},{tmp_path / 'w128'}", "--optimizers", "adamw,muon", "--out_dir", str(fig)]) == 0
    assert (fig / "fair_sweep_compare.png").stat().st_size > 0
    assert [[(p.optimizer, p.title) for p in row] for row in drawn[0]] == [  # a row per sweep, a column per optimizer
        [("adamw", f"LLaMA block, AdamW, 12 x {w}, 600 iterations"), ("muon", f"LLaMA block, Muon, 12 x {w}, 600 iterations")] for w in (64, 128)]
    assert fair_sweep.main(["--compare", f"{tmp_path / 'w64'},{tmp_path / 'w128'}", "--optimizers", "muonh", "--out_dir", str(fig)]) == 2
    assert fair_sweep.main(["--compare", f"{tmp_path / 'w64'},{tmp_path / 'w128'}", "--blocks", "gpt2", "--out_dir", str(fig)]) == 2
