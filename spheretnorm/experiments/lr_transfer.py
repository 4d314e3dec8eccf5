"""μP learning-rate transfer: final val loss against LR at two widths, standard vs μP.

    python scripts/mup_transfer.py                                    # the study in docs/LOG.md
    python scripts/mup_transfer.py --widths 64,256 --lrs 1e-3,4e-3,1.6e-2 --max_iters 100

For each method, width, parametrisation and peak LR, one run of a shallow CPU model (--n_layer
layers, heads of --head_dim so wider models have more heads, Tiny Shakespeare characters, block
64, batch 16, warm-up of a tenth of the run, cosine decay to lr/10). Depth stays fixed; only the
width changes. μP runs use mup_base_width = the smallest width. At that width μP is the standard
parametrisation exactly (tests/test_mup.py), so one run there serves both. Any other --key=value
is passed to every train.py run.

Writes OUT_DIR/transfer.json (every run), OUT_DIR/transfer.md (the table and the optimum's
move in grid steps) and OUT_DIR/mup_transfer.{png,pdf}: one panel per method and
parametrisation, one line per width. Runs go to OUT_DIR/<method>/w<WIDTH>_<param>/lr<LR>/ and a
finished run with the same settings is reused.
"""

from __future__ import annotations

import sys
from pathlib import Path


import argparse
import json
import time
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from spheretnorm.experiments.study import (
    CPU_MODEL,
    RESERVED as STUDY_RESERVED,
    add_common_options,
    as_args,
    ensure_data,
    make_job,
    outcome,
    run_jobs,
    wall_clock_line,
    exit_status,
    study_main,
)
from spheretnorm.experiments.figures import save_figure
from spheretnorm.runtime.cli import HelpFormatter
from spheretnorm.runtime.cli import UsageError
from spheretnorm.experiments.grid import check_overrides, parse_numbers, parse_methods, unigram_loss
from spheretnorm.runtime.methods import display_name, method_args
from spheretnorm.runtime.config import method_dirname

DEFAULT_METHODS = "p_spheret:0.5,pre_ln"
DEFAULT_WIDTHS = "64,256"
DEFAULT_LRS = "1e-3,2e-3,4e-3,8e-3,1.6e-2"
DEFAULT_MAX_ITERS = 250
PARAMETRISATIONS = ("standard", "mup")
RESERVED = {
    **STUDY_RESERVED,
    "learning_rate": "--lrs",
    "min_lr": "--lrs (min_lr is lr / 10)",
    "warmup_iters": "nothing (a tenth of --max_iters)",
    "max_iters": "--max_iters",
    "lr_decay_iters": "--max_iters (the cosine ends at max_iters)",
    "n_embd": "--widths",
    "n_head": "--head_dim (n_head = width / head_dim)",
    "n_layer": "--n_layer",
    "mup_base_width": "nothing (the smallest of --widths)",
}


@dataclass(frozen=True)
class Point:
    method: str
    width: int
    param: str  # 'standard' or 'mup'
    lr: float

    @property
    def label(self) -> str:
        return f"{self.method} width {self.width} {self.param} lr {self.lr:g}"

    def dirname(self) -> str:
        return f"{method_dirname(self.method)}/w{self.width}_{self.param}/lr{self.lr:g}"


def study_points(methods: list[str], widths: list[int], lrs: list[float]) -> list[Point]:
    """Every run to train; at the base width only the standard one (μP is identical there).

    Method by method, so that a study cut short has complete methods rather than half of each.
    """
    base = min(widths)
    return [
        Point(m, w, param, lr)
        for m in methods
        for w in widths
        for param in PARAMETRISATIONS
        if not (w == base and param == "mup")
        for lr in lrs
    ]


def run_of(point: Point, base: int) -> Point:
    """The point whose run answers for `point`: the base width's μP point is its standard run."""
    return Point(point.method, point.width, "standard", point.lr) if point.width == base else point


