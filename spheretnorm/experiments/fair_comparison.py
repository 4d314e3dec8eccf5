"""Each method at its own best learning rate, in both blocks: the fair version of the block study.

    python scripts/fair_sweep.py                 # plan, run (or resume) and tabulate the whole design
    python scripts/fair_sweep.py --table_only    # the table and plot of the runs already there
    python scripts/fair_sweep.py --dry_run       # print the runs the plan holds now, their number and time; write nothing

The design, per block (GPT-2's and LLaMA's): Pre-LN, 0.5-SpheretNorm, GeoNorm and nGPT, then
0.5-SpheretNorm with alpha_cap=none, with alpha_decay=none, with sphere_input_gain=true and with
alpha_cap_grad=straight_through (the paper's fixed choices opened up, docs/CONNECTIONS.md). Every arm first runs each learning rate of
--lrs with the first seed. Where its best rate lies at an end of the grid, the grid grows by one
step beyond that end (once), so that the best is bracketed. Then the best rate and its two
neighbours run with every other seed. The plan is a function of the finished runs alone: a
re-run skips what is done, resumes what was cut short and adds what the finished runs call for.
SIGINT or SIGTERM to the sweep (kill -INT, Ctrl-C) is passed on to its running train.py jobs,
which save a checkpoint and exit; no new run starts, and the same command resumes. A run folder
that another sweep trains now is left to it (a lock in the folder), and --dry_run says it is in
progress. --dry_run writes nothing (it prepares no data) and ends with the number of runs and
an estimate of their time.

Recipes: the depth study's for every arm but nGPT (warm-up, cosine to lr / 10, weight decay 0.1,
AdamW betas 0.9 and 0.99); nGPT's own (no warm-up, no weight decay, cosine to 0, betas 0.9 and
0.95, as NVIDIA/ngpt). Model: --n_layer x --n_embd (4 heads), Tiny Shakespeare characters, block
64, batch 16, fp32, one thread per run; the MLP keeps each block's own width for every arm.

Runs go to OUT_DIR/<block>/<arm>/lr<LR>_s<SEED>/. Writes OUT_DIR/fair_sweep.md (each arm at its
best rate: mean and range over seeds, the gap to the same block's Pre-LN paired by seed, the
pinned fractions of the sphere's step size and radius; then every run), OUT_DIR/fair_sweep.json
and OUT_DIR/fair_sweep.{png,pdf}: final val loss against learning rate, one panel per block, one
line per arm through the seeds' mean, each seed a point.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from spheretnorm.experiments.figures import save_figure
from spheretnorm.experiments.grid import BLOCK_TITLES, check_overrides
from spheretnorm.experiments.study import (
    CPU_MODEL, RESERVED, UNSTABLE, Axis, Column, Place, Point, Sweep, add_common_options, best_rate_follow_up, final_loss,
    dry_run_summary, markdown_table, method_settings, parse_number_list, parse_train_args, plan_points, publish, start_study, study_main,
    study_parser, train_argv,
)
from spheretnorm.model import OPENED_DEFAULTS
from spheretnorm.runtime.cli import UsageError

BASELINE = "pre_ln"
SHAPE: dict[str, Any] = {**CPU_MODEL, "n_layer": 12, "n_embd": 64, "n_head": 4, "batch_size": 16, "global_batch_size": 16}
PAPER_RECIPE: dict[str, Any] = {"beta1": 0.9, "beta2": 0.99, "weight_decay": 0.1, "dropout": 0.0}
NGPT_RECIPE: dict[str, Any] = {"beta1": 0.9, "beta2": 0.95, "weight_decay": 0.0, "dropout": 0.0, "warmup_iters": 0}
DEFAULT_LRS = "1e-3,2e-3,4e-3,8e-3"
DEFAULT_SEEDS = "1337,1338"
DEFAULT_MAX_ITERS = 600
DEFAULT_WARMUP = 100
EXTENSIONS = 1  # grid steps an arm may add beyond an end of --lrs
# Seconds an iteration of SHAPE takes on one thread, evaluations and start-up included: the
# default design's 104 runs of 600 iterations took 75 minutes two at a time on 2 cores (docs/LOG.md).
# The dry run's estimate until finished runs give their own times.
SECONDS_PER_ITER = 0.145


@dataclass(frozen=True)
class Arm:
    """One line of the plot: a method key, the model keys it changes, and its recipe."""

    slug: str  # its folder name
    title: str
    method: str
    keys: tuple[tuple[str, Any], ...] = ()
    ngpt_recipe: bool = False

    def settings(self, lr: float, warmup: int, max_iters: int) -> dict[str, Any]:
        recipe = NGPT_RECIPE if self.ngpt_recipe else {**PAPER_RECIPE, "warmup_iters": warmup}
        min_lr = 0.0 if self.ngpt_recipe else lr / 10
        return {**recipe, "learning_rate": lr, "min_lr": min_lr, "max_iters": max_iters, "lr_decay_iters": max_iters, **dict(self.keys)}


ARMS: tuple[Arm, ...] = (
    Arm("pre_ln", "Pre-LN", "pre_ln"),
    Arm("p_spheret-0.5", "0.5-SpheretNorm", "p_spheret:0.5"),
    Arm("geonorm", "GeoNorm", "geonorm"),
    Arm("ngpt", "nGPT (its recipe)", "ngpt", ngpt_recipe=True),
    Arm("p_spheret-0.5+alpha_cap=none", "0.5-SpheretNorm, alpha_cap=none", "p_spheret:0.5", (("alpha_cap", "none"),)),
    Arm("p_spheret-0.5+alpha_decay=none", "0.5-SpheretNorm, alpha_decay=none", "p_spheret:0.5", (("alpha_decay", "none"),)),
    Arm("p_spheret-0.5+sphere_input_gain", "0.5-SpheretNorm, input gain", "p_spheret:0.5", (("sphere_input_gain", "true"),)),
    Arm("p_spheret-0.5+alpha_cap_grad=straight_through", "0.5-SpheretNorm, straight-through cap", "p_spheret:0.5",
        (("alpha_cap_grad", "straight_through"),)),
)
ARM_BY_SLUG = {arm.slug: arm for arm in ARMS}


def design_size(design: Sweep) -> int:
    """The most runs the design can hold: per (block, arm), every rate of --lrs and the extension
    with the first seed, then the best rate and its two neighbours with every other seed
    (best_rate_follow_up)."""
    groups = len(design.values("block")) * len(design.values("arm"))
    return groups * (len(design.values("lr")) + EXTENSIONS + 3 * (len(design.values("seed")) - 1))


def design_sweep(lrs: list[float], seeds: list[int], blocks: list[str], arms: list[Arm] | tuple[Arm, ...], max_iters: int, warmup: int) -> Sweep:
    """Each (block, arm) at its own best rate: study.best_rate_follow_up plans the runs from the
    finished ones alone, so a re-run resumes the design."""

    def settings(p: Point) -> dict[str, Any]:
        arm = ARM_BY_SLUG[p["arm"]]
        return {**method_settings(arm.method), **arm.settings(p["lr"], warmup, max_iters)}

    return Sweep(
        name="fair_sweep",
        base={**SHAPE, "eval_interval": max(1, max_iters // 5)},
        axes=(Axis("block", tuple(blocks)), Axis("arm", tuple(a.slug for a in arms)), Axis("lr", tuple(lrs)), Axis("seed", tuple(seeds))),
        folder=lambda p: f"{p['block']}/{p['arm']}/lr{p['lr']:g}_s{p['seed']}",
        settings=settings,
        label=lambda p: f"{ARM_BY_SLUG[p['arm']].title} ({BLOCK_TITLES[p['block']]}), lr {p['lr']:g}",
        follow_up=best_rate_follow_up(EXTENSIONS),
        diagnostics=True,
    )


# -----------------------------------------------------------------------------
# The table and the plot


def seed_losses(rows: list[dict[str, Any]], block: str, arm: str) -> dict[float, dict[int, float]]:
    """{lr: {seed: val loss}} of an arm's runs that trained (diverged and collapsed ones left out)."""
    out: dict[float, dict[int, float]] = {}
    for r in rows:
        if (r["block"], r["arm"]) == (block, arm) and math.isfinite(final_loss(r)):
            out.setdefault(r["lr"], {})[r["seed"]] = r["val_loss"]
    return out


