"""Damaged run folders: scripts/tables.py and scripts/plot.py refuse them in one sentence.

Every case damages one file of an otherwise healthy runs root (config.json, metrics.jsonl or
ckpt_zero_shot.json) and runs the command as a user does, as a subprocess from the repository
root. The command must exit non-zero, name the damaged file on the last line of stderr, and
print no traceback. The second half checks which runs the commands consider: only those of
the asked dataset and scale, so an unrelated duplicate does not stop them, and every table
that is left out says why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from spheretnorm.diagnostics import DIAGNOSTICS
from spheretnorm.runtime.methods import method_dirname
from spheretnorm.experiments import grid as runs, tabulate as tables

REPO = Path(__file__).resolve().parents[1]
SHAPE_S = {"n_layer": 12, "n_head": 12, "n_embd": 768}  # the paper's S
LENGTHS = {"layer": 13, "block": 12, "sublayer": 24}  # values per eval row at S: the embedding output and 12 blocks, two sublayers each

# -----------------------------------------------------------------------------
# A healthy runs root


def run_dir(root: Path, dataset: str, method: str) -> Path:
    return root / f"{dataset}_s" / method_dirname(method)


def write_run(root: Path, dataset: str, method: str, val: float, zero_shot: dict[str, Any] | None = None) -> Path:
    """A finished run of `method` on `dataset` at scale S, with zero-shot results when given."""
    out = run_dir(root, dataset, method)
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({"dataset": dataset, "method": method, "max_iters": 100, **SHAPE_S}))
    diagnostics = {d.name: [0.5] * LENGTHS[d.index] if d.is_series else 0.5 for d in DIAGNOSTICS}
    rows = [
        {"kind": "train", "iter": 50, "train_loss": val + 0.5, "train_loss_avg200": val + 0.5},
        {"kind": "eval", "iter": 50, "val_loss": val + 0.4, **diagnostics},
        {"kind": "train", "iter": 100, "train_loss": val + 0.1, "train_loss_avg200": val + 0.2},
        {"kind": "eval", "iter": 100, "val_loss": val, **diagnostics},
    ]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if zero_shot is not None:
        (out / runs.ZERO_SHOT_NAME).write_text(json.dumps({"results": {}, "paper_table": zero_shot}))
    return out


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Two openwebtext S runs with zero-shot results; pre_ln's files are the ones damaged."""
    write_run(tmp_path, "openwebtext", "pre_ln", 3.0, {"piqa/acc_norm": 60.0, "wikitext/word_perplexity": 40.0})
    write_run(tmp_path, "openwebtext", "geonorm", 2.9, {"piqa/acc_norm": 61.0, "wikitext/word_perplexity": 38.0})
    return tmp_path


def run_script(script: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, script, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=120)


def assert_refused(proc: subprocess.CompletedProcess[str], path: Path) -> None:
    """A non-zero exit whose last stderr line names `path`, and no traceback anywhere."""
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    assert proc.returncode != 0, output
    assert str(path) in proc.stderr.strip().splitlines()[-1], output


# -----------------------------------------------------------------------------
# The damaged cases: (file name, damage); a damage turns the healthy text into the damaged bytes

BINARY = bytes(range(256)) * 4  # no UTF-8 text: every byte value, NUL included


def edit_json(change: Callable[[Any], Any]) -> Callable[[str], bytes]:
    return lambda text: json.dumps(change(json.loads(text))).encode()


def edit_rows(change: Callable[[list[Any]], list[Any]]) -> Callable[[str], bytes]:
    def damage(text: str) -> bytes:
        rows = change([json.loads(line) for line in text.splitlines()])
        return "".join(json.dumps(r) + "\n" for r in rows).encode()

    return damage


