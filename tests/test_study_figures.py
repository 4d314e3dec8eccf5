"""The studies' figures say what happened (issue 49, "Honest figures"): the fair sweep's panels
and --compare (fair_comparison.panel_axes), the μP transfer figure (lr_transfer.transfer_axes)
and the coordinate check's sheets (coordinates). Each test reads the matplotlib objects back."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.colors import to_rgba

from spheretnorm.experiments import coordinates, fair_comparison as fair
from spheretnorm.experiments import lr_transfer
from spheretnorm.experiments.figures import FAILURE_GID, FAILURE_LABEL, FAILURE_Y, SEED_GID, compact_rate, rate_axis, titled_grid

LONG_TITLE = "Final val loss against each optimizer's rate (12 x 128, 600 iterations, μP from width 64, Shakespeare characters)"
RATES = (1e-3, 2e-3, 4e-3)
COLLAPSED_LOSS = 1.5  # below every trained loss: a mean that took it in would dip, as the reviewer's figure did


def sweep_rows() -> list[dict[str, Any]]:
    """Two arms, three rates, two seeds, in both blocks; 0.5-SpheretNorm's second seed collapsed at
    2e-3 in GPT-2's block (its val loss still recorded, as study.outcome keeps it)."""
    rows = []
    for block, (arm, level), (i, lr), seed in itertools.product(("gpt2", "llama"), (("pre_ln", 1.60), ("p_spheret-0.5", 1.58)),
                                                                 enumerate(RATES), (1, 2)):
        collapsed = (block, arm, lr, seed) == ("gpt2", "p_spheret-0.5", 2e-3, 2)
        rows.append({"block": block, "arm": arm, "lr": lr, "seed": seed, "status": "stopped: collapse" if collapsed else "ok",
                     "val_loss": COLLAPSED_LOSS if collapsed else level + 0.01 * (i - 1) ** 2 + 0.002 * seed})
    return rows


def sweep_figure(rows: list[dict[str, Any]]) -> plt.Figure:
    panels = [[fair.Panel(rows, block, "adamw", 3.3, f"{block} block") for block in ("gpt2", "llama")]]
    return fair.panel_axes(panels, LONG_TITLE)


def line_labelled(ax: plt.Axes, label: str) -> Any:
    return next(line for line in ax.lines if line.get_label() == label)


def failure_lines(ax: plt.Axes) -> list[Any]:
    return [line for line in ax.lines if line.get_gid() == FAILURE_GID]


def legend_labels(fig: plt.Figure) -> list[str]:
    return [text.get_text() for legend in fig.legends for text in legend.get_texts()]


def drawn_axes(fig: plt.Figure) -> list[plt.Axes]:
    return [ax for ax in fig.axes if ax.get_visible() and ax.axison]


def assert_title_inside_and_above(fig: plt.Figure) -> None:
    """The suptitle's box lies inside the canvas and above every panel (its title and tick labels included)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig._suptitle.get_window_extent(renderer)
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height, (box, fig.bbox)
    assert max(ax.get_tightbbox(renderer).y1 for ax in drawn_axes(fig)) <= box.y0


def assert_tick_labels_apart(fig: plt.Figure) -> None:
    """No two shown x tick labels of a panel overlap."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in drawn_axes(fig):
        boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        for a, b in itertools.combinations(boxes, 2):
            assert not a.overlaps(b), f"{ax.get_title()}: tick labels overprint"


def assert_one_y_range(axes: list[plt.Axes]) -> None:
    first = axes[0]
    assert all(first.get_shared_y_axes().joined(first, ax) for ax in axes[1:])
    assert {ax.get_ylim() for ax in axes} == {first.get_ylim()}


