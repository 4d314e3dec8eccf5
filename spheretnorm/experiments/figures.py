"""Training and validation loss curves per method for one dataset and scale (the paper's Figures 2, 3).

    python scripts/plot.py --runs_root out --dataset openwebtext --scale S
    python scripts/plot.py --runs_root out --dataset fineweb_edu --scale L --smooth 0.95 --out figs/fwe_l
    python scripts/plot.py --runs_root out/depth_study/seed1337 --dataset shakespeare_char --scale 24x128 --diagnostics

With --diagnostics, also one figure per drawn diagnostic of spheretnorm.diagnostics.DIAGNOSTICS
(OUT_<name>.png/.pdf; today the attention sink, massive activations, layer contribution 1 - cos
and update ratio): for a per-layer list a heatmap per method, layer (or sublayer) against
iteration, all panels of a figure on one colour scale; for a single number a line per method. A
run written before a diagnostic existed is drawn blank in that figure (an empty panel, no
line), and one note on stderr names the diagnostics some runs lack.

Writes OUT.png and OUT.pdf (default OUT: <runs_root>/figures/<dataset>_<scale>): the train loss
of every logged iteration smoothed by an exponential moving average (bias-corrected, as
TensorBoard does; --smooth 0 plots the raw values) and the val loss of every evaluation,
unsmoothed. Curves come from metrics.jsonl only. Sphere methods are drawn solid, the others
dashed; a method keeps its colour in every figure. Runs of one method that differ in settings (an
optimizer, a changed key) are each a curve in the method's colour with a dash pattern and marker
of its own, named in the legend by what differs ('0.5-SpheretNorm, optimizer=muon'). Both panels share one iteration axis, from
the first logged iteration of any run to the last. A run that has not reached max_iters (still
training, or stopped by a signal to resume) is named "(unfinished)" in the legend, one that
ended early for good "(stopped: collapse at iteration 720)" or "(stopped: non_finite at ...)", and
its last point, in both panels, is a hollow circle, so a run with a single evaluation is not a bare dot. In W&B
the same runs share the group <config_name> (e.g. openwebtext_s), so these curves can be
compared there as well.

Runs of both blocks (--block=gpt2 and --block=llama) may share --runs_root: each run of a block
other than GPT-2's is its own curve, in its method's colour with square markers, labelled with
the block ('0.5-SpheretNorm (LLaMA)'), and the figure titles name the blocks; a folder of GPT-2
runs is drawn as before.

Only the runs of --dataset at --scale are read (beyond each run's config.json), so other
experiments under the same --runs_root do not stop the plot; two runs of one method among
them are refused. Where the runs drawn come from several experiments' folders, or differ in a
setting no label names, one note on stderr says which roots and settings the figure mixes (as
scripts/tables.py says it: tabulate.mixed_runs_text). A damaged run file is one error line
naming it (and the line of metrics.jsonl): a diagnostic that is not a number (or a list of numbers, one per layer, as long as the run's
other rows) is refused; a nan or inf value is no point of its figure, so that evaluation is left
out of that figure with one "note:" line on stderr naming the file and line. Each figure is
written to a temporary name beside it and renamed: a full disk or a folder that cannot be made
is one error line and leaves no partial file (an earlier figure stays as it was).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.colors import LogNorm, Normalize
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

matplotlib.use("Agg")  # files only: no display needed, also on clusters and in CI
import matplotlib.pyplot as plt  # the studies' figures take plt from here: the backend is chosen in this one place

from spheretnorm.zeroshot.errors import NUMBER, non_finite
from spheretnorm.runtime.atomic import WriteError, write_atomically
from spheretnorm.diagnostics import DIAGNOSTIC_BY_NAME, DIAGNOSTICS, Diagnostic, lacking, lacking_note
from spheretnorm.runtime.run_folder import METRICS_NAME
from spheretnorm.runtime.cli import HelpFormatter, UsageError
from spheretnorm.experiments.grid import BLOCKS, DEFAULT_BLOCK, Run, blocks_text, group_label, index_runs, row_label, sort_rows, split_row
from spheretnorm.runtime.methods import PAPER_METHODS, is_sphere_method, sort_methods
from spheretnorm.experiments.study import UNSTABLE
from spheretnorm.experiments.tabulate import check_value, groups_text, line_of, load_checked_run, mixed_runs_text, scan_runs

# Skipping the first iterations when choosing the y range keeps the initial loss (~ln vocab)
# from flattening the part of the curves where the methods differ.
YLIM_SKIP_FRACTION = 0.05


def ema(values: list[float], alpha: float) -> list[float]:
    """Bias-corrected exponential moving average: s_t = a s_{t-1} + (1 - a) x_t, divided by 1 - a^t."""
    if not alpha:
        return list(values)
    out, s = [], 0.0
    for t, x in enumerate(values, start=1):
        s = alpha * s + (1 - alpha) * x
        out.append(s / (1 - alpha**t))
    return out


def method_style(method: str) -> dict[str, object]:
    """A fixed colour per method (the paper's order in tab10) and a solid line for sphere methods."""
    cmap = plt.get_cmap("tab10")
    order = list(PAPER_METHODS)
    # Other methods share tab10's two spare colours, picked by a stable hash of the name.
    index = order.index(method) if method in order else len(order) + sum(map(ord, method)) % (10 - len(order))
    return {"color": cmap(index % 10), "linestyle": "-" if is_sphere_method(method) else "--"}


# The line patterns and markers of a method's further variants (its runs that differ in settings:
# an optimizer, a changed key): each keeps the method's colour, so the method still reads at a
# glance, and differs from the method's first line and from the other variants.
VARIANT_DASHES: list[Any] = [(0, (1, 1.5)), (0, (6, 1.5, 1, 1.5)), (0, (3, 1, 1, 1, 1, 1)), (0, (8, 2)), (0, (1, 3))]
VARIANT_MARKERS = ["^", "v", "D", "P", "X"]


def row_styles(rows: list[str]) -> dict[str, dict[str, object]]:
    """The style of each row, in the order given: its method's (method_style) for the first row
    of each method and block; a dash pattern and a marker of its own for each further variant."""
    seen: dict[tuple[str, str], int] = {}
    styles: dict[str, dict[str, object]] = {}
    for row in rows:
        cell = split_row(row)
        k = seen[cell] = seen.get(cell, -1) + 1
        style = method_style(cell[0])
        if k:
            style = {**style, "linestyle": VARIANT_DASHES[(k - 1) % len(VARIANT_DASHES)], "marker": VARIANT_MARKERS[(k - 1) % len(VARIANT_MARKERS)]}
        styles[row] = style
    return styles


def _y_range(series: list[tuple[list[int], list[float]]]) -> tuple[float, float] | None:
    kept = []
    for iters, values in series:
        if not iters:
            continue
        start = YLIM_SKIP_FRACTION * max(iters)
        kept += [v for i, v in zip(iters, values) if i >= start]
    return padded(kept, 0.05)


def padded(values: list[float], share: float) -> tuple[float, float] | None:
    """From the lowest value to the highest, widened by `share` of that span on each side (of 1
    where all are equal); None for no values."""
    if not values:
        return None
    lo, hi = min(values), max(values)
    pad = share * (hi - lo or 1.0)
    return lo - pad, hi + pad


def mark_last(ax: plt.Axes, series: tuple[list[int], list[float]], color: Any) -> None:
    """A hollow circle on the last point of an unfinished run's curve (not in the legend)."""
    iters, values = series
    if iters:
        ax.plot(iters[-1:], values[-1:], linestyle="none", marker="o", markersize=8, markerfacecolor="none",
                markeredgecolor=color, markeredgewidth=1.6, label="_nolegend_", zorder=3)


def end_text(run: Run) -> str:
    """How an unfinished run's curve ends, for its legend entry: the stop that ended it for good
    (a collapse or a non-finite loss, a failure), else "unfinished" (running, or resumable)."""
    stop = run.stop
    return f"stopped: {stop['reason']} at iteration {stop['iter']}" if stop else "unfinished"


def plot_runs(runs: list[Run], title: str, out: Path, smooth: float) -> list[Path]:
    """Two panels (train, val) on one iteration axis, a curve per run (Run.row, styled by row_styles)
    and one legend below them, saved as out.png and out.pdf. Constrained layout keeps the title and
    the legend (as many columns as the width holds) inside the canvas."""
    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True, sharey=True, layout="constrained")
    by_row = {r.row: r for r in runs}
    styles = row_styles(sort_rows(by_row))
    series = []
    for row in sort_rows(by_row):
        run, style = by_row[row], styles[row]
        trains, evals = run.of_kind("train"), run.of_kind("eval")
        train = ([r["iter"] for r in trains], ema([r["train_loss"] for r in trains], smooth))
        val = ([r["iter"] for r in evals], [r["val_loss"] for r in evals])
        unfinished = "max_iters" in run.config and not run.finished  # a config without max_iters counts as finished
        line = {"color": style["color"], "linestyle": style["linestyle"]}
        marker = style.get("marker") or ("o" if run.block == DEFAULT_BLOCK else "s")  # squares for a block other than GPT-2's
        label = row_label(row) + (f" ({end_text(run)})" if unfinished else "")
        marked = run.block != DEFAULT_BLOCK or "marker" in style  # the train curve has no points otherwise
        marks = {"marker": marker, "markersize": 3, "markevery": 0.1} if marked else {}
        ax_train.plot(*train, label=label, linewidth=1.4, **marks, **line)
        ax_val.plot(*val, markersize=3, linewidth=1.4, label=label, marker=marker, **line)
        if unfinished:
            mark_last(ax_train, train, style["color"])
            mark_last(ax_val, val, style["color"])
        series += [train, val]
    smoothing = f"EMA {smooth:g} over logged iterations" if smooth else "not smoothed"
    ax_train.set_title("train")
    ax_train.set_ylabel("loss (nats/token)")
    ax_train.set_xlabel(f"iteration (train loss, {smoothing})")
    ax_val.set_title("validation")
    ax_val.set_xlabel("iteration (val loss at each evaluation, not smoothed)")
    span = padded([i for xs, _ in series for i in xs], 0.02)  # from the first point of any curve to the last
    if span:
        ax_train.set_xlim(*span)  # shared: the val panel starts where the train panel does
    y_range = _y_range(series)
    if y_range:
        ax_train.set_ylim(*y_range)
    for ax in (ax_train, ax_val):
        ax.grid(alpha=0.3)
    legend_below(fig, *ax_val.get_legend_handles_labels())
    fitted_suptitle(fig, title)
    return save_figure(fig, out)


