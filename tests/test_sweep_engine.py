"""The sweep engine of spheretnorm/experiments/study.py: plans, settings, row names, the follow-up
rule, tables, and the p-SpheretNorm study (spheretnorm/experiments/p_sweep.py), which is only its
spec, run end to end on a tiny model.

Expected values are written out here (folders, settings, gaps, grid steps), not taken from the
engine's own helpers.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from spheretnorm.experiments import p_sweep
from spheretnorm.experiments.study import (
    Axis, Column, Place, Sweep, best_rate_follow_up, distinct_labels, grid_points, markdown_table, name_rows, narrowed,
    pivot_table, plan_points, point, refined_rates, run_settings, swept_rates, train_argv,
)
from spheretnorm.runtime.cli import UsageError
from spheretnorm.runtime.identity import run_conflicts

REPO = Path(__file__).resolve().parents[1]


def toy(**fields: object) -> Sweep:
    spec = {"name": "toy", "base": {"n_layer": 2, "learning_rate": 1.0}, "folder": lambda p: f"{p['method']}/lr{p['lr']:g}_s{p['seed']}",
            "axes": (Axis("method", ("pre_ln", "p_spheret:0.5")), Axis("lr", (1e-3, 3e-3)), Axis("seed", (1, 2)))}
    return Sweep(**{**spec, **fields})


def test_the_plan_is_the_axes_product_outermost_first_less_what_keep_drops() -> None:
    points = grid_points(toy(keep=lambda p: not (p["method"] == "pre_ln" and p["lr"] == 3e-3)))
    assert [(p["method"], p["lr"], p["seed"]) for p in points] == [
        ("pre_ln", 1e-3, 1), ("pre_ln", 1e-3, 2),
        ("p_spheret:0.5", 1e-3, 1), ("p_spheret:0.5", 1e-3, 2), ("p_spheret:0.5", 3e-3, 1), ("p_spheret:0.5", 3e-3, 2),
    ]
    assert point(seed=1, lr=1e-3, method="pre_ln") == points[0]  # the order of the keys does not matter
    assert points[0].but(seed=2) == points[1] and hash(points[0].but(seed=2)) == hash(points[1])


def test_a_points_settings_are_base_then_method_then_its_keys_then_the_derived_ones() -> None:
    sweep = toy(settings=lambda p: {"learning_rate": p["lr"], "min_lr": p["lr"] / 10}, name="toy_study")
    p = point(method="p_spheret:0.5", lr=3e-3, seed=7)
    assert run_settings(sweep, p) == {"config_name": "toy_study", "n_layer": 2, "learning_rate": 3e-3, "min_lr": pytest.approx(3e-4),
                                      "connection": "p_spheret", "spheret_p": "0.5", "seed": 7}  # lr is no train.py key
    argv = train_argv(sweep, p, Place(Path("out"), Path("data"), ["--n_layer=4"]))
    assert argv[-3:] == ["--data_dir=data", "--out_dir=out/p_spheret:0.5/lr0.003_s7", "--n_layer=4"]  # the user's overrides last


def test_points_share_a_run_only_where_their_settings_agree(tmp_path: Path) -> None:
    from spheretnorm.experiments.study import run_points

    careless = toy(folder=lambda p: f"{p['method']}/s{p['seed']}", settings=lambda p: {"learning_rate": p["lr"]})
    with pytest.raises(ValueError, match=r"gives pre_ln/s1 to runs with other settings"):
        run_points(careless, grid_points(careless), Place(tmp_path, tmp_path, table_only=True))
    shared = toy(folder=lambda p: f"{p['method']}/s{p['seed']}")  # lr sets nothing here: one run per method and seed
    assert run_points(shared, grid_points(shared), Place(tmp_path, tmp_path, table_only=True)) == {}  # nothing there yet


def test_rows_of_one_method_are_named_by_the_settings_in_which_they_differ() -> None:
    variants = ({"method": "pre_ln", "optimizer": "adamw"}, {"method": "pre_ln", "optimizer": "muon"}, {"method": "geonorm", "optimizer": "adamw"})
    sweep = toy(axes=(Axis("method", variants), Axis("lr", (1e-3,)), Axis("seed", (1, 2))))
    name = distinct_labels(sweep, grid_points(sweep))
    assert [name(p) for p in grid_points(sweep)[::2]] == ["pre_ln, optimizer=adamw", "pre_ln, optimizer=muon", "geonorm"]
    sweep = toy(axes=(Axis("method", ("pre_ln",)), Axis("lr", (1e-3, 3e-3)), Axis("seed", (1,))))
    assert [distinct_labels(sweep, grid_points(sweep))(p) for p in grid_points(sweep)] == ["pre_ln, lr=0.001", "pre_ln, lr=0.003"]


def test_each_row_gets_its_gap_to_the_same_seeds_baseline_run() -> None:
    sweep = toy(baseline=lambda p: p.but(method="pre_ln"))
    points = grid_points(sweep)
    losses = [2.0, 2.2, 2.5, 2.6, 1.9, None, 2.3, 2.1]  # in the plan's order: pre_ln lr 1e-3 seeds 1, 2; lr 3e-3; then p_spheret
    rows = name_rows(sweep, points, {p: {**p.values, "val_loss": loss} for p, loss in zip(points, losses)})
    gaps = [None if r["gap"] is None else round(r["gap"], 6) for r in rows]
    assert gaps == [0.0, 0.0, 0.0, 0.0, -0.1, None, round(2.3 - 2.5, 6), round(2.1 - 2.6, 6)]
    assert rows[4]["name"] == "p_spheret:0.5, lr=0.001" and rows[4]["baseline"] == "pre_ln, lr=0.001"


def test_the_follow_up_extends_past_a_best_end_by_the_grids_factor_then_seeds_the_best_and_its_neighbours() -> None:
    assert swept_rates([1.0, 3.0], {1.0: 2.0, 3.0: 1.5}) == ([1.0, 3.0, 9.0], False)  # best at the top: one step of x3
    assert swept_rates([1.0, 3.0], {1.0: 1.5, 3.0: 2.0}) == ([0.333333, 1.0, 3.0], False)  # at the bottom: one step of /3, to 6 digits
    assert swept_rates([1.0, 3.0], {1.0: 2.0, 3.0: 1.5, 9.0: 1.4}) == ([1.0, 3.0, 9.0], True)  # one extension only
    assert swept_rates([1.0, 2.0, 4.0], {1.0: 2.0, 2.0: 1.5, 4.0: 3.0}) == ([1.0, 2.0, 4.0], True)  # best inside: done
    assert swept_rates([1.0, 2.0], {1.0: math.inf, 2.0: math.inf}) == ([1.0, 2.0], True)  # nothing trained: no best to bracket
    assert swept_rates([2.0], {}) == ([2.0], False) and swept_rates([2.0], {2.0: 1.5}) == ([2.0], True)  # one rate: given, no step to extend by
    assert refined_rates([2.0], {2.0: 1.5}) == [2.0]

    sweep = toy(axes=(Axis("method", ("pre_ln", "geonorm")), Axis("lr", (1.0, 2.0, 4.0)), Axis("seed", (1, 2))),
                follow_up=best_rate_follow_up())
    assert [(p["method"], p["lr"], p["seed"]) for p in plan_points(sweep, {})] == [(m, lr, 1) for m in ("pre_ln", "geonorm") for lr in (1.0, 2.0, 4.0)]
    done = {point(method="pre_ln", lr=lr, seed=1): loss for lr, loss in {1.0: 2.0, 2.0: 1.5, 4.0: 1.7}.items()}
    later = [(p["method"], p["lr"], p["seed"]) for p in plan_points(sweep, done)][6:]
    assert later == [("pre_ln", 2.0, 2), ("pre_ln", 1.0, 2), ("pre_ln", 4.0, 2)]  # geonorm is still sweeping: nothing seeded


def test_an_extension_rate_is_written_as_a_user_would_give_it_and_an_old_records_unrounded_rate_is_the_same_run() -> None:
    grid = [3.5355e-4, 5e-4, 7.0711e-4]
    losses = {3.5355e-4: 1.9, 5e-4: 1.8, 7.0711e-4: 1.75}
    assert swept_rates(grid, losses) == ([*grid, 0.00100001], False)  # 7.0711e-4 * sqrt(2) = 0.0010000091..., to 6 digits
    assert swept_rates([1.4142e-3, 2e-3], {1.4142e-3: 1.62, 2e-3: 1.63}) == ([0.000999981, 1.4142e-3, 2e-3], False)
    # E3's record (2026-12-05) holds the extensions unrounded, in the folders the rounded rates name: the same runs.
    recorded = {"learning_rate": 0.0010000091042, "min_lr": 0.00010000091042}
    assert run_conflicts(recorded, {"learning_rate": 0.00100001, "min_lr": 0.000100001}) == []
    assert run_conflicts({"learning_rate": 0.00099998082}, {"learning_rate": 0.000999981}) == []
    assert run_conflicts(recorded, {"learning_rate": 0.0010001}) == ["learning_rate: the run has 0.0010000091042, asked for 0.0010001"]
    assert run_conflicts({"weight_decay": 0.1000001}, {"weight_decay": 0.1}) != []  # only rates are read at the folders' precision


def test_runs_are_planned_anew_as_each_ends_so_a_selected_rates_seeds_go_before_anothers_neighbours(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """pre_ln's best (2) is inside its grid, geonorm's (4) at its top, so geonorm extends to 8 while
    pre_ln's held-out seeds are due. Planned a batch at a time, pre_ln's neighbours (1 and 4, seed 2)
    ran in that batch, before geonorm's selected rate got its held-out seed; planned as each run
    ends, geonorm's seed 2 at 4 starts as soon as its extension has ended, and every neighbour last."""
    from spheretnorm.experiments import study, sweep_runner

    losses = {"pre_ln": {1.0: 2.0, 2.0: 1.5, 4.0: 1.7}, "geonorm": {1.0: 2.0, 2.0: 1.8, 4.0: 1.6, 8.0: 1.9}}
    started: list[str] = []
    monkeypatch.setattr(sweep_runner, "run_job", lambda job, threads, stopper=None: started.append(job.label) or study.JobResult(job, 0, 0.0, ""))
    monkeypatch.setattr(sweep_runner, "point_row", lambda sweep, p, result, unigram, place=None: {
        "status": "ok", "val_loss": losses[p["method"]][p["lr"]], "val_loss_full": losses[p["method"]][p["lr"]]})
    sweep = toy(axes=(Axis("method", ("pre_ln", "geonorm")), Axis("lr", (1.0, 2.0, 4.0)), Axis("seed", (1, 2))), follow_up=best_rate_follow_up())
    rows: dict = {}
    study.run_as_planned(sweep, Place(tmp_path / "out", tmp_path, jobs=1), rows)
    assert started == ["pre_ln/lr1_s1", "pre_ln/lr2_s1", "pre_ln/lr4_s1", "geonorm/lr1_s1", "geonorm/lr2_s1", "geonorm/lr4_s1",
                       "geonorm/lr8_s1",  # the extension (a selection run) first
                       "pre_ln/lr2_s2", "geonorm/lr4_s2",  # then each selected rate's held-out seed
                       "pre_ln/lr1_s2", "pre_ln/lr4_s2", "geonorm/lr2_s2", "geonorm/lr8_s2"]  # then the neighbours
    assert len(rows) == 13
    out = capsys.readouterr().out
    assert out.startswith("toy: 6 runs in the plan now (the finished ones may add more), 1 at a time")
    assert "[3/9] pre_ln/lr4_s1: " in out and "[7/13] geonorm/lr8_s1: " in out  # each line counts the plan as it is then