def test_a_collapsed_seed_breaks_the_mean_line_and_is_an_x_of_its_arms_colour() -> None:
    fig = sweep_figure(sweep_rows())
    gpt2, llama = fig.axes[:2]
    sphere = line_labelled(gpt2, "0.5-SpheretNorm")
    xs, ys = list(sphere.get_xdata()), np.asarray(sphere.get_ydata(), dtype=float)
    assert xs == list(RATES)
    assert math.isnan(ys[1]) and np.isfinite(ys[[0, 2]]).all()  # broken at the failed rate only
    assert ys[0] == pytest.approx(1.58 + 0.01 + 0.003)  # the mean of both seeds where both trained
    assert np.isfinite(np.asarray(line_labelled(llama, "0.5-SpheretNorm").get_ydata(), dtype=float)).all()
    (marker,) = failure_lines(gpt2)
    assert list(marker.get_xdata()) == [2e-3] and list(marker.get_ydata()) == [FAILURE_Y]
    assert to_rgba(marker.get_color()) == to_rgba(sphere.get_color()) != to_rgba(line_labelled(gpt2, "Pre-LN").get_color())
    assert marker.get_marker() == "x" and not failure_lines(llama)
    seeds = [(x, y) for line in gpt2.lines if line.get_gid() == SEED_GID for x, y in zip(line.get_xdata(), line.get_ydata())]
    assert (2e-3, COLLAPSED_LOSS) not in seeds and len(seeds) == 2 * 3 * 2 - 1  # the collapsed seed is no point
    assert FAILURE_LABEL in legend_labels(fig)
    assert_one_y_range([gpt2, llama])
    assert gpt2.get_ylim()[0] > COLLAPSED_LOSS  # the range is of the runs that trained
    assert_title_inside_and_above(fig)
    plt.close(fig)


def test_the_compare_grid_and_several_optimizers_share_one_y_range_and_keep_their_title_inside() -> None:
    rows = sweep_rows()
    rows += [{**r, "optimizer": "muonh", "lr": 10 * r["lr"], "val_loss": r["val_loss"] + 0.3} for r in rows]
    panels = [[fair.Panel(rows, block, o, 3.3, f"{block}, {o}") for block in ("gpt2", "llama") for o in ("adamw", "muonh")]] * 2
    panels[1] = [*panels[1][:3], fair.Panel(rows[:12], "llama", "muonh", 3.3, "a sweep without MuonH")]  # --compare: a column some sweep lacks
    fig = fair.panel_axes(panels, LONG_TITLE)
    assert len(fig.axes) == 8 and not fig.axes[7].lines
    assert_one_y_range(fig.axes)
    assert_title_inside_and_above(fig)
    assert_tick_labels_apart(fig)
    plt.close(fig)
    one = fair.panel_axes([[fair.Panel(rows, "llama", "adamw", 3.3, "LLaMA block")]], LONG_TITLE)  # --blocks llama: one narrow panel
    assert_title_inside_and_above(one)
    plt.close(one)


def transfer_rows() -> list[dict[str, Any]]:
    """MuonH's seven rates (the overprinted panel), AdamW's five; Muon diverged at width 256 at its top rate."""
    grids = {"adamw": [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2], "muonh": [2.5e-3, 5e-3, 1e-2, 2e-2, 4e-2, 8e-2, 1.6e-1]}
    rows = []
    for (optimizer, grid), width, param in itertools.product(grids.items(), (64, 128, 256), ("standard", "mup")):
        for i, lr in enumerate(grid):
            diverged = (optimizer, width, lr) == ("adamw", 256, 1.6e-2)
            rows.append({"method": "p_spheret:0.5", "optimizer": optimizer, "width": width, "param": param, "lr": lr,
                         "status": "diverged" if diverged else "ok", "val_loss": None if diverged else 2.0 + 0.05 * (i - 2) ** 2 - width / 2560})
    return rows


def test_the_transfer_figure_breaks_a_widths_line_where_it_diverged_and_shares_y() -> None:
    fig = lr_transfer.transfer_axes(transfer_rows(), "Shakespeare-char, 2 layers, 150 iterations: final val loss (μP base width 64)")
    axes = fig.axes[:4]
    assert_one_y_range(axes)
    for ax in axes[:2]:  # AdamW, standard and μP
        wide = line_labelled(ax, "width 256")
        assert math.isnan(wide.get_ydata()[-1]) and np.isfinite(np.asarray(wide.get_ydata()[:-1], dtype=float)).all()
        (marker,) = failure_lines(ax)
        assert list(marker.get_xdata()) == [1.6e-2] and to_rgba(marker.get_color()) == to_rgba(wide.get_color())
    assert not failure_lines(axes[2]) and FAILURE_LABEL in legend_labels(fig)
    assert [t.get_text() for t in axes[2].get_xticklabels()] == ["2.5e-3", "5e-3", "1e-2", "2e-2", "4e-2", "8e-2", "1.6e-1"]
    assert_title_inside_and_above(fig)
    assert_tick_labels_apart(fig)
    plt.close(fig)