SAVE_PAD_INCHES = 0.1  # the margin save_figure keeps around what a figure draws


def save_figure(fig: plt.Figure, out: Path) -> list[Path]:
    """Write fig as out.png and out.pdf, close it, and return the two paths. bbox_inches="tight":
    where a layout still leaves a legend or a title past the canvas (a single label wider than the
    figure), the file grows to take it rather than cutting it. Each file is drawn to a temporary
    name and renamed: a failure leaves no partial figure, one UsageError."""
    paths = [out.with_name(out.name + ext) for ext in (".png", ".pdf")]
    try:
        for path in paths:
            write_atomically(path, lambda tmp, fmt=path.suffix[1:]: fig.savefig(tmp, dpi=150, format=fmt, bbox_inches="tight",
                                                                                pad_inches=SAVE_PAD_INCHES))
    except WriteError as exc:
        raise UsageError(str(exc)) from None
    finally:
        plt.close(fig)
    return paths


def row_place(run: Run, row: dict[str, Any]) -> str:
    """'out/x/metrics.jsonl line 12 (eval row of iteration 400)': where a row came from, for errors and notes."""
    line = line_of(run, row)
    return f"{run.path / METRICS_NAME}{f' line {line}' if line else ''} (eval row of iteration {row['iter']})"


def run_label(run: Run) -> str:
    """The row's name (the method, and the block unless GPT-2's), with alpha_index when a run
    counts layers by sublayer (the ablation)."""
    extra = " (alpha_index=sublayer)" if run.config.get("alpha_index") == "sublayer" else ""
    return row_label(run.row) + extra


