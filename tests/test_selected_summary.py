"""The held-out statistics of any sweep that selects a rate (issue 65, item 1): a Sweep declared
here, outside the package, with the engine's rate follow-up gets from runs_text (and so from
sweep_main) each group at the rate its selection seed chose, the held-out seeds' mean there, the
gaps paired by held-out seed to its baseline at the baseline's own rate, and the rules judged on
those gaps; never the pool of every seed.

The rows are written here as the engine's rows look (name_rows over point_row's keys), no run
trains; every expected number is worked out by hand in the comments (the t quantile from a table).
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from spheretnorm.experiments import study
from spheretnorm.experiments.grid import Yardsticks
from spheretnorm.experiments.stats import parse_rule
from spheretnorm.experiments.study import Axis, Column, Place, Sweep, best_rate_follow_up, grid_points, name_rows, runs_text, sweep_main

LRS = (1e-3, 2e-3, 4e-3, 8e-3)
SEEDS = (1, 2, 3, 4)  # seed 1 selects, 2, 3 and 4 are held out
# val_loss of each run, by method, seed and rate.
LOSSES = {
    # Seed 1 picks 4e-3 (2.20); the held-out seeds' mean would pick 2e-3 (2.21 there, 2.26 at 4e-3).
    "pre_ln": {1: {1e-3: 2.35, 2e-3: 2.25, 4e-3: 2.20, 8e-3: 2.30}, 2: {1e-3: 2.36, 2e-3: 2.21, 4e-3: 2.26, 8e-3: 2.31},
               3: {1e-3: 2.34, 2e-3: 2.20, 4e-3: 2.23, 8e-3: 2.33}, 4: {1e-3: 2.37, 2e-3: 2.22, 4e-3: 2.29, 8e-3: 2.32}},
    # Seed 1 picks 2e-3 (2.10, a lucky draw: the held-out seeds there are 2.20, 2.19, 2.24).
    "geonorm": {1: {1e-3: 2.40, 2e-3: 2.10, 4e-3: 2.18, 8e-3: 2.50}, 2: {1e-3: 2.41, 2e-3: 2.20, 4e-3: 2.19, 8e-3: 2.52},
                3: {1e-3: 2.39, 2e-3: 2.19, 4e-3: 2.21, 8e-3: 2.49}, 4: {1e-3: 2.42, 2e-3: 2.24, 4e-3: 2.20, 8e-3: 2.51}},
}
T_975_DF2 = 4.302653  # Student's t, 97.5% quantile, 2 degrees of freedom, from a table

SWEEP = Sweep(
    name="toy_rates",
    base={},
    axes=(Axis("method", ("pre_ln", "geonorm")), Axis("lr", LRS), Axis("seed", SEEDS)),
    folder=lambda p: f"{p['method']}/lr{p['lr']:g}_s{p['seed']}",
    columns=(Column("run", "name", align=":--"), Column("seed", "seed"), Column("val loss", "val_loss", ".3f")),
    baseline=lambda p: p.but(method="pre_ln"),
    follow_up=best_rate_follow_up(),
)


def engine_rows(sweep: Sweep, failed: dict[tuple[str, int, float], str] | None = None) -> list[dict[str, Any]]:
    """Every run's row as point_row leaves it (its row keys and outcome), named by name_rows;
    failed: (method, seed, lr) -> the status of a run that did not learn (its loss is no result)."""
    failed = failed or {}
    rows = {}
    for p in grid_points(sweep):
        status = failed.get((p["method"], p["seed"], p["lr"]), "ok")
        loss = LOSSES[p["method"]][p["seed"]][p["lr"]]
        rows[p] = {**p.values, "status": status, "reason": "", "val_loss": None if status == "diverged" else (loss if status == "ok" else 3.3),
                   "val_loss_full": None, "kernel_path": None, "train_loss_avg": None, "final_cosine": 0.3, "last_eval_iter": 100,
                   "seconds": 1.0, "reused": True, "out_dir": f"/nowhere/{sweep.folder(p)}"}
    return name_rows(sweep, grid_points(sweep), rows, "val_loss")


def summary_line(text: str, method: str) -> list[str]:
    """The cells of a method's line in the held-out summary (the lines after its title), its name left out."""
    after = text.split("the held-out seeds (2, 3, 4) there", 1)[1]
    line = next(ln for ln in after.splitlines() if ln.startswith(f"| {method} |"))
    return [c.strip() for c in line.strip("|").split("|")][1:]