def test_a_crowded_rate_axis_is_thinned_and_its_labels_written_compactly() -> None:
    assert [compact_rate(r) for r in (5e-3, 1.6e-2, 0.16, 1e-3, 1.0, 2.0, 40.0)] == ["5e-3", "1.6e-2", "1.6e-1", "1e-3", "1", "2", "40"]
    assert compact_rate(2 ** 0.5 * 1e-4) == "1.41e-4" and compact_rate(1.25e-3) == "1.25e-3"
    rates = [1e-4 * 2 ** i for i in range(16)]
    shown = {}
    for inches in (3.0, 9.0):
        fig, axes = titled_grid(1, 1, (inches, 2.5), "sixteen rates")
        rate_axis(axes[0][0], rates, "peak rate")
        shown[inches] = [t.get_text() for t in axes[0][0].get_xticklabels() if t.get_text()]
        assert shown[inches][:2] == ["1e-4", compact_rate(rates[-(-16 // len(shown[inches]))])]  # every k-th rate, from the first
        assert_tick_labels_apart(fig)
        plt.close(fig)
    assert 3 <= len(shown[3.0]) < len(shown[9.0]) == 8  # a narrow panel labels fewer rates; none more than MAX_RATE_LABELS


def coord_results(rows: list[str], metrics: tuple[str, ...], widths: tuple[int, ...] = (64, 128, 256, 512)) -> dict[str, Any]:
    """A check's results as JSON keeps them (widths as strings): per layer (embed, 2 blocks, logits) a value per width."""
    def summary(width: int) -> dict[str, list[float]]:
        values = {m: [0.1 * (layer + 1) * width ** 0.1 for layer in range(4)] for m in metrics}
        if "update" in values:
            values["update"][0] = values["update"][3] = math.nan  # the embedding and the logits have no hidden matrix
        return values
    return {row: {param: {str(w): summary(w) for w in widths} for param in coordinates.PARAMETRISATIONS} for row in rows}


def write_record(path: Path, results: dict[str, Any], **setup: Any) -> Path:
    path.write_text(json.dumps({"setup": {"n_layer": 2, "steps": 5, "lr": 0.003, **setup}, "results": results}), encoding="utf-8")
    return path


def test_the_coordinate_check_is_drawn_as_sheets_of_at_most_twelve_panels(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """From a record as --from_json reads it: a sheet per optimizer (each of 12 panels, the 48 of the
    old single file), and a record of AdamW alone (two metrics, five connections) split by connections."""
    rows = [f"{c}, {o}" for o in ("adamw", "muon", "adamh", "muonh") for c in ("p_spheret", "pre_ln")]
    path = write_record(tmp_path / "check_optimizers.json", coord_results(rows, coordinates.METRICS), rates=[["muon", 0.04]])
    assert coordinates.main(["--from_json", str(path)]) == 0
    assert "Written:" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [f"check_optimizers_{o}.png" for o in ("adamh", "adamw", "muon", "muonh")]

    setup, optimizers, results = coordinates.load_record(path)
    assert optimizers == ("adamw", "muon", "adamh", "muonh") and setup.rates == (("muon", 0.04),)
    for sheet in coordinates.coord_sheets(results):
        fig = coordinates.sheet_figure(results, sheet, setup.n_layer, "t")
        assert len(drawn_axes(fig)) == 12
        assert_one_y_range(fig.axes[4:8])  # one metric's row
        plt.close(fig)
    muon = next(s for s in coordinates.coord_sheets(results) if s.optimizer == "muon")
    fig = coordinates.sheet_figure(results, muon, setup.n_layer, coordinates.check_title(setup, ("muon",), 64))
    assert fig._suptitle.get_text().replace("\n", " ").count("muon_lr=0.04") == 1
    assert_title_inside_and_above(fig)
    plt.close(fig)

    adamw_alone = coord_results(["pre_ln", "geonorm", "proj_spheret", "cay_spheret", "p_spheret"], ("delta_rms", "angle"))
    sheets = coordinates.coord_sheets(adamw_alone)
    assert [s.suffix for s in sheets] == ["pre_ln+geonorm", "proj_spheret+cay_spheret", "p_spheret"]
    assert all(len(s.rows) * 2 * 2 <= 12 for s in sheets)
    assert coordinates.main(["--from_json", str(tmp_path / "absent.json")]) == 2


def sweep_record(n_layer: int, gaps: dict[str, float]) -> dict:
    """A fair_sweep.json as the sweep writes it: Pre-LN's summary row has no gaps, the sphere's one per held-out seed."""
    rows = [{"block": "llama", "optimizer": "adamw", "arm": "pre_ln", "title": "Pre-LN", "gaps": {}},
            {"block": "llama", "optimizer": "adamw", "arm": "p_spheret-0.5", "title": "0.5-SpheretNorm", "gaps": gaps}]
    return {"n_layer": n_layer, "n_embd": 128, "max_iters": 600, "best": rows}


def test_the_gap_figure_puts_each_held_out_gap_at_its_depth_and_a_failed_seed_at_the_top(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from spheretnorm.experiments import fair_comparison
    from spheretnorm.experiments.gap_figure import gap_axes, gap_points, mean_gaps

    shallow, deep = tmp_path / "d12", tmp_path / "d24"
    for folder, record in ((shallow, sweep_record(12, {"1339": 1.90 - 1.85, "1340": 1.86 - 1.87})),
                           (deep, sweep_record(24, {"1338": 1.836 - 1.816, "1339": math.inf}))):
        folder.mkdir()
        (folder / "fair_sweep.json").write_text(json.dumps(record))  # +inf is written as Infinity, as the sweep writes it
    points = [p for folder in (shallow, deep) for p in gap_points(json.loads((folder / "fair_sweep.json").read_text()), "depth", str(folder))]
    assert [(p.x, p.seed, round(p.gap, 6)) for p in points] == [(12.0, 1339, 0.05), (12.0, 1340, -0.01), (24.0, 1338, 0.02), (24.0, 1339, math.inf)]
    assert mean_gaps(points) == {12.0: pytest.approx(0.02)}  # a failed seed leaves its depth without a mean
    fig = gap_axes(points, "depth", "t", {"p_spheret-0.5": "p_spheret:0.5"}, band=0.02)
    ax = fig.axes[0]
    top = ax.get_ylim()[1]
    crosses = [line for line in ax.lines if line.get_marker() == "x"]
    assert len(crosses) == 1 and crosses[0].get_ydata()[0] > 0.05 and crosses[0].get_ydata()[0] < top  # above every finite gap, inside the panel
    assert [t.get_text() for t in ax.get_xticklabels()] == ["12", "24"]
    assert fair_comparison.main(["--compare", f"{shallow},{deep}", "--gap_against", "depth", "--out_dir", str(tmp_path / "figs")]) == 0
    assert (tmp_path / "figs" / "gap_vs_depth.png").stat().st_size > 0
    gpt2 = sweep_record(24, {"1338": math.inf, "1339": math.inf})
    for row in gpt2["best"]:
        row["block"] = "gpt2"
    both = points + gap_points(gpt2, "depth", "gpt2")
    fig = gap_axes(both, "depth", "t", {"p_spheret-0.5": "p_spheret:0.5"})
    for ax in fig.axes[:2]:  # a block swept at 24 layers only keeps 12's place, its failed seeds near 24
        low, high = ax.get_xlim()
        assert low < 12 and high > 24 and all(20 < x < 28 for line in ax.lines if line.get_marker() == "x" for x in line.get_xdata())
    assert [t.get_text() for t in fig.axes[1].texts] == ["seeds 1338, 1339 failed"]  # one label for the two crosses, not two on each other
    capsys.readouterr()
    (deep / "fair_sweep.json").write_text(json.dumps({k: v for k, v in sweep_record(24, {}).items() if k != "n_layer"}))
    assert fair_comparison.main(["--compare", f"{shallow},{deep}", "--gap_against", "depth", "--out_dir", str(tmp_path / "figs")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no 'n_layer'" in err and "--table_only" in err


def test_arm_dodge_sets_arms_that_fail_at_one_depth_apart_and_names_the_crosses_once_in_the_legend() -> None:
    from spheretnorm.experiments.gap_figure import FAILED_LABEL, GapPoint, gap_axes

    # Table 2 in miniature at 12 layers: two rows fail every seed, one trains; without the dodge their crosses coincide.
    def arm(slug: str, gaps: tuple[float, ...]) -> list[GapPoint]:
        return [GapPoint("gpt2", "adamw", slug, slug, 12.0, 1338 + i, g) for i, g in enumerate(gaps)]

    points = arm("geonorm", (math.inf,) * 3) + arm("p_spheret-0.5", (math.inf,) * 3) + arm("peri_ln", (0.3, 0.25, 0.35))
    methods = {"geonorm": "geonorm", "p_spheret-0.5": "p_spheret:0.5", "peri_ln": "peri_ln"}

    def cross_xs(fig: Any) -> list[list[float]]:
        return [list(line.get_xdata()) for line in fig.axes[0].lines if line.get_marker() == "x"]

    plain = cross_xs(gap_axes(points, "depth", "t", methods))
    assert sorted(plain[:3]) == sorted(plain[3:])  # the overlap the dodge is for
    fig = gap_axes(points, "depth", "t", methods, arm_dodge=0.04)
    dodged = cross_xs(fig)
    first, second = {x for xs in dodged[:3] for x in xs}, {x for xs in dodged[3:] for x in xs}
    assert max(first) < min(second)  # each arm's three crosses apart from the next arm's
    trained = [x for line in fig.axes[0].lines if line.get_marker() == "o" for x in line.get_xdata()]
    assert min(trained) > max(second)  # the third arm's seeds to the right of both
    assert not fig.axes[0].texts  # no label beside the crosses: they would cover each other
    assert FAILED_LABEL in [t.get_text() for t in fig.legends[0].get_texts()]


def test_gap_y_panel_gives_each_panel_its_own_range_and_row_shares_one(tmp_path: Path) -> None:
    from spheretnorm.experiments import fair_comparison
    from spheretnorm.experiments.gap_figure import gap_axes, gap_points

    adamw = sweep_record(12, {"1338": 1.36, "1339": 0.18})  # a stalled seed: a gap of a whole nat
    muonh = sweep_record(12, {"1338": -0.008, "1339": -0.002})
    for row in muonh["best"]:
        row["optimizer"] = "muonh"
    points = gap_points(adamw, "width", "a") + gap_points(muonh, "width", "m")
    shared = gap_axes(points, "width", "t", {"p_spheret-0.5": "p_spheret:0.5"}, band=0.02)
    assert shared.axes[0].get_ylim() == shared.axes[1].get_ylim() and shared.axes[1].get_ylim()[1] > 1.36
    own = gap_axes(points, "width", "t", {"p_spheret-0.5": "p_spheret:0.5"}, band=0.02, y_range="panel")
    low, high = own.axes[1].get_ylim()
    assert own.axes[0].get_ylim()[1] > 1.36 and -0.03 < low < -0.02 and 0.02 < high < 0.03  # MuonH's panel: its gaps and the band
    folder = tmp_path / "w"
    folder.mkdir()
    (folder / "fair_sweep.json").write_text(json.dumps({**adamw, "best": adamw["best"] + muonh["best"]}))
    with pytest.raises(SystemExit):  # argparse names the valid choices
        fair_comparison.main(["--compare", f"{folder},{folder}", "--gap_against", "width", "--gap_y", "column"])
    assert fair_comparison.main(["--compare", f"{folder},{folder}", "--gap_y", "panel", "--out_dir", str(tmp_path)]) == 2  # without --gap_against


def test_the_tokens_gap_pairs_each_held_out_seeds_evaluations_at_each_arms_own_rate(tmp_path: Path) -> None:
    from spheretnorm.experiments.gap_figure import gap_axes, gap_points

    sweep = tmp_path / "moved"  # the record's out_dirs name another place: the runs are found under the sweep's folder

    def run(arm: str, lr: float, seed: int, losses: list[float], status: str = "ok") -> dict:
        folder = sweep / "llama" / arm / f"lr{lr:g}_s{seed}"
        folder.mkdir(parents=True)
        rows = [{"kind": "eval", "iter": 10 * i, "tokens": 1000 * i, "val_loss": v} for i, v in enumerate(losses)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*rows, {"kind": "train", "iter": 5, "loss": 9.0}]))
        return {"block": "llama", "arm": arm, "optimizer": "adamw", "lr": lr, "seed": seed, "status": status,
                "out_dir": f"/elsewhere/llama/{arm}/lr{lr:g}_s{seed}"}

    runs = [run("pre_ln", 2e-3, 2, [3.0, 2.5, 2.0]), run("pre_ln", 2e-3, 3, [3.0, 2.6, 2.1]),
            run("pre_ln", 1e-3, 2, [3.0, 2.9, 2.8]),  # not Pre-LN's selected rate: never paired
            run("p_spheret-0.5", 4e-3, 2, [3.0, 2.4, 2.05]), run("p_spheret-0.5", 4e-3, 3, [3.0, 2.7], "stopped: collapse")]
    record = {"runs": runs, "best": [
        {"block": "llama", "arm": "pre_ln", "optimizer": "adamw", "title": "Pre-LN", "best_lr": 2e-3, "gaps": {}},
        {"block": "llama", "arm": "p_spheret-0.5", "optimizer": "adamw", "title": "0.5-SpheretNorm", "best_lr": 4e-3,
         "gaps": {"2": 0.05, "3": math.inf}}]}
    points = gap_points(record, "tokens", str(sweep))
    got = sorted((p.seed, p.x, round(p.gap, 6)) for p in points)
    assert got == [(2, 0.0, 0.0), (2, 1000.0, -0.1), (2, 2000.0, 0.05),
                   (3, 0.0, 0.0), (3, 1000.0, 0.1), (3, 1000.0, math.inf)]  # seed 3's sphere run collapsed after its 2nd evaluation
    assert {p.series for p in points} == {"moved"}
    fig = gap_axes(points, "tokens", "t", {"p_spheret-0.5": "p_spheret:0.5"})
    mean_line = next(line for line in fig.axes[0].lines if line.get_gid() == "0.5-SpheretNorm (moved)")
    assert list(mean_line.get_xdata()) == [0.0]  # no mean where a seed failed (1000), nor after it (2000 has seed 2 alone)
    plt.close(fig)


def test_each_corpus_is_a_row_of_panels_on_its_own_y_range() -> None:
    """Web text's gap of 0.4 beside Tiny Shakespeare's 0.01 (E3): one y-range would flatten the
    second, so each corpus is a row with its own; a corpus without an optimizer leaves its panel empty."""
    from spheretnorm.experiments.gap_figure import GapPoint, gap_axes

    def gaps(corpus: str, optimizer: str, values: tuple[float, float]) -> list[GapPoint]:
        return [GapPoint("llama", optimizer, "p_spheret-0.5", "0.5-SpheretNorm", 1000.0 * i, seed, g, "s", corpus)
                for i, g in enumerate(values) for seed in (2, 3)]

    points = gaps("web", "adamw", (0.4, 0.3)) + gaps("plays", "adamw", (0.01, 0.02)) + gaps("plays", "muonh", (-0.01, -0.02))
    fig = gap_axes(points, "tokens", "t", {"p_spheret-0.5": "p_spheret:0.5"}, y_range="row")  # the tokens axis's default is per panel
    web_adamw, web_muonh, plays_adamw, plays_muonh = fig.axes[:4]
    assert [ax.get_title() for ax in (web_adamw, plays_adamw, plays_muonh)] == [
        "LLaMA block, AdamW\nweb", "LLaMA block, AdamW\nplays", "LLaMA block, MuonH\nplays"]
    assert not web_muonh.axison and web_adamw.get_ylim()[1] > 0.4 and plays_adamw.get_ylim()[1] < 0.1
    assert plays_adamw.get_ylim() == plays_muonh.get_ylim()
    # The y label is the figure's, once: a label per row was taller than a row and the two overlapped.
    assert fig.get_supylabel().startswith("held-out gap") and not any(ax.get_ylabel() for ax in fig.axes)
    fig.canvas.draw()
    label = fig._supylabel.get_window_extent()
    assert 0 <= label.y0 and label.y1 <= fig.bbox.height
    one = gap_axes(gaps("", "adamw", (0.4, 0.3)), "tokens", "t", {"p_spheret-0.5": "p_spheret:0.5"})
    assert len(one.axes) == 1 and one.axes[0].get_title() == "LLaMA block, AdamW"  # one corpus (or none recorded): no row title
    plt.close(fig)
    plt.close(one)


def test_a_legend_of_long_labels_takes_fewer_columns_so_it_fits_the_figure() -> None:
    """E3's labels name the sweep beside the arm (80 characters): three columns of them ran off both
    edges of a two-panel figure; the columns now widen with the longest label."""
    from spheretnorm.experiments.figures import figure_legend, titled_grid

    fig, axes = titled_grid(1, 2, (4.2, 3.4), "t")
    for i in range(3):
        axes[0][0].plot([0, 1], [i, i], label=f"0.5-SpheretNorm (sweep_{i}), mean of the held-out seeds" + "x" * 25)
    figure_legend(fig, axes)
    assert fig.legends[0]._ncols == 1  # 9 inches hold one 80-character column (about 5.7 inches), not three
    short, axes = titled_grid(1, 2, (4.2, 3.4), "t")
    for i in range(3):
        axes[0][0].plot([0, 1], [i, i], label=f"arm {i}")
    figure_legend(short, axes)
    assert short.legends[0]._ncols == 3
    plt.close(fig)
    plt.close(short)


# -----------------------------------------------------------------------------
# Nothing a figure says is cut (issue 66, item 5)


def assert_texts_inside(fig: plt.Figure) -> None:
    """Every text the figure shows (its title, legends, and each panel's title, axis labels and tick
    labels) lies inside the canvas once drawn."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [fig._suptitle, fig._supylabel, *(t for legend in fig.legends for t in legend.get_texts())]
    boxes = [legend.get_window_extent(renderer) for legend in fig.legends]
    boxes += [t.get_window_extent(renderer) for t in texts if t is not None and t.get_visible() and t.get_text()]
    boxes += [ax.get_tightbbox(renderer) for ax in drawn_axes(fig)]  # the panel with what it draws: title, labels, tick labels
    for box in boxes:
        assert -1 <= box.x0 and box.x1 <= fig.bbox.width + 1 and -1 <= box.y0 and box.y1 <= fig.bbox.height + 1, (box, fig.bbox)


def test_plot_runs_keeps_a_legend_of_long_labels_inside_the_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs that differ in several settings have labels of 70 characters: four columns of them ran
    past both edges of plot.py's figure."""
    from spheretnorm.experiments import figures
    from spheretnorm.experiments.grid import Run, index_runs

    def run(i: int, optimizer: str, lr: float) -> Run:
        config = {"method": "p_spheret:0.5", "dataset": "shakespeare_char", "n_layer": 4, "n_head": 4, "n_embd": 128, "max_iters": 20,
                  "optimizer": optimizer, "learning_rate": lr, "weight_decay": 0.1 * i}
        rows = [{"kind": "train", "iter": j, "train_loss": 3.0 - 0.01 * j + 0.1 * i} for j in range(1, 21)]
        rows += [{"kind": "eval", "iter": j, "val_loss": 3.0 - 0.01 * j + 0.1 * i} for j in (10, 20)]
        return Run(tmp_path / str(i), config, rows, None)

    runs = list(index_runs([run(i, o, lr) for i, (o, lr) in enumerate([("adamw", 1e-3), ("muon", 2e-3), ("muonh", 4e-3), ("adamh", 8e-3)])]).values())
    drawn: list[plt.Figure] = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, out: drawn.append(fig) or [])  # the figure as save_figure gets it
    figures.plot_runs(runs, "openwebtext S (GPT-2, LLaMA): loss per method", tmp_path / "fig", smooth=0.0)
    (fig,) = drawn
    labels = legend_labels(fig)
    assert len(labels) == 4 and min(map(len, labels)) > 60
    assert_texts_inside(fig)
    plt.close(fig)


def test_plot_runs_keeps_its_panels_and_names_a_stop_under_a_legend_of_a_whole_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A study's record (Table 2's M: 60 runs) gave the legend 60 rows: constrained layout shrank the
    panels to no height ("axes sizes collapsed to zero") and drew the legend over the curves. And a
    run the collapse alarm ended read "(unfinished)" like one still training."""
    import warnings

    from spheretnorm.experiments import figures
    from spheretnorm.experiments.grid import Run, index_runs

    def run(seed: int) -> Run:
        config = {"method": "pre_ln", "dataset": "shakespeare_char", "n_layer": 4, "n_head": 4, "n_embd": 128, "max_iters": 20, "seed": seed}
        ended = 10 if seed == 0 else 20
        rows = [{"kind": "train", "iter": j, "train_loss": 3.0 - 0.01 * j + 0.01 * seed} for j in range(1, ended + 1)]
        rows += [{"kind": "eval", "iter": j, "val_loss": 3.0 - 0.01 * j + 0.01 * seed} for j in (10, 20) if j <= ended]
        rows += [{"kind": "stop", "iter": 10, "reason": "collapse"}] if seed == 0 else []
        return Run(tmp_path / str(seed), config, rows, None)

    runs = list(index_runs([run(seed) for seed in range(60)]).values())
    drawn: list[plt.Figure] = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, out: drawn.append(fig) or [])
    figures.plot_runs(runs, "Shakespeare-char 4x128: loss per method", tmp_path / "fig", smooth=0.0)
    (fig,) = drawn
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "constrained_layout not applied" is a UserWarning
        fig.canvas.draw()
    labels = legend_labels(fig)
    assert len(labels) == 60 and "Pre-LN, seed=0 (stopped: collapse at iteration 10)" in labels
    assert not any("unfinished" in label for label in labels)
    for ax in drawn_axes(fig):
        assert ax.get_position().height * fig.get_figheight() > 2.5  # inches: the panels keep their height
    assert_texts_inside(fig)
    plt.close(fig)


def test_save_figure_writes_what_runs_past_the_canvas_rather_than_cutting_it(tmp_path: Path) -> None:
    from spheretnorm.experiments.figures import save_figure

    fig = plt.figure(figsize=(4, 3))
    fig.add_subplot().plot([0, 1], [0, 1])  # the panel fills the canvas from its left edge
    fig.text(0.9, 0.5, "a label that runs far past the right edge of the canvas")
    png, _ = save_figure(fig, tmp_path / "wide")
    assert plt.imread(png).shape[1] > 4 * 150  # wider than the canvas (4 inches at 150 dpi): the text is in the file


def test_the_transfer_figure_of_four_optimizer_rows_keeps_its_long_title_inside() -> None:
    """docs/mup_transfer_optimizers.png's title ran past both edges: the study's longest title over two panels."""
    rows = [dict(r, optimizer=o) for o in ("adamw", "muon", "muonh", "adamh") for r in transfer_rows() if r["optimizer"] == "adamw"]
    title = ("0.5-SpheretNorm, Shakespeare-char, 2 layers, 150 iterations: final val loss against each optimizer's rate "
             "(μP base width 64)")
    fig = lr_transfer.transfer_axes(rows, title)
    assert_title_inside_and_above(fig)
    assert_texts_inside(fig)
    plt.close(fig)


def six_sweeps() -> list[Any]:
    """E3's six sweeps on the tokens axis: three per optimizer, one arm; MuonH's gaps stay within 0.02, AdamW's reach 0.7."""
    from spheretnorm.experiments.gap_figure import GapPoint

    names = ("owt_600", "owt_2400", "owt_600_muonh", "owt_2400_muonh", "ts_2400", "ts_2400_muonh")
    return [GapPoint("llama", "muonh" if name.endswith("muonh") else "adamw", "p_spheret-0.5", "0.5-SpheretNorm", 1000.0 * i, seed,
                     (0.012 if name.endswith("muonh") else 0.7) / (1 + i) + 0.001 * seed, name, "web")
            for name in names for i in range(4) for seed in (1, 2)]


def test_each_sweep_on_the_tokens_axis_has_a_style_and_a_legend_entry_of_its_own() -> None:
    from spheretnorm.experiments.gap_figure import gap_axes

    fig = gap_axes(six_sweeps(), "tokens", "t", {"p_spheret-0.5": "p_spheret:0.5"}, band=0.02)
    means = [line for ax in fig.axes for line in ax.lines if str(line.get_gid()).startswith("0.5-SpheretNorm (")]
    looks = {line.get_gid(): (str(line.get_linestyle()), line.get_marker()) for line in means}
    assert len(looks) == 6 and len(set(looks.values())) == 6  # six sweeps, six looks
    assert {to_rgba(line.get_color()) for line in means} == {to_rgba(means[0].get_color())}  # all in the arm's colour
    labels = legend_labels(fig)
    assert [label for label in labels if label.startswith("sweep ")] == [f"sweep {p}" for p in (
        "owt_600", "owt_2400", "owt_600_muonh", "owt_2400_muonh", "ts_2400", "ts_2400_muonh")]
    assert labels[0] == "0.5-SpheretNorm, mean of the held-out seeds"  # the arm once, not once per sweep
    handles = {t.get_text(): h for t, h in zip(fig.legends[0].get_texts(), fig.legends[0].legend_handles)}
    for line in means:
        sweep = handles[f"sweep {line.get_gid().split('(')[1].rstrip(')')}"]
        assert (str(sweep.get_linestyle()), sweep.get_marker()) == looks[line.get_gid()]  # the legend draws each sweep as its lines are
    assert_texts_inside(fig)
    plt.close(fig)


def test_the_tokens_axis_gives_each_panel_its_own_y_range_unless_asked_for_rows() -> None:
    """One range per row flattened MuonH's gaps of 0.01 under AdamW's 0.7 (docs/gap_vs_tokens.png)."""
    from spheretnorm.experiments.gap_figure import gap_axes

    fig = gap_axes(six_sweeps(), "tokens", "t", {"p_spheret-0.5": "p_spheret:0.5"}, band=0.02)
    adamw, muonh = fig.axes[:2]
    assert adamw.get_ylim()[1] > 0.7 and muonh.get_ylim()[1] < 0.05  # MuonH's panel: its own gaps and the band
    assert "each panel on its own y-range" in fig._suptitle.get_text()
    rows = gap_axes(six_sweeps(), "tokens", "t", {"p_spheret-0.5": "p_spheret:0.5"}, band=0.02, y_range="row")
    assert rows.axes[0].get_ylim() == rows.axes[1].get_ylim() and "own y-range" not in rows._suptitle.get_text()
    plt.close(fig)
    plt.close(rows)
