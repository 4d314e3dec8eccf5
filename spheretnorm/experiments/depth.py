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

import sys
from pathlib import Path


import argparse
from dataclasses import dataclass
from typing import Any

from spheretnorm.experiments import figures as plot
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
from spheretnorm.runtime.cli import HelpFormatter
from spheretnorm.experiments.grid import CONFIG_NAME, check_overrides, load_run, parse_methods, unigram_loss
from spheretnorm.runtime.methods import display_name, method_args
from spheretnorm.runtime.config import method_dirname

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


@dataclass
class StudyRun:
    method: str
    seed: int
    alpha_index: str  # 'block' (the default) or 'sublayer' (the ablation)

    @property
    def label(self) -> str:
        extra = " alpha_index=sublayer" if self.alpha_index == "sublayer" else ""
        return f"{self.method}{extra} seed {self.seed}"

    @property
    def dirname(self) -> str:
        extra = "+alpha_index=sublayer" if self.alpha_index == "sublayer" else ""
        return f"seed{self.seed}/{method_dirname(self.method)}{extra}"

    def args(self, warmup: int, max_iters: int, eval_interval: int) -> list[str]:
        settings = {
            **CPU_MODEL,
            **RECIPE,
            "warmup_iters": warmup,
            "max_iters": max_iters,
            "lr_decay_iters": max_iters,
            "eval_interval": eval_interval,
            "seed": self.seed,
            "alpha_index": self.alpha_index,
        }
        return as_args(settings) + method_args(self.method)


def plan_runs(methods: list[str], seeds: list[int], ablation: bool) -> list[StudyRun]:
    """Seed-major, so a study cut short has whole seeds."""
    runs = []
    for seed in seeds:
        runs += [StudyRun(m, seed, "block") for m in methods]
        if ablation:
            runs.append(StudyRun(ABLATION_METHOD, seed, "sublayer"))
    return runs


# -----------------------------------------------------------------------------
# The table


def result_row(run: StudyRun, result: JobResult, unigram: float) -> dict[str, Any]:
    """The outcome of one run (study.outcome) and the diagnostics of its last evaluation."""
    base = outcome(result, unigram)
    out_dir = result.job.out_dir
    final = load_run(out_dir).final_eval if (out_dir / CONFIG_NAME).is_file() else None
    return {
        "method": run.method,
        "seed": run.seed,
        "alpha_index": run.alpha_index,
        **base,
        **(diagnostic_summary(final) if final else {}),
    }


def study_table(rows: list[dict[str, Any]]) -> str:
    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [
        f"| method | seed | val loss | {' | '.join(c.header for c in summary_columns())} | status | last eval |",
        "|:--|--:|--:|" + "--:|" * len(summary_columns()) + ":--|--:|",
    ]
    for r in rows:
        name = display_name(r["method"]) + (" (alpha_index=sublayer)" if r["alpha_index"] == "sublayer" else "")
        lines.append(
            f"| {name} | {r['seed']} | {num(r['val_loss'], '.3f')} | {' | '.join(summary_cells(r))} | {r['status']} | "
            f"{num(r['last_eval_iter'], 'd')} |"
        )
    return "\n".join(lines)


def seed_summary(rows: list[dict[str, Any]], baseline: str = "pre_ln") -> str:
    """Val loss per method over the seeds, with the gap to the same seed's baseline run
    (study.paired_seed_summary). Empty with one seed."""

    def name(method: str, alpha_index: str) -> str:
        return display_name(method) + (" (alpha_index=sublayer)" if alpha_index == "sublayer" else "")

    named = [{**r, "name": name(r["method"], r["alpha_index"]), "baseline": name(baseline, "block")} for r in rows]
    return paired_seed_summary(named, display_name(baseline))


# -----------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter, epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False
    )
    p.add_argument("--methods", default=DEFAULT_METHODS, help=f"comma-separated methods (default {DEFAULT_METHODS})")
    p.add_argument("--seeds", default="1337,1338", help="comma-separated seeds (default 1337,1338)")
    p.add_argument("--ablation", choices=("sublayer", "none"), default="sublayer", help=f"also run {ABLATION_METHOD} with alpha_index=sublayer (default), or not")
    p.add_argument("--warmup_iters", type=int, default=400, help="linear warm-up iterations (default 400)")
    add_run_options(p, "out/depth_study")
    add_common_options(p)
    return p.parse_known_args(argv)


def study(args: argparse.Namespace, overrides: list[str]) -> int:
    check_overrides(overrides, {**RESERVED, "seed": "--seeds", "alpha_index": "--ablation", "warmup_iters": "--warmup_iters", "max_iters": "--max_iters"})
    methods = parse_methods(args.methods)
    runs = plan_runs(methods, parse_number_list(args.seeds, "seeds", int), args.ablation == "sublayer")
    out_dir, data_dir = Path(args.out_dir), Path(args.data_dir)
    ensure_data(data_dir, args.input)
    jobs = []
    for run in runs:
        argv = run.args(args.warmup_iters, args.max_iters, args.eval_interval) + overrides
        argv += [f"--data_dir={data_dir}", f"--out_dir={out_dir / run.dirname}", f"--config_name=depth_study_seed{run.seed}"]
        jobs.append(make_job(run.label, argv, out_dir / run.dirname))
    runs, results = run_or_find(runs, jobs, args.table_only, args.jobs, args.threads)
    unigram = unigram_loss(data_dir)
    rows = [result_row(run, result, unigram) for run, result in zip(runs, results)]
    found = [load_run(r.job.out_dir) for r in results if (r.job.out_dir / CONFIG_NAME).is_file()]
    if found:
        plot.plot_diagnostics(found, f"{out_dir.name}: 24 x 128", out_dir / "figures" / "diagnostics")
    write_study(out_dir, "depth_study", rows, study_table(rows), seed_summary(rows), unigram)
    return exit_status(rows)


def main(argv: list[str] | None = None) -> int:
    return study_main(parse_args, study, argv)
