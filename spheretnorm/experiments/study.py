"""The CPU studies' front: the one module a study imports, and the command every sweep runs.

A study declares a Sweep (its name, base settings, axes, run folders, table columns, and where it
needs one, a follow-up rule) and sweep_main plans it, runs its jobs, resumes or reuses finished
runs, and writes its rows, its Markdown table and the summary over its seeds (where it selects a
rate, the held-out seeds' at each group's selected rate: selected_summary).

The engine lives beside this module along its seams (docs/EXPERIMENTS.md section 6: sweep_plan,
sweep_runner, sweep_record, sweep_report), and every name of it a study uses is importable from
here. Imports go one way: plan <- record <- runner, plan and record <- report, all <- here.

The model is deep and narrow, 24 layers of width 128, the regime where the connections differ
most, on Tiny Shakespeare (characters), one train.py subprocess per run, several at a time.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from spheretnorm.optim import OPTIMIZERS
from spheretnorm.experiments.grid import Yardsticks, check_overrides
from spheretnorm.experiments.stats import parse_rule, verdict
from spheretnorm.experiments.sweep_plan import (
    CPU_MODEL, DATASET, DEFAULT_DATA_DIR, FAILURE_WORDS, FULL_METRIC, GRID_FACTORS, RESERVED, SAMPLED_METRIC, UNSTABLE, Axis, BestRate,
    Column, Place, Point, Seeds, Sweep, as_args, best_rate_follow_up, current_plan, default_grid, distinct_labels, extension_rate,
    final_loss, grid_points, has_ended, method_settings, name_rows, narrowed, parse_number_list, parse_train_args, plan_points, point,
    positive_count, rate_grids, refined_rates, run_settings, seed_order, selection_of, study_name, swept_rates, table_metric,
    train_argv, value_text,
)
from spheretnorm.experiments.sweep_record import (
    DIGEST_KEYS, RECORD_FIX, UNVERIFIED, check_declaration, code_version, declaration_digest, declare, declared_rules,
    digest_mismatches, edited_declaration_line, file_digest, last_iteration, read_record, record_mismatch_lines, recorded_rows,
    run_inconsistency,
)
from spheretnorm.experiments.sweep_report import (
    METRIC_TEXT, NO_SPHERE, Gaps, GroupKey, SeedCell, diagnostic_columns, exit_status, failed_at_text, gap_record, gap_spread, gap_text,
    gap_values, gaps_text, held_out_summary, kernel_paths_line, markdown_table, paired_seed_summary, pivot_table, publish, rule_lines,
    runs_text, seed_cell, selected_cell, selected_summary, selected_table, wall_clock_line, write_outputs,
)
from spheretnorm.experiments.sweep_runner import (
    LOG_NAME, PROGRESS_EVERY_S, RUN_STATES, SHARED_CORPUS, START_UP_SECONDS, SWEEP_LOCK, Job, JobResult, Stopper, SweepStopped,
    check_out_dir, check_row, corpus_title, diagnostic_summary, dry_run_summary, ensure_data, finished_run_seconds, folder_jobs,
    folder_lock, in_progress, is_done, job_status_line, kernel_path_of, make_job, note_runs_without_config, outcome, point_row,
    progress_line, run_as_planned, run_job, run_points, run_seconds, run_state, run_sweep, schedule, start_study, train_command,
)
from spheretnorm.runtime.cli import REPO_ROOT, HelpFormatter, UsageError
from spheretnorm.runtime.config import config_keys

# Every name the engine defined when it was this one module, importable from here as before (a
# study's file, the docs' examples); REPO_ROOT and verdict too, which studies read as study.X. A
# test that patches what the engine reads patches the module that reads it (sweep_runner.run_job).
__all__ = [
    "CPU_MODEL", "DATASET", "DEFAULT_DATA_DIR", "DIGEST_KEYS", "FAILURE_WORDS", "FULL_METRIC", "GRID_FACTORS", "LOG_NAME",
    "METRIC_TEXT", "NO_SPHERE", "PROGRESS_EVERY_S", "RECORD_FIX", "REPO_ROOT", "RESERVED", "RUN_STATES", "SAMPLED_METRIC",
    "SHARED_CORPUS", "START_UP_SECONDS", "SWEEP_LOCK", "UNSTABLE", "UNVERIFIED", "Axis", "BestRate", "Column", "Done", "Gaps",
    "GroupKey", "Job", "JobResult", "Place", "Point", "Report", "SeedCell", "Seeds", "Stopper", "Sweep", "SweepStopped",
    "add_length_options", "add_methods_option", "add_place_options", "add_rate_grid_options", "add_seed_option", "add_table_options",
    "as_args", "best_rate_follow_up", "check_declaration", "check_out_dir", "check_row", "code_version", "corpus_title", "current_plan",
    "declaration_digest", "declare", "declared_rules", "default_grid", "diagnostic_columns", "diagnostic_summary", "digest_mismatches",
    "distinct_labels", "dry_run_summary", "edited_declaration_line", "ensure_data", "exit_status", "extension_rate", "failed_at_text",
    "file_digest", "final_loss", "finished_run_seconds", "folder_jobs", "folder_lock", "gap_record", "gap_spread", "gap_text",
    "gap_values", "gaps_text", "grid_points", "has_ended", "held_out_summary", "in_progress", "is_done", "job_status_line",
    "kernel_path_of", "kernel_paths_line", "last_iteration", "make_job", "markdown_table", "method_settings", "name_rows", "narrowed",
    "note_runs_without_config", "outcome", "paired_seed_summary", "parse_number_list", "parse_train_args", "pivot_table", "plan_points",
    "point", "point_row", "positive_count", "progress_line", "publish", "rate_grids", "read_record", "record_mismatch_lines",
    "recorded_rows", "refined_rates", "rule_lines", "run_as_planned", "run_inconsistency", "run_job", "run_points", "run_seconds",
    "run_settings", "run_state", "run_sweep", "runs_text", "schedule", "seed_cell", "seed_order", "selected_cell", "selected_summary",
    "selected_table", "selection_of", "start_study", "study_main", "study_name", "study_parser", "sweep_main", "swept_rates",
    "table_metric", "train_argv", "train_command", "value_text", "verdict", "wall_clock_line", "write_outputs",
]


# -----------------------------------------------------------------------------
# A study command: the options the studies share, each with one help text (a study's parse_args adds its own)


def add_place_options(parser: Any, out_dir: str, table_only: bool = True, dry_run: bool = False, data_dir: Path | None = None,
                      corpus: str | None = None) -> None:
    """What Place.of and start_study read: --out_dir (the study's folder), --table_only and --dry_run
    where the study has them, the data (--data_dir, --input) and the machine (--jobs, --threads).
    data_dir and corpus: a study's own defaults of --data_dir and --input (table2_mini's web text)."""
    parser.add_argument("--out_dir", default=out_dir, help=f"where the runs and what the study writes go (default {out_dir})")
    if table_only:
        parser.add_argument("--table_only", action="store_true", help="run nothing: tabulate the runs already in --out_dir")
    if dry_run:
        parser.add_argument("--dry_run", action="store_true", help="print the runs the plan holds now; run nothing")
    where = f"data/{DATASET}" if data_dir is None else str(data_dir.relative_to(REPO_ROOT) if data_dir.is_relative_to(REPO_ROOT) else data_dir)
    parser.add_argument("--data_dir", default=str(data_dir or DEFAULT_DATA_DIR), help=f"prepared {DATASET} data (default: {where}; prepared when missing)")
    source = corpus or "../shared/data/tinyshakespeare.txt when present, else download"
    parser.add_argument("--input", default=corpus, help=f"text corpus to prepare as characters; kept where --data_dir holds it already, same sha256 (default: {source})")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")


def add_length_options(parser: Any, max_iters: int, warmup_iters: int | None = None, warmup_of: str = "", eval_interval: int | None = None) -> None:
    """--max_iters, and where the study sets them --warmup_iters (warmup_of: whose warm-up it is) and --eval_interval."""
    parser.add_argument("--max_iters", type=int, default=max_iters, help=f"iterations per run; the cosine ends there (default {max_iters})")
    if warmup_iters is not None:
        parser.add_argument("--warmup_iters", type=int, default=warmup_iters, help=f"linear warm-up iterations{warmup_of} (default {warmup_iters})")
    if eval_interval is not None:
        parser.add_argument("--eval_interval", type=int, default=eval_interval, help=f"iterations between evaluations (default {eval_interval})")


def add_seed_option(parser: Any, default: str = "1337,1338", role: str = "") -> None:
    """--seeds; role: what the study does with each, where they differ (fair_sweep: the first selects, the rest are held out)."""
    parser.add_argument("--seeds", default=default, help=f"comma-separated seeds{role} (default {default})")


def add_methods_option(parser: Any, default: str) -> None:
    """--methods, as runtime.methods.parse_methods reads it."""
    parser.add_argument("--methods", default=default,
                        help=f"'paper' (the 8 of the paper), 'all' (every registered connection) or comma-separated methods (default {default})")


def add_rate_grid_options(parser: Any, lrs: str, base_lr: float | None = None, lrs_role: str = "", base_lr_beside_others: bool = False,
                          grid_role: str = "") -> None:
    """--lrs, the peak learning rates; with base_lr, an optimizer axis too (rate_grids): --optimizers,
    each sweeping its own rate key, --grid OPT=R1,R2,... and --base_lr for the AdamW part beside them.
    base_lr_beside_others: --base_lr stays None unless given (the study runs base_lr then) and the
    study refuses it with AdamW alone."""
    parser.add_argument("--lrs", default=lrs, help=f"peak learning rates{'' if base_lr is None else ' of AdamW'}{lrs_role} (default {lrs})")
    if base_lr is None:
        return
    parser.add_argument("--optimizers", default="adamw",
                        help=f"comma-separated optimizers, of: {', '.join(OPTIMIZERS)}; each sweeps its own rate key (default adamw)")
    parser.add_argument("--grid", action="append", default=[], metavar="OPT=R1,R2,...",
                        help=f"an optimizer's peak rates of its rate key (default: --lrs for AdamW, else the key's default x 1/4 .. 4){grid_role}; repeatable")
    refused = "; refused with --optimizers adamw alone, where it has no effect" if base_lr_beside_others else ""
    parser.add_argument("--base_lr", type=float, default=None if base_lr_beside_others else base_lr,
                        help=f"learning_rate of the other optimizers' AdamW part (embeddings, gains) (default {base_lr:g}){refused}")


def study_main(parse_args: Callable[[list[str] | None], tuple[Any, list[str]]],
               run: Callable[[Any, list[str]], int], argv: list[str] | None) -> int:
    """A study script's main: a usage error is one line on stderr and status 2, else run's status."""
    args, overrides = parse_args(argv)
    try:
        return run(args, overrides)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SweepStopped as e:
        print(str(e), file=sys.stderr)
        return 128 + e.signum  # as a shell reports a process a signal ended


# -----------------------------------------------------------------------------
# The command of a sweep: sweep_main


def study_parser(doc: str) -> argparse.ArgumentParser:
    """A study command's parser: the docstring's first paragraph as its description, the rest as epilog."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=HelpFormatter,
                                   epilog=doc.split("\n\n", 1)[1] if "\n\n" in doc else None, allow_abbrev=False)


