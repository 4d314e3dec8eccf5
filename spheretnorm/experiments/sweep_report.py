"""The tables, statistics and records of a study's rows: the table of runs, the summary over the
seeds (paired by seed, or for a sweep that selects a rate, the held-out seeds at each group's
selected rate: selected_summary), the decision rules' verdicts, and OUT_DIR/<stem>.md and .json.

It reads rows (sweep_runner.run_sweep's, in the plan's order) and the spec (sweep_plan.py), and
runs nothing.
"""

from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from spheretnorm.diagnostics import DIAGNOSTICS
from spheretnorm.experiments.stats import Rule, Spread, parse_rule, spread, verdict
from spheretnorm.experiments.sweep_plan import (
    BestRate, FAILURE_WORDS, FULL_METRIC, SAMPLED_METRIC, Column, Point, Seeds, Sweep, distinct_labels, final_loss, has_ended, point, selection_of,
    table_metric,
)
from spheretnorm.experiments.sweep_record import read_record
from spheretnorm.runtime.cli import UsageError

METRIC_TEXT = {FULL_METRIC: "val_loss_full, the whole validation split in non-overlapping windows",
               SAMPLED_METRIC: "val_loss, the mean of eval_iters sampled batches (some run lacks val_loss_full)"}
NO_SPHERE = "none"  # kernel_path_text's sphere path of a run off the sphere: it fits any sphere path


def kernel_paths_line(rows: Iterable[dict[str, Any]], mix: bool) -> str:
    """'Kernel path: float32 eager fused_eager.': the paths of a table's runs (a run off the sphere
    fits the sphere runs' path). Several are a UsageError unless mix (--mix_kernel_paths), since
    runs on two paths agree only up to rounding, which near a collapse can decide one."""
    paths = sorted({r["kernel_path"] for r in rows if r.get("kernel_path")})
    numeric = {p.rsplit(" ", 1)[0] for p in paths}
    sphere = {p.rsplit(" ", 1)[-1] for p in paths} - {NO_SPHERE}
    if (len(numeric) > 1 or len(sphere) > 1) and not mix:
        raise UsageError(f"the runs of this table ran on {len(paths)} kernel paths ({'; '.join(paths)}); give --mix_kernel_paths "
                         f"to tabulate them together, or tabulate runs of one path.")
    return f"Kernel path{'s' if len(paths) > 1 else ''}: {'; '.join(paths) or 'none recorded'}."


def wall_clock_line(wall: float, rows: list[dict[str, Any]]) -> str:
    """'Wall-clock: ...', saying how many runs were reused and what their training had cost; rows
    that share a run (one folder) count once."""
    rows = list({r["out_dir"]: r for r in rows}.values())
    text = f"Wall-clock: {wall / 60:.1f} min ({wall:.0f} s) for {len(rows)} runs"
    reused = [r for r in rows if r["reused"]]
    if reused:
        earlier = sum(r["seconds"] or 0 for r in reused)
        text += f", {len(reused)} of them found finished and reused (their training took {earlier / 60:.1f} min of run time)"
    return text + "."


def exit_status(rows: list[dict[str, Any]]) -> int:
    """1 when any run of a study failed, else 0."""
    return 1 if any(r["status"] == "failed" for r in rows) else 0


# -----------------------------------------------------------------------------
# Tables of a study's runs


def markdown_table(rows: list[dict[str, Any]], columns: tuple[Column, ...] | list[Column]) -> str:
    lines = ["| " + " | ".join(c.header for c in columns) + " |", "|" + "".join(f"{c.align}|" for c in columns)]
    return "\n".join([*lines, *("| " + " | ".join(c.cell(r) for c in columns) + " |" for r in rows)])


def diagnostic_columns() -> list[Column]:
    """The diagnostic columns of a study's table, in DIAGNOSTICS order."""
    return [Column(s.header, s.key, s.fmt) for entry in DIAGNOSTICS for s in entry.summaries]