def diagnostic_rows(run: Run, entry: Diagnostic) -> list[dict[str, Any]]:
    """The eval rows of a run that hold values of `entry`, each checked (a damaged row is one
    UsageError naming the run's metrics.jsonl). A row without the key predates the diagnostic, an
    empty list has nothing to draw (the step sizes of a Euclidean model): both are left out."""
    rows = [r for r in run.of_kind("eval") if entry.name in r and r[entry.name] != []]
    schema = [NUMBER] if entry.is_series else NUMBER
    what = f"a list of numbers, one per {entry.index}, as train.py writes" if entry.is_series else "a number, as train.py writes"
    kept = []
    for row in rows:
        check_value(row, {entry.name: schema}, row_place(run, row), what)
        values = row[entry.name] if entry.is_series else [row[entry.name]]
        bad = next((v for v in values if non_finite(v)), None)
        if bad is not None:
            # What is skipped is said: a nan (a diverging run's measurement) is no point of the figure.
            print(f"note: {row_place(run, row)}: {entry.name} holds {bad}; that evaluation is left out of the {entry.name} figure.", file=sys.stderr)
            continue
        impossible = next((v for v in values if entry.impossible(v)), None)
        if impossible is not None:
            # A value no measurement can give (a negative ratio of magnitudes) is a damaged row, not data.
            print(f"warning: {row_place(run, row)}: {entry.name} holds {impossible}, below {entry.lowest:g}, which {entry.label} "
                  f"cannot be; the row is damaged, and that evaluation is left out of the {entry.name} figure.", file=sys.stderr)
            continue
        kept.append(row)
    return kept