def test_tables_show_a_dash_for_a_missing_value_and_a_missing_run() -> None:
    rows = [{"m": "a", "lr": 1e-3, "loss": 2.0}, {"m": "a", "lr": 3e-3, "loss": None}, {"m": "b", "lr": 1e-3, "loss": 1.5}]
    columns = (Column("method", "m", align=":--"), Column("lr", "lr", "g"), Column("loss", "loss", ".2f"))
    assert markdown_table(rows, columns).splitlines() == [
        "| method | lr | loss |", "|:--|--:|--:|", "| a | 0.001 | 2.00 |", "| a | 0.003 | - |", "| b | 0.001 | 1.50 |"]
    pivot = pivot_table(rows, [columns[0]], lambda r: r["lr"], [1e-3, 3e-3], lambda lr: f"lr {lr:g}",
                        lambda r: "-" if r is None else columns[2].cell(r))
    assert pivot.splitlines() == ["| method | lr 0.001 | lr 0.003 |", "|:--|--:|--:|", "| a | 2.00 | - |", "| b | 1.50 | - |"]


def test_axis_narrowing_names_the_bad_value_and_the_valid_ones() -> None:
    chosen = narrowed(p_sweep.P_SWEEP, ["spheret_p=0.5,4", "seed=1338"])
    assert [(p["spheret_p"], p["seed"]) for p in grid_points(chosen)] == [(0.5, 1338), (4.0, 1338)]
    with pytest.raises(UsageError, match=r"give spheret_p= and some of: 0.25, 0.5, 1, 2, 4\.$"):
        narrowed(p_sweep.P_SWEEP, ["spheret_p=3"])
    with pytest.raises(UsageError, match=r"names no axis of p_sweep; its axes are: spheret_p, seed\.$"):
        narrowed(p_sweep.P_SWEEP, ["p=1"])