def pivot_table(rows: list[dict[str, Any]], heads: list[Column], across: Callable[[dict[str, Any]], Any], values: list[Any],
                header: Callable[[Any], str], cell: Callable[[dict[str, Any] | None], str]) -> str:
    """A table with a line per distinct set of head cells (in the rows' order) and a column per
    value of `across` (e.g. the learning rate); cell(None) fills a combination with no run."""
    lines: dict[tuple[str, ...], dict[Any, dict[str, Any]]] = {}
    for r in rows:
        lines.setdefault(tuple(h.cell(r) for h in heads), {})[across(r)] = r
    top = ["| " + " | ".join([*(h.header for h in heads), *map(header, values)]) + " |",
           "|" + "".join(f"{h.align}|" for h in heads) + "--:|" * len(values)]
    return "\n".join([*top, *("| " + " | ".join([*key, *(cell(line.get(v)) for v in values)]) + " |" for key, line in lines.items())])


def paired_seed_summary(rows: list[dict[str, Any]], baseline_title: str, metric: str = SAMPLED_METRIC) -> tuple[str, list[tuple[str, Gaps]]]:
    """The loss per variant over its seeds (each seed counts: these studies select nothing): mean
    and SD, and the gap to its baseline's run of the same seed (paired, so that what a seed does to
    every variant cancels) with its mean, SD and 95% interval; a variant with a failed seed says so
    and has no mean. Reads each row's "name", "seed" and "baseline" (name_rows). The table ('' when
    no variant has two seeds) and each variant's gaps (for the rules' verdicts)."""
    by_name: dict[str, dict[Any, dict[str, Any]]] = {}
    for r in rows:
        by_name.setdefault(r["name"], {})[r.get("seed")] = r
    if max(map(len, by_name.values()), default=0) < 2:
        return "", []
    summary, verdicts = [], []
    for name, mine in by_name.items():
        cell = seed_cell(mine, mine, metric)
        base = next((r["baseline"] for r in mine.values() if r.get("baseline")), None)
        gaps = gap_values(cell, seed_cell(by_name.get(base, {}), mine, metric)) if base and base != name else {}
        loss = cell.spread()
        summary.append({"name": name, "seeds": len(mine), "loss": cell.text(), "sd": loss.sd if loss else None, **gap_record("gap", gaps)})
        if gaps:
            verdicts.append((name, gaps))
    table = markdown_table(summary, (Column("method", "name", align=":--"), Column("seeds", "seeds"), Column("loss, mean", "loss"),
                                     Column("SD", "sd", ".3f"), Column(f"minus {baseline_title} (same seed), mean", "gap_text"),
                                     Column("SD", "gap_sd", ".3f"), Column("95% interval", "gap_interval")))
    return table, verdicts


# -----------------------------------------------------------------------------
# Selection and held-out seeds: the statistics of a study's table (stats.py has the maths)


@dataclass(frozen=True)
class SeedCell:
    """One variant's runs over some seeds (at one rate): the losses of those that trained, what
    went wrong with those that failed, and the seeds whose run is not there (yet)."""

    losses: dict[int, float]
    failed: dict[int, str]  # seed -> a FAILURE_WORDS word
    missing: tuple[int, ...]

    def values(self) -> dict[int, float | None]:
        """{seed: loss}, inf for a failed run and None for a missing one (what a gap subtracts)."""
        out: dict[int, float | None] = {s: math.inf for s in self.failed}
        out.update(self.losses)
        return {**out, **{s: None for s in self.missing}}

    def spread(self) -> Spread | None:
        """The losses' mean, SD and interval where every seed trained, else None: a failed seed is
        never averaged away, and a missing one leaves the cell open."""
        return spread(list(self.losses.values())) if self.losses and not self.failed and not self.missing else None

    def text(self, fmt: str = ".3f") -> str | None:
        """The headline cell: the mean, 'failed (seed 1338 collapsed)' or 'runs missing (seed 1339)'."""
        if self.failed:
            return "failed (" + ", ".join(f"seed {s} {word}" for s, word in self.failed.items()) + ")"
        if self.missing:
            return f"runs missing (seed {', '.join(map(str, self.missing))})"
        s = self.spread()
        return None if s is None else format(s.mean, fmt)

    def seeds_text(self, fmt: str = ".3f") -> str | None:
        """Each seed: '1338: 2.031, 1339: collapsed, 1340: -'."""
        def one(seed: int) -> str:
            return format(self.losses[seed], fmt) if seed in self.losses else self.failed.get(seed, "-")
        return ", ".join(f"{s}: {one(s)}" for s in sorted(self.values())) or None

    def record(self) -> dict[str, Any]:
        s = self.spread()
        return {"losses": self.losses, "failed": self.failed, "missing": list(self.missing),
                "mean": s.mean if s else None, "sd": s.sd if s else None, "low": s.low if s else None, "high": s.high if s else None}