def diagnostic_matrix(run: Run, key: str) -> tuple[list[int], np.ndarray]:
    """(eval iterations, array (layers, evaluations)) of one per-layer diagnostic of a run (empty
    without it); each eval row's list must hold as many numbers as the first row's."""
    entry = DIAGNOSTIC_BY_NAME[key]
    evals = diagnostic_rows(run, entry)
    for row in evals:
        if len(row[key]) != len(evals[0][key]):
            raise UsageError(
                f"{row_place(run, row)}: {key} has {len(row[key])} values but the row "
                f"of iteration {evals[0]['iter']} has {len(evals[0][key])}; one run's rows must all have one value per {entry.index}."
            )
    return [r["iter"] for r in evals], np.array([r[key] for r in evals], dtype=float).T


# The widest character of a title, as a fraction of its font size: a safe bound for wrapping
# without a renderer (DejaVu Sans averages about 0.55, capitals and 'm' reach 0.9).
TITLE_CHAR_EM = 0.62


def fitted_suptitle(fig: plt.Figure, text: str, fontsize: float = 12.0) -> None:
    """The figure's title, wrapped onto as many lines as its width needs: a single-panel figure is
    narrower than a title naming the study and the diagnostic, and suptitle would clip it."""
    per_line = max(20, int(fig.get_figwidth() * 72 / (fontsize * TITLE_CHAR_EM)))
    fig.suptitle(textwrap.fill(text, per_line), fontsize=fontsize)


def colour_norm(mats: list[np.ndarray], log: bool) -> Normalize | None:
    """One colour scale for all panels (log over the positive values when asked); None when nothing is drawn."""
    values = np.concatenate([m.ravel() for m in mats]) if mats else np.array([])
    if not values.size:
        return None
    positive = values[values > 0]
    if log and positive.size:
        return LogNorm(positive.min(), positive.max())
    return Normalize(values.min(), values.max())


