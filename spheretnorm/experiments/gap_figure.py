"""The held-out gap against depth, width or tokens seen, over finished fair sweeps (issue 50's
docs/gap_vs_depth.png and gap_vs_tokens.png):

    python scripts/fair_sweep.py --compare /work/runs/e2_12x128,/work/runs/e1_24x128 --gap_against depth --out_dir docs
    python scripts/fair_sweep.py --compare out/e3_600,out/e3_2400 --gap_against tokens --out_dir docs

depth and width: each sweep's fair_sweep.json gives, per (block, optimizer, arm), the final gap to Pre-LN paired by
held-out seed, each arm at its own selected rate, at the sweep's n_layer or n_embd; the means are joined across sweeps.
tokens: the same pairs of runs give the gap at each periodic evaluation (on the sampled batches: the whole split is
evaluated at the end only); each sweep is a line of its own (a 600- and a 2,400-iteration run have other schedules).
A panel per (block, optimizer), a row of panels per corpus, each row on its own y-range (a gap of 0.3 on web text
would flatten one of 0.01 on Tiny Shakespeare); per arm, each seed's gap a point and the mean where every seed has a finite
one. A held-out seed that failed (+inf: the arm collapsed, stalled or diverged; -inf: Pre-LN did) is a cross at the
panel's edge: it counts against its side, as the decision rules say, and is never averaged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.ticker import EngFormatter

from spheretnorm.experiments.figures import figure_legend, method_style, plt, save_figure, titled_grid
from spheretnorm.experiments.grid import BLOCK_TITLES
from spheretnorm.optim import OPTIMIZERS
from spheretnorm.runtime.cli import UsageError
from spheretnorm.runtime.run_folder import METRICS_NAME, read_metrics

# --gap_against: the record key that gives a sweep's place on the x axis (tokens: each eval row's), and the axis label.
AXES = {"depth": ("n_layer", "layers"), "width": ("n_embd", "width (n_embd)"), "tokens": ("tokens", "tokens seen")}
# On the tokens axis each sweep is a line style and a marker of its own (series_style), in its arm's colour.
SERIES_STYLES = ("-", "--", ":", "-.")
SERIES_MARKERS = ("s", "^", "D", "v", "P", "*")  # not "o" (a depth's seeds) nor "x" (a failed seed)
BASELINE = "pre_ln"
PANEL_INCHES = (4.2, 3.4)
SEED_JITTER = 0.015  # share of the x range between two seeds' points at one x, so that equal gaps do not hide each other
FAILED_LABEL = "a held-out seed that failed (at the edge its side loses; never averaged)"


@dataclass(frozen=True)
class GapPoint:
    """One held-out seed's paired gap (arm minus Pre-LN, each at its own rate) in one sweep."""

    block: str
    optimizer: str
    arm: str  # the arm's slug
    title: str
    x: float
    seed: int
    gap: float  # +inf: the arm failed and Pre-LN trained; -inf: the reverse
    series: str = ""  # the sweep it comes from, where each sweep is a line of its own (tokens)
    corpus: str = ""  # the sweep's corpus (its record's "corpus"): a row of panels each


def gap_points(record: dict[str, Any], against: str, source: str) -> list[GapPoint]:
    """The gaps of one sweep's record (the "gaps" of its summary rows), refused where the record lacks the axis key.
    Seeds whose run is missing, or where both sides failed (nan), are left out: neither says which side is ahead."""
    key = AXES[against][0]
    if against == "tokens":
        return eval_gap_points(record, Path(source))
    if key not in record:
        raise UsageError(f"--gap_against {against}: {source}'s fair_sweep.json has no {key!r} (written before it was recorded); "
                         f"run the sweep's command with --table_only there once, then again.")
    return [GapPoint(s["block"], s.get("optimizer", "adamw"), s["arm"], s["title"], float(record[key]), int(seed), float(gap),
                     corpus=record.get("corpus", ""))
            for s in record.get("best", []) if s["arm"] != BASELINE
            for seed, gap in (s.get("gaps") or {}).items() if gap is not None and not math.isnan(float(gap))]


