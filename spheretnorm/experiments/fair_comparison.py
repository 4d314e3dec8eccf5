"""Each method at its own best learning rate, in both blocks: the fair version of the block study.

    python scripts/fair_sweep.py                 # plan, run (or resume) and tabulate the whole design
    python scripts/fair_sweep.py --table_only    # the table and plot of the runs already there
    python scripts/fair_sweep.py --dry_run       # print the runs the plan holds now, run nothing

The design, per block (GPT-2's and LLaMA's): Pre-LN, 0.5-SpheretNorm, GeoNorm and nGPT, then
0.5-SpheretNorm with alpha_cap=none, with alpha_decay=none and with sphere_input_gain=true (the
paper's fixed choices opened up, docs/CONNECTIONS.md). Every arm first runs each learning rate of
--lrs with the first seed. Where its best rate lies at an end of the grid, the grid grows by one
step beyond that end (once), so that the best is bracketed. Then the best rate and its two
neighbours run with every other seed. The plan is a function of the finished runs alone: a
re-run skips what is done, resumes what was cut short and adds what the finished runs call for.

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
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from spheretnorm.experiments.block_variants import BLOCK_TITLES
from spheretnorm.experiments.figures import save_figure
from spheretnorm.experiments.grid import CONFIG_NAME, STOPPED_COLLAPSE, STUCK_AT_UNIGRAM, check_overrides, load_run, unigram_loss
from spheretnorm.experiments.study import (
    CPU_MODEL,
    RESERVED,
    JobResult,
    add_common_options,
    as_args,
    diagnostic_summary,
    ensure_data,
    exit_status,
    make_job,
    outcome,
    parse_number_list,
    parse_train_args,
    run_jobs,
    study_main,
    wall_clock_line,
)
from spheretnorm.runtime.cli import HelpFormatter, UsageError
from spheretnorm.runtime.methods import method_args

BASELINE = "pre_ln"
SHAPE: dict[str, Any] = {**CPU_MODEL, "n_layer": 12, "n_embd": 64, "n_head": 4, "batch_size": 16, "global_batch_size": 16}
PAPER_RECIPE: dict[str, Any] = {"beta1": 0.9, "beta2": 0.99, "weight_decay": 0.1, "dropout": 0.0}
NGPT_RECIPE: dict[str, Any] = {"beta1": 0.9, "beta2": 0.95, "weight_decay": 0.0, "dropout": 0.0, "warmup_iters": 0}
DEFAULT_LRS = "1e-3,2e-3,4e-3,8e-3"
DEFAULT_SEEDS = "1337,1338"
DEFAULT_MAX_ITERS = 600
DEFAULT_WARMUP = 100
EXTENSIONS = 1  # grid steps an arm may add beyond an end of --lrs


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
)
ARM_BY_SLUG = {arm.slug: arm for arm in ARMS}


@dataclass(frozen=True, order=True)
class Point:
    block: str
    arm: str  # an Arm's slug
    lr: float
    seed: int

    def dirname(self) -> str:
        return f"{self.block}/{self.arm}/lr{self.lr:g}_s{self.seed}"

    @property
    def label(self) -> str:
        return f"{ARM_BY_SLUG[self.arm].title} ({BLOCK_TITLES[self.block]}) lr {self.lr:g} seed {self.seed}"


# -----------------------------------------------------------------------------
# The plan: a function of the losses of the finished runs


def grid_step(lrs: list[float], at_top: bool) -> float:
    """The factor between the grid's two end points on that side (2 for 1e-3,2e-3,...)."""
    return lrs[-1] / lrs[-2] if at_top else lrs[1] / lrs[0]


def swept_rates(lrs: list[float], losses: dict[float, float]) -> tuple[list[float], bool]:
    """(the rates an arm sweeps with its first seed, whether all of them are finished), given the
    losses of its finished runs (inf: diverged or collapsed): --lrs, plus up to EXTENSIONS grid
    steps beyond the end where the best so far lies, so that the best is bracketed."""
    rates = sorted(lrs)
    while True:
        if any(lr not in losses for lr in rates):
            return rates, False
        best = min(rates, key=lambda lr: losses[lr])
        at_top = best == rates[-1]
        if len(rates) - len(lrs) >= EXTENSIONS or not math.isfinite(losses[best]) or best not in (rates[0], rates[-1]):
            return rates, True
        step = grid_step(rates, at_top)
        rates = sorted([*rates, best * step if at_top else best / step])