def blank_panel(ax: plt.Axes, entry: Diagnostic) -> None:
    # Said in the panel, so an empty panel is not read as a run whose values were all zero.
    ax.text(0.5, 0.5, f"no {entry.name}\nin this run's rows", ha="center", va="center", transform=ax.transAxes, fontsize=9, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def heatmaps(runs: list[Run], entry: Diagnostic) -> plt.Figure:
    """One heatmap per run (layer against iteration) of a per-layer diagnostic, on one colour scale,
    at most four panels to a row; a run without it is an empty panel."""
    mats = [(run, *diagnostic_matrix(run, entry.name)) for run in runs]
    norm = colour_norm([m for _, _, m in mats if m.size], entry.scale == "log")
    cols = min(max(len(mats), 1), 4)
    rows = (max(len(mats), 1) + cols - 1) // cols
    fig, grid = plt.subplots(rows, cols, figsize=(3.4 * cols + 1.2, 2.8 * rows + 0.8), squeeze=False, layout="constrained")
    axes = list(grid.flat)[: len(mats)]
    for ax in list(grid.flat)[len(mats):]:
        ax.axis("off")  # the spare panels
    image = None
    for ax, (run, iters, m) in zip(axes, mats):
        ax.set_title(run_label(run), fontsize=9)
        if not m.size:
            blank_panel(ax, entry)
            continue
        # The log scale has no place for values <= 0: they take its lowest colour.
        shown = np.clip(m, norm.vmin, None) if isinstance(norm, LogNorm) else m
        image = ax.imshow(shown, aspect="auto", origin="lower", norm=norm, cmap="viridis", interpolation="nearest")
        ticks = np.linspace(0, len(iters) - 1, min(len(iters), 5)).round().astype(int)
        ax.set_xticks(ticks, [str(iters[i]) for i in ticks])
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # rows are layer indices: no tick between two
        ax.set_xlabel("iteration")
        ax.set_ylabel(entry.index)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.9, label=entry.label)
    return fig


def lines(runs: list[Run], entry: Diagnostic) -> plt.Figure:
    """One line per run of a single-number diagnostic against iteration; a run without it has no line."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2), layout="constrained")
    for run in runs:
        rows = diagnostic_rows(run, entry)
        if rows:
            ax.plot([r["iter"] for r in rows], [r[entry.name] for r in rows], marker="o", markersize=3, linewidth=1.4,
                    label=run_label(run), **method_style(run.method))
    if ax.lines:
        ax.legend(fontsize=8, frameon=False)
    else:
        blank_panel(ax, entry)
    ax.set_yscale(entry.scale)
    ax.set_xlabel("iteration")
    ax.set_ylabel(entry.label)
    ax.grid(alpha=0.3)
    return fig


def plot_diagnostic(runs: list[Run], key: str, title: str, out: Path) -> list[Path]:
    """The figure of the diagnostic `key`: heatmaps of a per-layer list, lines of a single number."""
    entry = DIAGNOSTIC_BY_NAME[key]
    fig = (heatmaps if entry.is_series else lines)(runs, entry)
    fitted_suptitle(fig, f"{title}: {entry.label}")
    return save_figure(fig, out)


def plot_diagnostics(runs: list[Run], title: str, out: Path) -> list[Path]:
    """Every drawn diagnostic of the runs, as out_<key>.png/.pdf; runs in the paper's method order.
    A diagnostic that some runs predate is drawn blank for them, with one note on stderr."""
    order = {m: i for i, m in enumerate(sort_methods(r.method for r in runs))}
    blocks = {b: i for i, b in enumerate(BLOCKS)}
    runs = sorted(runs, key=lambda r: (order[r.method], blocks.get(r.block, len(blocks)), r.config.get("alpha_index", "")))
    entries = [entry for entry in DIAGNOSTICS if entry.drawn]
    missing = lacking([run.of_kind("eval") for run in runs], entries)
    if missing:
        print(lacking_note(missing, len(runs), "drawn blank"), file=sys.stderr)
    paths = []
    for entry in entries:
        paths += plot_diagnostic(runs, entry.name, title, out.with_name(f"{out.name}_{entry.name}"))
    return paths


# -----------------------------------------------------------------------------
# Grids of panels under one title, and loss against a rate (the studies' sweeps: fair_comparison,
# lr_transfer). What these figures promise a reader: the title is inside the canvas, the panels
# that compare one quantity share one y-range, a mean is drawn only where every seed trained, and
# a collapsed or diverged run is a marker of its line's colour, never a silent gap.

FAILURE_LABEL = "collapsed/diverged"
FAILURE_GID = "failure"  # marks the failure markers among an Axes' lines (for the tests, and any reader of the Axes)
SEED_GID = "seeds"
FAILURE_Y = 0.96  # axes fraction of the failure markers: at the top of the panel whatever its y-range
FAILURE_STEP = 0.05  # axes fraction a failure marker sits below another one at the same rate
LOSS_PAD = 0.02  # nats of margin below the lowest loss and above the highest shown
HEADROOM = 0.1  # share of the y-range above the highest loss shown, where the failure markers sit apart from the points
MAX_RATE_LABELS = 8  # more rates than this on one axis: only every k-th is labelled
RATE_LABEL_INCHES = 0.45  # width of axis one rate's label needs (a turned '1.6e-2' at size 8 and a gap): a narrower panel labels fewer
ROTATE_ABOVE = 5  # more labelled rates than this: the labels are turned 45 degrees


def compact_rate(rate: float) -> str:
    """'5e-3', '1.6e-1', '2': a rate's tick label, short enough that neighbours do not meet, and
    written one way for every rate below 1 (a '0.16' beside '8e-2' reads as another scale)."""
    if 1 <= abs(rate) < 100 or rate == 0:
        return f"{rate:.3g}"
    mantissa, exponent = f"{rate:.2e}".split("e")  # three significant digits: a grid's 1.25e-3 keeps its own
    return f"{float(mantissa):g}e{int(exponent)}"


def rate_axis(ax: plt.Axes, rates: list[float], label: str) -> None:
    """A log x axis with a tick at each rate, labelled compactly; a crowded axis is thinned and its
    labels turned, so that no two overprint (the MuonH panels of the transfer figure did)."""
    rates = sorted(set(rates))
    ax.set_xscale("log")
    inches = ax.get_position().width * ax.figure.get_figwidth()  # the layout's first guess, before constrained layout runs
    room = max(2, min(MAX_RATE_LABELS, int(inches / RATE_LABEL_INCHES)))
    step = max(1, -(-len(rates) // room))  # ceil: the labels kept are at most `room` (a panel without runs has none)
    ax.set_xticks(rates, [compact_rate(r) if i % step == 0 else "" for i, r in enumerate(rates)])
    ax.minorticks_off()
    if len(rates[::step]) > ROTATE_ABOVE:
        ax.tick_params(axis="x", labelrotation=45)
        for text in ax.get_xticklabels():
            text.set_horizontalalignment("right")
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel(label)


def titled_grid(rows: int, cols: int, panel: tuple[float, float], title: str, sharey: bool | str = True) -> tuple[plt.Figure, np.ndarray]:
    """A rows x cols grid of panels of `panel` inches under a wrapped title. Constrained layout
    reserves the title's room, so it is neither cut at the edges nor drawn over the first row."""
    fig, axes = plt.subplots(rows, cols, figsize=(panel[0] * cols + 0.6, panel[1] * rows + 1.2), squeeze=False, sharey=sharey,
                             layout="constrained")
    fitted_suptitle(fig, title)
    return fig, axes


