"""Runs of both blocks in one results folder: scripts/tables.py and scripts/plot.py (and the plot's axes).

train.py writes a GPT-2 run to out/<config>/<method>/ and a LLaMA run of the same method to
out/<config>/<method>+block=llama/: both land under one --runs_root. Tables and figures give a
run of a block other than GPT-2's its own row and curve, labelled with the block, and their
titles name the blocks; a folder of GPT-2 runs renders exactly as before (the golden tables
below were printed by the code before blocks were told apart). Two runs that still share a cell
are refused, naming the settings in which they differ.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest

from spheretnorm.experiments import figures as plot, grid as runs, tabulate as tables
from spheretnorm.runtime.identity import run_suffix
from spheretnorm.runtime.methods import method_dirname

REPO = Path(__file__).resolve().parents[1]

SHAPE_L = {"n_layer": 36, "n_head": 20, "n_embd": 1280}  # the paper's L


def write_run(
    root: Path,
    method: str,
    val: float,
    *,
    block: str | None = None,
    last_iter: int = 100,
    zero_shot: dict[str, float | None] | None = None,
    **settings: Any,
) -> Path:
    """A run folder as train.py writes it: out/openwebtext_l/<method>[+block=<block>] (block None: a run from before the key)."""
    folder = method_dirname(method) + (f"+block={block}" if block not in (None, "gpt2") else "")
    out = root / "openwebtext_l" / folder
    out.mkdir(parents=True)
    config = {"dataset": "openwebtext", "method": method, "max_iters": 100, **SHAPE_L, "out_dir": str(out), "seed": 1337,
              "learning_rate": 0.0006, **({"block": block} if block else {}), **settings}
    (out / "config.json").write_text(json.dumps(config))
    rows = [
        {"kind": "train", "iter": 0, "train_loss": 11.0, "train_loss_avg200": 11.0},
        {"kind": "train", "iter": last_iter, "train_loss": val + 0.3, "train_loss_avg200": val + 0.1},
        {"kind": "eval", "iter": last_iter, "val_loss": val},
    ]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if zero_shot is not None:
        (out / runs.ZERO_SHOT_NAME).write_text(json.dumps({"results": {}, "paper_table": zero_shot}))
    return out


def gpt2_runs(root: Path) -> Path:
    write_run(root, "pre_ln", 2.90, zero_shot={"piqa/acc_norm": 60.0, "wikitext/word_perplexity": 40.0})
    write_run(root, "p_spheret:0.5", 2.80, block="gpt2", zero_shot={"piqa/acc_norm": 61.0, "wikitext/word_perplexity": 35.0})
    write_run(root, "geonorm", 2.85, last_iter=50)  # not finished
    return root


# The tables of gpt2_runs as the code before blocks were told apart printed them (--paper).
GOLDEN_MARKDOWN = """\
**Table 2. Final train loss (mean of the last 200 iterations) and final val loss (best in bold, second underlined).**

| Method | OpenWebText L train | OpenWebText L val |
|:--|--:|--:|
| Pre-LN | 3.000 (2.858) | 2.900 (2.879) |
| GeoNorm | <u>2.950</u>* (3.001) | <u>2.850</u>* (3.017) |
| 0.5-SpheretNorm | **2.900** (2.826) | **2.800** (2.847) |

In parentheses: the paper's value.
* the run has not reached max_iters (still training, or stopped by a signal or a crash).

**Table 3. Final val perplexity (best in bold, second underlined).**

| Method | OpenWebText L |
|:--|--:|
| Pre-LN | 18.17 (17.80) |
| GeoNorm | <u>17.29</u>* (20.42) |
| 0.5-SpheretNorm | **16.44** (17.24) |

In parentheses: the paper's value.
* the run has not reached max_iters (still training, or stopped by a signal or a crash).

**Table 5. Zero-shot accuracy (%) and perplexity, models trained on OpenWebText L (best in bold, second underlined).**

| Method | ARC-C | ARC-E | BoolQ | HellaSwag | LAMBADA | OBQA | PIQA | SciQ | SocialIQa | WinoGrande | LAMBADA ppl | WikiText ppl |
|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|
| Pre-LN | - (23.38) | - (40.49) | - (59.54) | - (32.73) | - (32.19) | - (26.20) | <u>60.00</u> (62.89) | - (69.90) | - (38.33) | - (51.54) | - (39.24) | <u>40.00</u> (33.19) |
| 0.5-SpheretNorm | - (25.15) | - (42.21) | - (59.88) | - (33.43) | - (34.60) | - (27.40) | **61.00** (63.44) | - (73.20) | - (37.92) | - (52.96) | - (31.38) | **35.00** (31.02) |

