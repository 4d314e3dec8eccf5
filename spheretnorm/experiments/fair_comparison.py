"""Each method at its own best learning rate, in both blocks: the fair version of the block study.

    python scripts/fair_sweep.py                 # plan, run (or resume) and tabulate the whole design
    python scripts/fair_sweep.py --table_only    # the table and plot of the runs already there
    python scripts/fair_sweep.py --compare out/fair_sweep,out/fair_sweep_w128   # two finished sweeps (widths) in one figure
    python scripts/fair_sweep.py --compare out/fair_sweep,out/fair_sweep_w128 --optimizers muon,muonh   # their Muon and MuonH runs
    python scripts/fair_sweep.py --dry_run       # print the runs the plan holds now, their number and time; write nothing
    python scripts/fair_sweep.py --blocks llama --arms pre_ln,p_spheret-0.5,geonorm,ngpt --optimizers adamw,muon,muonh --n_embd=128

The design, per block (GPT-2's and LLaMA's): Pre-LN, 0.5-SpheretNorm, GeoNorm and nGPT, then
0.5-SpheretNorm with alpha_cap=none, with alpha_decay=none, with sphere_input_gain=true and with
alpha_cap_grad=straight_through (the paper's fixed choices opened up, docs/CONNECTIONS.md). Every arm first runs each learning rate of
--lrs with the selection seed (the first of --seeds, or --selection_seed). Where its best rate lies
at an end of the grid, the grid grows by one step beyond that end (once), so that the best is
bracketed; with --refine the midpoints on each side of the best (a sqrt(2) step on a grid of
factor 2) run too. Then the selection seed's best rate and its two neighbours run with every
held-out seed (the other seeds); with --no_neighbours the best rate alone does (a study whose
table reads the selected rates only, as issue 50's E3). The plan is a function of the finished runs alone: a
re-run skips what is done, resumes what was cut short and adds what the finished runs call for.
SIGINT or SIGTERM to the sweep (kill -INT, Ctrl-C) is passed on to its running train.py jobs,
which save a checkpoint and exit; no new run starts, and the same command resumes. A run folder
that another sweep trains now is left to it (a lock in the folder), and --dry_run says it is in
progress. --dry_run writes nothing (it prepares no data) and ends with the number of runs and
an estimate of their time.

--optimizers adds an optimizer axis (default adamw alone, the design above): each (block, arm,
optimizer) sweeps its own grid of the optimizer's rate key (AdamW's learning_rate, Muon's muon_lr,
AdamH's and MuonH's hyperball_lr), with the same extension and seeding. The grid is --lrs for
AdamW, --grid OPT=R1,R2,... where given, else the key's default times 1/4, 1/2, 1, 2 and 4. Beside
another optimizer, the AdamW part (embeddings, gains) runs at --base_lr (default 2e-3, the middle
of the default --lrs), and min_lr is base_lr / 10. AdamH and MuonH run every arm at
hyperball_radius=1, one recipe for all: at the default (each matrix's initial norm) MuonH barely
trains a sphere connection, whose step on the residual sphere shrinks with its sublayers' output
norm (docs/OPTIMIZERS.md). nGPT runs with AdamW alone: the Hyperball optimizers refuse it (its row
renormalisation undoes their radius), and the axis asks about the other arms. --grid ARM+OPT=...
gives one arm its own grid with that optimizer (MuonH at 0.02 for Pre-LN and 0.01 for the sphere).
A grid of one rate is a rate given, not chosen: every seed runs there and nothing is extended or
refined, so the table's held-out seeds are seeds at a fixed rate (the seed study of issue 50's E2):

    python scripts/fair_sweep.py --blocks llama --arms pre_ln,p_spheret-0.5 --optimizers adamw,muonh --lrs 2e-3
        --grid pre_ln+muonh=0.02 --grid p_spheret-0.5+muonh=0.01 --seeds 1337,1339,1340,1341,1342,1343 --rule "upper<0"

Recipes: the depth study's for every arm but nGPT (warm-up, cosine to lr / 10, weight decay 0.1,
AdamW betas 0.9 and 0.99); nGPT's own (no warm-up, no weight decay, cosine to 0, betas 0.9 and
0.95, as NVIDIA/ngpt). Model: --n_layer x --n_embd (4 heads), Tiny Shakespeare characters, block
64, batch 16, fp32, one thread per run; the MLP keeps each block's own width for every arm.

Runs go to OUT_DIR/<block>/<arm>/lr<LR>_s<SEED>/ (AdamW), OUT_DIR/<block>/<arm>+<optimizer>/lr<RATE>_s<SEED>/
(another optimizer). Writes OUT_DIR/fair_sweep.md (each arm and optimizer at the rate its
selection seed chose, or at the one rate its grid gives: the held-out seeds' mean there (the
headline), the gap to the same block's Pre-LN at Pre-LN's own rate paired by held-out seed, its
mean and 95% t-interval (from 3 held-out seeds); "failed (seed N collapsed)" instead of a mean
where a held-out seed failed; the rates where a held-out seed failed; with --wide also the
selection seed's loss, each held-out seed's loss and gap, the gaps' SD, with several optimizers
the gap to Pre-LN with AdamW, the pinned fractions of the sphere's step size and radius, and the
rates where any run failed (all of them always in the JSON record); then each --rule with its
verdict, and every run), on val_loss_full where every run has it, on one kernel
path unless --mix_kernel_paths; OUT_DIR/fair_sweep.json (the --rule given are written into it
before any run starts) and OUT_DIR/fair_sweep.{png,pdf}: final val loss
against the rate, one panel per block (with several optimizers, a row per block and a column per
optimizer) on one y-range, each seed a point, one line per arm through the seeds' mean where every
seed trained, and an x of the arm's colour at the top where a seed collapsed or diverged.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spheretnorm.experiments.figures import (
    LossRange, draw_rate_curve, figure_legend, loss_range, plt, rate_axis, rate_curve, save_figure, titled_grid, trained,
)
from spheretnorm.experiments.gap_figure import AXES as GAP_AXES, GAP_Y_RANGES, gap_figure, gap_points, run_file
from spheretnorm.experiments.grid import BLOCK_TITLES, CONFIG_NAME, STALLED, bigram_loss, check_overrides, is_stalled, parse_choices, stall_reason
from spheretnorm.experiments.stats import Rule, parse_rule
from spheretnorm.experiments.study import (
    CPU_MODEL, METRIC_TEXT, RESERVED, UNSTABLE, UNVERIFIED, Axis, Column, Done, Point, Report, Seeds, Sweep, add_length_options,
    add_place_options, add_rate_grid_options, add_seed_option, add_table_options, best_rate_follow_up, corpus_title, declared_rules,
    dry_run_summary, gaps_text, held_out_summary, kernel_paths_line, markdown_table, method_settings, parse_number_list, parse_train_args,
    plan_points, rate_grids, record_mismatch_lines, rule_lines, seed_order, study_parser, sweep_main, table_metric, train_argv,
)
from spheretnorm.kernels import compile_mode_text
from spheretnorm.model import OPENED_DEFAULTS, GPTConfig
from spheretnorm.optim import OPTIMIZERS
from spheretnorm.runtime.cli import UsageError
from spheretnorm.runtime.config import ParsedConfig
from spheretnorm.runtime.run_folder import METRICS_NAME, read_metrics

BASELINE = "pre_ln"
SHAPE: dict[str, Any] = {**CPU_MODEL, "n_layer": 12, "n_embd": 64, "n_head": 4, "batch_size": 16, "global_batch_size": 16}
PAPER_RECIPE: dict[str, Any] = {"beta1": 0.9, "beta2": 0.99, "weight_decay": 0.1, "dropout": 0.0}
NGPT_RECIPE: dict[str, Any] = {"beta1": 0.9, "beta2": 0.95, "weight_decay": 0.0, "dropout": 0.0, "warmup_iters": 0}
DEFAULT_LRS = "1e-3,2e-3,4e-3,8e-3"
DEFAULT_SEEDS = "1337,1338"
DEFAULT_MAX_ITERS = 600
DEFAULT_WARMUP = 100
EXTENSIONS = 1  # grid steps an arm may add beyond an end of --lrs
ADAMW = "adamw"  # the optimizer of the study's first design, whose runs keep their folders
DEFAULT_BASE_LR = 2e-3  # the AdamW part's peak rate beside another optimizer: the middle of DEFAULT_LRS
# Every Hyperball optimizer (AdamH, MuonH) runs every arm at this radius: at the initial norm
# (hyperball_radius=0) MuonH barely trains a sphere connection (docs/OPTIMIZERS.md).
HYPERBALL_RADIUS = 1.0
# The dry run's estimate of a run until finished runs give their own times, from a run's parts (run_cost.py, idle, one
# thread, docs/LOG.md 2026-12-07): at 12 x 64 and at 24 x 128 an evaluation (eval_iters batches of each split and the
# diagnostics) cost about EVAL_STEPS training steps and the whole val split of Tiny Shakespeare (111k characters) about
# FULL_EVAL_STEPS. The step of SHAPE on one thread, two runs at a time: eager, the default design's 104 runs of 600
# iterations and six evaluations took 75 minutes two at a time on 2 cores (docs/LOG.md, 2026-12-01), 86.5 s a run, which
# less RUN_FIXED_SECONDS over 600 + 6 * EVAL_STEPS + FULL_EVAL_STEPS steps is 0.115 s; the compiled step measured 1.5x
# faster (bench.py round-robin, 12 x 128, docs/LOG.md 2026-12-04).
SECONDS_PER_STEP = {False: 0.115, True: 0.115 / 1.5}
EVAL_STEPS = 6
FULL_EVAL_STEPS = 30
# What a run costs besides its steps and evaluations, by compile mode (kernels.compile_mode_text): start-up and,
# compiled, torch.compile's trace from the cache a sweep's earlier runs filled: per block (compile_scope=blocks) about
# 5 to 10 s at 12 to 36 layers, the whole model as one graph about 40 s at 12 layers, growing with depth (scaled by
# n_layer / 12 here; run_cost.py, docs/LOG.md 2026-12-07).
RUN_FIXED_SECONDS = {"eager": 10.0, "compiled_blocks": 10.0, "compiled": 40.0}


def estimated_run_seconds(model: GPTConfig, max_iters: int, eval_interval: int, compiled: bool, scope: str = "blocks") -> float:
    """A run's seconds before any has finished: RUN_FIXED_SECONDS, then its steps, its evaluations (at 0, eval_interval,
    ..., max_iters) and the whole split at SECONDS_PER_STEP scaled by depth times width. At these small widths the
    per-token overheads keep the cost about linear in n_embd (LLaMA's block, AdamW: 12 x 64 runs took 76 to 88 s, 12 x
    128 runs 142 to 234 s; docs/LOG.md)."""
    mode = compile_mode_text(compiled, scope)
    fixed = RUN_FIXED_SECONDS[mode] * (model.n_layer / SHAPE["n_layer"] if mode == "compiled" else 1.0)
    scale = (model.n_layer * model.n_embd) / (SHAPE["n_layer"] * SHAPE["n_embd"])
    evals = max_iters // eval_interval + 1
    return fixed + (max_iters + EVAL_STEPS * evals + FULL_EVAL_STEPS) * SECONDS_PER_STEP[compiled] * scale


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


def design_size(design: Sweep, refine: bool = False, neighbours: bool = True) -> int:
    """The most runs the design can hold: per (block, arm, optimizer), its grid and the extension with the
    selection seed, with refine the two midpoints beside its best, then every held-out seed at the best rate
    and (with neighbours) its two neighbours (best_rate_follow_up); a grid of one rate, its held-out seeds alone."""
    first = plan_points(design, {})
    held_out = len(design.values("seed")) - 1
    sizes = Counter((p["block"], p["arm"], optimizer_of(p)) for p in first).values()
    rates_held_out = 3 if neighbours else 1
    return len(first) + sum(held_out if size == 1 else EXTENSIONS + 2 * refine + rates_held_out * held_out for size in sizes)


def design_grids(design: Sweep) -> dict[str, list[float]]:
    """Each optimizer's first-seed rates, as the design plans them with no run finished."""
    first = plan_points(design, {})
    return {o: sorted({p["lr"] for p in first if optimizer_of(p) == o}) for o in design_optimizers(design)}


