"""μP learning-rate transfer: final val loss against LR at two widths, standard vs μP.

    python scripts/mup_transfer.py                                    # the study in docs/LOG.md
    python scripts/mup_transfer.py --widths 64,256 --lrs 1e-3,4e-3,1.6e-2 --max_iters 100
    python scripts/mup_transfer.py --methods p_spheret:0.5 --optimizers adamw,muon,muonh --widths 64,128,256 \
        --out_dir out/mup_transfer_optimizers             # every optimizer with its own μP rule

For each method, width, parametrisation and peak LR, one run of a shallow CPU model (--n_layer
layers, heads of --head_dim so wider models have more heads, Tiny Shakespeare characters, block
64, batch 16, warm-up of a tenth of the run, cosine decay to lr/10). Depth stays fixed; only the
width changes. μP runs use mup_base_width = the smallest width. At that width μP is the standard
parametrisation exactly (tests/test_mup.py), so one run there serves both. Any other --key=value
is passed to every train.py run.

--optimizers sweeps each optimizer's own rate of the hidden matrices (its rate key: AdamW's
learning_rate, Muon's muon_lr, AdamH's and MuonH's hyperball_lr): --lrs for AdamW, and for another
optimizer --grid OPT=r1,r2,... or, without one, its key's default times 1/4, 1/2, 1, 2 and 4. Their
AdamW part (embeddings, gains) runs at --base_lr, which the schedule's shape follows.

Writes OUT_DIR/transfer.json (every run), OUT_DIR/transfer.md (the table and the optimum's
move in grid steps) and OUT_DIR/mup_transfer.{png,pdf}: one panel per method, optimizer and
parametrisation, one line per width. Runs go to OUT_DIR/<method>/w<WIDTH>_<param>/lr<LR>/
(OUT_DIR/<method>/<optimizer>/... for an optimizer other than AdamW) and a finished run with the
same settings is reused.
"""

from __future__ import annotations

import argparse
from typing import Any

from spheretnorm.experiments.figures import draw_rate_curve, figure_legend, loss_range, plt, rate_axis, rate_curve, save_figure, titled_grid, trained
from spheretnorm.optim import OPTIMIZERS
from spheretnorm.experiments.grid import check_overrides, parse_choices, parse_numbers
from spheretnorm.runtime.methods import display_name, method_dirname, parse_methods
from spheretnorm.experiments.study import (
    CPU_MODEL, RESERVED as STUDY_RESERVED, Axis, Column, Done, Point, Report, Sweep, add_length_options, add_methods_option,
    add_place_options, add_rate_grid_options, pivot_table, rate_grids, sweep_main,
)
from spheretnorm.runtime.cli import UsageError

DEFAULT_METHODS = "p_spheret:0.5,pre_ln"
DEFAULT_WIDTHS = "64,256"
DEFAULT_LRS = "1e-3,2e-3,4e-3,8e-3,1.6e-2"
DEFAULT_MAX_ITERS = 250
DEFAULT_BASE_LR = 4e-3
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


