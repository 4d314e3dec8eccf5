"""Depth study on a CPU: what the residual stream does at 24 layers, per method, with the diagnostics.

    python scripts/depth_study.py                                    # warm-up 400, seeds 1337,1338, + ablation
    python scripts/depth_study.py --warmup_iters 100 --seeds 1337 --ablation none --out_dir out/depth_study_wu100
    python scripts/depth_study.py --table_only                       # the table of the runs already there

nanoGPT's CPU recipe at depth: 24 layers x 128 wide (4 heads) on Tiny Shakespeare characters,
block 64, batch 12, AdamW (0.9, 0.99), peak lr 1e-3 after --warmup_iters, cosine to 1e-4 at
--max_iters, dropout 0; Pre-LN, Peri-LN and the four sphere methods, one run per seed, plus the
layer-index ablation (alpha_index=sublayer, for 0.5-SpheretNorm). Every run keeps train.py's
collapse alarm on, so a collapsing run stops (status "stopped: collapse") and its last
evaluation is the one reported.

Runs go to OUT_DIR/seed<S>/<method>[+alpha_index=sublayer]/ (a finished or stopped run is
reused). Writes OUT_DIR/depth_study.md (one row per run: val loss, final_cosine and the
diagnostics of its last evaluation), OUT_DIR/depth_study.json and the per-layer heatmaps
OUT_DIR/figures/diagnostics_<name>.png (scripts/plot.py), and prints the table.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from spheretnorm.experiments import figures as plot
from spheretnorm.experiments.grid import CONFIG_NAME, check_overrides, load_run
from spheretnorm.experiments.study import (
    CPU_MODEL, RESERVED, Axis, Column, Done, Point, Report, Sweep, add_length_options, add_methods_option, add_place_options,
    add_seed_option, diagnostic_columns, parse_number_list, runs_text, sweep_main,
)
from spheretnorm.runtime.methods import display_name, method_dirname, parse_methods

DEFAULT_METHODS = "pre_ln,peri_ln,geonorm,p_spheret:0.5,proj_spheret,cay_spheret"
ABLATION_METHOD = "p_spheret:0.5"
RECIPE: dict[str, Any] = {
    "batch_size": 12,
    "global_batch_size": 12,
    "beta2": 0.99,
    "learning_rate": 1e-3,
    "min_lr": 1e-4,
    "dropout": 0.0,
}


def ablation_suffix(p: Point, sep: str) -> str:
    return f"{sep}alpha_index=sublayer" if p["alpha_index"] == "sublayer" else ""


def depth_sweep(methods: list[str], seeds: list[int], ablation: bool, warmup: int, max_iters: int, eval_interval: int) -> Sweep:
    """Seed-major, so that a study cut short has whole seeds; the ablation ends each seed."""
    variants = [{"method": m, "alpha_index": "block"} for m in methods]
    variants += [{"method": ABLATION_METHOD, "alpha_index": "sublayer"}] if ablation else []
    schedule = {"warmup_iters": warmup, "max_iters": max_iters, "lr_decay_iters": max_iters, "eval_interval": eval_interval}
    return Sweep(
        name="depth_study",
        base={**CPU_MODEL, **RECIPE, **schedule},
        axes=(Axis("seed", tuple(seeds)), Axis("method", tuple(variants))),
        folder=lambda p: f"seed{p['seed']}/{method_dirname(p['method'])}{ablation_suffix(p, '+')}",
        settings=lambda p: {"config_name": f"depth_study_seed{p['seed']}"},
        label=lambda p: display_name(p["method"]) + (f" ({ablation_suffix(p, '')})" if p["alpha_index"] == "sublayer" else ""),
        baseline=lambda p: p.but(method="pre_ln", alpha_index="block"),
        columns=(Column("method", "name", align=":--"), Column("seed", "seed"), Column("val loss", "val_loss", ".3f"),
                 *diagnostic_columns(), Column("status", "status", align=":--"), Column("last eval", "last_eval_iter", "d")),
        diagnostics=True,
    )


def options(p: argparse.ArgumentParser) -> None:
    add_methods_option(p, DEFAULT_METHODS)
    add_seed_option(p)
    p.add_argument("--ablation", choices=("sublayer", "none"), default="sublayer", help=f"also run {ABLATION_METHOD} with alpha_index=sublayer (default), or not")
    add_length_options(p, 800, warmup_iters=400, eval_interval=100)
    add_place_options(p, "out/depth_study")


def design(args: argparse.Namespace, overrides: list[str]) -> Sweep:
    check_overrides(overrides, {**RESERVED, "seed": "--seeds", "alpha_index": "--ablation", "warmup_iters": "--warmup_iters", "max_iters": "--max_iters"})
    return depth_sweep(parse_methods(args.methods), parse_number_list(args.seeds, "seeds", int), args.ablation == "sublayer",
                       args.warmup_iters, args.max_iters, args.eval_interval)


def diagnostic_figures(done: Done) -> list[Path]:
    """The per-layer heatmaps of the runs found (scripts/plot.py's), OUT_DIR/figures/diagnostics_<name>.png."""
    found = [load_run(Path(r["out_dir"])) for r in done.rows if (Path(r["out_dir"]) / CONFIG_NAME).is_file()]
    out = done.place.out_dir
    return plot.plot_diagnostics(found, f"{out.name}: 24 x 128", out / "figures" / "diagnostics") if found else []


def seeds_report(baseline_title: str) -> Callable[[Done], Report]:
    """<name>.md: the runs, each seed paired with its baseline, then the seeds' summary; the record:
    the yardsticks and the rows (the depth and block studies)."""
    return lambda done: (done.sweep.name, runs_text(done.sweep, done.rows, baseline_title), {**done.yardsticks.record(), "runs": done.rows})


def main(argv: list[str] | None = None) -> int:
    return sweep_main(design, argv, __doc__, options=options, figures=diagnostic_figures, report=seeds_report(display_name("pre_ln")))