@dataclass(frozen=True)
class LossRange:
    """The y-range the panels of one figure share: from the lowest loss to `top`, the highest shown
    (a loss above it is a triangle at `top`), with room above for the failure markers."""

    low: float
    top: float

    def apply(self, ax: plt.Axes) -> None:
        span = self.top - self.low + 2 * LOSS_PAD
        ax.set_ylim(self.low - LOSS_PAD, self.top + LOSS_PAD + HEADROOM * span)


def loss_range(losses: list[float], span: float | None = None) -> LossRange:
    """The range of `losses` (trained runs only), cut `span` nats above the lowest where given;
    0 to 1 where no run trained, so that the panels still show their failure markers."""
    if not losses:
        return LossRange(0.0, 1.0)
    low, high = min(losses), max(losses)
    return LossRange(low, high if span is None else min(high, low + span))


def trained(row: dict[str, Any]) -> bool:
    """Whether a run's loss counts: it finished as ok with a finite val loss (a collapsed run has a
    val loss too, which must not pull a mean down)."""
    return row["status"] == "ok" and row.get("val_loss") is not None and math.isfinite(row["val_loss"])


@dataclass(frozen=True)
class RateCurve:
    """One line of a loss-against-rate panel, from the runs (seeds) at each rate."""

    label: str
    color: Any
    losses: dict[float, tuple[float, ...]]  # every rate run, with the losses of its seeds that trained
    complete: frozenset[float]  # the rates where every seed trained: the only ones the mean line passes through
    failed: frozenset[float]  # the rates where a seed collapsed or diverged
    linestyle: str = "-"


