"""Stability sweep: final val loss against peak learning rate, at a short and a long warm-up.

    python scripts/lr_sweep.py                                   # the defaults below
    python scripts/lr_sweep.py --methods pre_ln,proj_spheret --lrs 3e-4,1e-3,3e-3 --warmups 100,1000 --max_iters 2000

For each method, peak LR and warm-up, one run of the CPU model (24 layers x 128 wide, Tiny
Shakespeare characters, block 64, batch 16, cosine decay to lr/10 at --max_iters), then a plot
like Keel's Figure 1a: final val loss against the LR (log scale), one line per method, one
panel per warm-up. Marked on it: runs that ended with a loss but did not learn (stuck at
unigram: no better than the unigram loss, the dotted line; stalled: no better than the bigram
loss; or stopped by the collapse alarm): a hollow red ring at their loss; and diverged runs (the
loss became non-finite and train.py stopped): a red cross at the panel's top. Any other
--key=value is passed to every train.py run (e.g. --n_layer=12 --block_size=128).

Writes OUT_DIR/sweep.json (every run's result), OUT_DIR/sweep.md (the table) and
OUT_DIR/lr_sweep.{png,pdf}. Runs go to OUT_DIR/<study>/<method>/lr<LR>_wu<WARMUP>/ and a
finished run with the same settings is reused, so the sweep can be extended point by point.
The defaults (4 methods x 2 LRs x 2 warm-ups x 200 iterations = 16 runs) took 25 minutes on 2
shared cores; a run costs max_iters / 2 to max_iters seconds on one core.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from spheretnorm.experiments.figures import method_style, plt, save_figure
from spheretnorm.experiments.grid import check_overrides, parse_numbers
from spheretnorm.runtime.methods import display_name, method_dirname, parse_methods, sort_methods
from spheretnorm.experiments.study import (
    CPU_MODEL, RESERVED as STUDY_RESERVED, UNSTABLE, Axis, Column, Done, Report, Sweep, add_length_options, add_methods_option,
    add_place_options, add_rate_grid_options, as_args, parse_train_args, pivot_table, study_name, sweep_main,
)
from spheretnorm.runtime.cli import UsageError

DEFAULT_METHODS = "pre_ln,proj_spheret,p_spheret:0.5,geonorm"
DEFAULT_LRS = "1e-3,3e-3"
DEFAULT_WARMUPS = "10,100"
DEFAULT_MAX_ITERS = 200
EVALS_PER_RUN = 4
RESERVED = {
    **STUDY_RESERVED,
    "learning_rate": "--lrs",
    "min_lr": "--lrs (min_lr is lr / 10)",
    "warmup_iters": "--warmups",
    "max_iters": "--max_iters",
    "lr_decay_iters": "--max_iters (the cosine ends at max_iters)",
}


def stability_sweep(methods: list[str], lrs: list[float], warmups: list[int], max_iters: int, overrides: list[str]) -> Sweep:
    """Warm-up by warm-up, then rate by rate; the runs and their config_name are named by the
    model's shape (shakespeare_char_24x128), the user's overrides included."""
    base = {**CPU_MODEL, "max_iters": max_iters, "lr_decay_iters": max_iters, "eval_interval": max(1, max_iters // EVALS_PER_RUN)}
    name = study_name(parse_train_args(as_args(base) + overrides))
    return Sweep(
        name=name,
        base=base,
        axes=(Axis("warmup", tuple(warmups)), Axis("lr", tuple(lrs)), Axis("method", tuple(methods))),
        folder=lambda p: f"{name}/{method_dirname(p['method'])}/lr{p['lr']:g}_wu{p['warmup']}",
        settings=lambda p: {"learning_rate": p["lr"], "min_lr": p["lr"] / 10, "warmup_iters": p["warmup"]},
    )


def cell_text(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    if row["status"] == "diverged":
        return "diverged"
    if row["val_loss"] is None:
        return row["status"]
    text = f"{row['val_loss']:.3f}"
    return text if row["status"] == "ok" else f"{text} ({row['status']})"


def sweep_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one row per method, one column per (warm-up, LR)."""
    order = sort_methods(r["method"] for r in rows)
    method = Column("Method", lambda r: display_name(r["method"]), align=":--")
    return pivot_table(sorted(rows, key=lambda r: order.index(r["method"])), [method], lambda r: (r["warmup"], r["lr"]),
                       sorted({(r["warmup"], r["lr"]) for r in rows}), lambda c: f"wu {c[0]}, lr {c[1]:g}", cell_text)


