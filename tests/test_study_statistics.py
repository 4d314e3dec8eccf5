"""The statistics of the studies' tables (issue 49, part 2): Student's t quantile, the selection and
held-out seeds, paired gaps with their 95% interval, declared decision rules, --refine, the whole
val split as the metric, and one kernel path per table.

Run folders are written here as train.py writes them (config.json and metrics.jsonl), with losses
chosen by hand; every expected number below is worked out in its comment, not by the code.
"""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from spheretnorm.experiments import fair_comparison as fair_sweep
from spheretnorm.experiments.stats import clopper_pearson, every_gap_power, normal_cdf, parse_rule, sign_counts, sign_test, spread, t_quantile, verdict
from spheretnorm.experiments.study import (
    Axis, Sweep, best_rate_follow_up, ensure_data, kernel_path_of, parse_train_args, plan_points, point, train_argv, Place,
)
from spheretnorm.runtime.cli import UsageError
from spheretnorm.runtime.methods import method_key


# -----------------------------------------------------------------------------
# The maths


@pytest.mark.parametrize("p,df,t", [(0.975, 1, 12.706205), (0.975, 2, 4.302653), (0.975, 4, 2.776445), (0.975, 10, 2.228139),
                                    (0.975, 30, 2.042272), (0.95, 5, 2.015048), (0.995, 3, 5.840909), (0.025, 4, -2.776445), (0.5, 7, 0.0)])
def test_the_t_quantile_matches_the_tables(p: float, df: int, t: float) -> None:
    assert t_quantile(p, df) == pytest.approx(t, abs=2e-6)


def test_the_interval_needs_three_values_and_uses_n_minus_1_degrees_of_freedom() -> None:
    # mean -0.03, SD 0.02 (deviations 0, +0.02, -0.02: sqrt(0.0008 / 2)), half width 4.302653 * 0.02 / sqrt(3) = 0.0496828
    s = spread([-0.03, -0.01, -0.05])
    assert (s.n, s.mean, s.sd) == (3, pytest.approx(-0.03), pytest.approx(0.02))
    assert (s.low, s.high) == (pytest.approx(-0.0796828, abs=1e-6), pytest.approx(0.0196828, abs=1e-6))
    two = spread([-0.03, -0.01])
    assert two.sd == pytest.approx(math.sqrt(0.0002)) and (two.low, two.high) == (None, None)
    assert two.interval_text() == "no interval (2 seeds; it needs 3)"


@pytest.mark.parametrize("wins,n,p", [
    (5, 5, 0.0625),            # 2 * 0.5**5 = 2 / 32
    (0, 5, 0.0625),            # the other side, the same split
    (15, 15, 6.103515625e-05), # 2 * 0.5**15 = 2 / 32768
    (16, 16, 3.0517578125e-05),  # 2 / 65536
    (9, 10, 0.021484375),      # 2 * (1 + 10) / 1024
    (8, 10, 0.109375),         # 2 * (1 + 10 + 45) / 1024
    (3, 6, 1.0),               # 2 * (1 + 6 + 15 + 20) / 64 = 1.3125, capped at 1
    (1, 1, 1.0),
])
def test_the_sign_test_is_twice_the_smaller_binomial_tail(wins: int, n: int, p: float) -> None:
    assert sign_test(wins, n) == pytest.approx(p, rel=1e-12)


def test_the_sign_test_leaves_ties_out_and_refuses_impossible_counts() -> None:
    gaps = [-0.01, 0.0, -0.02, -0.03]  # one tie: 3 of 3 signed pairs negative, not 3 of 4
    assert sign_counts(gaps) == (3, 0)
    negative, positive = sign_counts(gaps)
    assert sign_test(negative, negative + positive) == pytest.approx(0.25)  # 2 / 8
    assert sign_test(3, 4) == pytest.approx(0.625)  # what counting the tie as a pair would give: 2 * (1 + 4) / 16
    assert sign_counts([-0.01, math.inf, -math.inf]) == (2, 1)  # a failure counts by its sign
    for wins, n in ((6, 5), (-1, 5), (0, 0)):
        with pytest.raises(ValueError):
            sign_test(wins, n)


@pytest.mark.parametrize("k, n, low, high", [
    (0, 6, 0.0, 1 - 0.025 ** (1 / 6)),  # closed form at the ends: (1 - high) ** 6 = 0.025
    (6, 6, 0.025 ** (1 / 6), 1.0),      # low ** 6 = 0.025
    (0, 1, 0.0, 0.975),
    (1, 6, 0.0042107445, 0.6412345790),  # the beta quantiles Beta(0.025; 1, 6) and Beta(0.975; 2, 5), from a table
    (3, 6, 0.1181172488, 0.8818827512),
    (1, 10, 0.0025285785, 0.4450161170),
])
def test_clopper_pearson_meets_the_closed_forms_and_the_tabulated_beta_quantiles(k: int, n: int, low: float, high: float) -> None:
    got = clopper_pearson(k, n)
    assert got == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))