def best_rate(by_lr: dict[float, dict[int, float]]) -> float | None:
    """The rate with the lowest mean over the most seeds any rate has (so a one-seed rate never
    beats the two-seed ones by luck)."""
    if not by_lr:
        return None
    most = max(len(s) for s in by_lr.values())
    return min((lr for lr, s in by_lr.items() if len(s) == most), key=lambda lr: statistics.fmean(by_lr[lr].values()))


def best_rows(rows: list[dict[str, Any]], blocks: list[str], arms: list[Arm]) -> list[dict[str, Any]]:
    """One summary per (block, arm): its best rate, the seeds' mean and range there, the gap to
    Pre-LN of the same block at Pre-LN's best rate, paired by seed, and the pinned fractions."""
    out = []
    for block in blocks:
        base_by_lr = seed_losses(rows, block, BASELINE)
        base_lr = best_rate(base_by_lr)
        base = base_by_lr.get(base_lr, {}) if base_lr is not None else {}
        for arm in arms:
            by_lr = seed_losses(rows, block, arm.slug)
            lr = best_rate(by_lr)
            mine = by_lr.get(lr, {}) if lr is not None else {}
            gaps = [loss - base[s] for s, loss in mine.items() if s in base]
            at_best = [r for r in rows if (r["block"], r["arm"], r["lr"]) == (block, arm.slug, lr)]
            out.append({
                "block": block, "arm": arm.slug, "title": arm.title, "best_lr": lr, "seeds": len(mine),
                "mean": statistics.fmean(mine.values()) if mine else None,
                "low": min(mine.values(), default=None), "high": max(mine.values(), default=None),
                "gap_mean": statistics.fmean(gaps) if gaps else None,
                "gap_low": min(gaps, default=None), "gap_high": max(gaps, default=None),
                "step_pinned": mean_of(at_best, "step_pinned"), "radius": mean_of(at_best, "radius"),
                "radius_pinned": mean_of(at_best, "radius_pinned"),
                "unstable": sorted({r["lr"] for r in rows if (r["block"], r["arm"]) == (block, arm.slug) and r["status"] in UNSTABLE}),
            })
    return out


def mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(values) if values else None


def spread(low: str, high: str, fmt: str) -> Callable[[dict[str, Any]], str | None]:
    """A range cell 'low to high' of a summary row, '-' where it has none."""
    return lambda s: None if s[low] is None else f"{s[low]:{fmt}} to {s[high]:{fmt}}"


BEST_COLUMNS = (
    Column("block", lambda s: BLOCK_TITLES[s["block"]], align=":--"), Column("arm", "title", align=":--"), Column("best lr", "best_lr", "g"),
    Column("seeds", "seeds"), Column("val loss, mean", "mean", ".3f"), Column("range", spread("low", "high", ".3f")),
    Column("minus Pre-LN (same seed), mean", "gap_mean", "+.3f"), Column("range", spread("gap_low", "gap_high", "+.3f")),
    Column("alpha pinned", "step_pinned", ".2f"), Column("radius/sqrt(d)", "radius", ".3f"), Column("radius pinned", "radius_pinned", ".0f"),
    Column("diverged or collapsed at", lambda s: ", ".join(f"{lr:g}" for lr in s["unstable"]) or "-", align=":--"),
)


RUN_COLUMNS = (
    Column("block", lambda r: BLOCK_TITLES[r["block"]], align=":--"), Column("arm", lambda r: ARM_BY_SLUG[r["arm"]].title, align=":--"),
    Column("lr", "lr", "g"), Column("seed", "seed"), Column("val loss", "val_loss", ".3f"), Column("status", "status", align=":--"),
    Column("alpha pinned", "step_pinned", ".2f"), Column("radius pinned", "radius_pinned", ".0f"), Column("s", "seconds", ".0f"),
)