def eval_gap_points(record: dict[str, Any], folder: Path) -> list[GapPoint]:
    """The gap at each periodic evaluation of every held-out pair of runs the record's summary pairs, against the
    tokens seen; where one side failed, a +-inf point at its last evaluation."""
    runs = {(r["block"], r["arm"], r.get("optimizer", "adamw"), r["lr"], r["seed"]): r for r in record.get("runs", [])}
    best = {(s["block"], s["arm"], s.get("optimizer", "adamw")): s for s in record.get("best", [])}
    out = []
    for (block, arm, optimizer), s in best.items():
        base = best.get((block, BASELINE, optimizer))
        if arm == BASELINE or base is None:
            continue
        for seed, final in (s.get("gaps") or {}).items():
            mine, theirs = (runs.get((block, a, optimizer, c.get("best_lr"), int(seed))) for a, c in ((arm, s), (BASELINE, base)))
            if final is None or mine is None or theirs is None or math.isnan(float(final)):
                continue
            a, b = eval_losses(folder, mine), eval_losses(folder, theirs)
            point = lambda x, gap: GapPoint(block, optimizer, arm, s["title"], float(x), int(seed), gap, folder.name,  # noqa: E731
                                            record.get("corpus", ""))
            out += [point(x, a[x] - b[x]) for x in sorted(a.keys() & b.keys())]
            if not math.isfinite(float(final)):
                out.append(point(max((a if final > 0 else b) or {0: 0}), float(final)))
    return out


def run_file(folder: Path, row: dict[str, Any], name: str) -> Path | None:
    """A file of a run of a sweep's record (metrics.jsonl, config.json): under the sweep's folder by the run folder's
    last three parts (<block>/<arm>/lr<R>_s<S>), so that a sweep unpacked elsewhere (docs/run_records) still reads;
    else in its recorded out_dir; None where neither holds it (or the row records no out_dir)."""
    if not row.get("out_dir"):
        return None
    recorded = Path(row["out_dir"])
    return next((d / name for d in (folder.joinpath(*recorded.parts[-3:]), recorded) if (d / name).is_file()), None)


def eval_losses(folder: Path, row: dict[str, Any]) -> dict[int, float]:
    """{tokens seen: val_loss} of a run's finite periodic evaluations, from its metrics.jsonl (run_file)."""
    path = run_file(folder, row, METRICS_NAME)
    if path is None:
        raise UsageError(f"--gap_against tokens: no {METRICS_NAME} for {row.get('name', row.get('out_dir'))} under {folder} or at {row.get('out_dir')}; "
                         "unpack the sweep's run folders there first.")
    return {int(r["tokens"]): float(r["val_loss"]) for r in read_metrics(path)
            if r.get("kind") == "eval" and "tokens" in r and isinstance(r.get("val_loss"), float) and math.isfinite(r["val_loss"])}


def mean_gaps(points: Iterable[GapPoint]) -> dict[float, float]:
    """Per x, the mean of its seeds' gaps where every one is finite. Along one sweep's evaluations (a series) every
    seed of the sweep must be there, so that after a run stopped the survivors' mean is not drawn; across sweeps
    (depth, width) each x has its own seeds."""
    points = list(points)
    every = {p.seed for p in points}
    by_x: dict[float, dict[int, float]] = {}
    for p in points:
        seen = by_x.setdefault(p.x, {})
        if math.isfinite(seen.get(p.seed, 0.0)):  # a failure at x (its cross) outweighs the same seed's last finite gap there
            seen[p.seed] = p.gap
    return {x: sum(g.values()) / len(g) for x, g in sorted(by_x.items())
            if all(map(math.isfinite, g.values())) and (not points[0].series or set(g) == every)}


# --gap_y: which panels share a y-range. 'row' (a corpus's panels) lets the eye compare optimizers at a glance; 'panel'
# keeps a small effect readable beside a large one (MuonH's gaps of 0.01 beside AdamW's stalled +1.36).
GAP_Y_RANGES = ("row", "panel")
# Without --gap_y: the final gaps (a point per sweep) share a row's range; the evaluations' gaps, whose first points reach
# +0.7 under AdamW on web text while MuonH's stay within 0.02 of zero, take a range per panel.
DEFAULT_Y_RANGE = {"depth": "row", "width": "row", "tokens": "panel"}


def series_style(index: int) -> tuple[str, str]:
    """The (line style, marker) of the index-th sweep on the tokens axis: the two cycles (4 and 6 long)
    give no two of the first 12 sweeps the same pair."""
    return SERIES_STYLES[index % len(SERIES_STYLES)], SERIES_MARKERS[index % len(SERIES_MARKERS)]


