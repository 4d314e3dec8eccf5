"""The paper's Tables 2-5 from the runs' metrics.jsonl and zero-shot results, in Markdown or LaTeX.

    python scripts/tables.py --runs_root out                      # our runs, Markdown
    python scripts/tables.py --runs_root out --paper --format latex   # the paper's value beside ours
    python scripts/tables.py --source paper                       # the paper's own tables
    python scripts/tables.py --runs_root out --out out/tables     # also write out/tables.{md,tex}

Table 2: final train loss (train.py's mean over the last 200 iterations) and final val loss;
Table 3: val perplexity exp(val loss); Tables 4 and 5: zero-shot scores (eval/zero_shot.py's
paper columns, read from each run's ckpt_zero_shot.json) for FineWeb-Edu and OpenWebText.
Columns are (dataset, scale) pairs: S, M, L for the paper's shapes, else '<layers>x<width>'.

As in the paper, each column's best value is bold and the second best underlined: lowest for
losses and perplexities, highest for accuracies. Values are compared as printed (rounded);
tied values share a mark, and the second mark goes to the next distinct value. A '*' marks a
run that has not reached max_iters and may go on (still training, or stopped by a signal or a
crash, which resume); a '§' marks one that train.py ended for good before max_iters (the collapse
alarm or a non-finite loss: a failure, its value the last before the stop, never ranked). A '†' marks
zero-shot numbers from a --limit evaluation (a subset of each benchmark): they are partial,
never ranked, and a note under the table says so. eval/zero_shot.py writes such results to
ckpt_zero_shot_limit<N>.json, which tables do not read; only an older or copied limited file
named ckpt_zero_shot.json gets here; a table that is left out for want of results says why on
stderr. A '‡' marks a benchmark that a --skip_missing evaluation left out for lack of its files:
that run's zero-shot row is not a complete paper evaluation, and a note under the table says so.

Runs of both blocks (train.py --block=gpt2, the paper's, and --block=llama) may share one
--runs_root: a row is a method in a block, and a run of a block other than GPT-2's gets its own
row, labelled with the block ('0.5-SpheretNorm (LLaMA)'), right under the method's GPT-2 row, in
the same tables; their titles then name the blocks ('... (GPT-2 and LLaMA blocks)'), and the
best/second marks rank every row of a column, blocks together. The paper's values (--paper) are
of the GPT-2 block: a LLaMA row shows '-' there. A folder of GPT-2 runs only renders as before.
Two runs of one method in one block, dataset and scale are refused, the error naming both
folders and the settings in which their config.json files differ.

--datasets and --scales restrict the tables to some runs; only those are read, so another
experiment's folders under the same --runs_root (two runs of one method elsewhere, say) do not
stop them. Where the runs tabulated come from several experiments' folders (a run's root: its
parent, or the one above a folder named for its config, as out/<config_name>/<method>), or two
rows of one column differ in a setting no row label names, one note on stderr says which roots
and which differing settings the tables mix. A loss that is nan or infinite, or JSON nested too deeply to read, is damage too;
--out files are written to a temporary name and renamed, so a full disk is one error line and
leaves the earlier OUT.md / OUT.tex as they were. A damaged run file (config.json, metrics.jsonl, ckpt_zero_shot.json) is one error
line naming it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any, Collection, Iterable

from spheretnorm.zeroshot.errors import (
    NUMBER, Schema, UnreadableFile, non_finite, parse_json, problem_sentence, read_text_file, schema_problem, schema_text,
)
from spheretnorm.runtime.atomic import WriteError, write_atomically, write_text_atomically
from spheretnorm.zeroshot.driver import PAPER_COLUMNS, results_limit, results_skipped
from spheretnorm.runtime.cli import HelpFormatter, UsageError
from spheretnorm.runtime.methods import REFERENCE_PATH, load_reference
from spheretnorm.experiments.grid import (
    ZERO_SHOT_NAME, Run, blocks_text, dataset_display, group_label, index_runs, row_key, row_label, sort_groups, sort_rows,
)
from spheretnorm.runtime.imports import add_import_options, import_recorded, use_import_options
from spheretnorm.runtime.identity import keys_differing_within, param_text, run_identity
from spheretnorm.runtime.run_folder import AVG_WINDOW, CONFIG_NAME, METRICS_NAME

# The reference tables in paper_results.json, and the dataset of each zero-shot table.
REFERENCE_KEYS = {"2": "table2_loss", "3": "table3_val_ppl", "4": "table4_zero_shot_fineweb_edu_L", "5": "table5_zero_shot_openwebtext_L"}
TABLE_NUMBERS = tuple(REFERENCE_KEYS)
ZERO_SHOT_TABLE = {"fineweb_edu": "4", "openwebtext": "5"}
BEST, SECOND = "best", "second"


@dataclass(frozen=True)
class Column:
    key: str  # the column name in paper_results.json, e.g. "openwebtext/S/val"
    group: str  # the header above a group of columns, e.g. "OpenWebText S"
    header: str  # e.g. "val"
    higher_is_better: bool
    decimals: int


@dataclass
class Table:
    number: str  # "2".."5" (the paper's numbering); "Z" for a zero-shot table of another dataset
    title: str
    columns: list[Column]
    # row -> column key -> value; a row is a method key, with '+block=<block>' for a block other
    # than GPT-2's (grid.row_key), so the paper's tables and GPT-2 runs have method keys as rows.
    values: dict[str, dict[str, float | None]]
    paper: dict[str, dict[str, float | None]] = field(default_factory=dict)
    unfinished: set[tuple[str, str]] = field(default_factory=set)  # (row, column key)
    failed: set[tuple[str, str]] = field(default_factory=set)  # (row, column key) of a run stopped for good (grid.final_stop)
    limited: dict[tuple[str, str], int | float] = field(default_factory=dict)  # (row, column key) -> --limit
    skipped: set[tuple[str, str]] = field(default_factory=set)  # (row, column key) of benchmarks --skip_missing left out
    scale: str | None = None  # the models' scale, for a zero-shot table (one dataset and scale)


# -----------------------------------------------------------------------------
# Reading run folders, every file checked
#
# config.json is read for every run under a root (it says the dataset and scale), the other
# files only for the runs asked about, and each value the tables and plots use is checked, so that a damaged file is one
# error naming it rather than a traceback, or a run silently filed under the wrong column.

CONFIG_SCHEMA: Schema = {"dataset": str, "method": str, "max_iters": int, "n_layer": int, "n_head": int, "n_embd": int}
ROW_SCHEMA: Schema = {"kind": str}
ROW_SCHEMAS: dict[str, Schema] = {  # the fields of each kind of row that tables and plots read
    "train": {"iter": int, "train_loss": NUMBER, "train_loss_avg200": NUMBER},
    "eval": {"iter": int, "val_loss": NUMBER},
}


@dataclass
class CheckedRun(Run):
    """A Run whose files were checked, with the benchmarks its zero-shot evaluation skipped."""

    zero_shot_skipped: dict[str, str] = field(default_factory=dict)  # task -> why (eval/zero_shot.py --skip_missing)
    row_lines: list[int] = field(default_factory=list)  # the metrics.jsonl line of each of rows, for errors and notes


def line_of(run: Run, row: dict[str, Any]) -> int | None:
    """The metrics.jsonl line a row of a checked run was read from (None when not known)."""
    lines = getattr(run, "row_lines", None) or []
    return next((lines[i] for i, r in enumerate(run.rows) if r is row and i < len(lines)), None)


def read_checked_text(path: Path, what: str) -> str:
    try:
        return read_text_file(path)
    except UnreadableFile as exc:
        raise UsageError(f"{path} {exc}; expected {what}.") from None


def read_checked_json(path: Path, what: str) -> Any:
    """The JSON value in path; binary content or broken JSON is one UsageError naming the file."""
    text = read_checked_text(path, what)
    try:
        return parse_json(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); expected {what}.") from None
    except ValueError as exc:  # nested too deeply for the parser
        raise UsageError(f"{path} {exc}; expected {what}.") from None


def check_value(value: Any, schema: Schema, subject: str, what: str) -> Any:
    """value, or one UsageError saying what in it does not match schema."""
    problem = schema_problem(value, schema)
    if problem:
        raise UsageError(f"{problem_sentence(subject, problem)}; expected {what}.")
    return value


def read_checked_config(path: Path) -> dict[str, Any]:
    what = f"train.py's run config, an object with {schema_text(CONFIG_SCHEMA)}"
    config = check_value(read_checked_json(path, what), CONFIG_SCHEMA, str(path), what)
    # The user's modules its method's title comes from, as in the training process: with consent only
    # (tables over a run root import nothing they were not told to); without, the method's own name.
    import_recorded(config, str(path), needed=False)
    return config


def read_checked_metrics(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The rows of a metrics.jsonl, each checked, and the line of each; only a last line cut short
    by a crash is skipped. A loss that is nan or infinite is refused (train.py stops a run before it logs one)."""
    lines = read_checked_text(path, "train.py's metrics, one JSON object per line").split("\n")
    rows, row_lines = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = parse_json(line)
        except ValueError as exc:
            if not isinstance(exc, json.JSONDecodeError):  # nested too deeply for the parser
                raise UsageError(f"Line {number} of {path} {exc}; train.py writes one flat JSON object per line.") from None
            # train.py writes each row as one line with its newline: a crash mid-write leaves at
            # most the last line cut short, and with no newline after it. Anything else is damage.
            if number == len(lines) and line.lstrip().startswith("{"):
                continue
            raise UsageError(f"Line {number} of {path} is not valid JSON ({exc.msg}); train.py writes one JSON object per line.") from None
        subject = f"Line {number} of {path}"
        check_value(row, ROW_SCHEMA, subject, "an object with a 'kind', as train.py writes")
        schema = ROW_SCHEMAS.get(row["kind"])
        if schema:
            check_value(row, schema, subject, f"{row['kind']} rows with {schema_text(schema)} as numbers, as train.py writes them")
            bad = [k for k in schema if non_finite(row[k])]
            if bad:
                raise UsageError(f"{subject}: {bad[0]} is {row[bad[0]]}, not a finite number; train.py stops a run before it logs a "
                                 "non-finite loss, so this file was not written by it (remove the line, or the run).")
        rows.append(row)
        row_lines.append(number)
    return rows, row_lines