def plan(lrs: list[float], seeds: list[int], blocks: list[str], done: dict[Point, float], arms: tuple[Arm, ...] | list[Arm] = ARMS) -> list[Point]:
    """Every run of the design that the finished runs (done: Point -> final val loss, inf for a
    diverged or collapsed one) call for now, finished ones included: the first seed at each swept
    rate, then, once those are finished, every other seed at the best rate and its neighbours.
    In the order to run them: every sweep point, then the seeds at the best rates, then at their
    neighbours (so a study cut short misses the least telling runs)."""
    sweeps: list[Point] = []
    at_best: list[Point] = []
    beside: list[Point] = []
    first, others = seeds[0], seeds[1:]
    for block in blocks:
        for arm in arms:
            losses = {p.lr: loss for p, loss in done.items() if (p.block, p.arm, p.seed) == (block, arm.slug, first)}
            rates, finished = swept_rates(lrs, losses)
            sweeps += [Point(block, arm.slug, lr, first) for lr in rates]
            if not finished:
                continue
            best = rates.index(min(rates, key=lambda lr: losses[lr]))
            if not math.isfinite(losses[rates[best]]):
                continue  # every rate diverged or collapsed: no best to seed
            at_best += [Point(block, arm.slug, rates[best], seed) for seed in others]
            beside += [Point(block, arm.slug, lr, seed) for lr in rates[max(best - 1, 0): best + 2] if lr != rates[best] for seed in others]
    return sweeps + at_best + beside


# -----------------------------------------------------------------------------
# Runs