In parentheses: the paper's value.
"""


def test_tables_of_gpt2_runs_render_as_before(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert tables.main(["--runs_root", str(gpt2_runs(tmp_path)), "--paper"]) == 0
    assert capsys.readouterr().out == GOLDEN_MARKDOWN


def test_a_run_the_alarm_stopped_is_marked_failed_and_takes_no_rank(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A run train.py ended for good (a collapse stop row last) is a failure, not a run that may go
    on: it gets '§' and its note rather than '*', and its last value takes no rank (GeoNorm's 2.850
    would be second otherwise); a run stopped by a signal keeps '*'."""
    write_run(tmp_path, "pre_ln", 2.90)
    write_run(tmp_path, "p_spheret:0.5", 2.80)
    geonorm = write_run(tmp_path, "geonorm", 2.85, last_iter=50)
    with (geonorm / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"kind": "stop", "iter": 50, "reason": "collapse"}) + "\n")
    assert tables.main(["--runs_root", str(tmp_path), "--tables", "2"]) == 0
    text = capsys.readouterr().out
    assert "| GeoNorm | 2.950§ | 2.850§ |" in text
    assert "| Pre-LN | <u>3.000</u> | <u>2.900</u> |" in text
    assert "§ FAILED: train.py ended the run before max_iters (the collapse alarm or a non-finite loss)" in text
    assert "* the run has not reached max_iters" not in text
    assert tables.main(["--runs_root", str(tmp_path), "--tables", "2", "--format", "latex"]) == 0
    assert r"GeoNorm & 2.950$^\S$ & 2.850$^\S$ \\" in capsys.readouterr().out
    with (geonorm / "metrics.jsonl").open("a") as f:  # resumed past the stop, then stopped by a signal
        f.write(json.dumps({"kind": "train", "iter": 60, "train_loss": 3.0, "train_loss_avg200": 2.95}) + "\n")
        f.write(json.dumps({"kind": "stop", "iter": 60, "reason": "signal"}) + "\n")
    assert tables.main(["--runs_root", str(tmp_path), "--tables", "2"]) == 0
    text = capsys.readouterr().out
    assert "| GeoNorm | <u>2.950</u>* | <u>2.850</u>* |" in text and "§" not in text


def both_blocks(root: Path) -> Path:
    gpt2_runs(root)
    write_run(root, "pre_ln", 2.95, block="llama", zero_shot={"piqa/acc_norm": 59.0, "wikitext/word_perplexity": 41.0})
    write_run(root, "p_spheret:0.5", 2.70, block="llama", last_iter=60, zero_shot={"piqa/acc_norm": 62.0, "wikitext/word_perplexity": 33.0})
    return root