def rate_curve(rows: list[dict[str, Any]], label: str, color: Any, linestyle: str = "-") -> RateCurve:
    """The curve of runs with keys lr, status and val_loss. A run that failed to run or is unfinished
    breaks the line at its rate too (the mean would lack a seed) but is no failure marker."""
    by_rate: dict[float, list[dict[str, Any]]] = {}
    for row in rows:
        by_rate.setdefault(row["lr"], []).append(row)
    return RateCurve(
        label, color,
        {lr: tuple(r["val_loss"] for r in runs if trained(r)) for lr, runs in by_rate.items()},
        frozenset(lr for lr, runs in by_rate.items() if all(map(trained, runs))),
        frozenset(lr for lr, runs in by_rate.items() if any(r["status"] in UNSTABLE for r in runs)),
        linestyle,
    )


def draw_rate_curve(ax: plt.Axes, curve: RateCurve, shown: LossRange) -> None:
    """Each seed a point (a triangle at the top when above the range), the mean a line broken at
    every rate where not every seed trained, and an x of the curve's colour at the top of the
    panel at each rate where a seed collapsed or diverged."""
    rates = sorted(curve.losses)
    means = [statistics.fmean(curve.losses[lr]) if lr in curve.complete else math.nan for lr in rates]
    ax.plot(rates, means, label=curve.label, color=curve.color, linestyle=curve.linestyle, linewidth=1.4)
    seeds = [(lr, loss) for lr in rates for loss in curve.losses[lr]]
    for marker, kept in (("o", [(x, y) for x, y in seeds if y <= shown.top]), ("^", [(x, shown.top) for x, y in seeds if y > shown.top])):
        if kept:
            ax.plot(*zip(*kept), marker=marker, markersize=3.5, linestyle="none", color=curve.color, label="_nolegend_", gid=SEED_GID)
    if curve.failed:
        failed = sorted(curve.failed)
        ax.plot(failed, failure_heights(ax, failed), transform=ax.get_xaxis_transform(), marker="x", markersize=8, markeredgewidth=2,
                linestyle="none", color=curve.color, label="_nolegend_", gid=FAILURE_GID)


def failure_heights(ax: plt.Axes, rates: list[float]) -> list[float]:
    """FAILURE_Y at each rate, one FAILURE_STEP lower for each failure marker already there: two
    arms that fail at one rate are two markers, not one hiding the other."""
    taken = Counter(x for line in ax.lines if line.get_gid() == FAILURE_GID for x in line.get_xdata())
    return [FAILURE_Y - FAILURE_STEP * taken[rate] for rate in rates]


LEGEND_COLUMN_INCHES = 3.0  # room of one legend entry as long as the fair sweep's longest arm name, at font size 8
LEGEND_CHAR_INCHES = 0.065  # the width of one character of a legend label at font size 8, with room to spare


def figure_legend(fig: plt.Figure, axes: np.ndarray, extra: list[Line2D] | None = None) -> None:
    """One legend below the panels of every labelled line of any panel (each label once), then
    `extra` handles, and the failure marker's entry where some panel has one; as many columns as
    the figure's width holds, so that the legend is not cut at its edges."""
    handles: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    more = list(extra or [])
    if any(line.get_gid() == FAILURE_GID for ax in axes.flat for line in ax.lines):
        # In grey: each failure marker itself has its line's colour.
        more.append(Line2D([], [], marker="x", markersize=8, markeredgewidth=2, linestyle="none", color="0.35", label=FAILURE_LABEL))
    items = [*handles.values(), *more]
    legend_below(fig, items, [*handles, *(h.get_label() for h in more)])


LEGEND_ROW_INCHES = 0.17  # one row of a legend at font size 8, with matplotlib's spacing between rows
LEGEND_FREE_ROWS = 3  # the rows a figure's own height leaves room for below its panels


def legend_below(fig: plt.Figure, handles: list[Any], labels: list[str]) -> None:
    """One legend under the panels, where it hides no curve, in as many columns as the width holds.
    The figure grows by the rows past LEGEND_FREE_ROWS: constrained layout would otherwise shrink
    the panels to make room, and a legend of 60 runs (a whole study's record) left them no height
    at all, the legend drawn over the curves."""
    ncol = legend_columns(fig, labels)
    fig.set_figheight(fig.get_figheight() + max(0, math.ceil(len(labels) / ncol) - LEGEND_FREE_ROWS) * LEGEND_ROW_INCHES)
    fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=8, frameon=False)