def test_each_group_is_reported_at_its_selection_seeds_rate_on_the_held_out_seeds_alone() -> None:
    text = runs_text(SWEEP, engine_rows(SWEEP), "Pre-LN")
    assert "Over the seeds:" not in text  # no pooled summary of every seed at each rate
    pre_ln = summary_line(text, "pre_ln")
    # Seed 1 alone chooses 4e-3 (2.20), though the held-out seeds would choose 2e-3; held out there: 2.26, 2.23, 2.29.
    assert pre_ln[:5] == ["0.004", "2.200", "2: 2.260, 3: 2.230, 4: 2.290", format(statistics.mean([2.26, 2.23, 2.29]), ".3f"), "-"]
    assert pre_ln[4:] == ["-"] * 5  # the baseline has no gap to itself, not a column of zeros
    geonorm = summary_line(text, "geonorm")
    # Held out at 2e-3: mean (2.20 + 2.19 + 2.24) / 3 = 2.210; with seed 1's 2.10 it would be 2.1825.
    assert geonorm[:5] == ["0.002", "2.100", "2: 2.200, 3: 2.190, 4: 2.240", "2.210", "2: -0.060, 3: -0.040, 4: -0.050"]
    assert statistics.mean([2.20, 2.19, 2.24]) == pytest.approx(2.21)