def check_each(values: dict[str, Any], schema: Schema, subject: str, what: str) -> None:
    """Every value of a mapping against one schema (e.g. each score of a paper_table is a number)."""
    check_value(values, {key: schema for key in values}, subject, what)


def read_checked_zero_shot(path: Path) -> tuple[dict[str, float | None], int | float | None, dict[str, str]]:
    """(paper_table, --limit or None, skipped tasks) of eval/zero_shot.py's results JSON, checked."""
    what = "eval/zero_shot.py's results, an object with a 'paper_table' of numbers or nulls"
    results = check_value(read_checked_json(path, what), {"paper_table": dict}, str(path), what)
    check_each({k: results[k] for k in ("limited", "config", "skipped") if k in results}, dict, str(path), what)
    check_each({f"paper_table.{k}": v for k, v in results["paper_table"].items() if v is not None}, NUMBER, str(path), what)
    limit = results_limit(results)
    check_each({"limit": limit} if limit is not None else {}, NUMBER, str(path), "a --limit that is a number of examples")
    skipped = results_skipped(results)
    check_each({f"skipped.{task}": reason for task, reason in skipped.items()}, str, str(path), "a reason (a string) for each skipped task")
    return results["paper_table"], limit, skipped


def scan_runs(root: Path) -> list[Run]:
    """Every run folder under root (a config.json beside a metrics.jsonl), sorted by path; only
    config.json is read (and checked): the Runs have no rows yet; load_checked_run reads them."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"--runs_root {str(root)!r} is not a folder; point it at the out_dir root of your runs (default out/).")
    configs = sorted(p for p in root.rglob(CONFIG_NAME) if (p.parent / METRICS_NAME).is_file())
    return [Run(p.parent, read_checked_config(p), [], None) for p in configs]


def load_checked_run(folder: Run) -> CheckedRun:
    """The run of a folder, its metrics.jsonl and ckpt_zero_shot.json (when present) checked."""
    rows, row_lines = read_checked_metrics(folder.path / METRICS_NAME)
    zero_shot, limit, skipped = None, None, {}
    if (folder.path / ZERO_SHOT_NAME).is_file():
        zero_shot, limit, skipped = read_checked_zero_shot(folder.path / ZERO_SHOT_NAME)
    run = CheckedRun(folder.path, folder.config, rows, zero_shot, limit, zero_shot_skipped=skipped, row_lines=row_lines)
    # Eval rows past max_iters, which train.py never reaches (rows of another run appended, a hand
    # edit), are tabulated and plotted all the same, as they always have been, but not without a word.
    max_iters = run.config["max_iters"]
    late = [row for row in rows if row["kind"] == "eval" and row["iter"] > max_iters]
    if late:
        print(f"warning: {run.path / METRICS_NAME} has {len(late)} eval row(s) past the run's max_iters {max_iters} (the first at iteration "
              f"{late[0]['iter']}, line {line_of(run, late[0])}), which train.py never reaches; they are tabulated and plotted as they are.", file=sys.stderr)
    return run


def groups_text(folders: Iterable[Run], form: str = "{} {}") -> str:
    """'openwebtext S; fineweb_edu 24x128': the (dataset, scale) pairs of some run folders, each written as form."""
    return "; ".join(form.format(d, s) for d, s in sort_groups((f.dataset, f.scale) for f in folders)) or "no runs"


def load_runs(root: Path, datasets: Collection[str] | None = None, scales: Collection[str] | None = None) -> list[CheckedRun]:
    """The runs under root of the given datasets and scales (None: all), every file of theirs checked;
    two runs of one (dataset, scale, method, block) are refused among these runs only (grid.index_runs)."""
    folders = scan_runs(root)
    if not folders:
        raise UsageError(f"No runs under {str(root)!r} (a run folder holds config.json and metrics.jsonl).")
    kept = [f for f in folders if (datasets is None or f.dataset in datasets) and (scales is None or f.scale in scales)]
    if not kept:
        asked = " ".join(f"--{name} {','.join(sorted(v))}" for name, v in (("datasets", datasets), ("scales", scales)) if v is not None)
        raise UsageError(f"No runs of {asked} under {str(root)!r}; it has runs of: {groups_text(folders)}.")
    runs = [load_checked_run(f) for f in kept]
    index_runs(runs)
    return runs


# -----------------------------------------------------------------------------
# What a folder of many experiments mixes
#
# --runs_root out reads every run under out/: a grid's, a study's, a copy's. The tables name what
# tells their rows and columns apart, not that their runs come from several experiments, or that
# two rows of one column differ in a setting no label names: mixed_runs_text says both.


def run_root(run: Run, runs_root: Path) -> Path:
    """The folder of the experiment a run belongs to: its parent, or the parent's parent where the
    parent is named for the run's config (train.py's default out/<config_name>/<method>, the
    launcher's <runs_root>/<dataset>_<scale>/<method>: a grid's scales are one experiment); never
    a folder above runs_root."""
    parent = run.path.parent
    if run.path == runs_root or parent == runs_root:
        return runs_root
    config_names = {str(run.config.get("config_name")).lower(), f"{run.dataset}_{run.scale}".lower()}
    return parent.parent if parent.name.lower() in config_names else parent


def sorted_values(values: Iterable[Any]) -> list[Any]:
    """Distinct values, numbers in order before the rest in the order of their text."""
    distinct = {json.dumps(v, sort_keys=True, default=str): v for v in values}.values()
    return sorted(distinct, key=lambda v: (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, param_text(v)))


def and_join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


TABLES_ADVICE = "point --runs_root at one experiment's folder (or give --datasets, --scales) to tabulate it alone"


def mixed_runs_text(runs: list[Run], runs_root: Path, advice: str = TABLES_ADVICE) -> str:
    """One line saying which roots (run_root) and which differing settings (identity.run_identity:
    the computing keys less the method's own and the block) the runs mix, where they come from
    several experiments' folders or two rows of a column differ in a setting no label names (the
    labels name only what tells runs of one method apart: grid.index_runs); '' for one experiment's
    runs. advice ends the line: what the command's own options do about it (plot.py has no --datasets)."""
    roots = sorted({run_root(run, runs_root) for run in runs})
    identities = [run_identity(run.config) for run in runs]
    in_columns = keys_differing_within([(run.dataset, run.scale) for run in runs], identities)
    in_rows = keys_differing_within([(run.dataset, run.scale, row_key(run.method, run.block)) for run in runs], identities)
    unlabelled = sorted(in_columns - in_rows)
    if len(roots) < 2 and not unlabelled:
        return ""
    where = f"{len(roots)} roots ({', '.join(map(str, roots))})" if len(roots) > 1 else f"the runs of one root ({roots[0]})"
    values = {key: sorted_values(i[key] for i in identities if key in i) for key in sorted({key for i in identities for key in i})}
    differ = [f"{key} ({', '.join(map(param_text, v))})" for key, v in values.items() if len(v) > 1]
    text = f"mixed {where} whose runs differ in {and_join(differ)}" if differ else f"mixed {where} whose runs differ in their methods alone"
    if unlabelled:
        text += f"; within a column, rows differ in {and_join(unlabelled)}, which no row label names"
    return f"{text}; {advice}."