def legend_columns(fig: plt.Figure, labels: list[str]) -> int:
    """How many columns of `labels` (at font size 8) the figure's width holds: each column as wide
    as the longest label needs, so that a legend of long labels is not cut at both edges."""
    column = max(LEGEND_COLUMN_INCHES, 0.5 + LEGEND_CHAR_INCHES * max(map(len, labels), default=0))  # a longer label, a wider column
    return max(1, min(len(labels), int(fig.get_figwidth() // column)))


def select_runs(runs_root: Path, dataset: str, scale: str) -> list[Run]:
    """The runs of one dataset and scale under runs_root, their files checked; the error names the pairs there are.
    Only these runs' metrics are read, and two runs of one method in one block are refused among them only."""
    folders = scan_runs(runs_root)
    chosen = [f for f in folders if f.dataset == dataset and f.scale == scale]
    if not chosen:
        raise UsageError(f"No runs of dataset {dataset!r} at scale {scale!r}; the runs root has: {groups_text(folders, '--dataset {} --scale {}')}.")
    return list(index_runs(load_checked_run(f) for f in chosen).values())


PLOT_ADVICE = "point --runs_root at one experiment's folder to plot it alone"


def check_smooth(smooth: float) -> None:
    if not 0 <= smooth < 1:
        raise UsageError(f"--smooth {smooth} is not valid; use a value in [0, 1) (0: no smoothing).")


def plot_group(runs_root: Path, dataset: str, scale: str, out: Path | None = None, smooth: float = 0.9, diagnostics: bool = False) -> list[Path]:
    """Find the runs of (dataset, scale) under runs_root and plot them (and their diagnostics); returns the files written."""
    check_smooth(smooth)
    return plot_chosen(select_runs(runs_root, dataset, scale), runs_root, dataset, scale, out, smooth, diagnostics)


def plot_chosen(chosen: list[Run], runs_root: Path, dataset: str, scale: str, out: Path | None, smooth: float, diagnostics: bool) -> list[Path]:
    """Plot the runs select_runs chose (and their diagnostics); returns the files written."""
    out = out or Path(runs_root) / "figures" / f"{dataset}_{scale}"
    blocks = blocks_text(r.row for r in chosen)  # '' for GPT-2 runs only: the titles stay as they were
    group = group_label(dataset, scale) + (f" ({blocks})" if blocks else "")
    paths = plot_runs(chosen, f"{group}: loss per method", Path(out), smooth)
    if diagnostics:
        paths += plot_diagnostics(chosen, group, Path(out))
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--runs_root", default="out", help="folder holding the run folders (default: out)")
    p.add_argument("--dataset", required=True, help="e.g. openwebtext, fineweb_edu, shakespeare_char")
    p.add_argument("--scale", required=True, help="S, M, L, or <layers>x<width> for other shapes (e.g. 24x128)")
    p.add_argument("--smooth", type=float, default=0.9, help="EMA factor of the train curves (default 0.9; 0: none)")
    p.add_argument("--diagnostics", action="store_true", help="also draw the per-layer diagnostics as heatmaps (one figure each)")
    p.add_argument("--out", default=None, help="output path without extension (default: <runs_root>/figures/<dataset>_<scale>)")
    args = p.parse_args(argv)
    runs_root = Path(args.runs_root)
    try:
        check_smooth(args.smooth)
        chosen = select_runs(runs_root, args.dataset, args.scale)
        paths = plot_chosen(chosen, runs_root, args.dataset, args.scale, Path(args.out) if args.out else None, args.smooth, args.diagnostics)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # Said by the command, not plot_group: a study's figures (cpu_pipeline) draw one study's runs,
    # whose folders (p0.5/seed1337) run_root would count as several roots.
    if mixed := mixed_runs_text(chosen, runs_root, PLOT_ADVICE):
        print(f"note: {mixed}", file=sys.stderr)
    for path in paths:
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