# -----------------------------------------------------------------------------
# The p-SpheretNorm study: ten lines of spec


def test_the_docs_show_the_p_sweep_spec_as_the_code_has_it() -> None:
    doc = (REPO / "docs" / "EXPERIMENTS.md").read_text(encoding="utf-8")
    shown = re.search(r"```python\n(P_SWEEP = Sweep\(.*?\n\))\n```", doc, re.S)
    assert shown is not None, "docs/EXPERIMENTS.md lost its P_SWEEP example"
    assert shown.group(1) in (REPO / "spheretnorm" / "experiments" / "p_sweep.py").read_text(encoding="utf-8")


def test_the_p_sweep_plans_five_p_by_two_seeds_and_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    planned = plan_points(p_sweep.P_SWEEP, {})
    assert [p_sweep.P_SWEEP.folder(p) for p in planned[:3]] == ["p0.25/seed1337", "p0.25/seed1338", "p0.5/seed1337"] and len(planned) == 10
    args = dict(a[2:].split("=", 1) for a in train_argv(p_sweep.P_SWEEP, planned[-1], Place(tmp_path, tmp_path)))
    assert (args["connection"], args["spheret_p"], args["seed"], args["config_name"]) == ("p_spheret", "4.0", "1338", "p_sweep")

    from spheretnorm.experiments.study import ensure_data

    play = tmp_path / "play.txt"
    play.write_text("\n".join(f"{who}: the {what} is {how}." for who in ("ANN", "BEN") for what in ("sea", "king") for how in ("near", "gone")) * 60)
    ensure_data(tmp_path / "data", str(play))
    tiny = ["--n_layer=1", "--n_embd=16", "--n_head=2", "--block_size=16", "--batch_size=4", "--global_batch_size=4", "--eval_iters=2",
            "--max_iters=6", "--lr_decay_iters=6", "--warmup_iters=1", "--eval_interval=6", "--log_interval=2", "--compile=false"]
    argv = ["--axis", "spheret_p=0.5,1", "--axis", "seed=1337", f"--out_dir={tmp_path / 'out'}", f"--data_dir={tmp_path / 'data'}", *tiny]
    assert p_sweep.main(argv) == 0
    record = json.loads((tmp_path / "out" / "p_sweep.json").read_text())
    assert [(r["spheret_p"], r["seed"], r["name"], r["last_eval_iter"]) for r in record["runs"]] == [
        (0.5, 1337, "p_spheret, spheret_p=0.5", 6), (1.0, 1337, "p_spheret, spheret_p=1", 6)]
    metric = record["metric"]  # the whole val split: every run here has val_loss_full
    assert metric == "val_loss_full" and all(r["val_loss_full"] is not None for r in record["runs"])
    assert record["runs"][1]["gap"] == 0.0 and record["runs"][0]["gap"] == pytest.approx(record["runs"][0][metric] - record["runs"][1][metric])
    table = (tmp_path / "out" / "p_sweep.md").read_text().splitlines()
    assert table[0].startswith("Gaps and the summary over the seeds: val_loss_full, the whole validation split")
    assert table[2] == "| run | seed | val loss | minus p=1 | final cosine | status |"
    assert re.match(r"\| p_spheret, spheret_p=1 \| 1337 \| \d\.\d{3} \| \+0\.000 \| \d\.\d{3} \| [\w ]+ \|$", table[5])
    assert capsys.readouterr().out.count(": done in ") == 2


