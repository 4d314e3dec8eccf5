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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from spheretnorm.experiments import figures as plot, tabulate as tables
from spheretnorm.experiments.grid import check_overrides
from spheretnorm.experiments.study import (
    CPU_MODEL, DATASET, RESERVED, Axis, Column, Done, Place, Report, Sweep, add_length_options, add_methods_option, add_place_options,
    as_args, ensure_data, grid_points, markdown_table, parse_train_args, study_name, sweep_main, train_argv,
)
from spheretnorm.runtime.cli import UsageError
from spheretnorm.runtime.config import ParsedConfig
from spheretnorm.runtime.methods import display_name, method_dirname, parse_methods, scale_of
from spheretnorm.runtime.token_files import load_meta

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


OUTCOME_COLUMNS = (
    Column("Method", lambda r: display_name(r["method"]), align=":--"),
    Column("final val loss", "val_loss", ".3f"),
    Column("final train loss", "train_loss_avg", ".3f"),
    Column("final cosine", "final_cosine", ".3f"),
    Column("status", lambda r: r["status"] + (f" ({r['reason']})" if r["reason"] else ""), align=":--"),
    Column("time (s)", lambda r: None if r["seconds"] is None else f"{r['seconds']:.0f}" + (" (earlier)" if r["reused"] else "")),
)


def first_run(sweep: Sweep, place: Place) -> ParsedConfig:
    """The settings of the sweep's first run: what every method shares."""
    return parse_train_args(train_argv(sweep, grid_points(sweep)[0], place))


def settings_text(sweep: Sweep, place: Place, data_meta: dict[str, Any]) -> str:
    """The settings every method shares, in words, for the output and the summary."""
    parsed = first_run(sweep, place)
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
        f"{place.jobs} run(s) at a time, {place.threads} thread(s) each."
    )


def options(p: argparse.ArgumentParser) -> None:
    add_methods_option(p, "paper")
    add_length_options(p, DEFAULT_MAX_ITERS)
    add_place_options(p, "out/cpu_repro", table_only=False)
    p.add_argument("--smooth", type=float, default=0.9, help="EMA factor of the train curves in the figure")


def design(args: argparse.Namespace, overrides: list[str]) -> Sweep:
    """The sweep, its settings printed before any run."""
    check_overrides(overrides, RESERVED)
    if args.max_iters < 1:
        raise UsageError(f"--max_iters must be a positive integer, got {args.max_iters}.")
    spec = pipeline_sweep(parse_methods(args.methods), args.max_iters, overrides)
    print(settings_text(spec, Place.of(args, overrides), ensure_data(Path(args.data_dir), args.input)) + "\n", flush=True)
    return spec


TABLE_SUFFIXES = (".md", ".tex")


def tables_and_figures(done: Done) -> list[Path]:
    """OUT_DIR/tables.{md,tex} (the paper's Tables 2 and 3 for these runs, printed too) and the loss curves."""
    out = done.place.out_dir
    built = tables.build_tables(out, ["2", "3"], with_paper=False)
    written = tables.write_tables(built, out / "tables")
    scale = scale_of(asdict(first_run(done.sweep, done.place).model_config()))
    written += plot.plot_group(out, DATASET, scale, out / "figures" / done.sweep.name, done.args.smooth)
    print("\n" + tables.render(built, "markdown"))
    return written


def report(done: Done) -> Report:
    """OUT_DIR/summary.json: the settings, every run's outcome (printed as a table) and what was written."""
    place, rows = done.place, done.rows
    settings = settings_text(done.sweep, place, load_meta(place.data_dir))
    print(f"Run outcomes ({done.yardsticks.rules_text()}):\n\n{markdown_table(rows, OUTCOME_COLUMNS)}\n\n{settings}")
    return "summary", None, {
        "settings": settings, "train_args": as_args(done.sweep.base) + place.overrides, **done.yardsticks.record(),
        "train_seconds": round(sum(r["seconds"] or 0 for r in rows), 1), "runs": rows,
        "tables": [str(p) for p in done.figures if p.suffix in TABLE_SUFFIXES], "figures": [str(p) for p in done.figures if p.suffix not in TABLE_SUFFIXES]}


def main(argv: list[str] | None = None) -> int:
    return sweep_main(design, argv, __doc__, options=options, figures=tables_and_figures, report=report)
