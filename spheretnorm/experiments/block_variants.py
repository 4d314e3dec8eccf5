"""nGPT, and the connections in LLaMA's block, in the depth study's CPU setting.

    python scripts/block_study.py                       # seeds 1337,1338: 10 variants each
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
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spheretnorm.experiments.grid import CONFIG_NAME, check_overrides, load_run, unigram_loss
from spheretnorm.runtime.cli import HelpFormatter
from spheretnorm.runtime.methods import display_name, method_args
from spheretnorm.runtime.config import method_dirname
from spheretnorm.experiments.study import (
    CPU_MODEL,
    RESERVED,
    JobResult,
    add_common_options,
    add_run_options,
    as_args,
    diagnostic_summary,
    summary_cells,
    summary_columns,
    ensure_data,
    exit_status,
    make_job,
    outcome,
    paired_seed_summary,
    parse_number_list,
    run_or_find,
    study_main,
    write_study,
)

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
BLOCK_TITLES = {"gpt2": "GPT-2", "llama": "LLaMA"}
GPT2_METHODS = ("pre_ln", "p_spheret:0.5", "geonorm")
LLAMA_METHODS = ("pre_ln", "p_spheret:0.5")


@dataclass(frozen=True)
class Variant:
    method: str
    block: str
    ngpt_lr: float | None = None  # the peak lr of an nGPT run (its own recipe); None: the paper's recipe

    @property
    def name(self) -> str:
        lr = f", lr {self.ngpt_lr:g}" if self.ngpt_lr is not None else ""
        return f"{display_name(self.method)} ({BLOCK_TITLES[self.block]}{lr})"

    @property
    def baseline(self) -> "Variant":
        return Variant(BASELINE, self.block)

    def dirname(self, seed: int) -> str:
        lr = f"-lr{self.ngpt_lr:g}" if self.ngpt_lr is not None else ""
        return f"seed{seed}/{self.block}/{method_dirname(self.method)}{lr}"

    def args(self, seed: int, max_iters: int, eval_interval: int) -> list[str]:
        recipe = PAPER_RECIPE if self.ngpt_lr is None else {**NGPT_RECIPE, "learning_rate": self.ngpt_lr}
        settings = {
            **CPU_MODEL,
            **recipe,
            "block": self.block,
            "max_iters": max_iters,
            "lr_decay_iters": max_iters,
            "eval_interval": eval_interval,
            "seed": seed,
        }
        return as_args(settings) + method_args(self.method)


def plan_variants(ngpt_lrs: list[float]) -> list[Variant]:
    return [
        *(Variant(m, "gpt2") for m in GPT2_METHODS),
        *(Variant("ngpt", "gpt2", lr) for lr in ngpt_lrs),
        *(Variant(m, "llama") for m in LLAMA_METHODS),
    ]


# -----------------------------------------------------------------------------
# The table


def ms_per_step(out_dir: Path) -> float | None:
    """Median wall-clock of a training step in ms, from the train rows' tokens per second."""
    run = load_run(out_dir)
    tokens_per_step = run.config.get("global_batch_size", 0) * run.config.get("block_size", 0)
    rates = [r["tokens_per_s"] for r in run.of_kind("train") if r.get("tokens_per_s")]
    return 1000.0 * tokens_per_step / statistics.median(rates) if rates and tokens_per_step else None


def result_row(variant: Variant, seed: int, result: JobResult, unigram: float) -> dict[str, Any]:
    out_dir = result.job.out_dir
    found = (out_dir / CONFIG_NAME).is_file()
    final = load_run(out_dir).final_eval if found else None
    return {
        "name": variant.name,
        "baseline": variant.baseline.name,
        "method": variant.method,
        "block": variant.block,
        "ngpt_lr": variant.ngpt_lr,
        "seed": seed,
        **outcome(result, unigram),
        **(diagnostic_summary(final) if final else {}),
        "ms_per_step": ms_per_step(out_dir) if found else None,
    }


def study_table(rows: list[dict[str, Any]]) -> str:
    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    base = {(r["name"], r["seed"]): r["val_loss"] for r in rows}
    lines = [
        f"| variant | seed | val loss | minus Pre-LN | {' | '.join(c.header for c in summary_columns())} | ms/step | status |",
        "|:--|--:|--:|--:|" + "--:|" * len(summary_columns()) + "--:|:--|",
    ]
    for r in rows:
        reference = base.get((r["baseline"], r["seed"]))
        gap = r["val_loss"] - reference if r["val_loss"] is not None and reference is not None else None
        lines.append(
            f"| {r['name']} | {r['seed']} | {num(r['val_loss'], '.3f')} | {num(gap, '+.3f')} | {' | '.join(summary_cells(r))} | "
            f"{num(r['ms_per_step'], '.0f')} | {r['status']} |"
        )
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter, epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False
    )
    p.add_argument("--seeds", default="1337,1338", help="comma-separated seeds (default 1337,1338)")
    p.add_argument("--ngpt_lrs", default="1e-3,3e-3,1e-2", help="nGPT's peak learning rates (default 1e-3,3e-3,1e-2)")
    add_run_options(p, "out/block_study")
    add_common_options(p)
    return p.parse_known_args(argv)


def study(args: argparse.Namespace, overrides: list[str]) -> int:
    fixed = {k: "nothing (fixed by this study)" for k in (*PAPER_RECIPE, "block", "connection", "learning_rate", "lr_decay_iters")}
    check_overrides(overrides, {**RESERVED, **fixed, "seed": "--seeds", "max_iters": "--max_iters"})
    variants = plan_variants(parse_number_list(args.ngpt_lrs, "ngpt_lrs", float))
    runs = [(v, seed) for seed in parse_number_list(args.seeds, "seeds", int) for v in variants]  # seed-major
    out_dir, data_dir = Path(args.out_dir), Path(args.data_dir)
    ensure_data(data_dir, args.input)
    jobs = []
    for variant, seed in runs:
        run_dir = out_dir / variant.dirname(seed)
        argv = variant.args(seed, args.max_iters, args.eval_interval) + overrides
        argv += [f"--data_dir={data_dir}", f"--out_dir={run_dir}", f"--config_name=block_study_seed{seed}"]
        jobs.append(make_job(f"{variant.name} seed {seed}", argv, run_dir))
    runs, results = run_or_find(runs, jobs, args.table_only, args.jobs, args.threads)
    unigram = unigram_loss(data_dir)
    rows = [result_row(variant, seed, result, unigram) for (variant, seed), result in zip(runs, results)]
    write_study(out_dir, "block_study", rows, study_table(rows), paired_seed_summary(rows, "Pre-LN of the same block"), unigram)
    return exit_status(rows)


def main(argv: list[str] | None = None) -> int:
    return study_main(parse_args, study, argv)
