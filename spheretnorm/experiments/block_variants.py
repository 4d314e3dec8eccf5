"""nGPT, and the connections in LLaMA's block, in the depth study's CPU setting.

    python scripts/block_study.py                       # seeds 1337,1338: 8 variants each (3 are nGPT rates)
    python scripts/block_study.py --seeds 1337          # one seed
    python scripts/block_study.py --table_only          # the table of the runs already there

The setting is scripts/depth_study.py's: 24 layers x 128 wide (4 heads) on Tiny Shakespeare
characters, block 64, batch 12, 800 iterations, AdamW (0.9, 0.99), evaluations every 100
iterations on 10 batches per split, the collapse alarm on. The variants:
- GPT-2 block, the depth study's recipe (warm-up 400, peak lr 1e-3, cosine to 1e-4, weight
  decay 0.1): Pre-LN, 0.5-SpheretNorm, GeoNorm;
- GPT-2 block, nGPT with its paper's recipe (no warm-up, no weight decay, cosine to 0) at each
  peak learning rate of --ngpt_lrs, so that it is compared at its own best;
- LLaMA block (RMSNorm, SwiGLU, RoPE, no biases), the depth study's recipe: Pre-LN, 0.5-SpheretNorm.

Runs go to OUT_DIR/seed<S>/<block>/<method>[-lr<LR>]/ (a finished or stopped run is reused).
Writes OUT_DIR/block_study.md (one row per run: val loss, its gap to the same seed's Pre-LN in
the same block, the diagnostics of the last evaluation, ms per step; then the seeds' summary),
OUT_DIR/block_study.json, and prints the table.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from spheretnorm.experiments.depth import seeds_report
from spheretnorm.experiments.grid import BLOCK_TITLES, CONFIG_NAME, check_overrides, load_run
from spheretnorm.experiments.study import (
    CPU_MODEL, RESERVED, Axis, Column, Point, Sweep, add_length_options, add_place_options, add_seed_option, diagnostic_columns,
    parse_number_list, sweep_main,
)
from spheretnorm.runtime.methods import display_name, method_dirname

BASELINE = "pre_ln"
PAPER_RECIPE: dict[str, Any] = {  # scripts/depth_study.py's, at warm-up 400
    "batch_size": 12,
    "global_batch_size": 12,
    "beta2": 0.99,
    "learning_rate": 1e-3,
    "min_lr": 1e-4,
    "warmup_iters": 400,
    "weight_decay": 0.1,
    "dropout": 0.0,
}
# nGPT's paper trains without warm-up or weight decay and decays the lr to 0 (NVIDIA/ngpt).
NGPT_RECIPE: dict[str, Any] = {**PAPER_RECIPE, "min_lr": 0.0, "warmup_iters": 0, "weight_decay": 0.0}
GPT2_METHODS = ("pre_ln", "p_spheret:0.5", "geonorm")
LLAMA_METHODS = ("pre_ln", "p_spheret:0.5")


def variants(ngpt_lrs: list[float]) -> tuple[dict[str, Any], ...]:
    """The paper's recipe in GPT-2's block, nGPT's own at each of its peak learning rates, then LLaMA's block."""
    return (
        *({"method": m, "block": "gpt2", "ngpt_lr": None} for m in GPT2_METHODS),
        *({"method": "ngpt", "block": "gpt2", "ngpt_lr": lr} for lr in ngpt_lrs),
        *({"method": m, "block": "llama", "ngpt_lr": None} for m in LLAMA_METHODS),
    )


def recipe(p: Point) -> dict[str, Any]:
    lr = p["ngpt_lr"]
    return {**(PAPER_RECIPE if lr is None else {**NGPT_RECIPE, "learning_rate": lr}), "config_name": f"block_study_seed{p['seed']}"}


def variant_name(p: Point) -> str:
    lr = f", lr {p['ngpt_lr']:g}" if p["ngpt_lr"] is not None else ""
    return f"{display_name(p['method'])} ({BLOCK_TITLES[p['block']]}{lr})"


def ms_per_step(p: Point, out_dir: Path) -> dict[str, float | None]:
    """Median wall-clock of a training step in ms, from the train rows' tokens per second."""
    run = load_run(out_dir) if (out_dir / CONFIG_NAME).is_file() else None
    tokens_per_step = run.config.get("global_batch_size", 0) * run.config.get("block_size", 0) if run else 0
    rates = [r["tokens_per_s"] for r in run.of_kind("train") if r.get("tokens_per_s")] if run else []
    return {"ms_per_step": 1000.0 * tokens_per_step / statistics.median(rates) if rates and tokens_per_step else None}


def block_sweep(seeds: list[int], ngpt_lrs: list[float], max_iters: int, eval_interval: int) -> Sweep:
    """Seed-major, so that a study cut short has whole seeds."""
    return Sweep(
        name="block_study",
        base={**CPU_MODEL, "max_iters": max_iters, "lr_decay_iters": max_iters, "eval_interval": eval_interval},
        axes=(Axis("seed", tuple(seeds)), Axis("variant", variants(ngpt_lrs))),
        folder=lambda p: f"seed{p['seed']}/{p['block']}/{method_dirname(p['method'])}" + (f"-lr{p['ngpt_lr']:g}" if p["ngpt_lr"] is not None else ""),
        settings=recipe,
        label=variant_name,
        baseline=lambda p: p.but(method=BASELINE, ngpt_lr=None),
        columns=(Column("variant", "name", align=":--"), Column("seed", "seed"), Column("val loss", "val_loss", ".3f"),
                 Column("minus Pre-LN", "gap", "+.3f"), *diagnostic_columns(), Column("ms/step", "ms_per_step", ".0f"),
                 Column("status", "status", align=":--")),
        extra=ms_per_step,
        diagnostics=True,
    )


def options(p: argparse.ArgumentParser) -> None:
    add_seed_option(p)
    p.add_argument("--ngpt_lrs", default="1e-3,3e-3,1e-2", help="nGPT's peak learning rates (default 1e-3,3e-3,1e-2)")
    add_length_options(p, 800, eval_interval=100)
    add_place_options(p, "out/block_study")


def design(args: argparse.Namespace, overrides: list[str]) -> Sweep:
    fixed = {k: "nothing (fixed by this study)" for k in (*PAPER_RECIPE, "block", "connection", "learning_rate", "lr_decay_iters")}
    check_overrides(overrides, {**RESERVED, **fixed, "seed": "--seeds", "max_iters": "--max_iters"})
    return block_sweep(parse_number_list(args.seeds, "seeds", int), parse_number_list(args.ngpt_lrs, "ngpt_lrs", float),
                       args.max_iters, args.eval_interval)


def main(argv: list[str] | None = None) -> int:
    return sweep_main(design, argv, __doc__, options=options, report=seeds_report("Pre-LN of the same block"))