def seed_cell(runs: dict[int, dict[str, Any]], seeds: Iterable[int], metric: str) -> SeedCell:
    """The SeedCell of `seeds` from their rows ({seed: row}); a run that crashed or is unfinished is missing."""
    losses, failed, missing = {}, {}, []
    for s in seeds:
        row = runs.get(s)
        if row is None or not has_ended(row):
            missing.append(s)
        elif math.isfinite(loss := final_loss(row, metric)):
            losses[s] = loss
        else:
            failed[s] = FAILURE_WORDS.get(row["status"], row["status"])
    return SeedCell(losses, failed, tuple(missing))


def selected_cell(runs: list[dict[str, Any]], seeds: Seeds, metric: str, rate: str = "lr", seed: str = "seed") -> dict[str, Any]:
    """A group's runs (one arm, all rates and seeds) as its table shows them: the rate where the
    selection seed's loss is lowest, that loss, the held-out seeds there (a SeedCell, the
    headline), and each rate where the selection seed trained but a held-out seed failed."""
    by = {(r[rate], r[seed]): r for r in runs}
    chosen = {lr: final_loss(r, metric) for (lr, s), r in by.items() if s == seeds.selection and has_ended(r)}
    trained = {lr: loss for lr, loss in chosen.items() if math.isfinite(loss)}
    best = min(trained, key=trained.__getitem__) if trained else None
    held = seed_cell({s: r for (lr, s), r in by.items() if lr == best}, seeds.held_out, metric)
    failed_beside = [(lr, s, word) for lr in sorted(trained) for s, word in
                     seed_cell({q: r for (x, q), r in by.items() if x == lr}, seeds.held_out, metric).failed.items()]
    return {"rate": best, "selection_loss": trained.get(best) if best is not None else None, "held_out": held, "held_out_failed_at": failed_beside,
            "selection_failed": sorted(lr for lr in chosen if lr not in trained)}


def headline_text(cell: dict[str, Any], selection: int) -> str | None:
    """A selected_cell's headline: the held-out mean or its failures; where the selection seed
    failed at every rate it has ended at, no rate was selected, and the cell says so (not 'runs
    missing', which reads as runs still to come)."""
    if cell["rate"] is None and cell["selection_failed"]:
        rates = ", ".join(f"{lr:g}" for lr in cell["selection_failed"])
        return f"no rate selected (seed {selection} failed at {rates})"
    return cell["held_out"].text()


def failed_at_text(failed: list[tuple[float, int, str]]) -> str:
    """'0.004 (seed 1338 collapsed)': the rates where the selection seed trained and a held-out seed did not."""
    return ", ".join(f"{lr:g} (seed {s} {word})" for lr, s, word in failed) or "-"


Gaps = dict[int, "float | None"]  # {held-out seed: arm minus baseline}; see gap_values


def gap_values(mine: SeedCell, base: SeedCell) -> Gaps:
    """Per seed, the arm's loss minus the baseline's, each at its own selected rate: None where
    either run is missing, +inf where the arm failed and the baseline trained, -inf the reverse,
    nan where both failed (a failure counts against its side, stats.verdict)."""
    a, b = mine.values(), base.values()
    return {s: None if a[s] is None or b.get(s) is None else a[s] - b[s] for s in a}  # type: ignore[operator]