def plot_sweep(rows: list[dict[str, Any]], unigram: float, title: str, out: Path) -> list[Path]:
    """Val loss vs LR, one panel per warm-up; the runs that did not learn (UNSTABLE) marked in red:
    a ring at the loss of one that has one, a cross at the top for a diverged one."""
    warmups = sorted({r["warmup"] for r in rows})
    fig, axes = plt.subplots(1, len(warmups), figsize=(5.2 * len(warmups), 4.2), sharey=True, squeeze=False)
    finite = [r["val_loss"] for r in rows if r["val_loss"] is not None]
    top = max(finite + [unigram]) + 0.15
    for ax, warmup in zip(axes[0], warmups):
        for method in sort_methods(r["method"] for r in rows):
            points = sorted((r for r in rows if r["method"] == method and r["warmup"] == warmup), key=lambda r: r["lr"])
            style = method_style(method)
            xs = [r["lr"] for r in points if r["val_loss"] is not None]
            ys = [r["val_loss"] for r in points if r["val_loss"] is not None]
            ax.plot(xs, ys, marker="o", markersize=4, label=display_name(method), **style)
            for r in points:
                if r["status"] in UNSTABLE and r["val_loss"] is not None:
                    ax.plot(r["lr"], r["val_loss"], marker="o", markersize=13, markerfacecolor="none", markeredgecolor="red", linestyle="none")
                elif r["status"] == "diverged":
                    ax.plot(r["lr"], top, marker="x", markersize=10, color="red", linestyle="none")
                    ax.annotate(display_name(method).split(" ")[0], (r["lr"], top), textcoords="offset points", xytext=(4, -10), fontsize=7, color=style["color"])
        ax.axhline(unigram, color="grey", linestyle=":", linewidth=1)
        ax.annotate("unigram loss (collapse)", (0.02, unigram), xycoords=("axes fraction", "data"), xytext=(0, 3), textcoords="offset points", fontsize=7, color="grey")
        ax.set_xscale("log")
        ax.set_title(f"warm-up {warmup} iterations")
        ax.set_xlabel("peak learning rate")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("final val loss (red ring: did not learn, red x: diverged)")
    axes[0][0].set_ylim(top=top + 0.1)
    # One legend under the panels, where it hides no point.
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return save_figure(fig, out)


def findings(rows: list[dict[str, Any]]) -> list[str]:
    """One sentence per method: where it got stuck at unigram, collapsed or diverged, and its best point."""
    lines = []
    for m in sort_methods(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == m]
        bad = [f"{r['status']} at lr {r['lr']:g} / warm-up {r['warmup']}" for r in mine if r["status"] != "ok"]
        ok = [r for r in mine if r["status"] == "ok"]
        best = min(ok, key=lambda r: r["val_loss"]) if ok else None
        best_text = f"best {best['val_loss']:.3f} at lr {best['lr']:g} / warm-up {best['warmup']}" if best else "no run trained"
        lines.append(f"- {display_name(m)}: {best_text}; " + ("; ".join(bad) if bad else "no collapse or divergence") + ".")
    return lines


def options(p: argparse.ArgumentParser) -> None:
    add_methods_option(p, DEFAULT_METHODS)
    add_rate_grid_options(p, DEFAULT_LRS)
    p.add_argument("--warmups", default=DEFAULT_WARMUPS, help=f"warm-up lengths in iterations (default: {DEFAULT_WARMUPS})")
    add_length_options(p, DEFAULT_MAX_ITERS)
    add_place_options(p, "out/lr_sweep", table_only=False)


def design(args: argparse.Namespace, overrides: list[str]) -> Sweep:
    check_overrides(overrides, RESERVED)
    methods = parse_methods(args.methods)
    lrs = parse_numbers(args.lrs, float, "lrs")
    warmups = parse_numbers(args.warmups, int, "warmups")
    if args.max_iters <= max(warmups):
        raise UsageError(f"--max_iters {args.max_iters} must exceed the longest warm-up ({max(warmups)}); raise it or shorten --warmups.")
    return stability_sweep(methods, lrs, warmups, args.max_iters, overrides)


def title(done: Done) -> str:
    return f"{done.sweep.name}: final val loss after {done.args.max_iters} iterations"


def report(done: Done) -> Report:
    text = f"{title(done)}\n\n{sweep_table(done.rows)}\n\n{done.yardsticks.rules_text()}.\n\n" + "\n".join(findings(done.rows))
    record = {"study": done.sweep.name, "max_iters": done.args.max_iters, **done.yardsticks.record(),
              "train_seconds": round(sum(r["seconds"] or 0 for r in done.rows), 1), "runs": done.rows}
    return "sweep", text, record


def main(argv: list[str] | None = None) -> int:
    return sweep_main(design, argv, __doc__, options=options, report=report,
                      figures=lambda done: plot_sweep(done.rows, done.yardsticks.unigram, title(done), done.place.out_dir / "lr_sweep"))