def point_args(point: Point, base: int, n_layer: int, head_dim: int, max_iters: int, overrides: list[str]) -> list[str]:
    settings = {
        **CPU_MODEL,
        "n_layer": n_layer,
        "n_embd": point.width,
        "n_head": point.width // head_dim,
        "mup_base_width": base if point.param == "mup" else 0,
        "learning_rate": point.lr,
        "min_lr": point.lr / 10,
        "warmup_iters": max(1, max_iters // 10),
        "max_iters": max_iters,
        "lr_decay_iters": max_iters,
        "eval_interval": max_iters,  # evaluate at the start and the end only
        "eval_iters": 20,
    }
    return as_args(settings) + method_args(point.method) + overrides


# -----------------------------------------------------------------------------
# Results


def best_lrs(rows: list[dict[str, Any]]) -> dict[tuple[str, str, int], float | None]:
    """{(method, param, width): the LR of the lowest final val loss among runs that trained}."""
    best: dict[tuple[str, str, int], float | None] = {}
    for key in {(r["method"], r["param"], r["width"]) for r in rows}:
        ok = [r for r in rows if (r["method"], r["param"], r["width"]) == key and r["status"] == "ok"]
        best[key] = min(ok, key=lambda r: r["val_loss"])["lr"] if ok else None
    return best


def optimum_moves(rows: list[dict[str, Any]], lrs: list[float]) -> list[dict[str, Any]]:
    """Per method and parametrisation: the best LR at each width and its move in grid steps.

    A move of 0 means the optimum transferred to the grid's resolution; the sign says whether
    the wider model wants a larger (+) or smaller (-) LR.
    """
    best = best_lrs(rows)
    widths = sorted({r["width"] for r in rows})
    moves = []
    for method in dict.fromkeys(r["method"] for r in rows):
        for param in PARAMETRISATIONS:
            at = {w: best.get((method, param, w)) for w in widths}
            known = [at[w] for w in (widths[0], widths[-1]) if at[w] is not None]
            steps = lrs.index(known[1]) - lrs.index(known[0]) if len(known) == 2 else None
            moves.append({"method": method, "param": param, "best_lr": {str(w): at[w] for w in widths}, "grid_steps": steps})
    return moves


def transfer_table(rows: list[dict[str, Any]], lrs: list[float]) -> str:
    """Markdown: one row per (method, parametrisation, width), one column per LR; best in bold."""
    best = best_lrs(rows)
    cell = {(r["method"], r["param"], r["width"], r["lr"]): r for r in rows}
    lines = ["| method | param | width | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |", "|:--|:--|--:|" + "--:|" * len(lrs)]
    for method, param, width in sorted({(r["method"], r["param"], r["width"]) for r in rows}):
        cells = []
        for lr in lrs:
            r = cell.get((method, param, width, lr))
            text = "-" if r is None else (f"{r['val_loss']:.3f}" if r["val_loss"] is not None else r["status"])
            if r is not None and r["status"] not in ("ok", "diverged") and r["val_loss"] is not None:
                text += f" ({r['status']})"
            cells.append(f"**{text}**" if best.get((method, param, width)) == lr else text)
        lines.append(f"| {display_name(method)} | {param} | {width} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def moves_text(moves: list[dict[str, Any]]) -> list[str]:
    lines = []
    for m in moves:
        best = ", ".join(f"width {w}: {lr:g}" if lr is not None else f"width {w}: none trained" for w, lr in m["best_lr"].items())
        move = "unknown" if m["grid_steps"] is None else f"{m['grid_steps']:+d} grid step(s)"
        lines.append(f"- {display_name(m['method'])}, {m['param']}: best LR {best}; the optimum moves {move}.")
    return lines


def plot_transfer(rows: list[dict[str, Any]], title: str, out: Path) -> list[Path]:
    """Final val loss vs LR: a panel per (method, parametrisation), a line per width, optimum ringed."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    widths = sorted({r["width"] for r in rows})
    best = best_lrs(rows)
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(len(methods), len(PARAMETRISATIONS), figsize=(10, 3.6 * len(methods)), sharey="row", squeeze=False)
    for i, method in enumerate(methods):
        for j, param in enumerate(PARAMETRISATIONS):
            ax = axes[i][j]
            for k, width in enumerate(widths):
                mine = sorted((r for r in rows if (r["method"], r["param"], r["width"]) == (method, param, width) and r["val_loss"] is not None), key=lambda r: r["lr"])
                color = cmap(k / max(1, len(widths) - 1) * 0.85)
                ax.plot([r["lr"] for r in mine], [r["val_loss"] for r in mine], marker="o", color=color, label=f"width {width}")
                lr = best.get((method, param, width))
                if lr is not None:
                    loss = next(r["val_loss"] for r in mine if r["lr"] == lr)
                    ax.plot(lr, loss, marker="o", markersize=12, markerfacecolor="none", markeredgecolor=color)
            ax.set_xscale("log")
            ax.set_title(f"{display_name(method)}, {'μP' if param == 'mup' else 'standard'}")
            ax.set_xlabel("peak learning rate")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8)
        axes[i][0].set_ylabel("final val loss (ring: best LR)")
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, out)


# -----------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter, epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False)
    p.add_argument("--methods", default=DEFAULT_METHODS, help=f"comma-separated methods (default: {DEFAULT_METHODS})")
    p.add_argument("--widths", default=DEFAULT_WIDTHS, help=f"widths n_embd; the smallest is μP's base (default: {DEFAULT_WIDTHS})")
    p.add_argument("--lrs", default=DEFAULT_LRS, help=f"peak learning rates, a log grid (default: {DEFAULT_LRS})")
    p.add_argument("--max_iters", type=int, default=DEFAULT_MAX_ITERS, help=f"iterations per run (default {DEFAULT_MAX_ITERS})")
    p.add_argument("--n_layer", type=int, default=3, help="depth of every model (default 3)")
    p.add_argument("--head_dim", type=int, default=32, help="width of one attention head (default 32)")
    p.add_argument("--out_dir", default="out/mup_transfer", help="where runs, table and plot go (default: out/mup_transfer)")
    add_common_options(p)
    return p.parse_known_args(argv)


def check_shape(widths: list[int], head_dim: int, max_iters: int) -> None:
    if len(widths) < 2:
        raise UsageError(f"--widths {widths} needs at least two widths to compare.")
    bad = [w for w in widths if w % head_dim]
    if bad or head_dim < 1:
        raise UsageError(f"--widths {bad} are not multiples of --head_dim {head_dim}; choose widths that are.")
    if max_iters < 10:
        raise UsageError(f"--max_iters {max_iters} is too short for a warm-up of a tenth; use 10 or more.")


def study(args: argparse.Namespace, overrides: list[str]) -> int:
    started = time.perf_counter()
    check_overrides(overrides, RESERVED)
    methods = parse_methods(args.methods)
    widths = parse_numbers(args.widths, int, "widths")
    lrs = parse_numbers(args.lrs, float, "lrs")
    check_shape(widths, args.head_dim, args.max_iters)
    base = widths[0]
    out_dir, data_dir = Path(args.out_dir), Path(args.data_dir)
    meta = ensure_data(data_dir, args.input)
    points = study_points(methods, widths, lrs)
    jobs = []
    for point in points:
        run_dir = out_dir / point.dirname()
        argv = point_args(point, base, args.n_layer, args.head_dim, args.max_iters, overrides)
        extra = [f"--data_dir={data_dir}", f"--out_dir={run_dir}", "--config_name=mup_transfer"]
        jobs.append(make_job(point.label, argv + extra, run_dir))
    print(
        f"μP transfer on shakespeare_char ({meta['train_tokens']:,} train characters): {len(methods)} methods, widths "
        f"{widths} (base {base}), {len(lrs)} LRs, {args.n_layer} layers, = {len(jobs)} runs of {args.max_iters} iterations, "
        f"{args.jobs} at a time, {args.threads} thread(s) each.",
        flush=True,
    )

    results = dict(zip(points, run_jobs(jobs, args.jobs, args.threads)))

    unigram = unigram_loss(data_dir)
    all_points = [Point(m, w, p, lr) for m in methods for w in widths for p in PARAMETRISATIONS for lr in lrs]
    rows = [{"method": p.method, "width": p.width, "param": p.param, "lr": p.lr, **outcome(results[run_of(p, base)], unigram)} for p in all_points]
    title = f"Shakespeare-char, {args.n_layer} layers, {args.max_iters} iterations: final val loss (μP base width {base})"
    figures = plot_transfer(rows, title, out_dir / "mup_transfer")
    moves = optimum_moves(rows, lrs)
    table = transfer_table(rows, lrs)
    found = moves_text(moves)
    wall = time.perf_counter() - started
    note = f"At width {base} μP is the standard parametrisation, so its rows are the same runs."
    (out_dir / "transfer.md").write_text(f"{title}\n\n{table}\n\n{note}\n\n" + "\n".join(found) + "\n", encoding="utf-8")
    summary = {"widths": widths, "lrs": lrs, "base_width": base, "max_iters": args.max_iters, "n_layer": args.n_layer,
               "unigram_loss": unigram, "wall_clock_s": round(wall, 1), "moves": moves, "runs": rows}
    (out_dir / "transfer.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"\n{title}\n\n{table}\n\n{note}\n")
    print("\n".join(found))
    trained = [r for p, r in zip(all_points, rows) if run_of(p, base) == p]  # each run once
    print("\n" + wall_clock_line(wall, trained))
    print("Written: " + ", ".join(str(p) for p in [out_dir / "transfer.md", out_dir / "transfer.json", *figures]))
    return exit_status(rows)


def main(argv: list[str] | None = None) -> int:
    return study_main(parse_args, study, argv)