def test_gaps_pair_each_held_out_seed_with_the_baseline_at_the_baselines_own_rate() -> None:
    text = runs_text(SWEEP, engine_rows(SWEEP), "Pre-LN")
    header = next(ln for ln in text.split("there, gaps paired", 1)[1].splitlines() if ln.startswith("| method |"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "method", "lr (selected on seed 1)", "seed 1", "held-out seeds", "held-out mean", "minus Pre-LN (same seed), each", "mean", "SD",
        "95% interval", "held-out failed at"]
    # GeoNorm at its 2e-3 minus Pre-LN at its 4e-3, seed by seed: 2.20 - 2.26, 2.19 - 2.23, 2.24 - 2.29 (at one rate, 2e-3,
    # they would be -0.01, -0.01, +0.02). Mean -0.05, SD 0.01 (deviations -0.01, +0.01, 0: sqrt(0.0002 / 2)),
    # 95% interval -0.05 -+ 4.302653 * 0.01 / sqrt(3) = -0.05 -+ 0.024841: -0.074841 to -0.025159.
    gaps = [-0.06, -0.04, -0.05]
    half = T_975_DF2 * statistics.stdev(gaps) / 3 ** 0.5
    assert half == pytest.approx(0.024841, abs=1e-6)
    assert summary_line(text, "geonorm")[5:] == ["-0.050", "0.010", f"{-0.05 - half:+.3f} to {-0.05 + half:+.3f}", "-"]
    assert f"{-0.05 - half:+.3f} to {-0.05 + half:+.3f}" == "-0.075 to -0.025"


def rate_column_title(text: str) -> str:
    header = next(ln for ln in text.split("there, gaps paired", 1)[1].splitlines() if ln.startswith("| method |"))
    return header.strip("|").split("|")[1].strip()


def test_the_rate_column_says_given_where_an_arms_grid_holds_one_rate() -> None:
    """Where the selection seed ran one rate for an arm, nothing was selected on it: the column says so."""
    one_rate = replace(SWEEP, axes=(Axis("method", ("pre_ln", "geonorm")), Axis("lr", (2e-3,)), Axis("seed", SEEDS)))
    assert rate_column_title(runs_text(one_rate, engine_rows(one_rate), "Pre-LN")) == "lr (given, one per arm: none selected)"
    rows = [r for r in engine_rows(SWEEP) if r["method"] == "pre_ln" or r["lr"] == 2e-3]  # GeoNorm's grid: 2e-3 alone
    assert rate_column_title(runs_text(SWEEP, rows, "Pre-LN")) == "lr (selected on seed 1; given where an arm has one)"


def test_a_failed_held_out_seed_is_named_and_never_averaged_and_fails_the_rule() -> None:
    failed = {("geonorm", 3, 2e-3): "stopped: collapse", ("geonorm", 4, 4e-3): "diverged"}
    sweep = replace(SWEEP, rules=(parse_rule("every_gap<-0.03"),))
    text = runs_text(sweep, engine_rows(sweep, failed), "Pre-LN")
    geonorm = summary_line(text, "geonorm")
    # The survivors' mean (2.20 + 2.24) / 2 = 2.220 is no result: the cell fails, and so does its gap, with no interval.
    assert geonorm == ["0.002", "2.100", "2: 2.200, 3: collapsed, 4: 2.240", "failed (seed 3 collapsed)",
                       "2: -0.060, 3: +inf, 4: -0.050", "failed (seed 3: the arm failed)", "-", "-",
                       "0.002 (seed 3 collapsed), 0.004 (seed 4 diverged)"]  # the rates where seed 1 trained and a held-out seed did not
    assert "- rule every_gap<-0.03 (every held-out seed's gap below -0.03): geonorm -> does not hold" in text.splitlines()


def test_the_rules_are_judged_on_the_held_out_gaps() -> None:
    rules = tuple(map(parse_rule, ("every_gap<-0.03", "upper<-0.02", "lower>-0.08")))
    text = runs_text(replace(SWEEP, rules=rules), engine_rows(SWEEP), "Pre-LN")
    lines = text.splitlines()
    # Held-out gaps -0.06, -0.04, -0.05, interval -0.0748 to -0.0252 (above). Pooled with seed 1's gap (2.10 - 2.20 = -0.10),
    # the lower end would be -0.0625 - 3.182446 * 0.026300 / 2 = -0.1044 (t for 3 degrees of freedom): lower>-0.08 would fail.
    pooled = [-0.10, -0.06, -0.04, -0.05]
    assert statistics.mean(pooled) - 3.182446 * statistics.stdev(pooled) / 2 < -0.08
    assert "- rule every_gap<-0.03 (every held-out seed's gap below -0.03): geonorm -> holds" in lines
    assert "- rule upper<-0.02 (the upper end of the mean gap's 95% interval below -0.02): geonorm -> holds" in lines
    assert "- rule lower>-0.08 (the lower end of the mean gap's 95% interval above -0.08): geonorm -> holds" in lines
    assert not any("pre_ln ->" in ln for ln in lines)  # the baseline is not judged against itself


def test_sweep_main_writes_the_held_out_summary_and_records_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A study that is only its spec and sweep_main gets the held-out table and its record's "selected"."""
    def found(sweep: Sweep, args: Any, overrides: list[str]) -> tuple[list[dict[str, Any]], Place, Yardsticks]:
        return engine_rows(sweep), Place(Path(args.out_dir), Path(args.data_dir)), Yardsticks()

    monkeypatch.setattr(study, "start_study", found)
    assert sweep_main(SWEEP, ["--table_only", f"--out_dir={tmp_path}", "--rule=upper<-0.02"], baseline_title="Pre-LN") == 0
    text = (tmp_path / "toy_rates.md").read_text(encoding="utf-8")
    assert summary_line(text, "geonorm")[3] == "2.210"
    assert "- rule upper<-0.02 (the upper end of the mean gap's 95% interval below -0.02): geonorm -> holds" in text
    record = json.loads((tmp_path / "toy_rates.json").read_text(encoding="utf-8"))
    geonorm = next(s for s in record["selected"] if s["name"] == "geonorm")
    assert (geonorm["rate"], geonorm["selection_loss"], geonorm["held_out"]["losses"]) == (2e-3, 2.10, {"2": 2.20, "3": 2.19, "4": 2.24})
    assert (geonorm["gap_low"], geonorm["gap_high"]) == (pytest.approx(-0.074841, abs=1e-6), pytest.approx(-0.025159, abs=1e-6))


def test_the_docs_minimal_rate_study_selects_and_is_as_long_as_the_docs_say() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "EXPERIMENTS.md").read_text(encoding="utf-8")
    shown = re.search(r"```python\n(import sys\n.*?\nRATES = Sweep\(.*?)\n```", doc, re.S)
    assert shown is not None, "docs/EXPERIMENTS.md lost its rate_study example"
    assert len(shown.group(1).splitlines()) == 17 and "A minimal study with held-out\n  statistics is 17 lines" in doc
    namespace: dict[str, Any] = {"__name__": "rate_study"}
    exec(shown.group(1), namespace)  # the page's code as a user would save it; __name__ keeps it from running
    rates = namespace["RATES"]
    assert study.selection_of(rates) == study.BestRate(rate="lr", seed="seed")
    first = study.plan_points(rates, {})  # nothing finished: each method's three rates with seed 1337
    assert sorted((p["method"], p["lr"], p["seed"]) for p in first) == sorted((m, lr, 1337) for m in ("pre_ln", "p_spheret:0.5") for lr in (1e-3, 2e-3, 4e-3))


def test_a_group_whose_selection_seed_failed_at_every_rate_says_no_rate_was_selected() -> None:
    # Seed 1 collapsed at each of GeoNorm's four rates: nothing to select, and no run is still to come.
    failed = {("geonorm", 1, lr): "stopped: collapse" for lr in LRS}
    text = runs_text(SWEEP, engine_rows(SWEEP, failed), "Pre-LN")
    geonorm = summary_line(text, "geonorm")
    assert geonorm[0] == "-" and geonorm[3] == "no rate selected (seed 1 failed at 0.001, 0.002, 0.004, 0.008)", geonorm
    # Where seed 1 trained at one rate, that rate is selected as before.
    del failed[("geonorm", 1, 8e-3)]
    assert summary_line(runs_text(SWEEP, engine_rows(SWEEP, failed), "Pre-LN"), "geonorm")[0] == "0.008"