def test_a_sweep_run_from_another_folder_with_relative_paths_finds_its_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                              capsys: pytest.CaptureFixture) -> None:
    # The runs start with their working directory at the repository root; a relative --out_dir once
    # sent them there while the sweep looked in the user's folder, and called every run unfinished.
    from spheretnorm.experiments.study import ensure_data

    elsewhere = tmp_path / "my_folder"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    play = tmp_path / "play.txt"
    play.write_text("\n".join(f"{who}: the {what} is {how}." for who in ("ANN", "BEN") for what in ("sea", "king") for how in ("near", "gone")) * 60)
    ensure_data(elsewhere / "data", str(play))
    tiny = ["--n_layer=1", "--n_embd=16", "--n_head=2", "--block_size=16", "--batch_size=4", "--global_batch_size=4", "--eval_iters=2",
            "--max_iters=4", "--lr_decay_iters=4", "--warmup_iters=1", "--eval_interval=4", "--log_interval=2", "--compile=false"]
    assert p_sweep.main(["--axis", "spheret_p=0.5", "--axis", "seed=1337", "--out_dir=out", "--data_dir=data", *tiny]) == 0
    record = json.loads((elsewhere / "out" / "p_sweep.json").read_text())
    assert [(r["status"], r["last_eval_iter"]) for r in record["runs"]] in ([("ok", 4)], [("stalled", 4)], [("stuck at unigram", 4)])
    assert (elsewhere / "out" / "p0.5" / "seed1337" / "metrics.jsonl").is_file()
    assert not (REPO / "out" / "p0.5").exists()