def test_clopper_pearson_mirrors_failures_and_successes_and_refuses_impossible_counts() -> None:
    for k in range(7):  # k failures of 6 is 6 - k successes: the interval reflected about one half
        low, high = clopper_pearson(k, 6)
        assert clopper_pearson(6 - k, 6) == (pytest.approx(1 - high, abs=1e-12), pytest.approx(1 - low, abs=1e-12))
        assert low <= k / 6 <= high
    assert clopper_pearson(1, 6, confidence=0.5)[1] < clopper_pearson(1, 6)[1]  # a lower confidence narrows it
    for k, n, confidence in ((7, 6, 0.95), (-1, 6, 0.95), (0, 0, 0.95), (1, 6, 1.0)):
        with pytest.raises(ValueError):
            clopper_pearson(k, n, confidence)


def test_the_two_seed_rule_power_is_the_normal_tail_to_the_power_n() -> None:
    # Phi(0) = 0.5, Phi(1) = 0.8413447460685429 and Phi(1.959964) = 0.975 from the normal table.
    assert normal_cdf(0.0) == 0.5
    assert normal_cdf(1.0) == pytest.approx(0.8413447460685429, rel=1e-12)
    assert normal_cdf(-1.959963984540054) == pytest.approx(0.025, rel=1e-9)
    above, below = parse_rule("every_gap>0.02"), parse_rule("every_gap<-0.02")
    assert every_gap_power(above, 0.02, 0.01, 2) == pytest.approx(0.25)  # a true gap on the threshold: 0.5 * 0.5
    assert every_gap_power(above, 0.03, 0.01, 2) == pytest.approx(0.8413447460685429 ** 2)  # one SD beyond it
    assert every_gap_power(below, -0.03, 0.01, 2) == pytest.approx(0.8413447460685429 ** 2)  # the mirror image
    assert every_gap_power(below, 0.03, 0.01, 2) == pytest.approx((1 - 0.9999997133484281) ** 2)  # Phi(-5) ** 2
    assert every_gap_power(above, 0.02, 0.01, 5) == pytest.approx(0.03125)  # 0.5 ** 5
    with pytest.raises(ValueError):
        every_gap_power(parse_rule("upper<0"), 0.03, 0.01, 2)
    with pytest.raises(ValueError):
        every_gap_power(above, 0.03, 0.0, 2)


def test_a_rule_says_holds_does_not_hold_or_undecided() -> None:
    every, upper = parse_rule("every_gap<-0.02"), parse_rule(" upper < -0.02 ")
    assert (every.text, upper.describe()) == ("every_gap<-0.02", "the upper end of the mean gap's 95% interval below -0.02")
    assert verdict(every, {1338: -0.03, 1339: -0.025}) == "holds"
    assert verdict(every, {1338: -0.03, 1339: -0.01}) == "does not hold"
    assert verdict(every, {1338: -0.03, 1339: None}) == "undecided (runs missing: seed 1339)"
    assert verdict(upper, {1338: -0.03, 1339: -0.04}) == "undecided (no interval: 2 held-out seeds, it needs 3)"
    assert verdict(upper, {1: -0.03, 2: -0.01, 3: -0.05}) == "does not hold"  # upper end +0.0197 (the interval test above)
    assert verdict(parse_rule("upper<0.02"), {1: -0.03, 2: -0.01, 3: -0.05}) == "holds"
    # A failed run counts against its side: +inf where the arm failed, -inf where the baseline did, nan both.
    assert verdict(every, {1: -0.03, 2: math.inf}) == "does not hold"
    assert verdict(every, {1: -0.03, 2: -math.inf}) == "holds"
    assert verdict(upper, {1: -0.03, 2: math.inf, 3: -0.05}) == "does not hold"
    assert verdict(every, {1: -0.03, 2: math.nan}) == "does not hold"