def arm_grids_of(design: Sweep) -> dict[str, list[float]]:
    """Each arm's first-seed rates per optimizer ("pre_ln+muonh": [0.02]), as the design plans them with no run finished."""
    first = plan_points(design, {})
    return {f"{arm}+{o}": sorted({p["lr"] for p in first if (p["arm"], optimizer_of(p)) == (arm, o)})
            for arm, o in dict.fromkeys((p["arm"], optimizer_of(p)) for p in first)}


def optimizer_of(p: Point | dict[str, Any]) -> str:
    """A point's or row's optimizer: AdamW where it has none (a design of AdamW alone has no optimizer axis)."""
    return p.get("optimizer") or ADAMW


def is_hyperball(optimizer: str) -> bool:
    return any(param.key == "hyperball_radius" for param in OPTIMIZERS[optimizer].params)


def optimizer_settings(arm: Arm, optimizer: str, rate: float, base_lr: float, warmup: int, max_iters: int) -> dict[str, Any]:
    """An arm's recipe with the optimizer's rate key at `rate`; beside another optimizer, AdamW's part at base_lr (min_lr follows)."""
    key = OPTIMIZERS[optimizer].rate_key
    recipe = arm.settings(rate if key == "learning_rate" else base_lr, warmup, max_iters)
    if optimizer == ADAMW:
        return recipe  # today's settings exactly: the first design's runs are reused
    radius = {"hyperball_radius": HYPERBALL_RADIUS} if is_hyperball(optimizer) else {}
    return {**recipe, "optimizer": optimizer, key: rate, **radius}