def gap_figure(points: list[GapPoint], against: str, title: str, out: Path, methods: dict[str, str], band: float | None = None,
               y_range: str | None = None, arm_dodge: float = 0.0) -> list[Path]:
    """The figure, saved as out.{png,pdf}: each row (or, with y_range 'panel', each panel; None: DEFAULT_Y_RANGE) on
    one y-range, each arm in its method's colour (methods: arm slug -> method key), dotted lines at +-band where given.
    arm_dodge > 0 sets the arms of a panel side by side at each x, that share of the x range apart, and names the
    failed seeds' crosses once in the legend: where many arms fail at one x, their crosses and labels would otherwise
    cover each other (Table 2 in miniature: six of seven rows failed at 12 layers)."""
    return save_figure(gap_axes(points, against, title, methods, band, y_range, arm_dodge), out)


def gap_axes(points: list[GapPoint], against: str, title: str, methods: dict[str, str], band: float | None = None,
             y_range: str | None = None, arm_dodge: float = 0.0) -> plt.Figure:
    """gap_figure's figure, drawn and not saved."""
    y_range = y_range or DEFAULT_Y_RANGE[against]
    if y_range not in GAP_Y_RANGES:
        raise UsageError(f"--gap_y {y_range!r} is not one of: {', '.join(GAP_Y_RANGES)}.")
    panels = list(dict.fromkeys((p.block, p.optimizer) for p in points))
    if not panels:
        raise UsageError("--gap_against: the sweeps hold no held-out gap yet (no arm beside Pre-LN has a held-out seed at its rate).")
    corpora = list(dict.fromkeys(p.corpus for p in points))
    own = y_range == "panel" and len(panels) > 1  # said in the title: heights do not compare across panels
    fig, axes = titled_grid(len(corpora), len(panels), PANEL_INCHES, title + ("; each panel on its own y-range" if own else ""),
                            sharey="row" if y_range == "row" else False)
    xs = sorted({p.x for p in points})
    width = (xs[-1] - xs[0]) or xs[0] or 1.0
    series = list(dict.fromkeys(p.series for p in points))
    for row, corpus in zip(axes, corpora):
        draw_row(row, [p for p in points if p.corpus == corpus], panels, against, methods, band, xs, width, series,
                 f"\n{corpus}" if len(corpora) > 1 and corpus else "", y_range == "panel", arm_dodge)
    # One label for the figure: the rows share its meaning, and a label per row is taller than a short row (two rows overlapped).
    fig.supylabel("held-out gap: arm minus Pre-LN (same seed)", fontsize=10)
    extra = series_handles(points, methods, series) if series != [""] else []
    extra += [plt.Line2D([], [], color="0.5", linestyle=":", label=f"±{band:g} (the decision rules)")] if band else []
    if arm_dodge and any(not math.isfinite(p.gap) for p in points):
        extra.append(plt.Line2D([], [], color="0.3", marker="x", markersize=8, markeredgewidth=2, linestyle="none", label=FAILED_LABEL))
    figure_legend(fig, axes, extra)
    return fig


def series_handles(points: list[GapPoint], methods: dict[str, str], series: list[str]) -> list[plt.Line2D]:
    """The legend of the tokens axis: an entry per arm in its colour, then one per sweep in its line style and marker,
    in grey: arms times sweeps would repeat each name."""
    arms = dict.fromkeys((p.arm, p.title) for p in points)
    handles = [plt.Line2D([], [], color=method_style(methods.get(arm, arm))["color"], linewidth=1.4, label=f"{title}, mean of the held-out seeds")
               for arm, title in arms]
    for i, name in enumerate(series):
        linestyle, marker = series_style(i)
        handles.append(plt.Line2D([], [], color="0.35", linestyle=linestyle, marker=marker, markersize=4.5, linewidth=1.4, label=f"sweep {name}"))
    return handles


