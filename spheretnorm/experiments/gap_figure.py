"""The held-out gap against depth, width or run length, over finished fair sweeps (issue 50's
docs/gap_vs_depth.png and gap_vs_tokens.png):

    python scripts/fair_sweep.py --compare /work/runs/e2_12x128,/work/runs/e1_24x128 --gap_against depth --out_dir docs

Each sweep's fair_sweep.json gives, per (block, optimizer, arm), the gap to Pre-LN paired by
held-out seed, each arm at its own selected rate ("gaps" of its summary rows), and the value of
the axis (its n_layer, n_embd or max_iters). A panel per (block, optimizer); per arm, each seed's
gap a point, and the mean where every seed trained, joined across the axis. A held-out seed that
failed (gap +inf: the sphere collapsed or diverged; -inf: Pre-LN did) is a cross at the panel's
top or bottom edge: it counts against its arm, as the decision rules say, and is never averaged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from spheretnorm.experiments.figures import figure_legend, method_style, save_figure, titled_grid
from spheretnorm.experiments.grid import BLOCK_TITLES
from spheretnorm.optim import OPTIMIZERS
from spheretnorm.runtime.cli import UsageError

# --gap_against: the record key that gives a sweep's place on the x axis, and the axis label.
AXES = {"depth": ("n_layer", "layers"), "width": ("n_embd", "width (n_embd)"), "iterations": ("max_iters", "iterations")}
BASELINE = "pre_ln"
PANEL_INCHES = (4.2, 3.4)
SEED_JITTER = 0.015  # share of the x range between two seeds' points at one x, so that equal gaps do not hide each other


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


def gap_points(record: dict[str, Any], against: str, source: str) -> list[GapPoint]:
    """The gaps of one sweep's record; refused in one sentence where the record lacks the axis key
    (written before fair_sweep recorded it). Seeds whose run is missing, or where both sides
    failed (nan), are left out: neither says which side is ahead."""
    key = AXES[against][0]
    if key not in record:
        raise UsageError(f"--gap_against {against}: {source}'s fair_sweep.json has no {key!r} (written before it was recorded); "
                         f"run the sweep's command with --table_only there once, then again.")
    return [GapPoint(s["block"], s.get("optimizer", "adamw"), s["arm"], s["title"], float(record[key]), int(seed), float(gap))
            for s in record.get("best", []) if s["arm"] != BASELINE
            for seed, gap in (s.get("gaps") or {}).items() if gap is not None and not math.isnan(float(gap))]


def mean_gaps(points: Iterable[GapPoint]) -> dict[float, float]:
    """Per x, the mean of its seeds' gaps where every one is finite (a failed seed leaves no mean)."""
    by_x: dict[float, list[float]] = {}
    for p in points:
        by_x.setdefault(p.x, []).append(p.gap)
    return {x: sum(g) / len(g) for x, g in sorted(by_x.items()) if all(map(math.isfinite, g))}


def gap_figure(points: list[GapPoint], against: str, title: str, out: Path, methods: dict[str, str], band: float | None = None) -> list[Path]:
    """The figure, saved as out.{png,pdf}: a panel per (block, optimizer) that has points, on one
    y-range, each arm in its method's colour (methods: arm slug -> method key); dotted lines at
    +-band (a decision rule's threshold) where given."""
    return save_figure(gap_axes(points, against, title, methods, band), out)


def gap_axes(points: list[GapPoint], against: str, title: str, methods: dict[str, str], band: float | None = None) -> plt.Figure:
    """gap_figure's figure, drawn and not saved."""
    panels = list(dict.fromkeys((p.block, p.optimizer) for p in points))
    if not panels:
        raise UsageError("--gap_against: the sweeps hold no held-out gap yet (no arm beside Pre-LN has a held-out seed at its rate).")
    fig, axes = titled_grid(1, len(panels), PANEL_INCHES, title)
    finite = [p.gap for p in points if math.isfinite(p.gap)] + ([band, -band] if band else []) + [0.0]
    low, high = min(finite), max(finite)
    pad = 0.15 * (high - low or 0.01)
    xs = sorted({p.x for p in points})
    width = (xs[-1] - xs[0]) or xs[0]
    for ax, (block, optimizer) in zip(axes[0], panels):
        mine = [p for p in points if (p.block, p.optimizer) == (block, optimizer)]
        for arm in dict.fromkeys(p.arm for p in mine):
            draw_arm(ax, [p for p in mine if p.arm == arm], width, (low - pad, high + pad), method_style(methods.get(arm, arm))["color"])
        ax.axhline(0.0, color="0.3", linewidth=0.8)
        if band:
            for y in (band, -band):
                ax.axhline(y, color="0.5", linewidth=0.8, linestyle=":")
        ax.set_ylim(low - 1.5 * pad, high + 1.5 * pad)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.margins(x=0.12)
        ax.set_xlabel(AXES[against][1])
        ax.set_title(f"{BLOCK_TITLES.get(block, block)} block, {OPTIMIZERS[optimizer].title if optimizer in OPTIMIZERS else optimizer}", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out gap: arm minus Pre-LN (same seed)")
    extra = [plt.Line2D([], [], color="0.5", linestyle=":", label=f"±{band:g} (the decision rules)")] if band else []
    figure_legend(fig, axes, extra)
    return fig


def draw_arm(ax: plt.Axes, points: list[GapPoint], width: float, edges: tuple[float, float], color: Any) -> None:
    """One arm: each seed a point (a failed seed a cross at the edge its sign points to), the means joined."""
    seeds = sorted({p.seed for p in points})
    for p in points:
        x = p.x + (seeds.index(p.seed) - (len(seeds) - 1) / 2) * SEED_JITTER * width
        if math.isfinite(p.gap):
            ax.plot([x], [p.gap], marker="o", markersize=4, linestyle="none", color=color, alpha=0.6)
        else:
            ax.plot([x], [edges[1] if p.gap > 0 else edges[0]], marker="x", markersize=8, markeredgewidth=2, linestyle="none", color=color)
            ax.annotate(f"seed {p.seed} failed", (x, edges[1] if p.gap > 0 else edges[0]), textcoords="offset points", xytext=(-7, -3),
                        ha="right", fontsize=7, color=color)
    means = mean_gaps(points)
    ax.plot(list(means), list(means.values()), marker="s", markersize=6, color=color, label=f"{points[0].title}, mean of the held-out seeds")