# -----------------------------------------------------------------------------
# Columns, and tables from the paper and from runs


def loss_columns(groups: Iterable[tuple[str, str]]) -> list[Column]:
    return [Column(f"{d}/{s}/{split}", group_label(d, s), split, False, 3) for d, s in groups for split in ("train", "val")]


def ppl_columns(groups: Iterable[tuple[str, str]]) -> list[Column]:
    return [Column(f"{d}/{s}", dataset_display(d), s, False, 2) for d, s in groups]


def zero_shot_columns() -> list[Column]:
    # Accuracies (in percent) are better high, the two perplexity columns low.
    return [Column(c.key, "", c.header, c.percent, 2) for c in PAPER_COLUMNS]


TITLES = {"2": f"Final train loss (mean of the last {AVG_WINDOW} iterations) and final val loss", "3": "Final val perplexity"}
COLUMNS = {"2": loss_columns, "3": ppl_columns}


def zero_shot_title(dataset: str, scale: str) -> str:
    return f"Zero-shot accuracy (%) and perplexity, models trained on {group_label(dataset, scale)}"


def paper_tables(reference: dict[str, Any]) -> list[Table]:
    """The paper's Tables 2-5, as printed in it (paper_results.json)."""
    tables = []
    for number, ref_key in REFERENCE_KEYS.items():
        ref = reference[ref_key]
        if number in COLUMNS:  # over the (dataset, scale) pairs of its column keys ('fineweb_edu/S/train'), in order
            groups = list(dict.fromkeys(tuple(k.split("/")[:2]) for k in ref["columns"]))
            columns, title, scale = COLUMNS[number](groups), TITLES[number], None
        else:
            dataset = next(d for d, n in ZERO_SHOT_TABLE.items() if n == number)
            columns, title, scale = zero_shot_columns(), zero_shot_title(dataset, "L"), "L"
        # The columns are rebuilt from their keys; they must come out in the reference's order.
        assert [c.key for c in columns] == ref["columns"], f"column order of {ref_key} changed"
        values = {m: dict(zip(ref["columns"], row)) for m, row in ref["rows"].items()}
        tables.append(Table(number, title, columns, values, scale=scale))
    return tables