def transfer_sweep(methods: list[str], widths: list[int], grids: dict[str, tuple[float, ...]], n_layer: int, head_dim: int,
                   max_iters: int, base_lr: float = DEFAULT_BASE_LR) -> Sweep:
    """Method by method, then optimizer by optimizer, so that a study cut short has complete
    methods rather than half of each. grids: each optimizer's rates (its rate key's values). At the
    base width (the smallest) μP is the standard parametrisation exactly (tests/test_mup.py), so
    its μP points share the standard run's folder: one run serves both."""
    base = min(widths)
    optimizers = tuple(grids)
    rates = tuple(sorted({r for grid in grids.values() for r in grid}))

    def param_of(p: Point) -> str:
        return "standard" if p["width"] == base else p["param"]

    def settings(p: Point) -> dict[str, Any]:
        shape = {"n_embd": p["width"], "n_head": p["width"] // head_dim, "mup_base_width": base if param_of(p) == "mup" else 0}
        key = OPTIMIZERS[p["optimizer"]].rate_key
        if key == "learning_rate":
            return {**shape, "learning_rate": p["lr"], "min_lr": p["lr"] / 10}
        return {**shape, key: p["lr"], "learning_rate": base_lr, "min_lr": base_lr / 10}

    def folder(p: Point) -> str:
        optimizer = "" if p["optimizer"] == "adamw" else f"/{p['optimizer']}"  # AdamW's folders are those of the first study
        return f"{method_dirname(p['method'])}{optimizer}/w{p['width']}_{param_of(p)}/lr{p['lr']:g}"

    return Sweep(
        name="mup_transfer",
        base={**CPU_MODEL, "n_layer": n_layer, "warmup_iters": max(1, max_iters // 10), "max_iters": max_iters, "lr_decay_iters": max_iters,
              "eval_interval": max_iters, "eval_iters": 20},  # evaluate at the start and the end only
        axes=(Axis("method", tuple(methods)), Axis("optimizer", optimizers), Axis("width", tuple(widths)), Axis("param", PARAMETRISATIONS),
              Axis("lr", rates)),
        folder=folder,
        settings=settings,
        keep=lambda p: p["lr"] in grids[p["optimizer"]],
    )


# -----------------------------------------------------------------------------
# Results


def arm(r: dict[str, Any]) -> tuple[str, str]:
    """(method, optimizer) of a row: what one rate sweep is of (rows before --optimizers: AdamW)."""
    return r["method"], r.get("optimizer", "adamw")


def arm_name(a: tuple[str, str]) -> str:
    return f"{display_name(a[0])}, {OPTIMIZERS[a[1]].title if a[1] in OPTIMIZERS else a[1]}"


def best_lrs(rows: list[dict[str, Any]]) -> dict[tuple[tuple[str, str], str, int], float | None]:
    """{(arm, param, width): the rate of the lowest final val loss among runs that trained}."""
    best: dict[tuple[tuple[str, str], str, int], float | None] = {}
    for key in {(arm(r), r["param"], r["width"]) for r in rows}:
        ok = [r for r in rows if (arm(r), r["param"], r["width"]) == key and r["status"] == "ok"]
        best[key] = min(ok, key=lambda r: r["val_loss"])["lr"] if ok else None
    return best


def optimum_moves(rows: list[dict[str, Any]], grids: dict[str, tuple[float, ...]]) -> list[dict[str, Any]]:
    """Per arm and parametrisation: the best rate at each width and its move in grid steps from
    the smallest width to each wider one.

    A move of 0 means the optimum transferred to the grid's resolution; the sign says whether
    the wider model wants a larger (+) or smaller (-) rate.
    """
    best = best_lrs(rows)
    widths = sorted({r["width"] for r in rows})
    moves = []
    for a in dict.fromkeys(arm(r) for r in rows):
        grid = sorted(grids.get(a[1], ()))
        for param in PARAMETRISATIONS:
            at = {w: best.get((a, param, w)) for w in widths}
            first = at[widths[0]]
            steps = {str(w): (grid.index(at[w]) - grid.index(first) if first in grid and at[w] in grid else None) for w in widths[1:]}
            moves.append({"method": a[0], "optimizer": a[1], "param": param, "best_lr": {str(w): at[w] for w in widths},
                          "grid_steps": steps[str(widths[-1])], "grid_steps_by_width": steps})
    return moves


def transfer_table(rows: list[dict[str, Any]], lrs: list[float]) -> str:
    """Markdown: one row per (arm, parametrisation, width), one column per rate; best in bold."""
    best = best_lrs(rows)

    def cell(r: dict[str, Any] | None) -> str:
        if r is None:
            return "-"
        text = f"{r['val_loss']:.3f}" if r["val_loss"] is not None else r["status"]
        if r["status"] not in ("ok", "diverged") and r["val_loss"] is not None:
            text += f" ({r['status']})"
        return f"**{text}**" if best.get((arm(r), r["param"], r["width"])) == r["lr"] else text

    heads = [Column("method", lambda r: arm_name(arm(r)), align=":--"), Column("param", "param", align=":--"), Column("width", "width")]
    ordered = sorted(rows, key=lambda r: (arm(r), r["param"], r["width"]))
    return pivot_table(ordered, heads, lambda r: r["lr"], lrs, lambda lr: f"{lr:g}", cell)


def moves_text(moves: list[dict[str, Any]]) -> list[str]:
    lines = []
    for m in moves:
        best = ", ".join(f"width {w}: {lr:g}" if lr is not None else f"width {w}: none trained" for w, lr in m["best_lr"].items())
        by_width = m.get("grid_steps_by_width") or {}
        move = ", ".join(f"{s:+d} at width {w}" if s is not None else f"unknown at width {w}" for w, s in by_width.items()) or "unknown"
        lines.append(f"- {arm_name((m['method'], m.get('optimizer', 'adamw')))}, {m['param']}: best rate {best}; the optimum moves {move} (grid steps).")
    return lines


TRANSFER_PANEL_INCHES = (4.8, 3.4)


def transfer_axes(rows: list[dict[str, Any]], title: str) -> plt.Figure:
    """Final val loss vs rate: a panel per (arm, parametrisation), all on one y-range; a line per
    width (draw_rate_curve: a run that collapsed or diverged breaks it, an x of the width's colour
    at the top), its optimum ringed."""
    arms = list(dict.fromkeys(arm(r) for r in rows))
    widths = sorted({r["width"] for r in rows})
    fig, axes = titled_grid(len(arms), len(PARAMETRISATIONS), TRANSFER_PANEL_INCHES, title)
    shown = loss_range([r["val_loss"] for r in rows if trained(r)])
    cmap = plt.get_cmap("viridis")
    for i, a in enumerate(arms):
        for j, param in enumerate(PARAMETRISATIONS):
            ax = axes[i][j]
            mine = [r for r in rows if (arm(r), r["param"]) == (a, param)]
            for k, width in enumerate(widths):
                runs = [r for r in mine if r["width"] == width]
                if runs:
                    color = cmap(k / max(1, len(widths) - 1) * 0.85)
                    draw_rate_curve(ax, rate_curve(runs, f"width {width}", color), shown)
                    ring_best(ax, runs, color)
            rate_axis(ax, [r["lr"] for r in mine], f"peak {OPTIMIZERS[a[1]].rate_key if a[1] in OPTIMIZERS else 'rate'}")
            ax.set_title(f"{arm_name(a)}, {'μP' if param == 'mup' else 'standard'}", fontsize=10)
            ax.grid(alpha=0.3)
        axes[i][0].set_ylabel("final val loss (ring: best rate)")
    shown.apply(axes[0][0])  # shared by every panel
    figure_legend(fig, axes)
    return fig


def ring_best(ax: Any, runs: list[dict[str, Any]], color: Any) -> None:
    """A ring around the lowest loss of the runs that trained (best_lrs' optimum of one width)."""
    ok = [r for r in runs if trained(r)]
    if ok:
        best = min(ok, key=lambda r: r["val_loss"])
        ax.plot(best["lr"], best["val_loss"], marker="o", markersize=12, markerfacecolor="none", markeredgecolor=color, label="_nolegend_")


# -----------------------------------------------------------------------------
# Command line


def options(p: argparse.ArgumentParser) -> None:
    add_methods_option(p, DEFAULT_METHODS)
    p.add_argument("--widths", default=DEFAULT_WIDTHS, help=f"widths n_embd; the smallest is μP's base (default: {DEFAULT_WIDTHS})")
    add_rate_grid_options(p, DEFAULT_LRS, DEFAULT_BASE_LR, lrs_role=", a log grid")
    add_length_options(p, DEFAULT_MAX_ITERS)
    p.add_argument("--n_layer", type=int, default=3, help="depth of every model (default 3)")
    p.add_argument("--head_dim", type=int, default=32, help="width of one attention head (default 32)")
    add_place_options(p, "out/mup_transfer", table_only=False)


def grids_of(args: argparse.Namespace) -> dict[str, tuple[float, ...]]:
    """Each optimizer's rates, as --optimizers, --lrs and --grid give them (rate_grids)."""
    return rate_grids(parse_choices(args.optimizers, OPTIMIZERS, "optimizers"), parse_numbers(args.lrs, float, "lrs"), args.grid)


def design(args: argparse.Namespace, overrides: list[str]) -> Sweep:
    check_overrides(overrides, RESERVED)
    widths = parse_numbers(args.widths, int, "widths")
    grids = grids_of(args)
    if len(widths) < 2:
        raise UsageError(f"--widths {widths} needs at least two widths to compare.")
    bad = [w for w in widths if w % args.head_dim]
    if bad or args.head_dim < 1:
        raise UsageError(f"--widths {bad} are not multiples of --head_dim {args.head_dim}; choose widths that are.")
    if args.max_iters < 10:
        raise UsageError(f"--max_iters {args.max_iters} is too short for a warm-up of a tenth; use 10 or more.")
    return transfer_sweep(parse_methods(args.methods), widths, grids, args.n_layer, args.head_dim, args.max_iters, args.base_lr)


def title(done: Done) -> str:
    base = done.sweep.values("width")[0]  # the first of --widths, as given
    return f"Shakespeare-char, {done.args.n_layer} layers, {done.args.max_iters} iterations: final val loss (μP base width {base})"


def report(done: Done) -> Report:
    args, rows, grids = done.args, done.rows, grids_of(done.args)
    widths = list(done.sweep.values("width"))
    moves = optimum_moves(rows, grids)
    tables = [f"{OPTIMIZERS[o].title} ({OPTIMIZERS[o].rate_key}"
              + ("" if OPTIMIZERS[o].rate_key == "learning_rate" else f"; AdamW's part at learning_rate {args.base_lr:g}") + "):\n\n"
              + transfer_table([r for r in rows if arm(r)[1] == o], sorted(grids[o])) for o in grids]
    note = f"At width {widths[0]} μP is the standard parametrisation, so its rows are the same runs."
    text = f"{title(done)}\n\n" + "\n\n".join(tables) + f"\n\n{note}\n\n" + "\n".join(moves_text(moves))
    record = {"widths": widths, "grids": grids, "lrs": grids.get("adamw"), "base_width": widths[0], "max_iters": args.max_iters,
              "n_layer": args.n_layer, "base_lr": args.base_lr, **done.yardsticks.record(), "moves": moves, "runs": rows}
    return "transfer", text, record


def main(argv: list[str] | None = None) -> int:
    return sweep_main(design, argv, __doc__, options=options, report=report,
                      figures=lambda done: save_figure(transfer_axes(done.rows, title(done)), done.place.out_dir / "mup_transfer"))