@dataclass
class Design:
    lrs: list[float]
    seeds: list[int]
    blocks: list[str]
    arms: list[Arm]
    max_iters: int
    warmup: int
    out_dir: Path
    data_dir: Path
    overrides: list[str] = field(default_factory=list)

    def argv(self, point: Point) -> list[str]:
        arm = ARM_BY_SLUG[point.arm]
        settings = {**SHAPE, **arm.settings(point.lr, self.warmup, self.max_iters), "block": point.block, "seed": point.seed,
                    "eval_interval": max(1, self.max_iters // 5)}
        extra = [f"--data_dir={self.data_dir}", f"--out_dir={self.out_dir / point.dirname()}", "--config_name=fair_sweep"]
        return as_args(settings) + method_args(arm.method) + self.overrides + extra


UNSTABLE = ("diverged", STUCK_AT_UNIGRAM, STOPPED_COLLAPSE)  # grid.classify's statuses of a run that did not learn


def final_loss(row: dict[str, Any]) -> float:
    """What the planner ranks: the final val loss, inf for a run that diverged or collapsed."""
    return row["val_loss"] if row["status"] == "ok" and row["val_loss"] is not None else math.inf


def has_ended(row: dict[str, Any]) -> bool:
    """Whether a run counts for the plan: trained to the end, or stopped for good (not failed, not
    still unfinished as a run in progress is, seen by --table_only)."""
    return row["status"] == "ok" or row["status"] in UNSTABLE


def point_row(point: Point, result: JobResult, unigram: float) -> dict[str, Any]:
    out_dir = result.job.out_dir
    final = load_run(out_dir).final_eval if (out_dir / CONFIG_NAME).is_file() else None
    return {"block": point.block, "arm": point.arm, "lr": point.lr, "seed": point.seed, **outcome(result, unigram),
            **(diagnostic_summary(final) if final else {})}


def run_design(design: Design, jobs: int, threads: int, table_only: bool, dry_run: bool) -> list[dict[str, Any]]:
    """Plan, run what is missing, plan again with the new losses, until the plan stops growing.
    table_only and dry_run run nothing: the plan grows only with the runs already finished."""
    unigram = unigram_loss(design.data_dir)
    rows: dict[Point, dict[str, Any]] = {}
    tried: set[Point] = set()  # failed, or (table_only, dry_run) absent: not asked for again
    while True:
        done = {p: final_loss(r) for p, r in rows.items() if has_ended(r)}
        todo = [p for p in plan(design.lrs, design.seeds, design.blocks, done, design.arms) if p not in tried]
        if not todo:
            return [rows[p] for p in sorted(rows)]
        tried.update(todo)
        job_list = [make_job(p.label, design.argv(p), design.out_dir / p.dirname()) for p in todo]
        if table_only or dry_run:
            if dry_run:
                print("\n".join(f"{j.label}: {j.out_dir}" for j in job_list))
            found = [(p, j) for p, j in zip(todo, job_list) if (j.out_dir / CONFIG_NAME).is_file()]
            todo, results = [p for p, _ in found], [JobResult(j, None, 0.0, "") for _, j in found]
        else:
            print(f"fair sweep: {len(todo)} runs to run or reuse, {jobs} at a time", flush=True)
            results = run_jobs(job_list, jobs, threads)
        for p, result in zip(todo, results):
            row = point_row(p, result, unigram)
            if row["status"] != "failed":  # (an unfinished one is shown, and not planned on)
                rows[p] = row


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


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def best_table(summary: list[dict[str, Any]]) -> str:
    lines = [
        "| block | arm | best lr | seeds | val loss, mean | range | minus Pre-LN (same seed), mean | range | alpha pinned | radius/sqrt(d) | radius pinned | diverged or collapsed at |",
        "|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|:--|",
    ]
    for s in summary:
        spread = f"{_num(s['low'], '.3f')} to {_num(s['high'], '.3f')}" if s["seeds"] else "-"
        gap_spread = f"{_num(s['gap_low'], '+.3f')} to {_num(s['gap_high'], '+.3f')}" if s["gap_mean"] is not None else "-"
        lines.append(
            f"| {BLOCK_TITLES[s['block']]} | {s['title']} | {_num(s['best_lr'], 'g')} | {s['seeds']} | {_num(s['mean'], '.3f')} | {spread} | "
            f"{_num(s['gap_mean'], '+.3f')} | {gap_spread} | {_num(s['step_pinned'], '.2f')} | {_num(s['radius'], '.3f')} | "
            f"{_num(s['radius_pinned'], '.0f')} | {', '.join(f'{lr:g}' for lr in s['unstable']) or '-'} |"
        )
    return "\n".join(lines)


def runs_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| block | arm | lr | seed | val loss | status | alpha pinned | radius pinned | s |", "|:--|:--|--:|--:|--:|:--|--:|--:|--:|"]
    for r in rows:
        lines.append(
            f"| {BLOCK_TITLES[r['block']]} | {ARM_BY_SLUG[r['arm']].title} | {r['lr']:g} | {r['seed']} | {_num(r['val_loss'], '.3f')} | "
            f"{r['status']} | {_num(r.get('step_pinned'), '.2f')} | {_num(r.get('radius_pinned'), '.0f')} | {_num(r['seconds'], '.0f')} |"
        )
    return "\n".join(lines)


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
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter, epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False
    )
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


def design_of(args: argparse.Namespace, overrides: list[str]) -> Design:
    # The model's shape may change (--n_layer=12 --n_embd=128); what the arms compare may not.
    fixed = {k: "nothing (fixed by this study)" for k in (*PAPER_RECIPE, *NGPT_RECIPE, "block", "learning_rate", "min_lr",
                                                          "lr_decay_iters", "alpha_cap", "alpha_decay", "sphere_input_gain")}
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
    return Design(lrs, seeds, blocks, parse_arms(args.arms), args.max_iters, args.warmup_iters, Path(args.out_dir), Path(args.data_dir), overrides)


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
    ensure_data(design.data_dir, args.input)
    rows = run_design(design, args.jobs, args.threads, args.table_only, args.dry_run)
    if args.dry_run:
        return 0
    unigram = unigram_loss(design.data_dir)
    summary = best_rows(rows, design.blocks, design.arms)
    model = parse_train_args(design.argv(Point(design.blocks[0], BASELINE, design.lrs[0], design.seeds[0]))).model_config()
    shape = f"{model.n_layer} x {model.n_embd}, {design.max_iters} iterations"
    figures = plot_design(rows, design.blocks, unigram, f"Final val loss against the learning rate ({shape}, Shakespeare characters)",
                          design.out_dir / "fair_sweep") if rows else []
    text = f"{shape}\n\nEach arm at its best learning rate:\n\n{best_table(summary)}\n\nEvery run:\n\n{runs_table(rows)}\n"
    design.out_dir.mkdir(parents=True, exist_ok=True)
    (design.out_dir / "fair_sweep.md").write_text(text, encoding="utf-8")
    record = {"unigram_loss": unigram, "max_iters": design.max_iters, "warmup_iters": design.warmup, "lrs": design.lrs,
              "seeds": design.seeds, "best": summary, "runs": rows}
    (design.out_dir / "fair_sweep.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(text)
    print(wall_clock_line(time.perf_counter() - started, rows))
    print("Written: " + ", ".join(str(p) for p in [design.out_dir / "fair_sweep.md", design.out_dir / "fair_sweep.json", *figures]))
    return exit_status(rows)


def main(argv: list[str] | None = None) -> int:
    return study_main(parse_args, sweep, argv)
