"""The whole pipeline on a CPU: every method on a deep, narrow model, then the tables and the figure.

    python scripts/reproduce_cpu.py                                  # the paper's 8 methods
    python scripts/reproduce_cpu.py --methods pre_ln,proj_spheret --max_iters 100
    python scripts/reproduce_cpu.py --learning_rate=3e-3 --out_dir out/cpu_repro_lr3e-3   # any train.py key

Trains each method (24 layers x 128 wide, Tiny Shakespeare characters, block 64, batch 16) with
one learning rate and one warm-up for all, two runs at a time on one thread each, then writes
OUT_DIR/tables.{md,tex} (the paper's Tables 2 and 3 for these runs), OUT_DIR/figures/*.{png,pdf}
(loss curves, as the paper's Figures 2 and 3), OUT_DIR/summary.json, and prints the tables,
each run's outcome (ok / stuck at unigram / stalled / diverged) and the wall-clock time. On 2 cores the default
took 15 minutes (results in docs/EXPERIMENTS.md).

Runs go to OUT_DIR/shakespeare_char_24x128/<method>/ (train.log beside metrics.jsonl); a run
that already finished with the same settings is reused, so an interrupted reproduction resumes.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from spheretnorm.experiments import figures as plot, tabulate as tables
from spheretnorm.experiments.grid import check_overrides
from spheretnorm.runtime.methods import parse_methods
from spheretnorm.experiments.study import (
    CPU_MODEL, DATASET, RESERVED, Axis, Column, Place, Sweep, add_length_options, add_methods_option, add_place_options, as_args,
    ensure_data, grid_points, markdown_table, parse_train_args, publish, start_study, study_main, study_name, study_parser, train_argv,
)
from spheretnorm.runtime.cli import UsageError
from spheretnorm.runtime.config import ParsedConfig
from spheretnorm.runtime.methods import method_dirname
from spheretnorm.runtime.methods import display_name, scale_of

# One schedule for every method: peak LR, its warm-up, cosine decay to a tenth by the end.
SCHEDULE: dict[str, Any] = {"learning_rate": 1e-3, "min_lr": 1e-4, "warmup_iters": 100}
DEFAULT_MAX_ITERS = 400
EVALS_PER_RUN = 8


def pipeline_sweep(methods: list[str], max_iters: int, overrides: list[str]) -> Sweep:
    """Every method with one schedule; the runs and their config_name are named by the model's
    shape (shakespeare_char_24x128), the user's overrides included."""
    base = {**CPU_MODEL, **SCHEDULE, "max_iters": max_iters, "lr_decay_iters": max_iters, "eval_interval": max(1, max_iters // EVALS_PER_RUN)}
    name = study_name(parse_train_args(as_args(base) + overrides))
    return Sweep(name=name, base=base, axes=(Axis("method", tuple(methods)),), folder=lambda p: f"{name}/{method_dirname(p['method'])}")


def seconds_text(row: dict[str, Any]) -> str | None:
    return None if row["seconds"] is None else f"{row['seconds']:.0f}" + (" (earlier)" if row["reused"] else "")


OUTCOME_COLUMNS = (
    Column("Method", lambda r: display_name(r["method"]), align=":--"),
    Column("final val loss", "val_loss", ".3f"),
    Column("final train loss", "train_loss_avg", ".3f"),
    Column("final cosine", "final_cosine", ".3f"),
    Column("status", lambda r: r["status"] + (f" ({r['reason']})" if r["reason"] else ""), align=":--"),
    Column("time (s)", seconds_text),
)


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


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = study_parser(__doc__)
    add_methods_option(p, "paper")
    add_length_options(p, DEFAULT_MAX_ITERS)
    add_place_options(p, "out/cpu_repro", table_only=False)
    p.add_argument("--smooth", type=float, default=0.9, help="EMA factor of the train curves in the figure")
    return p.parse_known_args(argv)


def reproduce(args: argparse.Namespace, overrides: list[str]) -> int:
    started = time.perf_counter()
    check_overrides(overrides, RESERVED)
    if args.max_iters < 1:
        raise UsageError(f"--max_iters must be a positive integer, got {args.max_iters}.")
    spec = pipeline_sweep(parse_methods(args.methods), args.max_iters, overrides)
    parsed = parse_train_args(train_argv(spec, grid_points(spec)[0], Place.of(args, overrides)))
    settings = settings_text(parsed, ensure_data(Path(args.data_dir), args.input), args.jobs, args.threads)
    print(settings + "\n", flush=True)

    rows, place, yardsticks = start_study(spec, args, overrides)

    built = tables.build_tables(place.out_dir, ["2", "3"], with_paper=False)
    table_paths = tables.write_tables(built, place.out_dir / "tables")
    figure_paths = plot.plot_group(place.out_dir, DATASET, scale_of(asdict(parsed.model_config())), place.out_dir / "figures" / spec.name, args.smooth)
    print("\n" + tables.render(built, "markdown"))
    print(f"Run outcomes ({yardsticks.rules_text()}):\n\n{markdown_table(rows, OUTCOME_COLUMNS)}\n\n{settings}")
    summary = {"settings": settings, "train_args": as_args(spec.base) + overrides, **yardsticks.record(),
               "train_seconds": round(sum(r["seconds"] or 0 for r in rows), 1), "runs": rows,
               "tables": [str(p) for p in table_paths], "figures": [str(p) for p in figure_paths]}
    return publish(place.out_dir, "summary", None, summary, [*table_paths, *figure_paths], rows, started)


def main(argv: list[str] | None = None) -> int:
    return study_main(parse_args, reproduce, argv)