def keeps(p: Point) -> bool:
    """nGPT runs with AdamW alone (the module's docstring says why)."""
    return optimizer_of(p) == ADAMW or not ARM_BY_SLUG[p["arm"]].ngpt_recipe


def design_sweep(lrs: list[float], seeds: list[int], blocks: list[str], arms: list[Arm] | tuple[Arm, ...], max_iters: int, warmup: int,
                 grids: dict[str, tuple[float, ...]] | None = None, base_lr: float = DEFAULT_BASE_LR, refine: bool = False,
                 rules: tuple[Rule, ...] = (), arm_grids: dict[tuple[str, str], tuple[float, ...]] | None = None,
                 neighbours: bool = True) -> Sweep:
    """Each (block, arm, optimizer) at its own best rate of its optimizer's grid (grids; default AdamW's lrs
    alone; arm_grids, keyed by (arm, optimizer), gives an arm a grid of its own), planned by
    study.best_rate_follow_up from the finished runs alone, so a re-run resumes the design. A design of
    AdamW alone has no optimizer axis, so its points, settings and folders are those of the study before the axis."""
    grids = grids or {ADAMW: tuple(lrs)}
    arm_grids = arm_grids or {}

    def grid_of(group: Point) -> tuple[float, ...]:
        return arm_grids.get((group["arm"], optimizer_of(group)), grids[optimizer_of(group)])

    used = [arm_grids.get((arm.slug, o), grids[o]) for arm in arms for o in grids]
    rates = tuple(sorted({r for grid in used for r in grid}))
    optimizer_axis = (Axis("optimizer", tuple(grids)),) if list(grids) != [ADAMW] else ()

    def settings(p: Point) -> dict[str, Any]:
        arm = ARM_BY_SLUG[p["arm"]]
        return {**method_settings(arm.method), **optimizer_settings(arm, optimizer_of(p), p["lr"], base_lr, warmup, max_iters)}

    def folder(p: Point) -> str:
        optimizer = "" if optimizer_of(p) == ADAMW else f"+{optimizer_of(p)}"  # AdamW's folders are the first design's
        return f"{p['block']}/{p['arm']}{optimizer}/lr{p['lr']:g}_s{p['seed']}"

    def label(p: Point) -> str:
        recipe = OPTIMIZERS[optimizer_of(p)]
        rate = "lr" if optimizer_of(p) == ADAMW else f"{recipe.title} {recipe.rate_key}"
        return f"{ARM_BY_SLUG[p['arm']].title} ({BLOCK_TITLES[p['block']]}), {rate} {p['lr']:g}"

    return Sweep(
        name="fair_sweep", base={**SHAPE, "eval_interval": max(1, max_iters // 5)},
        axes=(Axis("block", tuple(blocks)), Axis("arm", tuple(a.slug for a in arms)), *optimizer_axis, Axis("lr", rates), Axis("seed", tuple(seeds))),
        folder=folder, settings=settings, label=label, keep=keeps, diagnostics=True, rules=rules,
        follow_up=best_rate_follow_up(EXTENSIONS, grid=grid_of, refine=refine, neighbours=neighbours),
        extra=lambda p, out_dir: {"optimizer": optimizer_of(p), **step_size_record(out_dir)},
    )


def step_size_record(out_dir: Path) -> dict[str, Any]:
    """A run's sphere step sizes (empty lists without them): "below_cap", the share of sublayers whose step is below
    its cap at each evaluation (under the paper's clamp it stays 0), and "step_ratio", the smallest and largest alpha
    at the last evaluation over alpha at the first (min(1, alpha_cap) * lambda_l: softplus(a) starts at 1)."""
    rows = read_metrics(out_dir / METRICS_NAME) if (out_dir / METRICS_NAME).is_file() else []
    evals = [r for r in rows if r.get("kind") == "eval" and r.get("step_sizes")]
    below = [1.0 - statistics.fmean(r["step_pinned"]) for r in evals if r.get("step_pinned")]
    ratios = [a / a0 for a, a0 in zip(evals[-1]["step_sizes"], evals[0]["step_sizes"])] if evals else []
    return {"below_cap": below, "step_ratio": [min(ratios), max(ratios)] if ratios else []}


# -----------------------------------------------------------------------------
# The table and the plot


def best_rows(rows: list[dict[str, Any]], blocks: list[str], arms: list[Arm], seeds: Seeds, metric: str = "val_loss",
              optimizers: list[str] | tuple[str, ...] = (ADAMW,)) -> list[dict[str, Any]]:
    """One summary per (block, arm, optimizer): the engine's held-out statistics (study.held_out_summary), its
    gaps to Pre-LN of the same block with the same optimizer ("gap") and with AdamW ("adamw_gap"), then this
    study's own: the pinned fractions and the unstable rates."""
    groups = [(block, arm.slug, optimizer) for block in blocks for optimizer in optimizers for arm in arms
              if keeps({"arm": arm.slug, "optimizer": optimizer})]
    baselines = {"gap": lambda g: (g[0], BASELINE, g[2]), "adamw_gap": lambda g: (g[0], BASELINE, ADAMW)}
    held_out = held_out_summary(rows, groups, lambda r: (r["block"], r["arm"], optimizer_of(r)), baselines, seeds, metric)
    out = []
    for (block, slug, optimizer), s in zip(groups, held_out):
        group = [r for r in rows if (r["block"], r["arm"], optimizer_of(r)) == (block, slug, optimizer)]
        at_best = [r for r in group if r["lr"] == s["rate"] and r["seed"] in seeds.held_out]
        out.append({  # the keys in the order the record has always had them
            "block": block, "arm": slug, "title": ARM_BY_SLUG[slug].title, "optimizer": optimizer, "optimizer_title": OPTIMIZERS[optimizer].title,
            "rate_key": OPTIMIZERS[optimizer].rate_key, "best_lr": s["rate"], "selection_loss": s["selection_loss"],
            "held_out": s["held_out"], "held_out_text": s["held_out_text"], "headline": s["headline"],
            **{k: v for k, v in s.items() if k.startswith("gap")}, **{k: v for k, v in s.items() if k.startswith("adamw_gap")},
            "held_out_failed_at": s["held_out_failed_at"],
            "step_pinned": mean_of(at_best, "step_pinned"), "below_cap": mean_history(at_best), "step_ratio": ratio_span(at_best), "radius": mean_of(at_best, "radius"),
            "radius_pinned": mean_of(at_best, "radius_pinned"),
            "unstable": sorted({r["lr"] for r in group if r["status"] in UNSTABLE}),
        })
    return out


def rule_verdicts(summary: list[dict[str, Any]], several: bool) -> list[tuple[str, dict[int, float | None]]]:
    """(the arm's name, its held-out gaps to Pre-LN with the same optimizer) of every arm but Pre-LN, for the rules."""
    return [(f"{s['title']} ({BLOCK_TITLES[s['block']]}{', ' + s['optimizer_title'] if several else ''})", s["gaps"])
            for s in summary if s["arm"] != BASELINE]


def mean_history(rows: list[dict[str, Any]]) -> list[float]:
    """step_size_record's below_cap shares averaged over the runs (seeds), evaluation by evaluation, as far as all runs reach."""
    histories = [r["below_cap"] for r in rows if r.get("below_cap")]
    return [statistics.fmean(h[i] for h in histories) for i in range(min(map(len, histories)))] if histories else []


def ratio_span(rows: list[dict[str, Any]]) -> list[float]:
    """The smallest and largest step_ratio over the runs (seeds); empty where none has one."""
    spans = [r["step_ratio"] for r in rows if r.get("step_ratio")]
    return [min(s[0] for s in spans), max(s[1] for s in spans)] if spans else []


def mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(values) if values else None


def summary_columns(several: bool, seeds: Seeds, given: str = "") -> tuple[Column, ...]:
    """The summary's default columns, what a reader decides on; the others are in fair_sweep.json's "best" and
    in --wide's table (best_columns)."""
    same = "minus Pre-LN, same optimizer (same seed)" if several else "minus Pre-LN (same seed)"
    return (
        *lead_columns(several, seeds, given), Column("held-out mean", "headline"), Column(f"{same}, mean", "gap_text"),
        Column("95% interval", "gap_interval"), Column("held-out failed at", "held_out_failed_at", align=":--"),
    )


def lead_columns(several: bool, seeds: Seeds, given: str = "") -> tuple[Column, ...]:
    """The summary's first columns, the group and its rate; given (given_rates): whether some or all arms' grids hold
    one rate, which is a rate given, not the best of several."""
    rate = rate_header(several)
    header = {"all": f"{rate} (the one its grid gives)",
              "some": f"{rate} (seed {seeds.selection}'s best, or the one its grid gives)"}.get(given, f"best {rate} (seed {seeds.selection})")
    return (Column("block", lambda s: BLOCK_TITLES[s["block"]], align=":--"), Column("arm", "title", align=":--"),
            Column("optimizer", "optimizer_title", align=":--"), Column(header, "best_lr", "g"))


def summary_title(several: bool, given: str = "") -> str:
    """The line above the summary; given as in lead_columns."""
    rate = "rate" if several else "learning rate"
    return {"all": f"Each arm at the one {rate} its grid gives:",
            "some": f"Each arm at its best {rate}, or at the one its grid gives:"}.get(given, f"Each arm at its best {rate}:")


def wide_note(to_adamw: bool) -> str:
    """The line under the default summary: what --wide adds (to_adamw: the gap to Pre-LN with AdamW is one)."""
    adamw = " the gap to Pre-LN with AdamW," if to_adamw else ""
    return (f"The selection seed's loss, each held-out seed and gap, the gaps' SD,{adamw} alpha, the radius and the rates where any "
            f"run failed: fair_sweep.json (\"best\"), or this table with --wide.")


def best_columns(several: bool, seeds: Seeds, with_adamw: bool = True, given: str = "") -> tuple[Column, ...]:
    """The summary's every column (--wide); with several optimizers a second gap, to Pre-LN with AdamW, says what the
    optimizer gains over the study's first design (where the design runs AdamW, with_adamw: else it would read "runs missing")."""
    same = "minus Pre-LN, same optimizer (same seed)" if several else "minus Pre-LN (same seed)"
    to_adamw = (Column("minus Pre-LN AdamW (same seed), mean", "adamw_gap_text"), Column("95% interval", "adamw_gap_interval")) if several and with_adamw else ()
    return (
        *lead_columns(several, seeds, given), Column(f"seed {seeds.selection}", "selection_loss", ".3f"),
        Column("held-out seeds", "held_out_text", align=":--"), Column("held-out mean", "headline"),
        Column(f"{same}, each", lambda s: gaps_text(s["gaps"]), align=":--"), Column("mean", "gap_text"), Column("SD", "gap_sd", ".3f"),
        Column("95% interval", "gap_interval"), *to_adamw, Column("held-out failed at", "held_out_failed_at", align=":--"),
        Column("alpha pinned", "step_pinned", ".2f"),
        Column("alpha below cap, by evaluation", lambda s: " ".join(f"{x:.2f}" for x in s["below_cap"]) or None, align=":--"),
        Column("alpha / its start, at the end", lambda s: f"{s['step_ratio'][0]:.2f} to {s['step_ratio'][1]:.2f}" if s["step_ratio"] else None),
        Column("radius/sqrt(d)", "radius", ".3f"), Column("radius pinned", "radius_pinned", ".0f"),
        Column("diverged or collapsed at", lambda s: ", ".join(f"{lr:g}" for lr in s["unstable"]) or "-", align=":--"),
    )


def rate_header(several: bool) -> str:
    """'lr' for AdamW alone (the first design's tables); 'rate' (each optimizer's rate key) with several."""
    return "rate" if several else "lr"


def run_columns(several: bool, metric: str = "val_loss") -> tuple[Column, ...]:
    return (
        Column("block", lambda r: BLOCK_TITLES[r["block"]], align=":--"), Column("arm", lambda r: ARM_BY_SLUG[r["arm"]].title, align=":--"),
        Column("optimizer", lambda r: OPTIMIZERS[optimizer_of(r)].title, align=":--"), Column(rate_header(several), "lr", "g"),
        Column("seed", "seed"), Column(metric, metric, ".3f"), Column("status", "status", align=":--"),
        Column("alpha pinned", "step_pinned", ".2f"), Column("radius pinned", "radius_pinned", ".0f"), Column("s", "seconds", ".0f"),
    )


Y_SPAN = 0.6  # nats above the figure's lowest loss that its panels show; a loss beyond is a triangle at the top
PANEL_INCHES = (5.2, 3.8)


@dataclass(frozen=True)
class Panel:
    """What one panel draws: a block's runs with one optimizer, under its title."""

    rows: list[dict[str, Any]]
    block: str
    optimizer: str
    unigram: float
    title: str

    def runs(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["block"] == self.block and optimizer_of(r) == self.optimizer]


def panel_figure(panels: list[list[Panel]], title: str, out: Path) -> list[Path]:
    """A grid of panels (draw_panel) with one legend of every arm drawn, saved as out.{png,pdf}."""
    return save_figure(panel_axes(panels, title), out)


def panel_axes(panels: list[list[Panel]], title: str) -> plt.Figure:
    """panel_figure's figure, drawn and not saved. Every panel shows one y-range, so a gap between two panels'
    lines reads at its true size (a 0.014 gap looked large on ranges of their own)."""
    fig, axes = titled_grid(len(panels), len(panels[0]), PANEL_INCHES, title)
    flat = [p for line in panels for p in line]
    losses = [r["val_loss"] for p in flat for r in p.runs() if trained(r)]
    shown = loss_range(losses or [p.unigram for p in flat], Y_SPAN)
    for line, ax_line in zip(panels, axes):
        for panel, ax in zip(line, ax_line):
            draw_panel(ax, panel, shown)
        ax_line[0].set_ylabel("final val loss\n(points: seeds; line: their mean where all trained)", fontsize=8)
    shown.apply(axes[0][0])  # shared by every panel
    figure_legend(fig, axes)  # nGPT is in AdamW's panels only
    return fig


def draw_panel(ax: Any, panel: Panel, shown: LossRange) -> None:
    """One block's runs with one optimizer: a curve per arm (draw_rate_curve), its colour the same in every panel."""
    mine = panel.runs()
    cmap = plt.get_cmap("tab10")
    for i, arm in enumerate(ARMS):
        runs = [r for r in mine if r["arm"] == arm.slug]
        if runs:
            draw_rate_curve(ax, rate_curve(runs, arm.title, cmap(i), "--" if arm.method == BASELINE else "-"), shown)
    key = OPTIMIZERS[panel.optimizer].rate_key
    rate_axis(ax, [r["lr"] for r in mine], "peak learning rate" if key == "learning_rate" else f"peak {key}")
    ax.set_title(panel.title, fontsize=10)
    ax.grid(alpha=0.3)


# -----------------------------------------------------------------------------
# Command line


def options(p: argparse.ArgumentParser) -> None:
    """The command's options, on sweep_main's parser (this module's docstring its description and epilog)."""
    add_rate_grid_options(p, DEFAULT_LRS, DEFAULT_BASE_LR, lrs_role=", which the selection seed runs first", base_lr_beside_others=True,
                          grid_role="; ARM+OPT=R1,... gives one arm its own grid; a grid of one rate is a rate given: every seed runs there, none is chosen")
    add_seed_option(p, DEFAULT_SEEDS, role=": the selection seed, then the held-out seeds of the best rates")
    p.add_argument("--selection_seed", type=int, default=None, help="the seed of --seeds that selects each arm's rate (default: the first)")
    p.add_argument("--refine", action="store_true", help="add the midpoints beside the selection seed's best rate (a sqrt(2) step) before the held-out seeds run")
    p.add_argument("--no_neighbours", action="store_true",
                   help="run the held-out seeds at each arm's selected rate alone, not at its two neighbours too (a table that reads the selected rates only)")
    p.add_argument("--blocks", default="gpt2,llama", help="the blocks (default gpt2,llama)")
    p.add_argument("--arms", default="all", help=f"'all' or a comma-separated subset of: {', '.join(ARM_BY_SLUG)} (default all)")
    add_length_options(p, DEFAULT_MAX_ITERS, warmup_iters=DEFAULT_WARMUP, warmup_of=" of every arm but nGPT")
    add_place_options(p, "out/fair_sweep", dry_run=True)
    p.add_argument("--compare", metavar="DIR,DIR,...", help="run nothing: plot finished sweeps' runs of --blocks and --optimizers (e.g. two widths), "
                   "a row of panels each, as OUT_DIR/fair_sweep_compare.png; two folders at least")
    p.add_argument("--gap_against", choices=list(GAP_AXES), default=None,
                   help="with --compare: plot each arm's held-out gap to Pre-LN against the sweeps' depth or width (final gaps), or "
                        "against the tokens seen (each periodic evaluation of the runs) instead, as OUT_DIR/gap_vs_<depth|width|tokens>.png")
    p.add_argument("--band", type=float, default=0.02, help="with --gap_against: dotted lines at +-BAND, the decision rules' threshold (default 0.02; 0: none)")
    p.add_argument("--gap_y", choices=list(GAP_Y_RANGES), default=None,
                   help="with --gap_against: the panels of a row share one y-range (row, the default of depth and width) or each has its "
                        "own (panel, the default of tokens: a small gap stays readable beside a large one)")
    add_table_options(p)
    p.add_argument("--wide", action="store_true", help="the summary table with every column: each held-out seed, the gaps' SD, the gap "
                   "to Pre-LN with AdamW, alpha and the radius (default: the rate, the held-out mean, the gap and its interval, failures)")


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The command line as main reads it: its options, and the train.py overrides (design_of takes both)."""
    p = study_parser(__doc__)
    options(p)
    return p.parse_known_args(argv)


def design_of(args: argparse.Namespace, overrides: list[str]) -> Sweep:
    # The model's shape may change (--n_layer=12 --n_embd=128); what the arms compare may not.
    fixed = {k: "nothing (fixed by this study)" for k in (*PAPER_RECIPE, *NGPT_RECIPE, *OPENED_DEFAULTS, "block", "learning_rate", "min_lr",
                                                          "lr_decay_iters", "alpha_decay", "hyperball_radius",
                                                          *(o.rate_key for o in OPTIMIZERS.values()))}
    fixed["optimizer"] = "--optimizers"
    check_overrides(overrides, {**RESERVED, **fixed, "seed": "--seeds", "max_iters": "--max_iters", "warmup_iters": "--warmup_iters"})
    lrs = sorted(set(parse_number_list(args.lrs, "lrs", float)))
    arms = parse_arms(args.arms)
    optimizers = parse_choices(args.optimizers, OPTIMIZERS, "optimizers")
    arm_grids = own_grids(args.grid, arms, optimizers)
    grids = optimizer_grids(args, lrs, [g for g in args.grid if not is_own_grid(g)])
    if args.refine and any(len(g) < 2 for g in [*grids.values(), *arm_grids.values()]):
        raise UsageError("--refine adds the midpoints beside a chosen rate, and a grid of one rate chooses none; drop --refine, or give two rates at least.")
    blocks = [b.strip() for b in args.blocks.split(",") if b.strip()]
    if not blocks or any(b not in BLOCK_TITLES for b in blocks):
        raise UsageError(f"--blocks {args.blocks!r} is not valid; choose from: {', '.join(BLOCK_TITLES)}.")
    if not 0 <= args.warmup_iters < args.max_iters:
        raise UsageError(f"--warmup_iters {args.warmup_iters} must lie in [0, --max_iters={args.max_iters}).")
    seeds = seed_order(list(dict.fromkeys(parse_number_list(args.seeds, "seeds", int))), args.selection_seed)
    return design_sweep(lrs, seeds, blocks, arms, args.max_iters, args.warmup_iters, grids, base_lr_of(args), args.refine,
                        tuple(map(parse_rule, args.rule)), arm_grids, not args.no_neighbours)


def optimizer_grids(args: argparse.Namespace, lrs: list[float], given: list[str]) -> dict[str, tuple[float, ...]]:
    """Each optimizer of --optimizers with its first-seed rates (study.rate_grids, from the --grid
    items `given` that name an optimizer alone), sorted; one rate is a rate given (design_sweep)."""
    base_lr = base_lr_of(args)
    if not (math.isfinite(base_lr) and base_lr > 0):
        raise UsageError(f"--base_lr {base_lr:g} must be a positive number, such as {DEFAULT_BASE_LR:g}.")
    grids = {o: tuple(sorted(set(g))) for o, g in rate_grids(parse_choices(args.optimizers, OPTIMIZERS, "optimizers"), lrs, given).items()}
    if args.base_lr is not None and list(grids) == [ADAMW]:
        raise UsageError(f"--base_lr {args.base_lr:g} sets the AdamW part beside another optimizer, and --optimizers {args.optimizers!r} has none, "
                         "so it would change nothing; drop it, or add an optimizer to --optimizers.")
    return grids


def is_own_grid(item: str) -> bool:
    """Whether a --grid item names an arm as well as an optimizer (ARM+OPT=...; an optimizer's name holds no '+')."""
    return "+" in item.rpartition("=")[0]


def own_grids(given: list[str], arms: list[Arm], optimizers: list[str]) -> dict[tuple[str, str], tuple[float, ...]]:
    """The --grid items ARM+OPT=R1,... that give one arm with one optimizer a grid of its own (E2:
    MuonH at 0.02 for Pre-LN and 0.01 for the sphere), keyed by (arm, optimizer); the items that name an
    optimizer alone are study.rate_grids'. An arm's slug may hold '+' and '=' itself, so the rates
    follow the last '=' and the optimizer the last '+'."""
    out: dict[tuple[str, str], tuple[float, ...]] = {}
    for item in filter(is_own_grid, given):
        name, _, values = item.rpartition("=")
        arm, _, optimizer = name.rpartition("+")
        if arm not in [a.slug for a in arms] or optimizer not in optimizers or not keeps({"arm": arm, "optimizer": optimizer}):
            raise UsageError(f"--grid {item!r} must be ARM+OPT=R1,R2,... with ARM one of --arms ({', '.join(a.slug for a in arms)}) "
                             f"and OPT one of --optimizers ({', '.join(optimizers)}) that the arm runs with.")
        if (arm, optimizer) in out:  # the later item silently replaced the earlier one
            raise UsageError(f"--grid {name}= is given twice; give one --grid {name}=R1,R2,... with every rate.")
        out[(arm, optimizer)] = tuple(sorted(set(parse_number_list(values, f"grid {name}", float))))
    return out


def base_lr_of(args: argparse.Namespace) -> float:
    """--base_lr, or its default where not given (None: a given value with AdamW alone is refused)."""
    return DEFAULT_BASE_LR if args.base_lr is None else args.base_lr


def design_optimizers(design: Sweep) -> list[str]:
    """The optimizers of a design: its optimizer axis, AdamW where it has none."""
    return list(design.values("optimizer")) if any(a.key == "optimizer" for a in design.axes) else [ADAMW]


def parse_arms(spec: str) -> list[Arm]:
    if spec.strip() == "all":
        return list(ARMS)
    slugs = [s.strip() for s in spec.split(",") if s.strip()]
    if not slugs or any(s not in ARM_BY_SLUG for s in slugs):
        raise UsageError(f"--arms {spec!r} is not valid; give 'all' or a comma-separated subset of: {', '.join(ARM_BY_SLUG)}.")
    if BASELINE not in slugs:
        raise UsageError(f"--arms {spec!r} lacks {BASELINE}: every gap in the table is to Pre-LN of the same block.")
    return [ARM_BY_SLUG[s] for s in dict.fromkeys(slugs)]


def compare_mode(args: argparse.Namespace, overrides: list[str]) -> int | None:
    """--compare, with --gap_against or without: finished sweeps drawn, nothing run; its exit status,
    or None where the command runs the sweep (sweep_main's `instead`)."""
    if args.gap_y is not None and not args.gap_against:
        raise UsageError(f"--gap_y {args.gap_y} sets the gap figure's y-ranges; it needs --gap_against depth, width or tokens with --compare.")
    if args.compare is not None:  # --compare= too: it runs nothing, as any --compare
        blocks, optimizers = parse_choices(args.blocks, BLOCK_TITLES, "blocks"), parse_choices(args.optimizers, OPTIMIZERS, "optimizers")
        folders = [Path(d.strip()) for d in args.compare.split(",") if d.strip()]
        written = (compare_gaps(folders, Path(args.out_dir), blocks, optimizers, args.gap_against, args.band, args.gap_y) if args.gap_against
                   else compare_sweeps(args.compare, folders, Path(args.out_dir), blocks, optimizers))
        print("Written: " + ", ".join(map(str, written)))
        return 0
    if args.gap_against:
        raise UsageError(f"--gap_against {args.gap_against} draws finished sweeps; give them with --compare DIR,DIR,...")
    return None


def first_run(done: Done) -> ParsedConfig:
    """The settings of the design's first run: the model and compile path every arm shares."""
    return parse_train_args(train_argv(done.sweep, plan_points(done.sweep, {})[0], done.place))


def dry_run_line(done: Done) -> None:
    """The dry run's last line (dry_run_summary): the most runs the design can hold, and their time."""
    parsed, args = first_run(done), done.args
    estimate = estimated_run_seconds(parsed.model_config(), args.max_iters, parsed.train.eval_interval, parsed.train.compile,
                                     parsed.train.resolved_compile_scope())
    print(dry_run_summary("fair_sweep", done.place, done.rows, design_size(done.sweep, args.refine, not args.no_neighbours), estimate))


@dataclass(frozen=True)
class Finished:
    """What the figure and the table read of a design that ran: its runs in the table's order, its
    optimizers, its model, its shape in words and the text it trained on (corpus_title)."""

    rows: list[dict[str, Any]]
    optimizers: list[str]
    model: GPTConfig
    shape: str
    corpus: str

    @property
    def several(self) -> bool:
        return self.optimizers != [ADAMW]

    @staticmethod
    def of(done: Done) -> "Finished":
        model, optimizers = first_run(done).model_config(), design_optimizers(done.sweep)
        rows = sorted(done.rows, key=lambda r: (r["block"], r["arm"], optimizers.index(optimizer_of(r)), r["lr"], r["seed"]))
        mup = f", μP from width {model.mup_base_width}" if model.mup_base_width else ""
        shape = f"{model.n_layer} x {model.n_embd}{mup}, {done.args.max_iters} iterations"
        return Finished(rows, optimizers, model, shape, corpus_title(done.place.data_dir))


def loss_figures(done: Done) -> list[Path]:
    """OUT_DIR/fair_sweep.{png,pdf}, none without a run: final val loss (table_metric's) against the rate, with AdamW alone
    one panel per block, with several optimizers a row per block and a column per optimizer (x: its rate key), all on
    one y-range (panel_axes)."""
    f, unigram = Finished.of(done), done.yardsticks.unigram
    if not f.rows:
        return []
    metric = table_metric(f.rows)  # the loss the table reads: the whole split where every run has it
    rows = [{**r, "val_loss": r.get(metric)} for r in f.rows] if metric != "val_loss" else f.rows
    blocks = done.sweep.values("block")
    panels = [[Panel(rows, block, o, unigram, f"{BLOCK_TITLES[block]} block, {OPTIMIZERS[o].title}") for o in f.optimizers] for block in blocks] \
        if f.several else [[Panel(rows, block, ADAMW, unigram, f"{BLOCK_TITLES[block]} block") for block in blocks]]
    against = "each optimizer's rate" if f.several else "the learning rate"
    return panel_figure(panels, f"Final val loss against {against} ({f.shape}, {f.corpus})", done.place.out_dir / "fair_sweep")


def report(done: Done) -> Report:
    """OUT_DIR/fair_sweep.md (each arm at its selected rate: best_rows, then the rules and every run) and its record."""
    f, design, args, place = Finished.of(done), done.sweep, done.args, done.place
    optimizers, several, rows, model = f.optimizers, f.several, f.rows, f.model
    blocks, slugs = list(design.values("block")), design.values("arm")
    seeds, metric = Seeds.of(design.values("seed")), table_metric(rows)
    summary = best_rows(rows, blocks, [ARM_BY_SLUG[s] for s in slugs], seeds, metric, optimizers)
    given = given_rates(design)
    columns = best_columns(several, seeds, ADAMW in optimizers, given) if args.wide else summary_columns(several, seeds, given)
    rest = "" if args.wide else f"\n\n{wide_note(several and ADAMW in optimizers)}"
    text = (f"{f.shape}\n\n{optimizers_note(optimizers, base_lr_of(args), [ARM_BY_SLUG[a] for a in slugs])}{seeds_note(seeds, metric, args.refine, given)} "
            f"{kernel_paths_line(rows, args.mix_kernel_paths)}\n\n{summary_title(several, given)}\n\n"
            f"{markdown_table(summary, columns)}{rest}\n\n{rule_lines(declared_rules(place), rule_verdicts(summary, several), place.declared)}\n\n"
            f"Every run:\n\n{markdown_table(rows, run_columns(several, metric))}\n")
    grids = design_grids(design)
    record = {"arm_grids": arm_grids_of(design), "n_layer": model.n_layer, "n_embd": model.n_embd, "corpus": f.corpus, "shape": f.shape, **done.yardsticks.record(), "max_iters": args.max_iters, "warmup_iters": args.warmup_iters, "lrs": list(grids.get(ADAMW, ())),
              "optimizers": optimizers, "grids": grids, "base_lr": base_lr_of(args), "seeds": list(design.values("seed")), "selection_seed": seeds.selection,
              "held_out_seeds": list(seeds.held_out), "refine": args.refine, "neighbours": not args.no_neighbours, "metric": metric, "best": summary, "runs": rows}
    return "fair_sweep", text, record


def compare_sweeps(spec: str, folders: list[Path], out_dir: Path, blocks: list[str], optimizers: list[str]) -> list[Path]:
    """--compare DIR,DIR,... (spec, naming folders): the runs of finished sweeps in `blocks` with `optimizers`, a row of
    panels per sweep (a width, say) and a column per block and optimizer that some sweep ran, as OUT_DIR/fair_sweep_compare.{png,pdf}."""
    records = [(folder, judged_record(folder)) for folder in folders]
    if len(records) < 2:
        raise UsageError(f"--compare {spec!r} names {len(records)} sweep folder(s); give two or more, comma-separated.")
    for folder, record in records:
        if not isinstance(record.get("runs"), list):  # the declaration alone, written before the runs (a run record may ship it)
            raise UsageError(f"--compare: {folder / 'fair_sweep.json'} holds no tabulated runs (a sweep's declaration, written "
                             f"before its runs); run --table_only in {folder} to tabulate them.")
    columns = [(b, o) for b in blocks for o in optimizers
               if any(r["block"] == b and optimizer_of(r) == o for _, rec in records for r in rec["runs"])]
    if not columns:
        raise UsageError(f"--compare: none of {spec!r} holds a run in block {' or '.join(blocks)} with optimizer "
                         f"{' or '.join(optimizers)}; choose --blocks and --optimizers from the ones those sweeps ran.")
    several = optimizers != [ADAMW]
    panels = [[Panel(record["runs"], block, opt, record["unigram_loss"],
                     f"{BLOCK_TITLES[block]} block, {OPTIMIZERS[opt].title + ', ' if several else ''}{record.get('shape', folder.name)}")
               for block, opt in columns] for folder, record in records]
    out_dir.mkdir(parents=True, exist_ok=True)
    against = "each optimizer's rate" if several else "the learning rate, AdamW"
    corpora = ", ".join(dict.fromkeys(record.get("corpus", "Tiny Shakespeare characters") for _, record in records))  # older records: Shakespeare's
    return panel_figure(panels, f"Final val loss against {against} ({corpora})", out_dir / "fair_sweep_compare")


def compare_gaps(folders: list[Path], out_dir: Path, blocks: list[str], optimizers: list[str], against: str, band: float,
                 y_range: str | None = None) -> list[Path]:
    """--compare DIR,... --gap_against AXIS: each arm's held-out gaps to Pre-LN in finished sweeps
    against their depth, width or tokens seen (gap_figure), as OUT_DIR/gap_vs_<axis>.{png,pdf}."""
    points = [p for folder in folders for p in gap_points(judged_record(folder), against, str(folder))
              if p.block in blocks and p.optimizer in optimizers]
    loss = ", periodic evaluations" if against == "tokens" else ""
    return gap_figure(points, against, f"Held-out gap to Pre-LN against {GAP_AXES[against][1]}, each arm at its own rate "
                      f"({len(folders)} sweep{'s' if len(folders) > 1 else ''}{loss})", out_dir / f"gap_vs_{against}",
                      {a.slug: a.method for a in ARMS}, band or None, y_range)


def read_sweep_record(folder: Path) -> dict[str, Any]:
    """A finished sweep's fair_sweep.json, or one sentence saying what to run first."""
    path = folder / "fair_sweep.json"
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--compare: {folder} is a file, not a sweep's folder; give the --out_dir folders of finished sweeps.")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--compare: {path} does not exist; run the sweep (or its --table_only) in {folder} first.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"--compare: {path} is not a fair sweep's JSON record ({e}); run --table_only in {folder} to write it again.") from None
    except OSError as e:  # a folder in its place, a file where a folder of its path should be, no permission
        raise UsageError(f"--compare: {path} cannot be read ({e.strerror or e}); give the --out_dir folders of finished sweeps.") from None


def judged_record(folder: Path) -> dict[str, Any]:
    """A finished sweep's record (read_sweep_record) with its runs judged for a stall (grid.STALLED): as written where it
    holds a bigram_loss; one from before the status judged against the bigram loss of the data folder its runs trained
    on (rejudged); where that folder is not here, as written, and one line says so."""
    record = checked_record(read_sweep_record(folder), folder)
    if "bigram_loss" in record or not record.get("runs"):
        return record
    data_dir = trained_data_dir(folder, record["runs"])
    if data_dir is None:
        print(f"note: {folder / 'fair_sweep.json'} predates the '{STALLED}' status and the data folder its runs trained on is not "
              f"here, so stalls cannot be judged for that record; its runs are drawn as recorded.")
        return record
    judged = rejudged(record, bigram_loss(data_dir))
    count = sum(r["status"] == STALLED for r in judged["runs"])
    print(f"note: {folder / 'fair_sweep.json'} predates the '{STALLED}' status; its runs were judged against the bigram loss "
          f"{judged['bigram_loss']:.3f} of {data_dir}: {count} stalled.")
    return judged


def checked_record(record: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The record with each run whose files no longer match its digests (study.record_mismatch_lines)
    named in one line, marked unverified, and its arm's summary row left out of the comparison."""
    lines = record_mismatch_lines(record, folder)
    for line in lines.values():
        print(line, flush=True)
    bad = {i for i in lines if i >= 0}
    if not bad:
        return record
    runs = [{**r, "status": UNVERIFIED, "val_loss": None, "val_loss_full": None} if i in bad else r for i, r in enumerate(record["runs"])]
    arms = {(runs[i].get("block"), runs[i].get("arm"), optimizer_of(runs[i])) for i in bad}
    best = [s for s in record.get("best") or [] if (s.get("block"), s.get("arm"), s.get("optimizer", ADAMW)) not in arms]
    return {**record, "runs": runs, "best": best}


def trained_data_dir(folder: Path, runs: list[dict[str, Any]]) -> Path | None:
    """The prepared data folder a sweep's runs trained on (the first run's config.json that names one holding a meta.json), or None."""
    for row in runs:
        config = run_file(folder, row, CONFIG_NAME)
        data_dir = json.loads(config.read_text(encoding="utf-8")).get("data_dir") if config else None
        if data_dir and (Path(data_dir) / "meta.json").is_file():
            return Path(data_dir)
    return None


def rejudged(record: dict[str, Any], bigram: float) -> dict[str, Any]:
    """The record with each "ok" run whose final loss lies above `bigram` stalled, and its summary
    ("best": selection, held-out cells, gaps) rebuilt from those runs as the table builds it (best_rows)."""
    unigram = record.get("unigram_loss")
    runs = [{**r, "status": STALLED, "reason": stall_reason(r, bigram, unigram)} if r["status"] == "ok" and is_stalled(r, bigram) else r
            for r in record["runs"]]
    best = record.get("best", [])
    blocks = list(dict.fromkeys(s["block"] for s in best))
    arms = [ARM_BY_SLUG[a] for a in dict.fromkeys(s["arm"] for s in best)]
    seeds = Seeds(record["selection_seed"], tuple(record["held_out_seeds"])) if "selection_seed" in record else Seeds.of(record["seeds"])
    summary = best_rows(runs, blocks, arms, seeds, record.get("metric", "val_loss"), record.get("optimizers", [ADAMW]))
    return {**record, "bigram_loss": bigram, "runs": runs, "best": summary}


def given_rates(design: Sweep) -> str:
    """'all' when every arm's grid is one rate (a rate given, none chosen), 'some' when some are, else ''."""
    sizes = [len(grid) for grid in arm_grids_of(design).values()]
    return "all" if all(n == 1 for n in sizes) else "some" if 1 in sizes else ""


def seeds_note(seeds: Seeds, metric: str, refine: bool, given: str = "") -> str:
    """The table's line on how its numbers were chosen: the selection and held-out seeds, the grid, the loss;
    given (given_rates): whether the arms' rates were given rather than chosen."""
    held = ", ".join(map(str, seeds.held_out)) or "none"
    grid = " on the grid refined by the midpoints beside its best" if refine else ""
    chosen = {"all": f"Each arm runs at the one rate its grid gives (none is chosen), seed {seeds.selection} beside the held-out seeds",
              "some": f"Each arm's rate is chosen on seed {seeds.selection} alone, except where its grid gives one rate (none is chosen there)"}
    how = chosen.get(given, f"Each arm's rate is chosen on seed {seeds.selection} alone{grid}")
    return (f"{how}; the headline is the held-out seeds' ({held}) mean there, "
            f"the gap is paired by held-out seed, each arm at its own rate. Loss: {METRIC_TEXT[metric]}.")


def optimizers_note(optimizers: list[str], base_lr: float, arms: list[Arm]) -> str:
    """The table's line on what the rate is, with optimizers other than AdamW; empty with AdamW alone."""
    if optimizers == [ADAMW]:
        return ""
    keys = ", ".join(f"{OPTIMIZERS[o].title} {OPTIMIZERS[o].rate_key}" for o in optimizers)
    radius = f"; the Hyperball optimizers at hyperball_radius {HYPERBALL_RADIUS:g}" if any(map(is_hyperball, optimizers)) else ""
    ngpt = "; nGPT runs with AdamW alone" if any(arm.ngpt_recipe for arm in arms) else ""
    return (f"The rate is each optimizer's rate key ({keys}); beside another optimizer than AdamW, AdamW's part runs at "
            f"learning_rate {base_lr:g}{radius}{ngpt}.\n\n")


def main(argv: list[str] | None = None) -> int:
    return sweep_main(design_of, argv, __doc__, options=options, figures=loss_figures, report=report, dry_run=dry_run_line, instead=compare_mode)