def draw_row(row: Any, points: list[GapPoint], panels: list[tuple[str, str]], against: str, methods: dict[str, str], band: float | None,
             xs: list[float], width: float, series: list[str], corpus: str, own_range: bool = False, arm_dodge: float = 0.0) -> None:
    """One corpus's panels (one without a point stays empty and unframed), on one y-range or each on its own (own_range)."""
    for ax, (block, optimizer) in zip(row, panels):
        mine = [p for p in points if (p.block, p.optimizer) == (block, optimizer)]
        if not mine:
            ax.set_axis_off()
            continue
        low, high, pad = gap_range(mine if own_range else points, band)
        arms = list(dict.fromkeys((p.arm, p.series) for p in mine))
        for i, (arm, line) in enumerate(arms):
            linestyle, marker = series_style(series.index(line)) if line else ("-", "")
            draw_arm(ax, [p for p in mine if (p.arm, p.series) == (arm, line)], width, (low - pad, high + pad),
                     method_style(methods.get(arm, arm))["color"], linestyle,
                     (i - (len(arms) - 1) / 2) * arm_dodge * width, name_failures=not arm_dodge, marker=marker)
        ax.axhline(0.0, color="0.3", linewidth=0.8)
        if band:
            for y in (band, -band):
                ax.axhline(y, color="0.5", linewidth=0.8, linestyle=":")
        ax.set_ylim(low - 1.5 * pad, high + 1.5 * pad)
        if against == "tokens":  # the evaluations are too many to label each: '200k', '1.2M'
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))
            ax.margins(x=0.12)
        else:  # a few sweeps: a tick at each, every panel on the same x-range (a block with fewer depths keeps its place)
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.set_xlim(xs[0] - 0.2 * width, xs[-1] + 0.2 * width)
        ax.set_xlabel(AXES[against][1])
        ax.set_title(f"{BLOCK_TITLES.get(block, block)} block, {OPTIMIZERS[optimizer].title if optimizer in OPTIMIZERS else optimizer}{corpus}", fontsize=10)
        ax.grid(alpha=0.3)


def gap_range(points: list[GapPoint], band: float | None) -> tuple[float, float, float]:
    """The lowest and highest finite gap (0 and +-band always shown) and the padding beyond them."""
    finite = [p.gap for p in points if math.isfinite(p.gap)] + ([band, -band] if band else []) + [0.0]
    low, high = min(finite), max(finite)
    return low, high, 0.15 * (high - low or 0.01)


def draw_arm(ax: plt.Axes, points: list[GapPoint], width: float, edges: tuple[float, float], color: Any, linestyle: str = "-",
             offset: float = 0.0, name_failures: bool = True, marker: str = "") -> None:
    """One arm (of one sweep, on the tokens axis): each seed a point (a failed seed a cross at the edge its sign points
    to, the failed seeds at one place named in one label), the means joined. offset (arm_dodge's, in x units) moves
    every mark; name_failures False leaves the crosses unlabelled (the legend names them). marker: the sweep's
    (series_style), whose means' line series_handles names rather than itself (its gid says which it is); '' for depth, width."""
    seeds = sorted({p.seed for p in points})
    failed: dict[tuple[float, float], list[tuple[float, int]]] = {}  # (x, edge) -> [(jittered x, seed)]
    for p in points:
        x = p.x + offset + (seeds.index(p.seed) - (len(seeds) - 1) / 2) * SEED_JITTER * width
        if math.isfinite(p.gap):
            ax.plot([x], [p.gap], marker=marker or "o", markersize=4, linestyle="none", color=color, alpha=0.6)
        else:
            edge = edges[1] if p.gap > 0 else edges[0]
            ax.plot([x], [edge], marker="x", markersize=8, markeredgewidth=2, linestyle="none", color=color)
            failed.setdefault((p.x, edge), []).append((x, p.seed))
    for (_, edge), marks in (failed if name_failures else {}).items():
        names = ", ".join(str(seed) for _, seed in marks)
        ax.annotate(f"seed{'s' if len(marks) > 1 else ''} {names} failed", (min(x for x, _ in marks), edge), textcoords="offset points",
                    xytext=(-7, -3), ha="right", fontsize=7, color=color)
    means = mean_gaps(points)
    name = f"{points[0].title}{f' ({points[0].series})' if points[0].series else ''}"
    ax.plot([x + offset for x in means], list(means.values()), marker=marker or "s", markersize=4.5 if marker else 6, color=color,
            linestyle=linestyle, label="_nolegend_" if marker else f"{name}, mean of the held-out seeds", gid=name)