def run_tables(runs: list[Run]) -> list[Table]:
    """Tables 2 and 3 over every (dataset, scale) found, and a zero-shot table per group that has
    results; a row is a run's Run.row, and a title names the blocks where not all are GPT-2's."""
    index = index_runs(runs)
    groups = sort_groups((d, s) for d, s, _ in index)
    loss, ppl = (Table(n, TITLES[n], COLUMNS[n](groups), {}) for n in ("2", "3"))
    zero_shot: dict[tuple[str, str], Table] = {}
    for (dataset, scale, row), run in index.items():
        prefix = f"{dataset}/{scale}"
        val = run.final_val_loss
        loss.values.setdefault(row, {}).update({f"{prefix}/train": run.final_train_loss, f"{prefix}/val": val})
        ppl.values.setdefault(row, {})[prefix] = math.exp(val) if val is not None and val < 700 else None
        mark = None if run.finished else "failed" if run.stop else "unfinished"  # a stop for good is a failure
        if mark:
            getattr(loss, mark).update({(row, f"{prefix}/train"), (row, f"{prefix}/val")})
            getattr(ppl, mark).add((row, prefix))
        if run.zero_shot:
            number = ZERO_SHOT_TABLE.get(dataset, "Z")
            table = zero_shot.setdefault((dataset, scale), Table(number, zero_shot_title(dataset, scale), zero_shot_columns(), {}, scale=scale))
            table.values[row] = {c.key: run.zero_shot.get(c.key) for c in table.columns}
            if mark:
                getattr(table, mark).update((row, c.key) for c in table.columns)
            if run.zero_shot_limit is not None:
                table.limited.update({(row, c.key): run.zero_shot_limit for c in table.columns})
            skipped = getattr(run, "zero_shot_skipped", {})  # only a CheckedRun knows them
            table.skipped |= {(row, c.key) for c in table.columns if c.key.split("/")[0] in skipped}
    tables = [loss, ppl] + [zero_shot[g] for g in sort_groups(zero_shot)]
    for table in tables:
        blocks = blocks_text(table.values)
        table.title += f" ({blocks})" if blocks else ""
    return tables