def test_tables_give_each_block_its_own_row_and_name_the_blocks(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert tables.main(["--runs_root", str(both_blocks(tmp_path)), "--paper", "--tables", "2,5"]) == 0
    text = capsys.readouterr().out
    assert "**Table 2. Final train loss (mean of the last 200 iterations) and final val loss (GPT-2 and LLaMA blocks) (best in bold" in text
    assert "**Table 5. Zero-shot accuracy (%) and perplexity, models trained on OpenWebText L (GPT-2 and LLaMA blocks) (best" in text
    table2 = text.split("**Table 5.")[0]
    rows = [line.split(" | ")[0].removeprefix("| ") for line in table2.splitlines() if line.startswith("| ") and not line.startswith("| Method")]
    assert rows == ["Pre-LN", "Pre-LN (LLaMA)", "GeoNorm", "0.5-SpheretNorm", "0.5-SpheretNorm (LLaMA)"]
    # One column ranks both blocks; the paper's (GPT-2) values are not put beside a LLaMA run.
    assert "| 0.5-SpheretNorm (LLaMA) | **2.800*** (-) | **2.700*** (-) |" in text
    assert "| 0.5-SpheretNorm | <u>2.900</u> (2.826) | <u>2.800</u> (2.847) |" in text
    assert "| Pre-LN (LLaMA) | - (-) |" in text and "59.00 (-)" in text and "**62.00*** (-)" in text
    assert tables.main(["--runs_root", str(tmp_path), "--format", "latex", "--tables", "3"]) == 0
    assert r"0.5-SpheretNorm (LLaMA) & \textbf{14.88}$^*$ \\" in capsys.readouterr().out


def test_llama_runs_alone_say_their_block_in_titles_and_rows(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_run(tmp_path, "pre_ln", 2.95, block="llama")
    assert tables.main(["--runs_root", str(tmp_path), "--tables", "3"]) == 0
    text = capsys.readouterr().out
    assert "**Table 3. Final val perplexity (LLaMA block) (best" in text and "| Pre-LN (LLaMA) |" in text


def test_runs_of_one_method_that_differ_in_settings_are_rows_named_by_them(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_run(tmp_path / "a", "pre_ln", 3.0, block="llama")
    write_run(tmp_path / "b", "pre_ln", 3.1, block="llama", seed=1338, learning_rate=0.001, wandb_run_name="other")
    assert tables.main(["--runs_root", str(tmp_path), "--tables", "3"]) == 0
    text = capsys.readouterr().out
    # Only the computing keys that differ name the rows: wandb_run_name is neutral.
    assert "| Pre-LN (LLaMA), learning_rate=0.0006, seed=1337 | **20.09** |" in text
    assert "| Pre-LN (LLaMA), learning_rate=0.001, seed=1338 | <u>22.20</u> |" in text
    figures = captured_figures_of(lambda: plot.main(["--runs_root", str(tmp_path), "--dataset", "openwebtext", "--scale", "L", "--out", str(tmp_path / "f")]))
    assert {"Pre-LN (LLaMA), learning_rate=0.0006, seed=1337", "Pre-LN (LLaMA), learning_rate=0.001, seed=1338"} <= set(legend_labels(figures[0]))
    # A run from before the block key is GPT-2's: it shares a cell with an explicit gpt2 run, and
    # the same settings twice is a collision, naming both folders.
    write_run(tmp_path / "c", "geonorm", 3.0)
    write_run(tmp_path / "d", "geonorm", 3.0, block="gpt2")
    c, d = (tmp_path / x / "openwebtext_l" / "geonorm" for x in ("c", "d"))
    with pytest.raises(runs.UsageError, match=rf"Two runs of geonorm on openwebtext at scale L hold the same settings: {c} and {d} \(a copied folder\?\)"):
        runs.index_runs(tables.load_checked_run(f) for f in tables.scan_runs(tmp_path) if f.method == "geonorm")


def test_a_key_only_some_runs_have_names_the_rows_it_tells_apart(tmp_path: Path) -> None:
    # One AdamW run and two Muon runs at different muon_lr: muon_lr, which the AdamW run lacks,
    # still tells the Muon runs apart, as the launcher and the sweeps do (another folder each).
    write_run(tmp_path / "a", "pre_ln", 3.0)
    write_run(tmp_path / "b", "pre_ln", 3.1, optimizer="muon", optimizer_params={"muon_lr": 0.01})
    write_run(tmp_path / "c", "pre_ln", 3.2, optimizer="muon", optimizer_params={"muon_lr": 0.02})
    index = runs.index_runs(tables.load_checked_run(f) for f in tables.scan_runs(tmp_path))
    assert sorted(run.settings for run in index.values()) == ["muon_lr=0.01, optimizer=muon", "muon_lr=0.02, optimizer=muon", "optimizer=adamw"]
    # Runs that share every setting are still refused.
    write_run(tmp_path / "d", "pre_ln", 3.3, optimizer="muon", optimizer_params={"muon_lr": 0.02})
    with pytest.raises(runs.UsageError, match=r"Two runs of pre_ln \(muon_lr=0.02, optimizer=muon\) on openwebtext at scale L hold the same settings"):
        runs.index_runs(tables.load_checked_run(f) for f in tables.scan_runs(tmp_path))


def captured_figures_of(call) -> list[plt.Figure]:
    figures: list[plt.Figure] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plot, "save_figure", lambda fig, out: figures.append(fig) or [])
        assert call() == 0
    return figures


def captured_figures(monkeypatch: pytest.MonkeyPatch) -> list[plt.Figure]:
    figures: list[plt.Figure] = []
    monkeypatch.setattr(plot, "save_figure", lambda fig, out: figures.append(fig) or [])
    return figures


def legend_labels(fig: plt.Figure) -> list[str]:
    return [t.get_text() for t in fig.legends[0].get_texts()]


def test_plot_draws_each_block_and_names_the_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = captured_figures(monkeypatch)
    plot.plot_group(both_blocks(tmp_path), "openwebtext", "L")
    (fig,) = figures
    assert fig._suptitle.get_text() == "OpenWebText L (GPT-2 and LLaMA blocks): loss per method"
    assert legend_labels(fig) == ["Pre-LN", "Pre-LN (LLaMA)", "GeoNorm (unfinished)", "0.5-SpheretNorm", "0.5-SpheretNorm (LLaMA) (unfinished)"]
    val_lines = {line.get_label(): line for line in fig.axes[1].get_lines()}
    assert val_lines["Pre-LN"].get_color() == val_lines["Pre-LN (LLaMA)"].get_color()  # a method keeps its colour
    assert (val_lines["Pre-LN"].get_marker(), val_lines["Pre-LN (LLaMA)"].get_marker()) == ("o", "s")
    figures.clear()
    plot.plot_group(tmp_path, "openwebtext", "L", diagnostics=True)
    assert [f._suptitle.get_text().split(":")[0] for f in figures] == ["OpenWebText L (GPT-2 and LLaMA blocks)"] * len(figures)


def test_plot_of_gpt2_runs_keeps_its_title_and_labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = captured_figures(monkeypatch)
    plot.plot_group(gpt2_runs(tmp_path), "openwebtext", "L")
    assert figures[0]._suptitle.get_text() == "OpenWebText L: loss per method"
    assert legend_labels(figures[0]) == ["Pre-LN", "GeoNorm (unfinished)", "0.5-SpheretNorm"]


def test_plot_panels_share_the_iteration_axis_and_mark_unfinished_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Train rows from iteration 0, eval rows only at the last iteration (one, for the unfinished run).
    figures = captured_figures(monkeypatch)
    plot.plot_group(gpt2_runs(tmp_path), "openwebtext", "L")
    ax_train, ax_val = figures[0].axes[:2]
    assert ax_train.get_xlim() == ax_val.get_xlim()
    low, high = ax_val.get_xlim()
    assert low <= 0 < 100 <= high  # the val panel starts where the train panel does
    hollow = {ax: [(list(l.get_xdata()), l.get_markerfacecolor()) for l in ax.get_lines() if l.get_label() == "_nolegend_"] for ax in (ax_train, ax_val)}
    # GeoNorm stopped at iteration 50 of 100: its last train and val points are hollow circles.
    assert hollow[ax_train] == [([50], "none")] and hollow[ax_val] == [([50], "none")]


def test_readme_documents_the_run_folder_names() -> None:
    training = " ".join((REPO / "README.md").read_text().split("\n## Training\n")[1].split("\n## ")[0].split())
    assert run_suffix({"n_layer": 2, "max_iters": 20}) == "+max_iters=20+n_layer=2" and "`pre_ln+max_iters=20+n_layer=2`" in training
    assert run_suffix({"block": "llama"}) == "+block=llama" and "`p_spheret-0.5+block=llama`" in training
    # Longer than 60 characters, or a character outside [A-Za-z0-9_.=+-]: a hash, and config.json says what it holds.
    assert run_suffix({"dataset": "x" * 51}) == "+dataset=" + "x" * 51  # 60 characters
    for unsafe in ({"dataset": "x" * 52}, {"dataset": "my data"}, {"dataset": "a/b"}):
        assert re.fullmatch(r"\+overrides-[0-9a-f]{8}", run_suffix(unsafe)), unsafe
    # The pairs that fit stay readable, before the hash of them all; an unsafe one is only in the hash.
    assert re.fullmatch(r"\+block=llama\+overrides-[0-9a-f]{8}", run_suffix({"block": "llama", "dataset": "my data"}))
    assert "longer than 60 characters" in training and "`_.=+-`" in training
    assert "`<method>+<key>=<value>...+overrides-<8 hex digits>`" in training and "`config.json`" in training
    assert "`+overrides-<8 hex digits>` alone" in training  # the earlier form, still found
