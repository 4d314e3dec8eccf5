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
run that has not reached max_iters (still training, stopped, or diverged). A '†' marks
zero-shot numbers from a --limit evaluation (a subset of each benchmark): they are partial,
never ranked, and a note under the table says so. eval/zero_shot.py writes such results to
ckpt_zero_shot_limit<N>.json, which tables do not read; only an older or copied limited file
named ckpt_zero_shot.json gets here.
"""

from __future__ import annotations

import sys
from pathlib import Path


import argparse
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from spheretnorm.eval.zero_shot import PAPER_COLUMNS
from spheretnorm.runs import HelpFormatter
from spheretnorm.runs import (
    REFERENCE_PATH,
    Run,
    UsageError,
    dataset_display,
    display_name,
    find_runs,
    group_label,
    index_runs,
    load_reference,
    sort_groups,
    sort_methods,
)
from spheretnorm.rundir import AVG_WINDOW

TABLE_NUMBERS = ("2", "3", "4", "5")
# The reference tables in paper_results.json, and the dataset of each zero-shot table.
REFERENCE_KEYS = {
    "2": "table2_loss",
    "3": "table3_val_ppl",
    "4": "table4_zero_shot_fineweb_edu_L",
    "5": "table5_zero_shot_openwebtext_L",
}
ZERO_SHOT_TABLE = {"fineweb_edu": "4", "openwebtext": "5"}
BEST, SECOND = "best", "second"


@dataclass(frozen=True)
class Column:
    key: str  # the column name in paper_results.json, e.g. "openwebtext/S/val"
    group: str  # the header above a group of columns, e.g. "OpenWebText S"
    header: str  # e.g. "val"
    higher_is_better: bool
    decimals: int

    @property
    def label(self) -> str:
        return f"{self.group} {self.header}".strip()


@dataclass
class Table:
    number: str  # "2".."5" (the paper's numbering); "Z" for a zero-shot table of another dataset
    title: str
    columns: list[Column]
    values: dict[str, dict[str, float | None]]  # method -> column key -> value
    paper: dict[str, dict[str, float | None]] = field(default_factory=dict)
    unfinished: set[tuple[str, str]] = field(default_factory=set)  # (method, column key)
    limited: dict[tuple[str, str], int | float] = field(default_factory=dict)  # (method, column key) -> --limit
    scale: str | None = None  # the models' scale, for a zero-shot table (one dataset and scale)

    @property
    def methods(self) -> list[str]:
        return sort_methods(self.values)


# -----------------------------------------------------------------------------
# Columns


def loss_columns(groups: Iterable[tuple[str, str]]) -> list[Column]:
    return [
        Column(f"{d}/{s}/{split}", group_label(d, s), split, False, 3)
        for d, s in groups
        for split in ("train", "val")
    ]


def ppl_columns(groups: Iterable[tuple[str, str]]) -> list[Column]:
    return [Column(f"{d}/{s}", dataset_display(d), s, False, 2) for d, s in groups]


def zero_shot_columns() -> list[Column]:
    # Accuracies (in percent) are better high, the two perplexity columns low.
    return [Column(c.key, "", c.header, c.percent, 2) for c in PAPER_COLUMNS]


TITLES = {
    "2": f"Final train loss (mean of the last {AVG_WINDOW} iterations) and final val loss",
    "3": "Final val perplexity",
}


def zero_shot_title(dataset: str, scale: str) -> str:
    return f"Zero-shot accuracy (%) and perplexity, models trained on {group_label(dataset, scale)}"


# -----------------------------------------------------------------------------
# Tables from the paper and from runs


def _groups_of(keys: Iterable[str]) -> list[tuple[str, str]]:
    """(dataset, scale) pairs of column keys such as 'fineweb_edu/S/train', in order."""
    return list(dict.fromkeys(tuple(k.split("/")[:2]) for k in keys))


def paper_tables(reference: dict[str, Any]) -> list[Table]:
    """The paper's Tables 2-5, as printed in it (paper_results.json)."""
    tables = []
    for number, ref_key in REFERENCE_KEYS.items():
        ref = reference[ref_key]
        if number == "2":
            columns = loss_columns(_groups_of(ref["columns"]))
            title = TITLES[number]
        elif number == "3":
            columns = ppl_columns(_groups_of(ref["columns"]))
            title = TITLES[number]
        else:
            columns = zero_shot_columns()
            dataset = next(d for d, n in ZERO_SHOT_TABLE.items() if n == number)
            title = zero_shot_title(dataset, "L")
        scale = None if number in ("2", "3") else "L"
        # The columns are rebuilt from their keys; they must come out in the reference's order.
        assert [c.key for c in columns] == ref["columns"], f"column order of {ref_key} changed"
        values = {m: dict(zip(ref["columns"], row)) for m, row in ref["rows"].items()}
        tables.append(Table(number, title, columns, values, scale=scale))
    return tables