def attach_paper(tables: list[Table], reference: dict[str, Any]) -> None:
    """Put the paper's value of each (method, column) that the paper has beside ours; the paper's
    models are of the GPT-2 block: a row of another block (not a method key of its tables) gets none."""
    by_number = {t.number: t for t in paper_tables(reference)}
    for table in tables:
        ref = by_number.get(table.number)
        # The paper's zero-shot tables are of its L models only.
        if ref is None or table.scale not in (None, "L"):
            continue
        table.paper = {m: {c.key: ref.values.get(m, {}).get(c.key) for c in table.columns} for m in table.values}


# -----------------------------------------------------------------------------
# Ranking: best bold, second underlined


def rank_marks(table: Table) -> dict[tuple[str, str], str]:
    """{(method, column key): 'best' | 'second'} for each column's best and second-best value."""
    marks: dict[tuple[str, str], str] = {}
    for col in table.columns:
        # Partial (--limit) numbers are not comparable with full ones, nor is a failed run's last value
        # with a final one: they take no rank.
        values = {m: table.values[m].get(col.key) for m in table.values
                  if (m, col.key) not in table.limited and (m, col.key) not in table.failed}
        cells = {m: round(v, col.decimals) for m, v in values.items() if v is not None and math.isfinite(v)}
        for mark, target in zip((BEST, SECOND), sorted(set(cells.values()), reverse=col.higher_is_better)):
            marks.update({(m, col.key): mark for m, v in cells.items() if v == target})
    return marks