def without(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda d: {k: v for k, v in d.items() if k != key}


def with_item(key: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda d: {**d, key: value}


def in_eval_rows(change: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[str], bytes]:
    return edit_rows(lambda rows: [change(r) if r["kind"] == "eval" else r for r in rows])


CONFIG_CASES = {
    "not JSON": lambda text: text.replace('"', "'").encode(),
    "binary": lambda text: BINARY,
    "a list": lambda text: b"[1, 2]",
    "no method": edit_json(without("method")),
    "string n_layer": edit_json(with_item("n_layer", "12")),
    "null dataset": edit_json(with_item("dataset", None)),
}
METRICS_CASES = {
    "not JSON": lambda text: b"iter 50 | loss 3.5\n" + text.encode(),
    "binary": lambda text: BINARY,
    "row a list": lambda text: b"[50, 3.5]\n" + text.encode(),
    "string val_loss": in_eval_rows(with_item("val_loss", "2.9")),
    "eval row without val_loss": in_eval_rows(without("val_loss")),
    "train row without iter": edit_rows(lambda rows: [without("iter")(r) if r["kind"] == "train" else r for r in rows]),
    "string train_loss_avg200": edit_rows(lambda rows: [with_item("train_loss_avg200", "3.1")(r) if r["kind"] == "train" else r for r in rows]),
}
ZERO_SHOT_CASES = {
    "not JSON": lambda text: text[: len(text) // 2].encode() + b"\n}",
    "binary": lambda text: BINARY,
    "a list": lambda text: b"[]",
    "no paper_table": edit_json(without("paper_table")),
    "paper_table a string": edit_json(with_item("paper_table", "60.0")),
    "string score": edit_json(with_item("paper_table", {"piqa/acc_norm": "60.0"})),
    "string limit": edit_json(with_item("limited", {"limit": "100"})),
}
# The diagnostics only plot.py --diagnostics reads.
DIAGNOSTIC_CASES = {
    "ragged heatmap": in_eval_rows(lambda r: {**r, "attn_sink": r["attn_sink"][:3] if r["iter"] == 100 else r["attn_sink"]}),
    "string heatmap value": in_eval_rows(with_item("attn_sink", ["0.5"] * 12)),
}


def damage(run: Path, name: str, how: Callable[[str], bytes]) -> Path:
    path = run / name
    path.write_bytes(how(path.read_text()))
    return path


TABLES_CASES = [
    *(("config.json", case) for case in CONFIG_CASES),
    *(("metrics.jsonl", case) for case in METRICS_CASES),
    *((runs.ZERO_SHOT_NAME, case) for case in ZERO_SHOT_CASES),
]
# plot.py reads run folders through the same checks as tables.py (spheretnorm.tables.load_checked_run):
# a few of the cases above show that it reports them alike; its own are the diagnostics.
PLOT_CASES = [
    ("config.json", "binary"),
    ("config.json", "string n_layer"),
    ("metrics.jsonl", "row a list"),
    ("metrics.jsonl", "string val_loss"),
    *(("metrics.jsonl", case) for case in DIAGNOSTIC_CASES),
]
CASES = {"config.json": CONFIG_CASES, "metrics.jsonl": {**METRICS_CASES, **DIAGNOSTIC_CASES}, runs.ZERO_SHOT_NAME: ZERO_SHOT_CASES}


@pytest.mark.parametrize("name, case", TABLES_CASES, ids=[f"{n}: {c}" for n, c in TABLES_CASES])
def test_tables_refuse_a_damaged_file_in_one_line(root: Path, name: str, case: str) -> None:
    path = damage(run_dir(root, "openwebtext", "pre_ln"), name, CASES[name][case])
    assert_refused(run_script("scripts/tables.py", "--runs_root", root), path)


@pytest.mark.parametrize("name, case", PLOT_CASES, ids=[f"{n}: {c}" for n, c in PLOT_CASES])
def test_plot_refuses_a_damaged_file_in_one_line(root: Path, name: str, case: str) -> None:
    path = damage(run_dir(root, "openwebtext", "pre_ln"), name, CASES[name][case])
    proc = run_script("scripts/plot.py", "--runs_root", root, "--dataset", "openwebtext", "--scale", "S", "--diagnostics", "--out", root / "fig")
    assert_refused(proc, path)


# Runs written before a diagnostic existed are no damage: plot.py draws them blank, with one note.
DRAWN = tuple(d.name for d in DIAGNOSTICS if d.drawn)
PREDATING = {"a newer diagnostic": DRAWN[-1:], "every diagnostic": DRAWN}


@pytest.mark.parametrize("lacks", list(PREDATING))
def test_plot_draws_runs_that_predate_a_diagnostic_blank_with_one_note(root: Path, lacks: str) -> None:
    dropped = PREDATING[lacks]
    damage(run_dir(root, "openwebtext", "pre_ln"), "metrics.jsonl", in_eval_rows(lambda r: {k: v for k, v in r.items() if k not in dropped}))
    proc = run_script("scripts/plot.py", "--runs_root", root, "--dataset", "openwebtext", "--scale", "S", "--diagnostics", "--out", root / "fig")
    assert proc.returncode == 0, proc.stderr
    named = ", ".join(f"{key} (1 of 2 runs)" for key in dropped)
    assert proc.stderr.splitlines() == [f"note: runs written before a diagnostic existed lack it, so it is drawn blank for them: {named}."]
    for key in DRAWN:
        for ext in ("png", "pdf"):
            assert (root / f"fig_{key}.{ext}").stat().st_size > 0
            assert f"written: {root / f'fig_{key}.{ext}'}" in proc.stdout


# -----------------------------------------------------------------------------
# Which runs the commands read


def test_only_the_runs_asked_about_are_read(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from spheretnorm.experiments import figures as plots

    root = tmp_path / "out"
    write_run(root, "openwebtext", "pre_ln", 3.0)
    write_run(root, "openwebtext", "geonorm", 2.9)
    for seed in ("seed1", "seed2"):  # another experiment: two runs of one method
        write_run(root / seed, "fineweb_edu", "pre_ln", 3.1)
    broken = write_run(root, "shakespeare_char", "pre_ln", 1.5)  # and a damaged run of a third dataset
    (broken / "metrics.jsonl").write_bytes(BINARY)
    figure = ["--runs_root", str(root), "--scale", "S", "--out", str(tmp_path / "fig")]
    assert plots.main([*figure, "--dataset", "openwebtext"]) == 0
    assert tables.main(["--runs_root", str(root), "--datasets", "openwebtext", "--scales", "S"]) == 0
    assert "| GeoNorm | **3.100** | **2.900** |" in capsys.readouterr().out
    # A duplicate among the runs asked about is still refused, naming both folders.
    assert plots.main([*figure, "--dataset", "fineweb_edu"]) == 2
    assert tables.main(["--runs_root", str(root), "--datasets", "openwebtext,fineweb_edu"]) == 2
    for err in capsys.readouterr().err.strip().splitlines():
        assert err.startswith("error: Two runs of pre_ln on fineweb_edu at scale S hold the same settings:") and "seed1" in err and "seed2" in err
    assert tables.main(["--runs_root", str(root), "--datasets", "wikitext103"]) == 2
    assert "it has runs of: fineweb_edu S; openwebtext S; shakespeare_char S" in capsys.readouterr().err


def write_limited(run: Path, limit: int) -> None:
    (run / f"ckpt_zero_shot_limit{limit}.json").write_text(json.dumps({"paper_table": {"piqa/acc_norm": 60.0}, "limited": {"limit": limit}}))


def test_tables_say_which_tables_are_left_out_and_why(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for method, val in (("pre_ln", 3.0), ("geonorm", 2.9)):
        write_limited(write_run(tmp_path, "openwebtext", method, val), 100)
    assert tables.main(["--runs_root", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "Table 2." in captured.out and "Table 5." not in captured.out
    limited_file = run_dir(tmp_path, "openwebtext", "geonorm") / "ckpt_zero_shot_limit100.json"
    assert captured.err.splitlines()[:2] == [
        "Table 4 left out: no fineweb_edu run among the runs read.",
        "Table 5 left out: no openwebtext run has ckpt_zero_shot.json (2 read); there are only --limit results "
        f"(2 files, e.g. {limited_file}), partial numbers that tables do not read; run eval/zero_shot.py without --limit "
        "(scripts/launch.py --stage zero_shot) to write it.",
    ]
    assert tables.main(["--runs_root", str(tmp_path), "--tables", "4", "--datasets", "openwebtext"]) == 0
    assert "Table 4 left out: --datasets leaves out fineweb_edu." in capsys.readouterr().err


def test_tables_mark_benchmarks_a_skip_missing_evaluation_left_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_run(tmp_path, "openwebtext", "geonorm", 2.9, {"piqa/acc_norm": 61.0, "wikitext/word_perplexity": 38.0})
    run = write_run(tmp_path, "openwebtext", "pre_ln", 3.0)
    results = {"paper_table": {"piqa/acc_norm": 60.0, "wikitext/word_perplexity": None}, "skipped": {"wikitext": "files absent under --local_data: d/wikitext2/wiki.test.raw"}}
    (run / runs.ZERO_SHOT_NAME).write_text(json.dumps(results))
    assert tables.main(["--runs_root", str(tmp_path), "--tables", "5"]) == 0
    captured = capsys.readouterr()
    pre_ln = next(line for line in captured.out.splitlines() if line.startswith("| Pre-LN |"))
    assert pre_ln.split(" | ")[-1] == "-‡ |"  # the WikiText ppl column
    assert "‡ NOT EVALUATED: the benchmark's files were absent (eval/zero_shot.py --skip_missing), so these rows are not a complete paper evaluation (Pre-LN: WikiText ppl)." in captured.out
    assert "marked ‡ and are not complete" in captured.err
    assert tables.main(["--runs_root", str(tmp_path), "--tables", "5", "--format", "latex"]) == 0
    assert r"--$^\ddagger$" in capsys.readouterr().out


def test_heatmap_rows_are_labelled_by_whole_layer_numbers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spheretnorm.experiments import figures as plots

    run = runs.Run(tmp_path, {"method": "pre_ln"}, [{"kind": "eval", "iter": i, "attn_sink": [0.1, 0.5, 0.9]} for i in (10, 20)], None)
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, out: figures.append(fig) or [])
    plots.plot_diagnostic([run], "attn_sink", "tiny", tmp_path / "fig")
    ax = figures[0].axes[0]
    ax.figure.canvas.draw()
    low, high = sorted(ax.get_ylim())
    ticks = [t for t in ax.get_yticks() if low <= t <= high]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