def run_tables(runs: list[Run]) -> list[Table]:
    """Tables 2 and 3 over every (dataset, scale) found, and a zero-shot table per group that has results."""
    index = index_runs(runs)
    groups = sort_groups((d, s) for d, s, _ in index)
    loss = Table("2", TITLES["2"], loss_columns(groups), {})
    ppl = Table("3", TITLES["3"], ppl_columns(groups), {})
    zero_shot: dict[tuple[str, str], Table] = {}
    for (dataset, scale, method), run in index.items():
        prefix = f"{dataset}/{scale}"
        val = run.final_val_loss
        loss.values.setdefault(method, {}).update({f"{prefix}/train": run.final_train_loss, f"{prefix}/val": val})
        ppl.values.setdefault(method, {})[prefix] = math.exp(val) if val is not None and val < 700 else None
        if not run.finished:
            loss.unfinished |= {(method, f"{prefix}/train"), (method, f"{prefix}/val")}
            ppl.unfinished.add((method, prefix))
        if run.zero_shot:
            number = ZERO_SHOT_TABLE.get(dataset, "Z")
            table = zero_shot.setdefault(
                (dataset, scale), Table(number, zero_shot_title(dataset, scale), zero_shot_columns(), {}, scale=scale)
            )
            table.values[method] = {c.key: run.zero_shot.get(c.key) for c in table.columns}
            if not run.finished:
                table.unfinished |= {(method, c.key) for c in table.columns}
            if run.zero_shot_limit is not None:
                table.limited.update({(method, c.key): run.zero_shot_limit for c in table.columns})
    return [loss, ppl] + [zero_shot[g] for g in sort_groups(zero_shot)]


def attach_paper(tables: list[Table], reference: dict[str, Any]) -> None:
    """Put the paper's value of each (method, column) that the paper has beside ours."""
    by_number = {t.number: t for t in paper_tables(reference)}
    for table in tables:
        ref = by_number.get(table.number)
        # The paper's zero-shot tables are of its L models only.
        if ref is None or table.scale not in (None, "L"):
            continue
        table.paper = {m: {c.key: ref.values.get(m, {}).get(c.key) for c in table.columns} for m in table.values}


# -----------------------------------------------------------------------------
# Ranking: best bold, second underlined


def rounded(value: float | None, decimals: int) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, decimals)


def rank_marks(table: Table) -> dict[tuple[str, str], str]:
    """{(method, column key): 'best' | 'second'} for each column's best and second-best value."""
    marks: dict[tuple[str, str], str] = {}
    for col in table.columns:
        # Partial (--limit) numbers are not comparable with full ones: they take no rank.
        cells = {m: rounded(table.values[m].get(col.key), col.decimals) for m in table.values if (m, col.key) not in table.limited}
        distinct = sorted({v for v in cells.values() if v is not None}, reverse=col.higher_is_better)
        for mark, target in zip((BEST, SECOND), distinct):
            marks.update({(m, col.key): mark for m, v in cells.items() if v == target})
    return marks


# -----------------------------------------------------------------------------
# Rendering


def _number(value: float | None, decimals: int, missing: str) -> str:
    return missing if value is None or not math.isfinite(value) else f"{value:.{decimals}f}"


def _caption(table: Table) -> str:
    number = f"Table {table.number}" if table.number in TABLE_NUMBERS else "Table"
    rule = "best in bold, second underlined"
    return f"{number}. {table.title} ({rule})."


def _notes(table: Table, with_paper: bool) -> list[str]:
    notes = []
    if with_paper and table.paper:
        notes.append("In parentheses: the paper's value.")
    if table.unfinished:
        notes.append("* the run has not reached max_iters (still training, stopped or diverged).")
    if table.limited:
        limits = ", ".join(sorted({f"{v:g}" for v in table.limited.values()}))
        notes.append(
            f"† LIMITED: from a --limit evaluation (at most {limits} examples per task): partial numbers, "
            "not final and not ranked; rerun eval/zero_shot.py without --limit."
        )
    return notes


def _cell(
    table: Table,
    method: str,
    column: Column,
    marks: dict[tuple[str, str], str],
    style: dict[str, str],
    missing: str,
    unfinished_mark: str,
    with_paper: bool,
    limited_mark: str = "†",
) -> str:
    """One formatted cell: the value, its rank mark, the unfinished and limited marks, the paper's value."""
    key = (method, column.key)
    text = _number(table.values[method].get(column.key), column.decimals, missing)
    if key in marks:
        text = style[marks[key]].format(text)
    if key in table.unfinished:
        text += unfinished_mark
    if key in table.limited:
        text += limited_mark
    if with_paper and table.paper:
        paper_value = table.paper.get(method, {}).get(column.key)
        text += f" ({_number(paper_value, column.decimals, missing)})"
    return text