# -----------------------------------------------------------------------------
# Rendering: a format's marks of rank, of a missing value and of the notes' footnotes

MARKDOWN = {BEST: "**{}**", SECOND: "<u>{}</u>", "missing": "-", "unfinished": "*", "failed": "§", "limited": "†", "skipped": "‡"}
LATEX = {BEST: r"\textbf{{{}}}", SECOND: r"\underline{{{}}}", "missing": "--", "unfinished": "$^*$", "failed": r"$^\S$",
         "limited": r"$^\dagger$", "skipped": r"$^\ddagger$"}
CELL_MARKS = ("unfinished", "failed", "limited", "skipped")  # the footnote marks a cell may carry, in this order


def _number(value: float | None, decimals: int, missing: str) -> str:
    return missing if value is None or not math.isfinite(value) else f"{value:.{decimals}f}"


def _caption(table: Table) -> str:
    number = f"Table {table.number}" if table.number in TABLE_NUMBERS else "Table"
    return f"{number}. {table.title} (best in bold, second underlined)."


def _notes(table: Table, with_paper: bool) -> list[str]:
    notes = []
    if with_paper and table.paper:
        notes.append("In parentheses: the paper's value.")
    if table.unfinished:
        notes.append("* the run has not reached max_iters (still training, or stopped by a signal or a crash).")
    if table.failed:
        notes.append("§ FAILED: train.py ended the run before max_iters (the collapse alarm or a non-finite loss); the value is its last before the stop.")
    if table.limited:
        limits = ", ".join(sorted({f"{v:g}" for v in table.limited.values()}))
        notes.append(f"† LIMITED: from a --limit evaluation (at most {limits} examples per task): partial numbers, "
                     "not final and not ranked; rerun eval/zero_shot.py without --limit.")
    if table.skipped:
        by_method: dict[str, list[str]] = {}
        for row, key in sorted(table.skipped):
            by_method.setdefault(row_label(row), []).append(next(c.header for c in table.columns if c.key == key))
        which = "; ".join(f"{m}: {', '.join(headers)}" for m, headers in by_method.items())
        notes.append(f"‡ NOT EVALUATED: the benchmark's files were absent (eval/zero_shot.py --skip_missing), so these rows are not a complete paper evaluation ({which}).")
    return notes


def _rows(table: Table, style: dict[str, str], with_paper: bool) -> list[tuple[str, list[str]]]:
    """(label, cells) of each row; a cell is the value, its rank mark, its footnote marks (CELL_MARKS), the paper's value."""
    marks = rank_marks(table)
    rows = []
    for method in sort_rows(table.values):  # the paper's methods first, each method's GPT-2 row before its other blocks
        cells = []
        for column in table.columns:
            key = (method, column.key)
            text = _number(table.values[method].get(column.key), column.decimals, style["missing"])
            text = style[marks[key]].format(text) if key in marks else text
            text += "".join(style[name] for name in CELL_MARKS if key in getattr(table, name))
            if with_paper and table.paper:
                text += f" ({_number(table.paper.get(method, {}).get(column.key), column.decimals, style['missing'])})"
            cells.append(text)
        rows.append((row_label(method), cells))
    return rows


