"""The whole pipeline on a CPU: every method on a deep, narrow model, then the tables and the figure.

    python scripts/reproduce_cpu.py                                  # the paper's 8 methods
    python scripts/reproduce_cpu.py --methods pre_ln,proj_spheret --max_iters 100
    python scripts/reproduce_cpu.py --learning_rate=3e-3 --out_dir out/cpu_repro_lr3e-3   # any train.py key

Trains each method (24 layers x 128 wide, Tiny Shakespeare characters, block 64, batch 16) with
one learning rate and one warm-up for all, two runs at a time on one thread each, then writes
OUT_DIR/tables.{md,tex} (the paper's Tables 2 and 3 for these runs), OUT_DIR/figures/*.{png,pdf}
(loss curves, as the paper's Figures 2 and 3), OUT_DIR/summary.json, and prints the tables,
each run's outcome (ok / stuck at unigram / diverged) and the wall-clock time. On 2 cores the default
took 15 minutes (results in docs/EXPERIMENTS.md).

Runs go to OUT_DIR/shakespeare_char_24x128/<method>/ (train.log beside metrics.jsonl); a run
that already finished with the same settings is reused, so an interrupted reproduction resumes.
"""

from __future__ import annotations

import sys
from pathlib import Path


import argparse
import json
import time
from dataclasses import asdict
from typing import Any

from spheretnorm.experiments import figures as plot, tabulate as tables
from spheretnorm.experiments.study import (
    CPU_MODEL,
    exit_status,
    study_main,
    DATASET,
    RESERVED,
    JobResult,
    add_common_options,
    as_args,
    ensure_data,
    make_job,
    outcome,
    parse_train_args,
    run_jobs,
    study_name,
    wall_clock_line,
)
from spheretnorm.runtime.cli import HelpFormatter
from spheretnorm.experiments.grid import COLLAPSE_MARGIN, STUCK_AT_UNIGRAM, check_overrides, parse_methods, unigram_loss
from spheretnorm.runtime.cli import UsageError
from spheretnorm.runtime.methods import display_name, method_args, scale_of
from spheretnorm.runtime.config import method_dirname
from spheretnorm.runtime.config import ParsedConfig

# One schedule for every method: peak LR, its warm-up, cosine decay to a tenth by the end.
SCHEDULE: dict[str, Any] = {"learning_rate": 1e-3, "min_lr": 1e-4, "warmup_iters": 100}
DEFAULT_MAX_ITERS = 400
EVALS_PER_RUN = 8