def to_markdown(table: Table, with_paper: bool = False) -> str:
    marks = rank_marks(table)
    style = {BEST: "**{}**", SECOND: "<u>{}</u>"}
    lines = [f"**{_caption(table)}**", ""]
    lines.append("| Method | " + " | ".join(c.label for c in table.columns) + " |")
    lines.append("|:--|" + "--:|" * len(table.columns))
    for m in table.methods:
        cells = [_cell(table, m, c, marks, style, "-", "*", with_paper) for c in table.columns]
        lines.append(f"| {display_name(m)} | " + " | ".join(cells) + " |")
    notes = _notes(table, with_paper)
    return "\n".join(lines + ([""] + notes if notes else []))


_LATEX_SPECIAL = {"&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "$": r"\$"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def _latex_group_header(columns: list[Column]) -> str | None:
    """The \\multicolumn row above the column headers (None when no column has a group)."""
    if not any(c.group for c in columns):
        return None
    spans: list[tuple[str, int]] = []
    for c in columns:
        if spans and spans[-1][0] == c.group:
            spans[-1] = (c.group, spans[-1][1] + 1)
        else:
            spans.append((c.group, 1))
    cells = [rf"\multicolumn{{{n}}}{{c}}{{{latex_escape(g)}}}" for g, n in spans]
    return " & " + " & ".join(cells) + r" \\"


def to_latex(table: Table, with_paper: bool = False) -> str:
    """A booktabs tabular (needs \\usepackage{booktabs})."""
    marks = rank_marks(table)
    style = {BEST: r"\textbf{{{}}}", SECOND: r"\underline{{{}}}"}
    lines = [
        f"% {_caption(table)}",
        r"\begin{tabular}{l" + "r" * len(table.columns) + "}",
        r"\toprule",
    ]
    group_row = _latex_group_header(table.columns)
    if group_row:
        lines.append(group_row)
    lines.append("Method & " + " & ".join(latex_escape(c.header) for c in table.columns) + r" \\")
    lines.append(r"\midrule")
    for m in table.methods:
        cells = [_cell(table, m, c, marks, style, "--", "$^*$", with_paper, r"$^\dagger$") for c in table.columns]
        lines.append(latex_escape(display_name(m)) + " & " + " & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    lines += [f"% {note}" for note in _notes(table, with_paper)]
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


def build_tables(runs_root: Path | None, numbers: list[str], with_paper: bool, reference_path: Path = REFERENCE_PATH) -> list[Table]:
    """The selected tables from the runs under runs_root, or the paper's own when runs_root is None."""
    reference = load_reference(Path(reference_path))
    if runs_root is None:
        return select(paper_tables(reference), numbers)
    runs = find_runs(Path(runs_root))
    if not runs:
        raise UsageError(f"No runs under {str(runs_root)!r} (a run folder holds config.json and metrics.jsonl).")
    tables = select(run_tables(runs), numbers)
    if with_paper:
        attach_paper(tables, reference)
    return tables


def write_tables(tables: list[Table], prefix: Path, with_paper: bool = False) -> list[Path]:
    """PREFIX.md and PREFIX.tex."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt, suffix in (("markdown", ".md"), ("latex", ".tex")):
        path = prefix.with_name(prefix.name + suffix)
        path.write_text(render(tables, fmt, with_paper), encoding="utf-8")
        paths.append(path)
    return paths


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--runs_root", default="out", help="folder holding the run folders (default: out)")
    p.add_argument("--source", choices=("runs", "paper"), default="runs", help="our runs, or the paper's own numbers")
    p.add_argument("--tables", default="2,3,4,5", help="comma-separated table numbers (default: 2,3,4,5)")
    p.add_argument("--format", choices=tuple(RENDERERS), default="markdown", help="output format")
    p.add_argument("--paper", action="store_true", help="show the paper's value in parentheses beside ours")
    p.add_argument("--reference", default=str(REFERENCE_PATH), help="the paper's numbers (default: reference/paper_results.json)")
    p.add_argument("--out", default=None, help="also write the tables to OUT.md and OUT.tex")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        numbers = [n.strip() for n in args.tables.split(",") if n.strip()]
        bad = [n for n in numbers if n not in TABLE_NUMBERS]
        if bad or not numbers:
            raise UsageError(f"--tables {args.tables!r} is not valid; choose from: {', '.join(TABLE_NUMBERS)}.")
        runs_root = None if args.source == "paper" else Path(args.runs_root)
        tables = build_tables(runs_root, numbers, args.paper, Path(args.reference))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not tables:
        print("No table has data: zero-shot tables need ckpt_zero_shot.json files (eval/zero_shot.py).", file=sys.stderr)
    if any(t.limited for t in tables):
        print("warning: some zero-shot results come from --limit evaluations; they are marked † and are not final.", file=sys.stderr)
    print(render(tables, args.format, args.paper), end="")
    if args.out:
        for path in write_tables(tables, Path(args.out), args.paper):
            print(f"written: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