def to_markdown(table: Table, with_paper: bool = False) -> str:
    header = " | ".join(f"{c.group} {c.header}".strip() for c in table.columns)
    lines = [f"**{_caption(table)}**", "", f"| Method | {header} |", "|:--|" + "--:|" * len(table.columns)]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in _rows(table, MARKDOWN, with_paper)]
    notes = _notes(table, with_paper)
    return "\n".join(lines + ([""] + notes if notes else []))


LATEX_SPECIAL = str.maketrans({"&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "$": r"\$"})


def to_latex(table: Table, with_paper: bool = False) -> str:
    """A booktabs tabular (needs \\usepackage{booktabs})."""
    lines = [f"% {_caption(table)}", r"\begin{tabular}{l" + "r" * len(table.columns) + "}", r"\toprule"]
    if any(c.group for c in table.columns):  # a \multicolumn row of the groups above the column headers
        spans = [(group, len(list(run))) for group, run in groupby(c.group for c in table.columns)]
        lines.append(" & " + " & ".join(rf"\multicolumn{{{n}}}{{c}}{{{g.translate(LATEX_SPECIAL)}}}" for g, n in spans) + r" \\")
    lines += ["Method & " + " & ".join(c.header.translate(LATEX_SPECIAL) for c in table.columns) + r" \\", r"\midrule"]
    lines += [label.translate(LATEX_SPECIAL) + " & " + " & ".join(cells) + r" \\" for label, cells in _rows(table, LATEX, with_paper)]
    lines += [r"\bottomrule", r"\end{tabular}", *(f"% {note}" for note in _notes(table, with_paper))]
    return "\n".join(lines)


RENDERERS = {"markdown": to_markdown, "latex": to_latex}


def render(tables: list[Table], fmt: str, with_paper: bool = False) -> str:
    return "\n\n".join(RENDERERS[fmt](t, with_paper) for t in tables) + "\n"


# -----------------------------------------------------------------------------
# Command line


def select(tables: list[Table], numbers: list[str]) -> list[Table]:
    """Tables with the given numbers; other datasets' zero-shot tables come with 4 or 5."""
    wanted = set(numbers) | ({"Z"} if {"4", "5"} & set(numbers) else set())
    return [t for t in tables if t.number in wanted]


def left_out_reasons(runs: list[Run], tables: list[Table], numbers: list[str], datasets: Collection[str] | None) -> dict[str, str]:
    """{table number: why it is not among the tables} for each requested zero-shot table (4, 5) left out."""
    reasons = {}
    for dataset, number in ZERO_SHOT_TABLE.items():
        if number not in numbers or any(t.number == number for t in tables):
            continue
        if datasets is not None and dataset not in datasets:
            reasons[number] = f"--datasets leaves out {dataset}"
            continue
        of_dataset = [r for r in runs if r.dataset == dataset]
        if not of_dataset:
            reasons[number] = f"no {dataset} run among the runs read"
            continue
        limited = [p for r in of_dataset for p in sorted(r.path.glob("ckpt_zero_shot_limit*.json"))]
        reasons[number] = (
            f"no {dataset} run has {ZERO_SHOT_NAME} ({len(of_dataset)} read)"
            + (f"; there are only --limit results ({len(limited)} files, e.g. {limited[0]}), partial numbers that tables do not read"
               if limited else "")
            + "; run eval/zero_shot.py without --limit (scripts/launch.py --stage zero_shot) to write it"
        )
    return reasons


def tables_of_runs(runs: list[Run], numbers: list[str], with_paper: bool, reference: dict[str, Any]) -> list[Table]:
    """The selected tables of some runs, with the paper's values beside ours when with_paper."""
    tables = select(run_tables(runs), numbers)
    if with_paper:
        attach_paper(tables, reference)
    return tables


def build_tables(runs_root: Path | None, numbers: list[str], with_paper: bool, reference_path: Path = REFERENCE_PATH,
                 datasets: Collection[str] | None = None, scales: Collection[str] | None = None) -> list[Table]:
    """The selected tables from the runs under runs_root of the given datasets and scales (None:
    all), or the paper's own when runs_root is None."""
    reference = load_reference(Path(reference_path))
    if runs_root is None:
        return select(paper_tables(reference), numbers)
    return tables_of_runs(load_runs(Path(runs_root), datasets, scales), numbers, with_paper, reference)


def write_tables(tables: list[Table], prefix: Path, with_paper: bool = False) -> list[Path]:
    """PREFIX.md and PREFIX.tex, each written to a temporary name beside it and renamed, the .md
    only once the .tex is in place: a failure (a full disk, a folder that cannot be made) leaves
    both as they were, no partial file, and one UsageError naming the file."""
    md, tex = (prefix.with_name(prefix.name + suffix) for suffix in (".md", ".tex"))
    markdown, latex = render(tables, "markdown", with_paper), render(tables, "latex", with_paper)

    def write_md(tmp: Path) -> None:
        tmp.write_text(markdown, encoding="utf-8")
        write_text_atomically(tex, latex)

    try:
        write_atomically(md, write_md)
    except WriteError as exc:
        raise UsageError(str(exc)) from None
    return [md, tex]


def _filter(spec: str | None, what: str) -> set[str] | None:
    """--datasets / --scales: a set of names, or None (no filter) when not given."""
    if spec is None:
        return None
    items = {s.strip() for s in spec.split(",") if s.strip()}
    if not items:
        raise UsageError(f"--{what} {spec!r} names nothing; give a comma-separated list, or leave the option out for all.")
    return items


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--runs_root", default="out", help="folder holding the run folders (default: out)")
    p.add_argument("--source", choices=("runs", "paper"), default="runs", help="our runs, or the paper's own numbers")
    p.add_argument("--tables", default="2,3,4,5", help="comma-separated table numbers (default: 2,3,4,5)")
    p.add_argument("--datasets", default=None, help="comma-separated datasets whose runs are tabled, e.g. openwebtext (default: every dataset found)")
    p.add_argument("--scales", default=None, help="comma-separated scales whose runs are tabled: S, M, L or <layers>x<width> (default: every scale found)")
    p.add_argument("--format", choices=tuple(RENDERERS), default="markdown", help="output format")
    p.add_argument("--paper", action="store_true", help="show the paper's value in parentheses beside ours")
    p.add_argument("--reference", default=str(REFERENCE_PATH), help="the paper's numbers (default: reference/paper_results.json)")
    p.add_argument("--out", default=None, help="also write the tables to OUT.md and OUT.tex")
    add_import_options(p)  # the modules of a run's own connection: imported only when named or trusted
    args = p.parse_args(argv)
    written: list[Path] = []
    try:
        use_import_options(args, UsageError)
        numbers = [n.strip() for n in args.tables.split(",") if n.strip()]
        bad = [n for n in numbers if n not in TABLE_NUMBERS]
        if bad or not numbers:
            raise UsageError(f"--tables {args.tables!r} is not valid; choose from: {', '.join(TABLE_NUMBERS)}.")
        datasets = _filter(args.datasets, "datasets")
        if args.source == "paper":
            tables = build_tables(None, numbers, False, Path(args.reference))
        else:
            # Built here rather than by build_tables, because the runs also say which tables are missing and why.
            runs = load_runs(Path(args.runs_root), datasets, _filter(args.scales, "scales"))
            tables = tables_of_runs(runs, numbers, args.paper, load_reference(Path(args.reference)))
            if mixed := mixed_runs_text(runs, Path(args.runs_root)):
                print(f"note: {mixed}", file=sys.stderr)
            for number, why in left_out_reasons(runs, tables, numbers, datasets).items():
                print(f"Table {number} left out: {why}.", file=sys.stderr)
        if not tables:
            print("No table has data: zero-shot tables need ckpt_zero_shot.json files (eval/zero_shot.py).", file=sys.stderr)
        if any(t.limited for t in tables):
            print("warning: some zero-shot results come from --limit evaluations; they are marked † and are not final.", file=sys.stderr)
        if any(t.skipped for t in tables):
            print("warning: some zero-shot evaluations skipped benchmarks whose files were absent; they are marked ‡ and are not complete.",
                  file=sys.stderr)
        if args.out:  # before the tables are printed, so that a refusal is the last line
            written = write_tables(tables, Path(args.out), args.paper)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render(tables, args.format, args.paper), end="")
    for path in written:
        print(f"written: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