@pytest.mark.parametrize("spec", ["every_gap<=-0.02", "mean<0", "every_gap<", "upper<0.0.1"])
def test_a_bad_rule_is_one_sentence_naming_the_valid_forms(spec: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_rule(spec)
    assert str(e.value) == (f"--rule {spec!r} is not a rule; give QUANTITY<NUMBER or QUANTITY>NUMBER with QUANTITY one of "
                            "every_gap, upper, lower (e.g. every_gap<-0.02).")


# -----------------------------------------------------------------------------
# --refine in the engine's follow-up rule


def test_refine_adds_the_midpoints_beside_the_selection_best_before_the_held_out_seeds_run() -> None:
    sweep = Sweep("toy", {}, (Axis("lr", (1e-3, 2e-3, 4e-3, 8e-3)), Axis("seed", (7, 8))), lambda p: f"{p['lr']:g}_{p['seed']}",
                  follow_up=best_rate_follow_up(refine=True))
    done = {point(lr=lr, seed=7): loss for lr, loss in {1e-3: 2.3, 2e-3: 2.1, 4e-3: 2.2, 8e-3: 2.4}.items()}
    # Best 2e-3: midpoints sqrt(1e-3 * 2e-3) = 0.00141421 and sqrt(2e-3 * 4e-3) = 0.00282843; no held-out seed yet.
    first = plan_points(sweep, done)
    assert sorted(p["lr"] for p in first) == [1e-3, 0.00141421, 2e-3, 0.00282843, 4e-3, 8e-3] and {p["seed"] for p in first} == {7}
    done.update({point(lr=0.00141421, seed=7): 2.15, point(lr=0.00282843, seed=7): 2.05})
    held = [p["lr"] for p in plan_points(sweep, done) if p["seed"] == 8]
    assert held == [0.00282843, 2e-3, 4e-3]  # the refined best first, then its neighbours on the refined grid
    plain = Sweep("toy", {}, sweep.axes, sweep.folder, follow_up=best_rate_follow_up())
    assert [p["lr"] for p in plan_points(plain, done) if p["seed"] == 8] == [2e-3, 1e-3, 4e-3]


def test_no_neighbours_runs_the_held_out_seeds_at_each_selected_rate_alone() -> None:
    """--no_neighbours (issue 50's E3 reads the selected rates only): the plan, the design's size
    and the record say so; the default keeps the two neighbours."""
    sweep = Sweep("toy", {}, (Axis("lr", (1e-3, 2e-3, 4e-3)), Axis("seed", (7, 8, 9))), lambda p: f"{p['lr']:g}_{p['seed']}",
                  follow_up=best_rate_follow_up(neighbours=False))
    done = {point(lr=lr, seed=7): loss for lr, loss in {1e-3: 2.3, 2e-3: 2.1, 4e-3: 2.2}.items()}
    held = [(p["lr"], p["seed"]) for p in plan_points(sweep, done) if p["seed"] != 7]
    assert held == [(2e-3, 8), (2e-3, 9)]
    args, overrides = fair_sweep.parse_args(["--blocks=llama", "--arms=pre_ln,p_spheret-0.5", "--lrs=1e-3,2e-3,4e-3", "--seeds=1,2,3", "--no_neighbours"])
    # Per arm: 3 rates and 1 extension with the selection seed, then 2 held-out seeds at the best alone (with neighbours: 3 rates x 2).
    design = fair_sweep.design_of(args, overrides)
    assert fair_sweep.design_size(design, neighbours=False) == 2 * (3 + 1 + 2)
    done = {point(block="llama", arm=arm, lr=lr, seed=1): loss for arm in ("pre_ln", "p_spheret-0.5") for lr, loss in {1e-3: 2.3, 2e-3: 2.1, 4e-3: 2.2}.items()}
    assert sorted((p["arm"], p["lr"], p["seed"]) for p in plan_points(design, done) if p["seed"] != 1) == [
        ("p_spheret-0.5", 2e-3, 2), ("p_spheret-0.5", 2e-3, 3), ("pre_ln", 2e-3, 2), ("pre_ln", 2e-3, 3)]
    args, overrides = fair_sweep.parse_args(["--blocks=llama", "--arms=pre_ln,p_spheret-0.5", "--lrs=1e-3,2e-3,4e-3", "--seeds=1,2,3"])
    assert fair_sweep.design_size(fair_sweep.design_of(args, overrides)) == 2 * (3 + 1 + 6)


# -----------------------------------------------------------------------------
# Kernel paths


def test_an_old_run_folders_kernel_path_is_derived_from_its_config() -> None:
    assert kernel_path_of({"kernel_path": "float32 compiled fused_in_model_compile", "dtype": "bfloat16"}) == "float32 compiled fused_in_model_compile"
    assert kernel_path_of({"dtype": "auto", "device": "cpu"}) == "float32 eager unknown"  # no compile key: eager; no sphere_kernels: unknown
    assert kernel_path_of({"dtype": "auto", "device": "cuda", "compile": True, "sphere_kernels": "triton"}) == "unknown compiled triton"
    assert kernel_path_of({"dtype": "float32", "compile": False, "sphere_kernels": None}) == "float32 eager none"
    assert kernel_path_of({"dtype": "auto", "resolved_dtype": "bfloat16", "sphere_kernels": "fused_eager"}) == "bfloat16 eager fused_eager"


# -----------------------------------------------------------------------------
# The fair sweep's table over run folders written here


SEEDS = (1337, 1338, 1339, 1340)
LRS = (1e-3, 2e-3, 4e-3)
# val_loss_full of each run (block llama): the selection seed 1337 at every rate, the held-out seeds
# at the best rate (2e-3 for both arms) and at its neighbours. 0.0 marks a run that collapsed.
LOSSES = {
    "pre_ln": {1337: {1e-3: 2.30, 2e-3: 2.20, 4e-3: 2.25}, 1338: {1e-3: 2.31, 2e-3: 2.21, 4e-3: 2.26},
               1339: {1e-3: 2.29, 2e-3: 2.19, 4e-3: 2.24}, 1340: {1e-3: 2.33, 2e-3: 2.23, 4e-3: 2.27}},
    "p_spheret-0.5": {1337: {1e-3: 2.40, 2e-3: 2.15, 4e-3: 2.19}, 1338: {1e-3: 2.41, 2e-3: 2.18, 4e-3: 2.20},
                      1339: {1e-3: 2.42, 2e-3: 2.15, 4e-3: 0.0}, 1340: {1e-3: 2.39, 2e-3: 2.20, 4e-3: 2.21}},
}
MAX_ITERS = 600
SPHERE_PATH = "float32 eager fused_eager"


CHAIN_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN"
CHAIN_SUCCESSORS = 16


def chain_text(length: int = 20_000) -> str:
    """Characters of a made-up chain: each of 40 letters is followed by one of its 16 fixed successors
    at random (seeded). Its unigram loss is near ln 40 = 3.69 and its bigram loss near ln 16 = 2.77, so
    the losses chosen below (2.15 to 2.43) are trained runs, and one between 2.9 and 3.5 a stall."""
    rng = random.Random(0)
    successors = {c: rng.sample(CHAIN_LETTERS, CHAIN_SUCCESSORS) for c in CHAIN_LETTERS}
    out, c = [], "a"
    for _ in range(length):
        out.append(c)
        c = rng.choice(successors[c])
    return "".join(out)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """chain_text's characters, prepared as the studies prepare Tiny Shakespeare."""
    root = tmp_path_factory.mktemp("stats_data")
    (root / "chain.txt").write_text(chain_text(), encoding="utf-8")
    ensure_data(root / "data", str(root / "chain.txt"))
    return root / "data"


def argv(out: Path, data_dir: Path, *extra: str) -> list[str]:
    return ["--table_only", "--blocks=llama", "--arms=pre_ln,p_spheret-0.5", f"--lrs={','.join(map(str, LRS))}",
            f"--seeds={','.join(map(str, SEEDS))}", f"--max_iters={MAX_ITERS}", f"--out_dir={out}", f"--data_dir={data_dir}", *extra]


def write_run(out: Path, data_dir: Path, arm: str, lr: float, seed: int, full: float, kernel_path: str | None = None,
              whole_split: bool = True) -> None:
    """A finished run folder as train.py leaves it: config.json (fair_sweep's settings for it) and
    metrics.jsonl (a train row, evaluations, the last one at max_iters with val_loss_full); full 0.0:
    the collapse alarm stopped it at iteration 300 (a stop row last); whole_split False: a run from before val_loss_full."""
    design = fair_sweep.design_of(*fair_sweep.parse_args(argv(out, data_dir)))
    p = point(block="llama", arm=arm, lr=lr, seed=seed)
    parsed = parse_train_args(train_argv(design, p, Place(out, data_dir)))
    model = parsed.model_config()
    on_sphere = arm != "pre_ln"
    config = {**asdict(parsed.train), **asdict(model), "method": method_key(model), "resolved_dtype": "float32",
              "sphere_kernels": "fused_eager" if on_sphere else None,
              "kernel_path": kernel_path or (SPHERE_PATH if on_sphere else "float32 eager none")}
    folder = out / design.folder(p)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, default=str), encoding="utf-8")
    if full == 0.0:
        rows = [{"kind": "eval", "iter": 300, "val_loss": 2.9, "final_cosine": 0.99},
                {"kind": "stop", "iter": 300, "reason": "collapse", "message": "final_cosine above 0.95 at 3 evaluations"}]
    else:
        last = {"kind": "eval", "iter": MAX_ITERS, "val_loss": round(full + 0.1, 4), "final_cosine": 0.2}  # the sampled loss: not the table's
        rows = [{"kind": "train", "iter": 590, "train_loss_avg200": 2.0}, {"kind": "eval", "iter": 300, "val_loss": 2.6},
                {**last, **({"val_loss_full": full, "val_full_tokens": 4096} if whole_split else {})}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_sweep(out: Path, data_dir: Path, losses: dict = LOSSES) -> None:
    for arm, by_seed in losses.items():
        for seed, by_lr in by_seed.items():
            for lr, full in by_lr.items():
                write_run(out, data_dir, arm, lr, seed, full)


def table(out: Path) -> list[str]:
    return (out / "fair_sweep.md").read_text(encoding="utf-8").splitlines()


def row_of(lines: list[str], arm_title: str) -> list[str]:
    line = next(ln for ln in lines if ln.startswith(f"| LLaMA | {arm_title} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_headline_is_the_held_out_mean_at_the_selection_seeds_rate_with_a_paired_interval(data_dir: Path, tmp_path: Path,
                                                                                                capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "sweep"
    write_sweep(out, data_dir)
    assert fair_sweep.main(argv(out, data_dir, "--rule=every_gap<-0.02", "--rule=upper<-0.02", "--wide")) == 0  # every column
    lines = table(out)
    sphere = row_of(lines, "0.5-SpheretNorm")
    # Selected on seed 1337 alone: 2e-3 (2.15; the held-out seeds would pick 2e-3 too). Held out: 2.18, 2.15, 2.20, mean 2.17667.
    # Gaps to Pre-LN at its own 2e-3: -0.03, -0.04, -0.03: mean -0.03333, SD 0.0057735,
    # half width 4.302653 * 0.0057735 / sqrt(3) = 0.0143422: -0.0476755 to -0.0189912.
    assert sphere[3:11] == ["0.002", "2.150", "1338: 2.180, 1339: 2.150, 1340: 2.200", "2.177",
                            "1338: -0.030, 1339: -0.040, 1340: -0.030", "-0.033", "0.006", "-0.048 to -0.019"]
    assert sphere[11] == "0.004 (seed 1339 collapsed)"  # the selection seed trained there, a held-out seed did not
    pre_ln = row_of(lines, "Pre-LN")
    assert pre_ln[3:7] == ["0.002", "2.200", "1338: 2.210, 1339: 2.190, 1340: 2.230", "2.210"]
    text = "\n".join(lines)
    assert "Loss: val_loss_full, the whole validation split" in text and f"Kernel paths: {SPHERE_PATH}; float32 eager none." in text
    assert "- rule every_gap<-0.02 (every held-out seed's gap below -0.02): 0.5-SpheretNorm (LLaMA) -> holds" in lines
    assert "- rule upper<-0.02 (the upper end of the mean gap's 95% interval below -0.02): 0.5-SpheretNorm (LLaMA) -> does not hold" in lines
    record = json.loads((out / "fair_sweep.json").read_text())
    assert record["declared"]["rules"] == ["every_gap<-0.02", "upper<-0.02"] and record["declared"]["held_out_seeds"] == [1338, 1339, 1340]
    assert (record["selection_seed"], record["metric"]) == (1337, "val_loss_full")
    best = next(s for s in record["best"] if s["arm"] == "p_spheret-0.5")
    assert (best["gap_low"], best["gap_high"]) == (pytest.approx(-0.0476755, abs=1e-6), pytest.approx(-0.0189912, abs=1e-6))

    # The rules were declared before these results: another one is refused, none given keeps them.
    capsys.readouterr()
    assert fair_sweep.main(argv(out, data_dir, "--rule=every_gap<-0.01")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "differs from the rule(s) declared in" in err and "(every_gap<-0.02 upper<-0.02)" in err
    assert fair_sweep.main(argv(out, data_dir)) == 0
    assert "- rule every_gap<-0.02 (every held-out seed's gap below -0.02): 0.5-SpheretNorm (LLaMA) -> holds" in table(out)


def test_the_default_summary_is_narrow_and_the_record_keeps_every_column(data_dir: Path, tmp_path: Path) -> None:
    """Issue 66, item 8: the rate, the held-out mean, the gap and its interval, failures; the rest in
    fair_sweep.json and --wide (the same numbers as the test above: 2.177, -0.033, -0.048 to -0.019)."""
    out = tmp_path / "sweep"
    write_sweep(out, data_dir)
    assert fair_sweep.main(argv(out, data_dir)) == 0
    lines = table(out)
    top = lines.index("Each arm at its best learning rate:") + 2
    assert lines[top:top + 4] == [
        "| block | arm | optimizer | best lr (seed 1337) | held-out mean | minus Pre-LN (same seed), mean | 95% interval | held-out failed at |",
        "|:--|:--|:--|--:|--:|--:|--:|:--|",
        "| LLaMA | Pre-LN | AdamW | 0.002 | 2.210 | - | - | - |",
        "| LLaMA | 0.5-SpheretNorm | AdamW | 0.002 | 2.177 | -0.033 | -0.048 to -0.019 | 0.004 (seed 1339 collapsed) |"]
    assert lines[top + 5] == ("The selection seed's loss, each held-out seed and gap, the gaps' SD, alpha, the radius and the rates where any "
                              "run failed: fair_sweep.json (\"best\"), or this table with --wide.")
    best = next(s for s in json.loads((out / "fair_sweep.json").read_text())["best"] if s["arm"] == "p_spheret-0.5")
    assert (best["selection_loss"], best["held_out_text"], best["gap_sd"]) == (2.15, "1338: 2.180, 1339: 2.150, 1340: 2.200", pytest.approx(0.0057735, abs=1e-7))
    assert {"step_pinned", "below_cap", "step_ratio", "radius", "radius_pinned", "unstable"} <= set(best)


def test_a_grid_of_one_rate_is_not_called_the_best(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    write_sweep(out, data_dir)
    assert fair_sweep.main(argv(out, data_dir, "--lrs=2e-3")) == 0  # every seed at 2e-3, none chosen
    text = "\n".join(table(out))
    assert "best lr" not in text and "its best" not in text  # the title and the rate's header (the record's key is still "best")
    assert "Each arm at the one learning rate its grid gives:" in text
    assert "| block | arm | optimizer | lr (the one its grid gives) | held-out mean |" in text
    assert "| LLaMA | 0.5-SpheretNorm | AdamW | 0.002 | 2.177 | -0.033 | -0.048 to -0.019 | - |" in text  # no other rate ran: no failure beside


def test_a_held_out_seed_that_collapsed_at_the_selected_rate_fails_the_cell(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    losses = json.loads(json.dumps(LOSSES), object_hook=lambda d: {(float(k) if "." in k else int(k)) if k[0].isdigit() else k: v for k, v in d.items()})
    losses["p_spheret-0.5"][1339][2e-3] = 0.0  # collapsed at the selected rate
    write_sweep(out, data_dir, losses)
    assert fair_sweep.main(argv(out, data_dir, "--rule=every_gap<-0.02", "--rule=upper<-0.02", "--wide")) == 0
    sphere = row_of(table(out), "0.5-SpheretNorm")
    # Never the mean of the two survivors (2.18, 2.20): the cell fails, and so does the gap, with no interval.
    assert sphere[3:11] == ["0.002", "2.150", "1338: 2.180, 1339: collapsed, 1340: 2.200", "failed (seed 1339 collapsed)",
                            "1338: -0.030, 1339: +inf, 1340: -0.030", "failed (seed 1339: the arm failed)", "-", "-"]
    assert "- rule every_gap<-0.02 (every held-out seed's gap below -0.02): 0.5-SpheretNorm (LLaMA) -> does not hold" in table(out)


STALL = 3.10  # a whole-split loss above chain_text's bigram loss (2.84) and, sampled (3.20), below its unigram line (3.66 - 0.05)


def counted_bigram_loss(data_dir: Path) -> float:
    """The add-one bigram cross-entropy of docs/LOG.md (2026-12-07), counted here in plain Python."""
    vocab = json.loads((data_dir / "meta.json").read_text())["vocab_size"]
    train, val = ([int(t) for t in np.fromfile(data_dir / f"{split}.bin", dtype=np.uint16)] for split in ("train", "val"))
    pairs, starts = Counter(zip(train, train[1:])), Counter(train[:-1])
    return -sum(math.log((pairs[a, b] + 1) / (starts[a] + vocab)) for a, b in zip(val, val[1:])) / (len(val) - 1)


def with_stall(arm: str, seed: int, lr: float) -> dict:
    losses = copy.deepcopy(LOSSES)
    losses[arm][seed][lr] = STALL
    return losses


def test_a_held_out_seed_that_stalled_at_the_selected_rate_fails_the_cell_as_a_collapse_does(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    write_sweep(out, data_dir, with_stall("p_spheret-0.5", 1339, 2e-3))
    assert fair_sweep.main(argv(out, data_dir, "--rule=every_gap<-0.02", "--rule=upper<-0.02", "--wide")) == 0
    lines = table(out)
    sphere = row_of(lines, "0.5-SpheretNorm")
    # Counted as trained, 3.10 would give a mean of (2.18 + 3.10 + 2.20) / 3 = 2.493 and a gap of (-0.03 + 0.91 - 0.03) / 3 = +0.283.
    assert sphere[3:12] == ["0.002", "2.150", "1338: 2.180, 1339: stalled, 1340: 2.200", "failed (seed 1339 stalled)",
                            "1338: -0.030, 1339: +inf, 1340: -0.030", "failed (seed 1339: the arm failed)", "-", "-",
                            "0.002 (seed 1339 stalled), 0.004 (seed 1339 collapsed)"]
    assert sphere[-1] == "0.002, 0.004"  # diverged or collapsed at
    assert "- rule every_gap<-0.02 (every held-out seed's gap below -0.02): 0.5-SpheretNorm (LLaMA) -> does not hold" in lines
    assert "| LLaMA | 0.5-SpheretNorm | AdamW | 0.002 | 1339 | 3.100 | stalled | - | - | - |" in lines
    record = json.loads((out / "fair_sweep.json").read_text())
    assert record["bigram_loss"] == pytest.approx(counted_bigram_loss(data_dir), rel=1e-9)
    assert [(r["lr"], r["seed"], r["reason"]) for r in record["runs"] if r["status"] == "stalled"] == [
        (0.002, 1339, f"val loss 3.100 above the bigram loss {counted_bigram_loss(data_dir):.3f} (unigram {record['unigram_loss']:.3f})")]


def test_compare_judges_an_old_record_from_its_data_folder_or_says_in_one_line_it_cannot(data_dir: Path, tmp_path: Path,
                                                                                          capsys: pytest.CaptureFixture) -> None:
    from spheretnorm.experiments.gap_figure import gap_points

    new = tmp_path / "new"
    write_sweep(new, data_dir, with_stall("p_spheret-0.5", 1339, 2e-3))
    assert fair_sweep.main(argv(new, data_dir)) == 0
    old = tmp_path / "old"  # the same sweep as the code before the status recorded it: the stall "ok", its 3.10 in the gaps
    shutil.copytree(new, old)
    record = json.loads((old / "fair_sweep.json").read_text())
    del record["bigram_loss"]
    record["runs"] = [{**r, "status": "ok", "reason": ""} if r["status"] == "stalled" else r for r in record["runs"]]
    # ... and before the digests (issue 67): nothing vouches for its files, so editing them below is no mismatch.
    record["runs"] = [{k: v for k, v in r.items() if k not in ("config_sha256", "metrics_sha256", "declared_digest")} for r in record["runs"]]
    sphere = next(s for s in record["best"] if s["arm"] == "p_spheret-0.5")
    sphere["gaps"] = {"1338": -0.03, "1339": 0.91, "1340": -0.03}  # 3.10 - 2.19 at seed 1339
    (old / "fair_sweep.json").write_text(json.dumps(record))

    def gaps(folder: Path) -> dict[int, float]:
        return {p.seed: p.gap for p in gap_points(fair_sweep.judged_record(folder), "width", str(folder))}

    capsys.readouterr()
    assert gaps(new) == {1338: pytest.approx(-0.03), 1339: math.inf, 1340: pytest.approx(-0.03)}
    assert capsys.readouterr().out == ""  # a record with its bigram loss is read as written
    assert gaps(old) == {1338: pytest.approx(-0.03), 1339: math.inf, 1340: pytest.approx(-0.03)}
    assert capsys.readouterr().out == (f"note: {old / 'fair_sweep.json'} predates the 'stalled' status; its runs were judged against "
                                       f"the bigram loss {counted_bigram_loss(data_dir):.3f} of {data_dir}: 1 stalled.\n")
    for config in old.glob("**/config.json"):  # the data folder its runs trained on is gone
        config.write_text(json.dumps({**json.loads(config.read_text()), "data_dir": str(tmp_path / "gone")}))
    assert gaps(old) == {1338: pytest.approx(-0.03), 1339: pytest.approx(0.91), 1340: pytest.approx(-0.03)}  # as recorded
    note = capsys.readouterr().out
    assert note.count("\n") == 1 and "stalls cannot be judged for that record" in note
    assert fair_sweep.main(["--compare", f"{old},{new}", "--gap_against", "width", "--blocks", "llama", f"--out_dir={tmp_path / 'figs'}"]) == 0
    assert (tmp_path / "figs" / "gap_vs_width.png").is_file()


def test_two_held_out_seeds_give_no_interval_and_a_missing_one_leaves_the_rule_undecided(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    write_sweep(out, data_dir, {arm: {s: by_seed[s] for s in (1337, 1338, 1339)} for arm, by_seed in LOSSES.items()})
    assert fair_sweep.main(argv(out, data_dir, "--seeds=1337,1338,1339", "--rule=upper<-0.02", "--wide")) == 0
    sphere = row_of(table(out), "0.5-SpheretNorm")
    assert sphere[6:11] == ["2.165", "1338: -0.030, 1339: -0.040", "-0.035", "0.007", "no interval (2 seeds; it needs 3)"]
    assert "- rule upper<-0.02 (the upper end of the mean gap's 95% interval below -0.02): 0.5-SpheretNorm (LLaMA) -> " \
           "undecided (no interval: 2 held-out seeds, it needs 3)" in table(out)
    out2 = tmp_path / "missing"
    write_sweep(out2, data_dir, {arm: {s: by_seed[s] for s in (1337, 1338)} for arm, by_seed in LOSSES.items()})
    assert fair_sweep.main(argv(out2, data_dir, "--seeds=1337,1338,1339", "--rule=every_gap<-0.02", "--wide")) == 0
    assert row_of(table(out2), "0.5-SpheretNorm")[6] == "runs missing (seed 1339)"
    assert "- rule every_gap<-0.02 (every held-out seed's gap below -0.02): 0.5-SpheretNorm (LLaMA) -> " \
           "undecided (runs missing: seed 1339)" in table(out2)


def test_the_selection_seed_may_be_named_and_old_runs_use_the_sampled_loss(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    write_sweep(out, data_dir)
    write_run(out, data_dir, "pre_ln", 1e-3, 1340, 2.33, whole_split=False)  # a run from before val_loss_full: every run's val_loss then
    assert fair_sweep.main(argv(out, data_dir, "--selection_seed=1338", "--wide")) == 0
    lines = table(out)
    assert "Loss: val_loss, the mean of eval_iters sampled batches (some run lacks val_loss_full)." in "\n".join(lines)
    # Seed 1338 selects (val_loss = val_loss_full + 0.1): Pre-LN 2e-3 at 2.31; the held-out 1337, 1339, 1340 there: 2.30, 2.29, 2.33.
    assert row_of(lines, "Pre-LN")[3:7] == ["0.002", "2.310", "1337: 2.300, 1339: 2.290, 1340: 2.330", "2.307"]
    assert "| best lr (seed 1338) | seed 1338 |" in lines[next(i for i, ln in enumerate(lines) if "best lr" in ln)]


def test_a_table_refuses_two_kernel_paths_unless_asked(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "sweep"
    write_sweep(out, data_dir)
    write_run(out, data_dir, "p_spheret-0.5", 1e-3, 1337, 2.40, "float32 eager fused_compiled")
    assert fair_sweep.main(argv(out, data_dir)) == 2
    err = capsys.readouterr().err
    assert err == (f"error: the runs of this table ran on 3 kernel paths (float32 eager fused_compiled; {SPHERE_PATH}; float32 eager none); "
                   "give --mix_kernel_paths to tabulate them together, or tabulate runs of one path.\n")
    assert fair_sweep.main(argv(out, data_dir, "--mix_kernel_paths")) == 0
    assert "Kernel paths: float32 eager fused_compiled; float32 eager fused_eager; float32 eager none." in "\n".join(table(out))


def test_a_selection_seed_outside_the_seeds_is_one_sentence(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert fair_sweep.main(argv(tmp_path / "sweep", data_dir, "--selection_seed=7")) == 2
    assert capsys.readouterr().err == "error: --selection_seed 7 is not one of --seeds (1337, 1338, 1339, 1340); give one of them.\n"


def test_the_rate_is_the_selection_seeds_even_where_the_mean_over_all_seeds_would_pick_another() -> None:
    from spheretnorm.experiments.study import Seeds, selected_cell

    def run(lr: float, seed: int, loss: float) -> dict[str, object]:
        return {"lr": lr, "seed": seed, "val_loss": loss, "status": "ok"}

    # Seed 1 alone picks 4e-3 (1.90 < 1.95); the mean over both seeds would pick 2e-3 (1.975 < 2.00).
    runs = [run(2e-3, 1, 1.95), run(2e-3, 2, 2.00), run(4e-3, 1, 1.90), run(4e-3, 2, 2.10)]
    cell = selected_cell(runs, Seeds(1, (2,)), "val_loss")
    assert (cell["rate"], cell["selection_loss"], cell["held_out"].losses) == (4e-3, 1.90, {2: 2.10})