Y_SPAN = 0.6  # nats above a panel's lowest loss that it shows; a point beyond is a triangle at the top


def plot_design(rows: list[dict[str, Any]], blocks: list[str], unigram: float, title: str, out: Path) -> list[Path]:
    """Final val loss against the learning rate: one panel per block, a line per arm through the
    seeds' means, each seed a point; a diverged or collapsed run is a red x at the panel's top,
    a loss more than Y_SPAN above the panel's best a triangle there."""
    fig, axes = plt.subplots(1, len(blocks), figsize=(6.2 * len(blocks), 4.6), squeeze=False)
    cmap = plt.get_cmap("tab10")
    for ax, block in zip(axes[0], blocks):
        mine = [r for r in rows if r["block"] == block]
        trained = [final_loss(r) for r in mine if math.isfinite(final_loss(r))] or [unigram]
        top = min(max(trained), min(trained) + Y_SPAN) + 0.02
        for i, arm in enumerate(ARMS):
            by_lr = seed_losses(rows, block, arm.slug)
            color = cmap(i)
            if by_lr:
                xs = sorted(by_lr)
                means = [min(statistics.fmean(by_lr[x].values()), top) for x in xs]
                ax.plot(xs, means, label=arm.title, linewidth=1.4, color=color, linestyle="--" if arm.method == BASELINE else "-")
                for x in xs:
                    for loss in by_lr[x].values():
                        ax.plot(x, min(loss, top), marker="o" if loss <= top else "^", markersize=3.5, linestyle="none", color=color)
            for r in mine:
                if r["arm"] == arm.slug and r["status"] in UNSTABLE:
                    ax.plot(r["lr"], top, marker="x", markersize=8, color="red", linestyle="none")
        rates = sorted({r["lr"] for r in mine})
        ax.set_xscale("log")
        ax.set_xticks(rates, [f"{lr:g}" for lr in rates], fontsize=7)
        ax.minorticks_off()
        ax.set_title(f"{BLOCK_TITLES[block]} block")
        ax.set_xlabel("peak learning rate")
        ax.set_ylim(min(trained) - 0.02, top + 0.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("final val loss (points: seeds; red x: diverged or collapsed)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return save_figure(fig, out)


# -----------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = study_parser(__doc__)
    p.add_argument("--lrs", default=DEFAULT_LRS, help=f"the first seed's learning rates (default {DEFAULT_LRS})")
    p.add_argument("--seeds", default=DEFAULT_SEEDS, help=f"the sweep's seed, then the seeds of the best rates (default {DEFAULT_SEEDS})")
    p.add_argument("--blocks", default="gpt2,llama", help="the blocks (default gpt2,llama)")
    p.add_argument("--arms", default="all", help=f"'all' or a comma-separated subset of: {', '.join(ARM_BY_SLUG)} (default all)")
    p.add_argument("--max_iters", type=int, default=DEFAULT_MAX_ITERS, help=f"iterations per run (default {DEFAULT_MAX_ITERS})")
    p.add_argument("--warmup_iters", type=int, default=DEFAULT_WARMUP, help=f"warm-up of every arm but nGPT (default {DEFAULT_WARMUP})")
    p.add_argument("--out_dir", default="out/fair_sweep", help="where the runs, table and plot go (default out/fair_sweep)")
    p.add_argument("--table_only", action="store_true", help="run nothing: tabulate the runs already in --out_dir")
    p.add_argument("--dry_run", action="store_true", help="print the runs the plan holds now; run nothing")
    add_common_options(p)
    return p.parse_known_args(argv)


def design_of(args: argparse.Namespace, overrides: list[str]) -> Sweep:
    # The model's shape may change (--n_layer=12 --n_embd=128); what the arms compare may not.
    fixed = {k: "nothing (fixed by this study)" for k in (*PAPER_RECIPE, *NGPT_RECIPE, *OPENED_DEFAULTS, "block", "learning_rate", "min_lr",
                                                          "lr_decay_iters", "alpha_decay")}
    check_overrides(overrides, {**RESERVED, **fixed, "seed": "--seeds", "max_iters": "--max_iters", "warmup_iters": "--warmup_iters"})
    lrs = sorted(set(parse_number_list(args.lrs, "lrs", float)))
    if len(lrs) < 2:
        raise UsageError(f"--lrs {args.lrs!r} needs at least two learning rates, to have a best with neighbours.")
    blocks = [b.strip() for b in args.blocks.split(",") if b.strip()]
    if not blocks or any(b not in BLOCK_TITLES for b in blocks):
        raise UsageError(f"--blocks {args.blocks!r} is not valid; choose from: {', '.join(BLOCK_TITLES)}.")
    if not 0 <= args.warmup_iters < args.max_iters:
        raise UsageError(f"--warmup_iters {args.warmup_iters} must lie in [0, --max_iters={args.max_iters}).")
    seeds = list(dict.fromkeys(parse_number_list(args.seeds, "seeds", int)))
    return design_sweep(lrs, seeds, blocks, parse_arms(args.arms), args.max_iters, args.warmup_iters)


def parse_arms(spec: str) -> list[Arm]:
    if spec.strip() == "all":
        return list(ARMS)
    slugs = [s.strip() for s in spec.split(",") if s.strip()]
    if not slugs or any(s not in ARM_BY_SLUG for s in slugs):
        raise UsageError(f"--arms {spec!r} is not valid; give 'all' or a comma-separated subset of: {', '.join(ARM_BY_SLUG)}.")
    if BASELINE not in slugs:
        raise UsageError(f"--arms {spec!r} lacks {BASELINE}: every gap in the table is to Pre-LN of the same block.")
    return [ARM_BY_SLUG[s] for s in dict.fromkeys(slugs)]


def sweep(args: argparse.Namespace, overrides: list[str]) -> int:
    started = time.perf_counter()
    design = design_of(args, overrides)
    found, place, unigram = start_study(design, args, overrides)
    if args.dry_run:
        print(dry_run_summary("fair_sweep", place, found, design_size(design), args.max_iters * SECONDS_PER_ITER))
        return 0
    rows = sorted(found, key=lambda r: (r["block"], r["arm"], r["lr"], r["seed"]))
    blocks, slugs = list(design.values("block")), design.values("arm")
    summary = best_rows(rows, blocks, [ARM_BY_SLUG[s] for s in slugs])
    model = parse_train_args(train_argv(design, plan_points(design, {})[0], Place.of(args, overrides))).model_config()
    shape = f"{model.n_layer} x {model.n_embd}, {args.max_iters} iterations"
    figures = plot_design(rows, blocks, unigram, f"Final val loss against the learning rate ({shape}, Shakespeare characters)",
                          place.out_dir / "fair_sweep") if rows else []
    text = f"{shape}\n\nEach arm at its best learning rate:\n\n{markdown_table(summary, BEST_COLUMNS)}\n\nEvery run:\n\n{markdown_table(rows, RUN_COLUMNS)}\n"
    record = {"unigram_loss": unigram, "max_iters": args.max_iters, "warmup_iters": args.warmup_iters, "lrs": list(design.values("lr")),
              "seeds": list(design.values("seed")), "best": summary, "runs": rows}
    return publish(place.out_dir, "fair_sweep", text, record, figures, rows, started)


def main(argv: list[str] | None = None) -> int:
    return study_main(parse_args, sweep, argv)