def base_args(max_iters: int, overrides: list[str]) -> list[str]:
    """train.py arguments shared by every method; the user's --key=value come last and win."""
    settings = {
        **CPU_MODEL,
        **SCHEDULE,
        "max_iters": max_iters,
        "lr_decay_iters": max_iters,
        "eval_interval": max(1, max_iters // EVALS_PER_RUN),
    }
    return as_args(settings) + overrides


def settings_text(parsed: ParsedConfig, data_meta: dict[str, Any], jobs: int, threads: int) -> str:
    """The settings every method shares, in words, for the output and the summary."""
    t, m = parsed.train, parsed.model_config()
    return (
        f"Every method: {m.n_layer} layers x {m.n_embd} wide ({m.n_head} heads), block {m.block_size}, "
        f"batch {t.global_batch_size}, {t.max_iters} iterations on {t.dataset} "
        f"({data_meta['train_tokens']:,} train / {data_meta['val_tokens']:,} val characters).\n"
        f"One learning rate and warm-up for all: AdamW peak lr {t.learning_rate:g} after a "
        f"{t.warmup_iters}-iteration linear warm-up, cosine decay to {t.min_lr:g} at iteration "
        f"{t.lr_decay_iters}; weight decay {t.weight_decay:g}, betas ({t.beta1:g}, {t.beta2:g}), clip "
        f"{t.grad_clip:g}, seed {t.seed}, {t.dtype} on {t.device}.\n"
        f"Evaluation every {t.eval_interval} iterations on {t.eval_iters} batches per split; "
        f"{jobs} run(s) at a time, {threads} thread(s) each."
    )


def outcome_rows(methods: list[str], results: list[JobResult], unigram: float) -> list[dict[str, Any]]:
    """One row per method: final losses, final cosine, status (ok / stuck at unigram / diverged) and time."""
    return [{"method": m, **outcome(r, unigram)} for m, r in zip(methods, results)]


def outcome_table(rows: list[dict[str, Any]]) -> str:
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [
        "| Method | final val loss | final train loss | final cosine | status | time (s) |",
        "|:--|--:|--:|--:|:--|--:|",
    ]
    for r in rows:
        status = r["status"] + (f" ({r['reason']})" if r["reason"] else "")
        seconds = "-" if r["seconds"] is None else f"{r['seconds']:.0f}" + (" (earlier)" if r["reused"] else "")
        lines.append(
            f"| {display_name(r['method'])} | {num(r['val_loss'], '.3f')} | {num(r['train_loss_avg'], '.3f')} | "
            f"{num(r['final_cosine'], '.3f')} | {status} | {seconds} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
        allow_abbrev=False,
    )
    p.add_argument("--methods", default="paper", help="'paper' (the 8 of the paper), 'all', or a comma-separated list")
    p.add_argument("--max_iters", type=int, default=DEFAULT_MAX_ITERS, help=f"iterations per run (default {DEFAULT_MAX_ITERS}); the cosine ends there")
    p.add_argument("--out_dir", default="out/cpu_repro", help="where runs, tables and figures go (default: out/cpu_repro)")
    p.add_argument("--smooth", type=float, default=0.9, help="EMA factor of the train curves in the figure")
    add_common_options(p)
    return p.parse_known_args(argv)


def reproduce(args: argparse.Namespace, overrides: list[str]) -> int:
    started = time.perf_counter()
    check_overrides(overrides, RESERVED)
    if args.max_iters < 1:
        raise UsageError(f"--max_iters must be a positive integer, got {args.max_iters}.")
    methods = parse_methods(args.methods)
    out_dir, data_dir = Path(args.out_dir), Path(args.data_dir)
    base = base_args(args.max_iters, overrides)
    parsed = parse_train_args(base + method_args(methods[0]))
    name = study_name(parsed)
    meta = ensure_data(data_dir, args.input)
    jobs = [
        make_job(
            m,
            base + method_args(m) + [f"--data_dir={data_dir}", f"--out_dir={out_dir / name / method_dirname(m)}", f"--config_name={name}"],
            out_dir / name / method_dirname(m),
        )
        for m in methods
    ]
    settings = settings_text(parsed, meta, args.jobs, args.threads)
    print(settings + "\n", flush=True)

    results = run_jobs(jobs, args.jobs, args.threads)

    unigram = unigram_loss(data_dir)
    rows = outcome_rows(methods, results, unigram)
    built = tables.build_tables(out_dir, ["2", "3"], with_paper=False)
    table_paths = tables.write_tables(built, out_dir / "tables")
    scale = scale_of(asdict(parsed.model_config()))
    figure_paths = plot.plot_group(out_dir, DATASET, scale, out_dir / "figures" / name, args.smooth)
    wall = time.perf_counter() - started

    print()
    print(tables.render(built, "markdown"))
    print(f"Run outcomes ({STUCK_AT_UNIGRAM}: final val loss above the unigram loss {unigram:.3f} - {COLLAPSE_MARGIN}, "
          "no better than predicting character frequencies; diverged: the loss became non-finite):\n")
    print(outcome_table(rows) + "\n")
    print(settings)
    print(wall_clock_line(wall, rows))
    print("Written: " + ", ".join(str(p) for p in [*table_paths, *figure_paths, out_dir / "summary.json"]))
    summary = {
        "settings": settings,
        "train_args": base,
        "unigram_loss": unigram,
        "wall_clock_s": round(wall, 1),  # of this call; runs found finished cost it nothing
        "train_seconds": round(sum(r["seconds"] or 0 for r in rows), 1),
        "runs": rows,
        "tables": [str(p) for p in table_paths],
        "figures": [str(p) for p in figure_paths],
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return exit_status(rows)


def main(argv: list[str] | None = None) -> int:
    return study_main(parse_args, reproduce, argv)
