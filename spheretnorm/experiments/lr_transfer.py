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

import argparse
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from spheretnorm.experiments.figures import save_figure
from spheretnorm.experiments.grid import check_overrides, parse_numbers
from spheretnorm.runtime.methods import parse_methods
from spheretnorm.experiments.study import (
    CPU_MODEL, RESERVED as STUDY_RESERVED, Axis, Column, Point, Sweep, add_common_options, pivot_table, publish, start_study,
    study_main, study_parser,
)
from spheretnorm.runtime.cli import UsageError
from spheretnorm.runtime.methods import method_dirname
from spheretnorm.runtime.methods import display_name

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


def transfer_sweep(methods: list[str], widths: list[int], lrs: list[float], n_layer: int, head_dim: int, max_iters: int) -> Sweep:
    """Method by method, so that a study cut short has complete methods rather than half of each.
    At the base width (the smallest) μP is the standard parametrisation exactly
    (tests/test_mup.py), so its μP points share the standard run's folder: one run serves both."""
    base = min(widths)

    def param_of(p: Point) -> str:
        return "standard" if p["width"] == base else p["param"]

    def settings(p: Point) -> dict[str, Any]:
        return {"n_embd": p["width"], "n_head": p["width"] // head_dim, "mup_base_width": base if param_of(p) == "mup" else 0,
                "learning_rate": p["lr"], "min_lr": p["lr"] / 10}

    return Sweep(
        name="mup_transfer",
        base={**CPU_MODEL, "n_layer": n_layer, "warmup_iters": max(1, max_iters // 10), "max_iters": max_iters, "lr_decay_iters": max_iters,
              "eval_interval": max_iters, "eval_iters": 20},  # evaluate at the start and the end only
        axes=(Axis("method", tuple(methods)), Axis("width", tuple(widths)), Axis("param", PARAMETRISATIONS), Axis("lr", tuple(lrs))),
        folder=lambda p: f"{method_dirname(p['method'])}/w{p['width']}_{param_of(p)}/lr{p['lr']:g}",
        settings=settings,
    )


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

    def cell(r: dict[str, Any] | None) -> str:
        if r is None:
            return "-"
        text = f"{r['val_loss']:.3f}" if r["val_loss"] is not None else r["status"]
        if r["status"] not in ("ok", "diverged") and r["val_loss"] is not None:
            text += f" ({r['status']})"
        return f"**{text}**" if best.get((r["method"], r["param"], r["width"])) == r["lr"] else text

    heads = [Column("method", lambda r: display_name(r["method"]), align=":--"), Column("param", "param", align=":--"), Column("width", "width")]
    ordered = sorted(rows, key=lambda r: (r["method"], r["param"], r["width"]))
    return pivot_table(ordered, heads, lambda r: r["lr"], lrs, lambda lr: f"lr {lr:g}", cell)


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
    p = study_parser(__doc__)
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
    widths = parse_numbers(args.widths, int, "widths")
    lrs = parse_numbers(args.lrs, float, "lrs")
    check_shape(widths, args.head_dim, args.max_iters)
    spec = transfer_sweep(parse_methods(args.methods), widths, lrs, args.n_layer, args.head_dim, args.max_iters)
    rows, place, unigram = start_study(spec, args, overrides)
    base = widths[0]
    title = f"Shakespeare-char, {args.n_layer} layers, {args.max_iters} iterations: final val loss (μP base width {base})"
    figures = plot_transfer(rows, title, place.out_dir / "mup_transfer")
    moves = optimum_moves(rows, lrs)
    note = f"At width {base} μP is the standard parametrisation, so its rows are the same runs."
    text = f"{title}\n\n{transfer_table(rows, lrs)}\n\n{note}\n\n" + "\n".join(moves_text(moves))
    record = {"widths": widths, "lrs": lrs, "base_width": base, "max_iters": args.max_iters, "n_layer": args.n_layer,
              "unigram_loss": unigram, "moves": moves, "runs": rows}
    return publish(place.out_dir, "transfer", text, record, figures, rows, started)


def main(argv: list[str] | None = None) -> int:
    return study_main(parse_args, study, argv)