def gap_spread(gaps: Gaps) -> Spread | None:
    """The gaps' mean, SD and interval where every seed has a finite gap, else None."""
    values = list(gaps.values())
    return spread(values) if values and all(v is not None and math.isfinite(v) for v in values) else None  # type: ignore[arg-type]


def gap_text(gaps: Gaps, fmt: str = "+.3f") -> str | None:
    """The mean gap, or why there is none: 'failed (seed 1338: the arm failed)', 'runs missing (seed 1339)'."""
    failed = [f"seed {s}: {'both failed' if math.isnan(g) else 'the arm failed' if g > 0 else 'the baseline failed'}"
              for s, g in gaps.items() if g is not None and not math.isfinite(g)]
    missing = [str(s) for s, g in gaps.items() if g is None]
    if failed:
        return f"failed ({', '.join(failed)})"
    if missing:
        return f"runs missing (seed {', '.join(missing)})"
    s = gap_spread(gaps)
    return None if s is None else format(s.mean, fmt)


def gap_record(prefix: str, gaps: Gaps) -> dict[str, Any]:
    """A summary row's keys of a gap: each seed's, the mean, SD and interval (None where there is none)."""
    s = gap_spread(gaps)
    return {f"{prefix}s": gaps, f"{prefix}_text": gap_text(gaps), f"{prefix}_mean": s.mean if s else None, f"{prefix}_sd": s.sd if s else None,
            f"{prefix}_low": s.low if s else None, f"{prefix}_high": s.high if s else None,
            f"{prefix}_interval": s.interval_text() if s else None}


def gaps_text(gaps: Gaps, fmt: str = "+.3f") -> str | None:
    """Each seed's gap: '1338: -0.012, 1339: +inf'."""
    return ", ".join(f"{s}: {'-' if g is None else format(g, fmt)}" for s, g in sorted(gaps.items())) or None


GroupKey = tuple[Any, ...]  # a group's values of every row key but the rate and the seed (held_out_summary)


def held_out_summary(rows: list[dict[str, Any]], groups: Iterable[GroupKey], key: Callable[[dict[str, Any]], GroupKey],
                     baselines: dict[str, Callable[[GroupKey], GroupKey]], seeds: Seeds, metric: str, rate: str = "lr",
                     seed: str = "seed") -> list[dict[str, Any]]:
    """The statistics of a study that selects a rate (docs/EXPERIMENTS.md section 6): one summary
    per group of `groups`, in their order (key(row): a run's group, every rate and seed of it): its
    selected_cell ("rate", "selection_loss"; the held-out seeds: "held_out" the SeedCell's record,
    "held_out_text" each, "headline" their mean, where a failed seed is named, never averaged;
    "held_out_failed_at"), and for each baseline (prefix: the baseline group's key from the
    group's) gap_record's keys of the gaps paired by held-out seed (none where a group is its own
    baseline: a column of zeros would read as a result). A baseline group without runs has every
    seed missing."""
    runs: dict[GroupKey, list[dict[str, Any]]] = {}
    for r in rows:
        runs.setdefault(key(r), []).append(r)
    cell = functools.cache(lambda group: selected_cell(runs.get(group, []), seeds, metric, rate, seed))
    out = []
    for group in groups:
        mine = cell(group)
        held = mine["held_out"]
        gaps: dict[str, Any] = {}
        for prefix, baseline in baselines.items():
            base = baseline(group)
            gaps.update(gap_record(prefix, gap_values(held, cell(base)["held_out"]) if base != group else {}))
        out.append({"rate": mine["rate"], "selection_loss": mine["selection_loss"], "held_out": held.record(), "held_out_text": held.seeds_text(),
                    "headline": headline_text(mine, seeds.selection), **gaps, "held_out_failed_at": failed_at_text(mine["held_out_failed_at"])})
    return out


def group_keys(sweep: Sweep, chosen: BestRate) -> list[str]:
    """The row keys that make a group of a sweep that selects a rate: every one but the rate and the seed."""
    return [k for k in sweep.row_keys() if k not in (chosen.rate, chosen.seed)]


