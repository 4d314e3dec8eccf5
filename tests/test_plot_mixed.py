"""scripts/plot.py over a folder of many experiments (issue 66, item 8): where the runs it draws
come from several experiments' folders, or differ in a setting no label names, it says so in the
one stderr line scripts/tables.py prints (tabulate.mixed_runs_text), closing with plot.py's own
advice; one experiment's runs print no such line."""

from __future__ import annotations

from pathlib import Path

import pytest

from spheretnorm.experiments import figures as plot
from test_tables_mixed import write_run


def notes(root: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The 'note: mixed' lines plot.py prints to stderr for the 12x128 runs under root (its figure
    written beside root, outside the runs)."""
    argv = ["--runs_root", str(root), "--dataset", "shakespeare_char", "--scale", "12x128", "--out", f"{root}_fig"]
    assert plot.main(argv) == 0
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: mixed")]


def test_runs_of_several_roots_are_said_and_one_experiments_are_not(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    write_run(out / "a", "pre_ln")
    write_run(out / "a", "p_spheret:0.5")
    write_run(out / "a", "pre_ln", n_layer=24)  # another scale of one grid: not drawn, and one experiment
    assert notes(out / "a", capsys) == []
    write_run(out / "b", "geonorm")
    assert notes(out, capsys) == [
        f"note: mixed 2 roots ({out / 'a'}, {out / 'b'}) whose runs differ in their methods alone; "
        "point --runs_root at one experiment's folder to plot it alone."
    ]


def test_curves_that_differ_in_an_unlabelled_setting_are_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    write_run(out, "pre_ln")
    write_run(out, "p_spheret:0.5", learning_rate=3e-3)
    assert notes(out, capsys) == [
        f"note: mixed the runs of one root ({out}) whose runs differ in learning_rate (0.001, 0.003); within a column, rows differ in "
        "learning_rate, which no row label names; point --runs_root at one experiment's folder to plot it alone."
    ]
