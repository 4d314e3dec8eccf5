"""scripts/tables.py over a folder of many experiments (issue 66, item 8): where the runs it
tabulates come from several experiments' folders, or two rows of one column differ in a setting no
row label names, it says in one line which roots and which differing settings it mixed; one
grid's runs (its scales in folders named for their configs) print no such line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spheretnorm.experiments import tabulate as tables
from spheretnorm.experiments.grid import Run
from spheretnorm.runtime.methods import method_dirname


def write_run(experiment: Path, method: str, *, n_layer: int = 12, max_iters: int = 600, **settings: Any) -> Path:
    """A finished run as train.py's default out_dir lays it out: <experiment>/<config_name>/<method>."""
    config_name = f"shakespeare_char_{n_layer}x128"
    out = experiment / config_name / method_dirname(method)
    out.mkdir(parents=True)
    config = {"dataset": "shakespeare_char", "config_name": config_name, "method": method, "max_iters": max_iters,
              "n_layer": n_layer, "n_head": 4, "n_embd": 128, "out_dir": str(out), "seed": 1337, "learning_rate": 1e-3, **settings}
    (out / "config.json").write_text(json.dumps(config))
    rows = [{"kind": "train", "iter": max_iters, "train_loss": 1.6, "train_loss_avg200": 1.6}, {"kind": "eval", "iter": max_iters, "val_loss": 1.7}]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def notes(root: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> list[str]:
    """The 'note: mixed' lines tables.py prints to stderr for the runs under root."""
    assert tables.main(["--runs_root", str(root), "--tables", "2,3", *extra]) == 0
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: mixed")]


def test_runs_of_several_roots_are_said_with_the_settings_they_differ_in(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    write_run(out / "a", "pre_ln")
    write_run(out / "b", "pre_ln", n_layer=24, max_iters=2400)
    write_run(out / "c", "p_spheret:0.5", n_layer=24, max_iters=2400)
    said = notes(out, capsys)
    assert said == [
        f"note: mixed 3 roots ({out / 'a'}, {out / 'b'}, {out / 'c'}) whose runs differ in max_iters (600, 2400) and n_layer (12, 24); "
        "point --runs_root at one experiment's folder (or give --datasets, --scales) to tabulate it alone."
    ]


def test_one_grids_scales_under_one_root_print_no_such_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each scale in its folder named for its config, as train.py and the launcher lay them out:
    the columns tell the scales apart, and the grid is one experiment."""
    out = tmp_path / "out"
    for method in ("pre_ln", "p_spheret:0.5"):
        write_run(out, method)
        write_run(out, method, n_layer=24, max_iters=2400)
    assert notes(out, capsys) == []


def test_rows_of_one_column_that_differ_in_an_unlabelled_setting_are_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two methods trained at other rates in one folder: their rows name no rate (the labels tell
    runs of one method apart), so the line names it."""
    out = tmp_path / "out"
    write_run(out, "pre_ln")
    write_run(out, "p_spheret:0.5", learning_rate=3e-3)
    assert notes(out, capsys) == [
        f"note: mixed the runs of one root ({out}) whose runs differ in learning_rate (0.001, 0.003); within a column, rows differ in "
        "learning_rate, which no row label names; point --runs_root at one experiment's folder (or give --datasets, --scales) to tabulate it alone."
    ]


def test_only_the_runs_tabulated_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    write_run(out / "a", "pre_ln")
    write_run(out / "b", "pre_ln", n_layer=24)
    assert notes(out, capsys, "--scales", "12x128") == []


def test_a_runs_root_is_its_parent_or_the_experiment_above_its_config_folder(tmp_path: Path) -> None:
    def run_at(path: Path, **config: Any) -> Run:
        return Run(path, {"dataset": "openwebtext", "n_layer": 12, "n_head": 12, "n_embd": 768, **config}, [], None)

    out = tmp_path / "out"
    assert tables.run_root(run_at(out / "e6b" / "openwebtext_S" / "pre_ln"), out) == out / "e6b"  # the paper's S shape
    assert tables.run_root(run_at(out / "e6b" / "owt_small" / "pre_ln", config_name="owt_small"), out) == out / "e6b"
    assert tables.run_root(run_at(out / "e6b" / "seed1" / "pre_ln"), out) == out / "e6b" / "seed1"
    assert tables.run_root(run_at(out / "openwebtext_s" / "pre_ln"), out / "openwebtext_s") == out / "openwebtext_s"  # never above --runs_root
    assert tables.run_root(run_at(out), out) == out