def selected_summary(sweep: Sweep, rows: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """held_out_summary of a sweep that selects a rate (selection_of), over its rows (name_rows): a
    group per set of values of every row key but the rate and the seed, in the rows' order, named
    ("name") by the settings in which the groups differ (distinct_labels); its baseline ("gap") the
    group of sweep.baseline's point, where the sweep has a baseline."""
    chosen = selection_of(sweep)
    if chosen is None:
        raise ValueError(f"Sweep {sweep.name!r} selects no rate (its follow_up is not a BestRate); its summary is paired_seed_summary.")
    keys = group_keys(sweep, chosen)

    def group_of(values: dict[str, Any] | Point) -> GroupKey:
        return tuple(values.get(k) for k in keys)

    def point_of(row: dict[str, Any]) -> Point:  # a row's point: its row keys, less those its point lacked (None)
        return point(**{k: row[k] for k in sweep.row_keys() if row.get(k) is not None})

    first: dict[GroupKey, dict[str, Any]] = {}
    for r in rows:
        first.setdefault(group_of(r), r)
    baseline = sweep.baseline
    baselines = {"gap": lambda group: group_of(baseline(point_of(first[group])))} if baseline else {}
    summary = held_out_summary(rows, first, group_of, baselines, Seeds.of(sweep.values(chosen.seed)), metric, chosen.rate, chosen.seed)
    points = [point(**{k: v for k, v in zip(keys, group) if v is not None}) for group in first]
    name = distinct_labels(sweep, points)
    return [{"name": name(p), **s} for p, s in zip(points, summary)]


def rate_header(sweep: Sweep, rows: list[dict[str, Any]], selection: int) -> str:
    """The rate column's title: which rate a row shows, selected on the selection seed, or given
    where an arm's grid holds one rate on that seed (nothing was chosen there)."""
    chosen = selection_of(sweep)
    assert chosen is not None
    keys = group_keys(sweep, chosen)
    grids: dict[GroupKey, set[Any]] = {}
    for r in rows:
        if r.get(chosen.seed) == selection:
            grids.setdefault(tuple(r.get(k) for k in keys), set()).add(r.get(chosen.rate))
    sizes = {len(grid) for grid in grids.values()}
    if sizes == {1}:
        return f"{chosen.rate} (given, one per arm: none selected)"
    return f"{chosen.rate} (selected on seed {selection}" + ("; given where an arm has one)" if 1 in sizes else ")")


def selected_table(sweep: Sweep, rows: list[dict[str, Any]], baseline_title: str, metric: str) -> tuple[str, list[tuple[str, Gaps]]]:
    """selected_summary as a table ('' without rows) and each group's held-out gaps to its
    baseline, for the rules' verdicts (paired_seed_summary's counterpart for a sweep that selects)."""
    chosen = selection_of(sweep)
    summary = selected_summary(sweep, rows, metric) if chosen else []
    if not summary:
        return "", []
    selection = Seeds.of(sweep.values(chosen.seed)).selection
    gaps = (Column(f"minus {baseline_title} (same seed), each", lambda s: gaps_text(s["gaps"]), align=":--"), Column("mean", "gap_text"),
            Column("SD", "gap_sd", ".3f"), Column("95% interval", "gap_interval")) if sweep.baseline else ()
    columns = (Column("method", "name", align=":--"), Column(rate_header(sweep, rows, selection), "rate", "g"),
               Column(f"seed {selection}", "selection_loss", ".3f"), Column("held-out seeds", "held_out_text", align=":--"),
               Column("held-out mean", "headline"), *gaps, Column("held-out failed at", "held_out_failed_at", align=":--"))
    return markdown_table(summary, columns), [(s["name"], s["gaps"]) for s in summary if s.get("gaps")]


def rule_lines(rules: tuple[Rule, ...] | list[Rule], verdicts: list[tuple[str, Gaps]], declared: dict[str, Any]) -> str:
    """The decision rules with each arm's verdict ('- rule every_gap<-0.02 (...): 0.5-SpheretNorm -> holds'),
    and when they were declared; 'Decision rule: none declared.' without one; a declaration edited
    after it was written (edited_declaration_line) judges nothing, and says so."""
    if declared.get("edited"):
        return str(declared["edited"]).removeprefix("warning: ").capitalize()
    if not rules:
        return "Decision rule: none declared (--rule)."
    before = declared.get("runs_in_folder", 0)
    when = "before any run" if not before else f"after {before} run folder(s) were already there"
    lines = [f"Decision rules, declared {when} ({declared.get('declared_at', 'now')}):"]
    for rule in rules:
        lines += [f"- rule {rule.text} ({rule.describe()}): {name} -> {verdict(rule, gaps)}" for name, gaps in verdicts] or \
                 [f"- rule {rule.text} ({rule.describe()}): no arm has paired gaps to judge yet"]
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# What a study writes: OUT_DIR/<stem>.md and .json


def write_outputs(out_dir: Path, stem: str, text: str | None, record: dict[str, Any]) -> list[Path]:
    """OUT_DIR/<stem>.md (unless text is None) and <stem>.json; their paths. The declaration that
    <stem>.json held (declare, written before the runs) stays in it as it was."""
    out_dir.mkdir(parents=True, exist_ok=True)
    declared = read_record(out_dir / f"{stem}.json").get("declared")  # one that cannot be read is refused, not replaced
    record = {**record, "declared": declared} if declared is not None else record
    (out_dir / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    if text is None:
        return [out_dir / f"{stem}.json"]
    (out_dir / f"{stem}.md").write_text(text.rstrip("\n") + "\n", encoding="utf-8")
    return [out_dir / f"{stem}.md", out_dir / f"{stem}.json"]


def runs_text(sweep: Sweep, rows: list[dict[str, Any]], baseline_title: str = "", declared: dict[str, Any] | None = None,
              mix: bool | None = None) -> str:
    """The loss and kernel path lines, the table of runs, then the summary and the rules' verdicts
    on its gaps: for a sweep that selects a rate (selection_of), each group at its selected rate on
    the held-out seeds alone (selected_table); else, with a baseline and two seeds, every seed
    alike (paired_seed_summary). mix: --mix_kernel_paths (None: a command without the option, whose
    table names every path and refuses none)."""
    metric = table_metric(rows)
    paths = kernel_paths_line(rows, True if mix is None else mix)
    text = f"Gaps and the summary over the seeds: {METRIC_TEXT[metric]}. {paths}\n\n{markdown_table(rows, sweep.columns)}"
    chosen = selection_of(sweep)
    if chosen is not None:  # the seed that chose a rate is no evidence for it: the held-out seeds alone
        summary, verdicts = selected_table(sweep, rows, baseline_title, metric)
        seeds = Seeds.of(sweep.values(chosen.seed))
        title = (f"Each group at the {chosen.rate} its seed {seeds.selection} selected; the held-out seeds "
                 f"({', '.join(map(str, seeds.held_out)) or 'none'}) there, gaps paired by held-out seed, each group at its own rate:")
    else:
        summary, verdicts = paired_seed_summary(rows, baseline_title, metric) if sweep.baseline else ("", [])
        title = "Over the seeds:"
    if summary:
        text += f"\n\n{title}\n\n{summary}"
    if sweep.rules or (declared or {}).get("rules") or (declared or {}).get("edited"):
        rules = sweep.rules or tuple(parse_rule(t) for t in (declared or {})["rules"])
        text += "\n\n" + rule_lines(rules, verdicts, declared or {})
    return text


def publish(out_dir: Path, stem: str, text: str | None, record: dict[str, Any], figures: list[Path], rows: list[dict[str, Any]], started: float) -> int:
    """Write OUT_DIR/<stem>.md and .json (the record, with this call's wall-clock), print the text,
    the wall-clock line and what was written; the exit status."""
    wall = time.perf_counter() - started
    paths = write_outputs(out_dir, stem, text, {**record, "wall_clock_s": round(wall, 1)})  # runs found finished cost it nothing
    print(f"\n{text or ''}\n\n{wall_clock_line(wall, rows)}")
    print("Written: " + ", ".join(str(p) for p in [*paths, *figures]))
    return exit_status(rows)