def add_table_options(parser: Any) -> None:
    """The options of a table of held-out seeds, gaps and rules (sweep_main, fair_sweep)."""
    parser.add_argument("--rule", action="append", default=[], metavar="RULE",
                        help="a decision rule on each arm's held-out gaps to the baseline, e.g. every_gap<-0.02 or upper<0 "
                             "(QUANTITY<N or >N, QUANTITY one of every_gap, upper, lower); recorded before the runs; repeatable")
    parser.add_argument("--mix_kernel_paths", action="store_true", help="tabulate runs of several kernel paths together (default: refuse)")


@dataclass
class Done:
    """A study's sweep once it ran (or, in a dry run, was found): what sweep_main's hooks read."""

    sweep: Sweep
    args: argparse.Namespace
    rows: list[dict[str, Any]]
    place: Place
    yardsticks: Yardsticks
    figures: list[Path] = field(default_factory=list)  # what the figures hook wrote


Report = tuple[str, "str | None", dict[str, Any]]  # the stem of OUT_DIR/<stem>.md and .json, the .md's text (None: no .md), the record


def sweep_main(sweep: Sweep | Callable[[argparse.Namespace, list[str]], Sweep], argv: list[str] | None = None, doc: str = "",
               baseline_title: str = "the baseline", *, options: Callable[[argparse.ArgumentParser], None] | None = None,
               figures: Callable[[Done], list[Path]] | None = None, report: Callable[[Done], Report] | None = None,
               dry_run: Callable[[Done], None] | None = None,
               instead: Callable[[argparse.Namespace, list[str]], int | None] | None = None) -> int:
    """A study's command (docs/EXPERIMENTS.md section 6): a Sweep runs as declared, with --axis,
    --rule and --mix_kernel_paths; or `options` adds a study's own options (the place options among
    them) and `sweep` is the function that turns them and the train.py overrides into its Sweep.
    `figures` draws from the rows and returns the paths it wrote; `report` gives the stem, text and
    record to write instead of runs_text's; `dry_run` prints what a dry run adds after the runs it
    listed; `instead` is a mode that runs no sweep (fair_sweep's --compare): its exit status, or
    None to run the sweep."""
    p = study_parser(doc or f"The {getattr(sweep, 'name', 'study')} sweep.")  # a design function has no name: its doc says
    if options:
        options(p)
    else:
        p.add_argument("--axis", action="append", default=[], help="KEY=V1,V2: run only these values of an axis (repeatable)")
        add_place_options(p, f"out/{sweep.name}", dry_run=True)
        add_table_options(p)

    def design(args: argparse.Namespace, overrides: list[str]) -> Sweep:
        if options:
            return sweep(args, overrides)
        check_overrides(overrides, {**RESERVED, **{k: "--axis" for k in sweep.row_keys() if k in config_keys()}})
        return replace(narrowed(sweep, args.axis), rules=sweep.rules + tuple(map(parse_rule, args.rule)))

    def runs_report(done: Done) -> Report:
        text = runs_text(done.sweep, done.rows, baseline_title, done.place.declared, done.args.mix_kernel_paths)
        metric = table_metric(done.rows)
        held_out = {"selected": selected_summary(done.sweep, done.rows, metric)} if selection_of(done.sweep) else {}  # every column
        return done.sweep.name, text, {**done.yardsticks.record(), "metric": metric, **held_out, "runs": done.rows}

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        started = time.perf_counter()
        if instead and (status := instead(args, overrides)) is not None:
            return status
        rows, place, yardsticks = start_study(chosen := design(args, overrides), args, overrides)
        done = Done(chosen, args, rows, place, yardsticks)
        if place.dry_run:
            if dry_run:
                dry_run(done)
            return 0
        done.figures = figures(done) if figures else []
        stem, text, record = (report or runs_report)(done)
        return publish(place.out_dir, stem, text, record, done.figures, rows, started)

    return study_main(p.parse_known_args, run, argv)
