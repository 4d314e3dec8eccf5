"""The paper's Table 2 in miniature (issue 64): its eight rows at its three depths, three seeds, its protocol.

    python scripts/table2_mini.py                          # plan, run (or resume) and tabulate: S whole, then M, then L
    python scripts/table2_mini.py --dry_run                # the plan now, the most it can grow to, its time; writes nothing
    python scripts/table2_mini.py --table_only --tables_dir docs   # docs/table2_miniature.{md,png} from the runs there

Scales S, M and L keep the paper's depths (12, 24, 36 layers) at width 64, head dim 16 (4 heads):
GPT-2's block with bias, AdamW (0.9, 0.95), weight decay 0.1, clip 1.0, dropout 0, a warm-up of 4%
of the run and a cosine to a tenth of the peak, fp32 on the CPU, compiled (one kernel path), on
the OpenWebText sample as characters (--input, prepared into --data_dir), --max_iters iterations of
16 x 64 = 1,024 tokens (default 2,400).

Rates, the paper's way: one rate per scale for every method, Pre-LN's best on seed 1337 over a
ladder of sqrt(2) steps (1e-3 * 2**(k/2)): five steps around 2e-3 at S, five around the scale
before's choice at M and L, extended up to two steps past a winning edge so that the best is
bracketed. The eight rows then run at that rate on seeds 1338, 1339 and 1340. At M and L a second
shared rate, twice the first (two steps up), runs Pre-LN, Peri-LN, GeoNorm, 0.5- and
1-SpheretNorm on the same seeds. At M, per-arm tuning (the engine's held-out protocol: seed 1337
over the same grid, bracketed, then the held-out seeds at its own best) for Pre-LN (whose tuning is
the shared rate's selection: no run of its own), 1-SpheretNorm, and the best other row (of Pre-DyT,
Peri-LN, Keel, GeoNorm, 0.5- and 2-SpheretNorm, the lowest mean val loss at M's shared rate over
rows whose three seeds trained).

Order: S whole, then M, then L: a scale's runs enter the plan once every run of the scale before
has ended, and each scale's tables are written as it completes. --cuts N applies the first N cuts
of the declared order (the doubled rate at L, then Keel and Pre-DyT at L); no seed is ever cut.

A collapse, a divergence, a run stuck at unigram or stalled (whatever the engine's study.FAILURE_WORDS holds)
is a failure: counted, shown, never averaged. Writes OUT_DIR/table2_mini.{md,json} (the tables and
every run) and TABLES_DIR/table2_miniature.md (Table 2's layout: each cell the mean and 95%
t-interval over the held-out seeds, or its failures, the paper's OpenWebText value beside it; the
doubled and tuned cells; the rank orders and Kendall's tau; a line per claim of the paper, judged by
the rules declared in docs/LOG.md) and table2_miniature.png (each row's gap to Pre-LN against depth).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any, Iterable

from spheretnorm.experiments import study
from spheretnorm.experiments.gap_figure import GapPoint, gap_figure
from spheretnorm.experiments.grid import SHARED_DIR, Yardsticks, check_overrides
from spheretnorm.experiments.stats import HOLDS, parse_rule, verdict
from spheretnorm.experiments.study import (
    CPU_MODEL, RESERVED, RUN_STATES, Axis, Column, Point, SeedCell, Sweep, add_length_options, add_place_options, corpus_title,
    final_loss, gap_spread, gap_values, has_ended, kernel_paths_line, markdown_table, method_settings, point, publish, run_sweep,
    seed_cell, start_study, study_main, study_parser, swept_rates, table_metric,
)
from spheretnorm.model import SPHERE_CONNECTIONS
from spheretnorm.runtime.cli import UsageError
from spheretnorm.runtime.methods import PAPER_METHODS, display_name, load_reference, method_dirname

NAME = "table2_mini"
TABLE_STEM = "table2_miniature"
DEPTHS = {"S": 12, "M": 24, "L": 36}
WIDTH = 64
SHAPE: dict[str, Any] = {"n_embd": WIDTH, "n_head": 4, "block_size": 64, "batch_size": 16, "global_batch_size": 16}
# The paper's Table 6, less what a CPU changes (fp32, not bf16; compiled, one kernel path).
RECIPE: dict[str, Any] = {"block": "gpt2", "bias": True, "beta1": 0.9, "beta2": 0.95, "weight_decay": 0.1, "grad_clip": 1.0, "dropout": 0.0}
WARMUP_SHARE = 0.04  # 2,000 of the paper's 50,000 iterations
MIN_LR_SHARE = 0.1  # the cosine ends at a tenth of the peak
EVALS = 10  # evaluations per run (and at iteration 0): the collapse alarm needs three in a row
DEFAULT_MAX_ITERS = 2400

METHODS = PAPER_METHODS  # the eight rows, in the paper's order
BASELINE = "pre_ln"
SPHERET = ("p_spheret:0.5", "proj_spheret", "cay_spheret")  # 0.5-, 1- and 2-SpheretNorm
GEONORM = "geonorm"  # the exponential map: p-SpheretNorm's limit as p grows
DOUBLED = ("pre_ln", "peri_ln", "geonorm", "p_spheret:0.5", "proj_spheret")  # the second shared rate's rows
DOUBLED_SCALES = ("M", "L")
TUNED_SCALE = "M"
TUNED_FIRST = "proj_spheret"  # tuned at M beside Pre-LN and the best other row
SELECTION_SEED = 1337
HELD_OUT = (1338, 1339, 1340)

# The rate ladder: step k is LADDER_BASE * sqrt(2)**k, written to 6 significant digits (the folders' precision).
LADDER_BASE = 1e-3
FIRST_CENTRE = 2  # S's grid is centred on 2e-3
GRID_HALF = 2  # steps each side of the centre: five rates
EXTENSIONS = 2  # steps a grid may grow past an end where the best lies
DOUBLE = 2  # twice the rate is two sqrt(2) steps up


@dataclass(frozen=True)
class Cut:
    """One item of the declared cut order: these rows at this scale and rate are not run."""

    scale: str
    rate: str  # "shared" or "doubled"
    methods: tuple[str, ...]
    text: str


CUT_ORDER = (
    Cut("L", "doubled", DOUBLED, "the doubled rate at L"),
    Cut("L", "shared", ("keel", "pre_dyt"), "Keel and Pre-DyT at L"),
)
CUT_ORDER_TEXT = "; ".join(f"{i + 1}. {c.text}" for i, c in enumerate(CUT_ORDER))
KINDS = {"shared": METHODS, "doubled": DOUBLED}  # each shared rate's rows
FAMILY = (*SPHERET, GEONORM)  # p-SpheretNorm at p = 0.5, 1, 2 and its limit


def rate(step: int) -> float:
    """The ladder's rate at `step`: 1e-3 at 0, 1.41421e-3 at 1, 2e-3 at 2."""
    return float(f"{LADDER_BASE * 2 ** (step / 2):.6g}")


def warmup_iters(max_iters: int) -> int:
    return max(1, round(WARMUP_SHARE * max_iters))


def title(method: str) -> str:
    """A row's name as Table 2 prints it."""
    return {"proj_spheret": "1-SpheretNorm", "cay_spheret": "2-SpheretNorm"}.get(method, display_name(method))


def is_cut(scale: str, kind: str, method: str, cuts: int) -> bool:
    return any(c.scale == scale and c.rate == kind and method in c.methods for c in CUT_ORDER[:cuts])


# -----------------------------------------------------------------------------
# The plan: a function of the finished runs' losses alone, so that a re-run resumes it


@dataclass(frozen=True)
class Selection:
    """One arm's rate chosen on seed 1337 at one scale: the steps swept and the best (None until
    all of them have ended, or where none trained)."""

    steps: tuple[int, ...]
    best: int | None

    @property
    def bracketed(self) -> bool:
        return self.best is not None and self.steps[0] < self.best < self.steps[-1]


def run_point(scale: str, method: str, step: int, seed: int) -> Point:
    return point(scale=scale, method=method, lr=rate(step), seed=seed)


def selection(method: str, scale: str, grid: tuple[int, ...], done: dict[Point, float]) -> Selection:
    """`method`'s seed-1337 sweep over `grid` at `scale`, as far as the finished runs go, bracketed
    as the engine brackets (study.swept_rates, EXTENSIONS steps at most). swept_rates grows a
    geometric grid by its own factor; on the values 2**k that factor is exactly 2, so the step past
    k comes out as exactly 2**(k + 1)."""
    losses = {k: loss for k in range(grid[0] - EXTENSIONS, grid[-1] + EXTENSIONS + 1)
              if (loss := done.get(run_point(scale, method, k, SELECTION_SEED))) is not None}
    rates, finished = swept_rates([2.0 ** k for k in grid], {2.0 ** k: v for k, v in losses.items()}, EXTENSIONS)
    steps = [round(math.log2(r)) for r in rates]
    trained = [k for k in steps if math.isfinite(losses.get(k, math.inf))]
    return Selection(tuple(steps), min(trained, key=lambda k: losses[k]) if finished and trained else None)


def best_other_row(scale: str, step: int, done: dict[Point, float]) -> tuple[bool, str | None]:
    """(decided, the row): the row beside Pre-LN and 1-SpheretNorm with the lowest mean val loss at
    the scale's shared rate, among rows whose three seeds trained; undecided until all have ended."""
    cells = {m: [done.get(run_point(scale, m, step, s)) for s in HELD_OUT] for m in METHODS if m not in (BASELINE, TUNED_FIRST)}
    if any(v is None for losses in cells.values() for v in losses):
        return False, None
    means = {m: statistics.fmean(losses) for m, losses in cells.items() if all(map(math.isfinite, losses))}  # type: ignore[arg-type]
    return True, (min(means, key=means.__getitem__) if means else None)


@dataclass(frozen=True)
class ScaleState:
    """What one scale's plan holds given the finished runs."""

    scale: str
    shared: Selection  # Pre-LN's, which sets the scale's rate for every row
    tuned: dict[str, Selection]  # at TUNED_SCALE: each tuned arm's own selection (Pre-LN's is `shared`)
    points: tuple[Point, ...]
    complete: bool  # every run of its plan has ended: the next scale may start


def scale_state(scale: str, centre: int, done: dict[Point, float], cuts: int) -> ScaleState:
    """One scale's runs in the order they should start: Pre-LN's selection; the eight rows at the
    shared rate, seed-major; the doubled rate; at M the tuned arms' selections, then their held-out seeds."""
    grid = tuple(range(centre - GRID_HALF, centre + GRID_HALF + 1))
    shared = selection(BASELINE, scale, grid, done)
    points = [run_point(scale, BASELINE, j, SELECTION_SEED) for j in shared.steps]
    if (k := shared.best) is not None:
        points += [run_point(scale, m, k, s) for s in HELD_OUT for m in METHODS if not is_cut(scale, "shared", m, cuts)]
        if scale in DOUBLED_SCALES:
            points += [run_point(scale, m, k + DOUBLE, s) for s in HELD_OUT for m in DOUBLED if not is_cut(scale, "doubled", m, cuts)]
    tuned: dict[str, Selection] = {}
    waiting = False  # at M, until the best other row is known
    if scale == TUNED_SCALE:
        decided, best_other = best_other_row(scale, k, done) if k is not None else (False, None)
        tuned = {m: selection(m, scale, grid, done) for m in [TUNED_FIRST, *([best_other] if best_other else [])]}
        points += [run_point(scale, m, j, SELECTION_SEED) for m, sel in tuned.items() for j in sel.steps]
        points += [run_point(scale, m, sel.best, s) for m, sel in tuned.items() if sel.best is not None for s in HELD_OUT]
        waiting = k is not None and not decided
    points = list(dict.fromkeys(points))
    return ScaleState(scale, shared, tuned, tuple(points), all(p in done for p in points) and not waiting)


def study_states(done: dict[Point, float], scales: Iterable[str], cuts: int) -> list[ScaleState]:
    """Each scale's state, S first; a scale enters once the one before is complete, its grid
    centred on that scale's shared rate."""
    states: list[ScaleState] = []
    centre = FIRST_CENTRE
    for scale in scales:
        state = scale_state(scale, centre, done, cuts)
        states.append(state)
        if not state.complete or state.shared.best is None:
            break
        centre = state.shared.best
    return states


def most_runs(scale: str, cuts: int) -> int:
    """The most runs a scale's plan can hold: Pre-LN's grid and extensions, the rows at the shared
    rate, the doubled rate, and at M two tuned arms' grids, extensions and held-out seeds."""
    sweep = 2 * GRID_HALF + 1 + EXTENSIONS
    shared = sum(not is_cut(scale, "shared", m, cuts) for m in METHODS) * len(HELD_OUT)
    doubled = sum(not is_cut(scale, "doubled", m, cuts) for m in DOUBLED) * len(HELD_OUT) if scale in DOUBLED_SCALES else 0
    tuned = 2 * (sweep + len(HELD_OUT)) if scale == TUNED_SCALE else 0
    return sweep + shared + doubled + tuned


def design(max_iters: int = DEFAULT_MAX_ITERS, scales: tuple[str, ...] = tuple(DEPTHS), cuts: int = 0) -> Sweep:
    """The study on the one engine: its plan is study_states', its runs' settings the protocol's."""
    if not 0 <= cuts <= len(CUT_ORDER):
        raise UsageError(f"--cuts {cuts} is not valid; give 0 to {len(CUT_ORDER)} (the declared order: {CUT_ORDER_TEXT}).")
    if max_iters < 1:
        raise UsageError(f"--max_iters {max_iters} is not valid; give a positive number of iterations, such as {DEFAULT_MAX_ITERS}.")

    def plan(sweep: Sweep, done: dict[Point, float]) -> list[Point]:
        return list(dict.fromkeys(p for state in study_states(done, scales, cuts) for p in state.points))

    def settings(p: Point) -> dict[str, Any]:
        return {"n_layer": DEPTHS[p["scale"]], "learning_rate": p["lr"], "min_lr": p["lr"] * MIN_LR_SHARE}

    schedule = {"max_iters": max_iters, "lr_decay_iters": max_iters, "warmup_iters": warmup_iters(max_iters),
                "eval_interval": max(1, max_iters // EVALS)}
    return Sweep(
        name=NAME,
        base={**CPU_MODEL, **SHAPE, **RECIPE, **schedule},
        axes=(Axis("scale", scales), Axis("method", METHODS), Axis("lr", tuple(rate(FIRST_CENTRE + d) for d in range(-GRID_HALF, GRID_HALF + 1))),
              Axis("seed", (SELECTION_SEED, *HELD_OUT))),
        folder=lambda p: f"{p['scale']}_{DEPTHS[p['scale']]}x{WIDTH}/{method_dirname(p['method'])}/lr{p['lr']:g}_s{p['seed']}",
        settings=settings,
        label=lambda p: f"{title(p['method'])}, {p['scale']}, lr {p['lr']:g}",
        baseline=lambda p: p.but(method=BASELINE),
        follow_up=plan,
        columns=RUN_COLUMNS,
        rules=RULES,
    )


# The rules of every paired comparison below (study.verdict on the held-out seeds' gaps): the 95%
# interval of the mean gap entirely below 0, or entirely above. A failed seed counts against its side.
AHEAD, BEHIND = parse_rule("upper<0"), parse_rule("lower>0")
RULES = (AHEAD, BEHIND)
RUN_COLUMNS = (
    Column("scale", "scale", align=":--"), Column("row", lambda r: title(r["method"]), align=":--"), Column("lr", "lr", "g"),
    Column("seed", "seed"), Column("train loss (last 200)", "train_loss_avg", ".3f"), Column("val loss", "val_loss_full", ".3f"),
    Column("minus Pre-LN (same seed)", "gap", "+.3f"), Column("final cosine", "final_cosine", ".3f"), Column("status", "status", align=":--"),
    Column("s", "seconds", ".0f"),
)


# -----------------------------------------------------------------------------
# The tables: cells of seeds, Table 2's layout, ranks, claims


def finished_losses(rows: list[dict[str, Any]], metric: str) -> dict[Point, float]:
    """What the plan reads: each ended run's final loss by `metric` (inf for a failure)."""
    return {point(scale=r["scale"], method=r["method"], lr=r["lr"], seed=r["seed"]): final_loss(r, metric) for r in rows if has_ended(r)}


def mean_of(cell: SeedCell | None) -> float | None:
    """A cell's mean where every seed trained, else None."""
    s = cell.spread() if cell else None
    return s.mean if s else None


def cell_text(cell: SeedCell | None, fmt: str = ".3f") -> str:
    """'2.345 ± 0.014' (the mean and the half-width of its 95% t-interval), or the failures, or what is missing."""
    if cell is None or not (cell.losses or cell.failed):
        return "not run"
    s = cell.spread()
    if s is None or s.low is None or s.high is None:
        return cell.text(fmt) or "not run"
    return f"{s.mean:{fmt}} ± {(s.high - s.low) / 2:{fmt}}"


def paper_value(method: str, scale: str, split: str) -> float | None:
    """Table 2's OpenWebText value of a row (reference/paper_results.json)."""
    table = load_reference()["table2_loss"]
    return table["rows"][method][table["columns"].index(f"openwebtext/{scale}/{split}")] if method in table["rows"] else None


def comparison(mine: SeedCell | None, theirs: SeedCell | None) -> str:
    """'ahead', 'behind', 'open' or 'missing': mine against theirs by the declared rules, seed by seed."""
    gaps = {} if mine is None or theirs is None else gap_values(mine, theirs)
    if not gaps or None in gaps.values():
        return "missing"
    if verdict(AHEAD, gaps) == HOLDS:
        return "ahead"
    return "behind" if verdict(BEHIND, gaps) == HOLDS else "open"


def gap_text(mine: SeedCell | None, theirs: SeedCell | None) -> str:
    """The paired gap's mean and interval ('-0.012 (-0.020 to -0.004)'), or why there is none."""
    if mine is None or theirs is None:
        return "not run"
    gaps = gap_values(mine, theirs)
    s = gap_spread(gaps)
    return f"{s.mean:+.3f} ({s.interval_text()})" if s is not None else study.gap_text(gaps) or "not run"


def kendall_tau(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's tau-b of two rankings of the same items (ties allowed; inf ranks last): the
    concordant minus the discordant pairs over the square root of the pairs untied in each. None
    for fewer than two items or where one side is all ties."""
    if len(xs) != len(ys):
        raise ValueError(f"kendall_tau needs two lists of one length, got {len(xs)} and {len(ys)}.")
    signs = [((a > b) - (a < b), (c > d) - (c < d)) for (a, c), (b, d) in combinations(zip(xs, ys), 2)]
    untied_x, untied_y = sum(dx != 0 for dx, _ in signs), sum(dy != 0 for _, dy in signs)
    if not untied_x or not untied_y:
        return None
    return sum(dx * dy for dx, dy in signs) / math.sqrt(untied_x * untied_y)


@dataclass
class Tabulation:
    """Every cell the tables and claims read, from the rows of the runs there."""

    rows: list[dict[str, Any]]
    metric: str
    states: dict[str, ScaleState]
    cuts: int

    def cell(self, scale: str, method: str, step: int | None, split: str) -> SeedCell | None:
        """A row's held-out seeds at one scale and rate (the engine's SeedCell), None where the rate is not known yet."""
        if step is None:
            return None
        runs = {r["seed"]: r for r in self.rows if (r["scale"], r["method"], r["lr"]) == (scale, method, rate(step))}
        return seed_cell(runs, HELD_OUT, self.metric if split == "val" else "train_loss_avg")

    def at(self, kind: str, scale: str, method: str, split: str = "val") -> SeedCell | None:
        """A row's cell at the scale's shared rate or at twice it (kind "doubled"), None where it is not run or cut."""
        state = self.states.get(scale)
        if state is None or state.shared.best is None or method not in KINDS[kind] or is_cut(scale, kind, method, self.cuts):
            return None
        if kind == "shared":
            return self.cell(scale, method, state.shared.best, split)
        return self.cell(scale, method, state.shared.best + DOUBLE, split) if scale in DOUBLED_SCALES else None

    def shared(self, scale: str, method: str, split: str = "val") -> SeedCell | None:
        return self.at("shared", scale, method, split)

    def tuned(self, method: str, split: str = "val") -> SeedCell | None:
        """A tuned arm's held-out seeds at its own rate at M (Pre-LN's own rate is the shared one)."""
        if method == BASELINE:
            return self.shared(TUNED_SCALE, BASELINE, split)
        state = self.states.get(TUNED_SCALE)
        sel = state.tuned.get(method) if state else None
        return self.cell(TUNED_SCALE, method, sel.best if sel else None, split)

    def ended(self, scale: str, methods: Iterable[str] = METHODS) -> bool:
        """Whether every seed of these rows (less the cut ones) has ended at the scale's shared rate."""
        return all((c := self.shared(scale, m)) is not None and not c.missing for m in methods if not is_cut(scale, "shared", m, self.cuts))


def tabulate(rows: list[dict[str, Any]], cuts: int = 0) -> Tabulation:
    metric = table_metric(rows)
    states = study_states(finished_losses(rows, metric), tuple(DEPTHS), cuts)
    return Tabulation(rows, metric, {s.scale: s for s in states}, cuts)


def rank_value(cell: SeedCell | None) -> float | None:
    """A row's place in a ranking: its mean, inf (last) with a failed seed, None where runs are missing."""
    if cell is None or cell.missing:
        return None
    return math.inf if cell.failed else mean_of(cell)


def ranking(t: Tabulation, scale: str, split: str) -> tuple[list[str], float | None]:
    """The rows that have a place, in our order, and Kendall's tau of our order against the paper's."""
    ours = {m: v for m in METHODS if (v := rank_value(t.shared(scale, m, split))) is not None}
    theirs = {m: paper_value(m, scale, split) for m in ours}
    both = [m for m in ours if theirs[m] is not None]
    tau = kendall_tau([ours[m] for m in both], [theirs[m] for m in both])  # type: ignore[misc]
    return sorted(ours, key=lambda m: (ours[m], METHODS.index(m))), tau


def order_text(methods: list[str], values: dict[str, float | None]) -> str:
    return " < ".join(f"{title(m)}{' (failed)' if values.get(m) == math.inf else ''}" for m in methods)


# -----------------------------------------------------------------------------
# The paper's claims, one line each, by the rules declared in docs/LOG.md before the runs

NOT_RUN = "not run yet"
OPEN = "not resolved at three seeds"


def lowest_trained(t: Tabulation, scale: str, methods: Iterable[str]) -> str | None:
    """The row with the lowest mean val loss among `methods` whose seeds all trained."""
    means = {m: v for m in methods if (v := mean_of(t.shared(scale, m))) is not None}
    return min(means, key=means.__getitem__) if means else None


def by_scale(head: str, scales: Iterable[str], judge: Any, t: Tabulation, methods: Iterable[str] = METHODS) -> str:
    """One claim's line: its verdict at each scale ('M: holds (...); L: not run yet'), judged once
    every seed of `methods` has ended there."""
    return f"**{head}**: " + "; ".join(f"{s}: {judge(t, s) if t.ended(s, methods) else NOT_RUN}" for s in scales) + "."


def lowest_is_spheret(t: Tabulation, scale: str) -> str:
    """Holds where a SpheretNorm row has the lowest mean and is ahead of every other kind of row;
    does not hold where another row is ahead of every SpheretNorm row; else open."""
    best = lowest_trained(t, scale, METHODS)
    others = [m for m in METHODS if m not in SPHERET and not is_cut(scale, "shared", m, t.cuts)]
    if best in SPHERET:
        open_to = [m for m in others if comparison(t.shared(scale, best), t.shared(scale, m)) != "ahead"]
        if not open_to:
            return f"holds ({title(best)} lowest, ahead of every other kind of row)"
        return f"{OPEN} ({title(best)} lowest; against {title(open_to[0])} {gap_text(t.shared(scale, best), t.shared(scale, open_to[0]))})"
    ahead_of_all = [m for m in others if all(comparison(t.shared(scale, m), t.shared(scale, s)) == "ahead" for s in SPHERET)]
    if ahead_of_all:
        return f"does not hold ({title(ahead_of_all[0])} ahead of every SpheretNorm row)"
    return f"{OPEN} ({title(best) if best else 'no row trained on every seed'} lowest, not ahead of every SpheretNorm row)"


def failed_cells(t: Tabulation) -> list[tuple[str, str, str]]:
    """(scale, rate kind, method) of every cell that has a failed seed."""
    return [(s, kind, m) for s in DEPTHS for kind in KINDS for m in METHODS if (c := t.at(kind, s, m)) is not None and c.failed]


def converges_where_others_fail(t: Tabulation) -> str:
    """Over every cell run: holds where Pre-LN or Keel failed a seed in some cell and every
    SpheretNorm run of those cells trained; does not hold where one failed there too; not tested
    where Pre-LN and Keel never failed. SpheretNorm's failures where Pre-LN trained are named too."""
    head = "**Convergence where Pre-LN or Keel fails**"
    scales = [s for s in DEPTHS if t.ended(s)]
    if not scales:
        return f"{head}: {NOT_RUN}."
    failed = failed_cells(t)
    where = sorted({(s, k) for s, k, m in failed if m in (BASELINE, "keel")})
    also_failed = [(s, k, m) for s, k in where for m in SPHERET if (c := t.at(k, s, m)) is not None and c.failed]
    alone = [(s, k, m) for s, k, m in failed if m in SPHERET and (s, k) not in where]
    scope = f"(scales run: {', '.join(scales)})"
    tail = ("; SpheretNorm failed where Pre-LN and Keel trained: " + ", ".join(f"{title(m)} at {s} {k}" for s, k, m in alone)) if alone else ""
    if not where:
        return f"{head}: not tested {scope}: Pre-LN and Keel trained on every seed of every cell{tail}."
    named = ", ".join(f"{s} {k}" for s, k in where)
    if also_failed:
        return (f"{head}: does not hold {scope}: Pre-LN or Keel failed at {named}, and so did "
                + ", ".join(f"{title(m)} ({s} {k})" for s, k, m in also_failed) + f"{tail}.")
    return f"{head}: holds {scope}: Pre-LN or Keel failed at {named}, every SpheretNorm run there trained{tail}."


def finite_p_best(t: Tabulation, scale: str) -> str:
    """Of 0.5-, 1-, 2-SpheretNorm and GeoNorm (p -> infinity): holds where the lowest is a finite p
    ahead of GeoNorm; does not hold where GeoNorm is ahead of every finite p; else open."""
    best = lowest_trained(t, scale, FAMILY)
    geo = t.shared(scale, GEONORM)
    if best in SPHERET:
        word = "holds" if comparison(t.shared(scale, best), geo) == "ahead" else OPEN
        return f"{word} ({title(best)} lowest; against GeoNorm {gap_text(t.shared(scale, best), geo)})"
    if best == GEONORM and all(comparison(geo, t.shared(scale, m)) == "ahead" for m in SPHERET):
        return "does not hold (GeoNorm ahead of every finite p)"
    return f"{OPEN} ({title(best) if best else 'none of the four trained on every seed'} lowest)"


def retraction_ahead_of_geonorm(t: Tabulation, scale: str) -> str:
    """Each SpheretNorm row against GeoNorm: holds where all three are ahead, does not hold where
    one is behind, else 'holds for k of 3' or open."""
    geo = t.shared(scale, GEONORM)
    results = {m: comparison(t.shared(scale, m), geo) for m in SPHERET}
    ahead = sum(r == "ahead" for r in results.values())
    if ahead == len(SPHERET):
        word = "holds"
    elif "behind" in results.values():
        word = "does not hold"
    else:
        word = f"holds for {ahead} of {len(SPHERET)}" if ahead else OPEN
    return f"{word} (" + ", ".join(f"{title(m)} {gap_text(t.shared(scale, m), geo)}" for m in SPHERET) + ")"


def pre_ln_best(t: Tabulation, scale: str) -> str:
    """Holds where every other row is behind Pre-LN; does not hold where one is ahead of it; else open."""
    base = t.shared(scale, BASELINE)
    results = {m: comparison(t.shared(scale, m), base) for m in METHODS if m != BASELINE and not is_cut(scale, "shared", m, t.cuts)}
    ahead = [m for m, r in results.items() if r == "ahead"]
    if ahead:
        return f"does not hold ({title(ahead[0])} ahead of Pre-LN: {gap_text(t.shared(scale, ahead[0]), base)})"
    if all(r == "behind" for r in results.values()):
        return "holds (every other row behind Pre-LN)"
    lowest = lowest_trained(t, scale, METHODS)
    near = [m for m, r in results.items() if r != "behind"]
    return (f"{OPEN} ({title(lowest) if lowest else 'no row'} lowest; not behind Pre-LN: "
            + ", ".join(f"{title(m)} {gap_text(t.shared(scale, m), base)}" for m in near) + ")")


def shared_rate_does_not_decide(t: Tabulation) -> str:
    """The check at M: holds where each tuned arm's reading against Pre-LN (ahead, behind, open) is
    the same at its own rate as at the shared one; else names the arms whose reading the rate changes."""
    head = "**Check: the shared rate does not decide (M, each arm at its own rate)**"
    state = t.states.get(TUNED_SCALE)
    if state is None or not state.complete:
        return f"{head}: {NOT_RUN}."
    base = t.shared(TUNED_SCALE, BASELINE)
    parts, changed = [], []
    for m, sel in state.tuned.items():
        if sel.best is None:
            parts.append(f"{title(m)}: no rate trained on seed {SELECTION_SEED}")
            continue
        at_shared, at_own = comparison(t.shared(TUNED_SCALE, m), base), comparison(t.tuned(m), base)
        parts.append(f"{title(m)} {at_shared} at the shared rate, {at_own} at its own ({rate(sel.best):g})")
        changed += [m] if at_shared != at_own else []
    word = "holds" if not changed else "does not hold: the rate changes the reading of " + ", ".join(map(title, changed))
    return f"{head}: {word} ({'; '.join(parts)})."


def claims(t: Tabulation) -> list[str]:
    """The LOG's lines, one per claim of the paper in the issue's order, then the rate check."""
    return [
        by_scale("The lowest losses at 24 and 36 layers (a SpheretNorm row lowest)", ("M", "L"), lowest_is_spheret, t),
        converges_where_others_fail(t),
        by_scale("A finite p best (of 0.5-, 1-, 2-SpheretNorm and GeoNorm, p -> infinity)", DEPTHS, finite_p_best, t, FAMILY),
        by_scale("The retraction ahead of GeoNorm", DEPTHS, retraction_ahead_of_geonorm, t, FAMILY),
        by_scale("Pre-LN best at 12 layers", ("S",), pre_ln_best, t),
        shared_rate_does_not_decide(t),
    ]


# -----------------------------------------------------------------------------
# The Markdown page and the figure


def table2_text(t: Tabulation, kind: str = "shared") -> str:
    """Table 2's layout: a line per row, S/M/L train and val, each cell ours and the paper's; the
    lowest mean of each column in bold."""
    columns = [(s, split) for s in DEPTHS for split in ("train", "val")]
    lines = ["| method | " + " | ".join(f"{s} ({DEPTHS[s]} x {WIDTH}) {split}" for s, split in columns) + " |", "|:--|" + "--:|" * len(columns)]
    lowest = {(s, split): min([v for m in KINDS[kind] if (v := mean_of(t.at(kind, s, m, split))) is not None], default=None)
              for s, split in columns}
    for m in KINDS[kind]:
        cells = []
        for s, split in columns:
            c = t.at(kind, s, m, split)
            text = "cut" if is_cut(s, kind, m, t.cuts) else ("-" if kind == "doubled" and s not in DOUBLED_SCALES else cell_text(c))
            if (v := mean_of(c)) is not None and v == lowest[(s, split)]:
                text = f"**{text}**"
            paper = paper_value(m, s, split) if kind == "shared" else None
            cells.append(f"{text} ({paper:.3f})" if paper is not None else text)
        lines.append(f"| {title(m)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def selection_text(t: Tabulation) -> str:
    """Pre-LN's seed-1337 losses over each scale's grid, the rate chosen, and whether it is bracketed."""
    lines = ["| scale | Pre-LN, seed 1337: lr val loss | shared rate | doubled rate |", "|:--|:--|--:|--:|"]
    for s in DEPTHS:
        state = t.states.get(s)
        if state is None:
            lines.append(f"| {s} | not run | - | - |")
            continue
        runs = {r["lr"]: r for r in t.rows if (r["scale"], r["method"], r["seed"]) == (s, BASELINE, SELECTION_SEED)}
        swept = ", ".join(f"{rate(k):g} {selection_loss(runs.get(rate(k)), t.metric)}" for k in state.shared.steps)
        k = state.shared.best
        chosen = "-" if k is None else f"{rate(k):g}" + ("" if state.shared.bracketed else " (at the grid's edge after its extensions)")
        doubled = f"{rate(k + DOUBLE):g}" if k is not None and s in DOUBLED_SCALES else "-"
        lines.append(f"| {s} | {swept} | {chosen} | {doubled} |")
    return "\n".join(lines)


def selection_loss(row: dict[str, Any] | None, metric: str) -> str:
    if row is None or not has_ended(row):
        return "(not run)"
    loss = final_loss(row, metric)
    return f"{loss:.3f}" if math.isfinite(loss) else study.FAILURE_WORDS.get(row["status"], row["status"])


def gaps_text(t: Tabulation) -> str:
    """Each row's paired val gap to Pre-LN at each scale and shared rate, with its interval and the rule's reading."""
    lines = ["| method | rate | " + " | ".join(f"{s} minus Pre-LN" for s in DEPTHS) + " |", "|:--|:--|" + ":--|" * len(DEPTHS)]
    for kind, methods in KINDS.items():
        for m in [x for x in methods if x != BASELINE]:
            pairs = [(t.at(kind, s, m), t.at(kind, s, BASELINE)) for s in DEPTHS]
            cells = ["-" if mine is None or base is None else f"{gap_text(mine, base)}, {comparison(mine, base)}" for mine, base in pairs]
            lines.append(f"| {title(m)} | {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tuned_text(t: Tabulation) -> str:
    """At M: each tuned arm at the shared rate and at its own, and its gap to Pre-LN at each."""
    state = t.states.get(TUNED_SCALE)
    lines = ["| method (M) | own rate (seed 1337) | val at the shared rate | val at its own rate | minus Pre-LN, shared | minus Pre-LN, own |",
             "|:--|--:|--:|--:|:--|:--|"]
    if state is None:
        return "\n".join([*lines, "| not run | - | - | - | - | - |"])
    base = t.shared(TUNED_SCALE, BASELINE)
    for m in (BASELINE, *state.tuned):
        sel = state.shared if m == BASELINE else state.tuned[m]
        own = "-" if sel.best is None else f"{rate(sel.best):g}" + ("" if sel.bracketed else " (edge)")
        shared, mine = t.shared(TUNED_SCALE, m), t.tuned(m)
        lines.append(f"| {title(m)} | {own} | {cell_text(shared)} | {cell_text(mine)} | "
                     f"{'-' if m == BASELINE else gap_text(shared, base)} | {'-' if m == BASELINE else gap_text(mine, base)} |")
    return "\n".join(lines)


def ranks_text(t: Tabulation) -> str:
    lines = ["| scale | split | our order (lowest first) | the paper's order (OpenWebText) | Kendall's tau |", "|:--|:--|:--|:--|--:|"]
    for s in DEPTHS:
        for split in ("train", "val"):
            order, tau = ranking(t, s, split)
            if not t.ended(s):
                lines.append(f"| {s} | {split} | not run | - | - |")
                continue
            values = {m: rank_value(t.shared(s, m, split)) for m in order}
            paper = sorted(order, key=lambda m: (paper_value(m, s, split), METHODS.index(m)))
            lines.append(f"| {s} | {split} | {order_text(order, values)} | {order_text(paper, {})} | {'-' if tau is None else f'{tau:+.2f}'} |")
    return "\n".join(lines)


def failures_text(t: Tabulation) -> str:
    cells = failed_cells(t)
    if not cells:
        return "Failures: none in the runs there."
    return "Failures (counted, never averaged): " + "; ".join(
        f"{title(m)} {s} {k} rate: {t.at(k, s, m).text()}" for s, k, m in cells) + "."  # type: ignore[union-attr]


def page_text(t: Tabulation, max_iters: int, corpus: str, kernel_line: str, failures: str) -> str:
    tokens = max_iters * SHAPE["batch_size"] * SHAPE["block_size"]
    scope = (f"Width {WIDTH} (4 heads of 16), GPT-2's block with bias, AdamW (0.9, 0.95), weight decay 0.1, clip 1.0, dropout 0, "
             f"warm-up {warmup_iters(max_iters)} of {max_iters} iterations, cosine to a tenth, batch 16 x 64 ({tokens:,} tokens), "
             f"{corpus}, fp32 on a CPU. {kernel_line} Each cell: the mean over seeds {', '.join(map(str, HELD_OUT))} and the "
             f"half-width of its 95% t-interval, or its failures (never averaged); in parentheses Table 2's OpenWebText value "
             f"(the paper's models are 0.12B to 0.77B parameters on 6.5B tokens). Loss: {study.METRIC_TEXT[t.metric]}; train: the "
             f"mean over the last 200 iterations. Bold: the lowest mean of a column. Failures: {failures}; stopped: collapse: the final "
             f"states' mean cosine above 0.95 at three evaluations in a row.")
    cut = f"\n\nCut, in the declared order: {'; '.join(c.text for c in CUT_ORDER[:t.cuts])}." if t.cuts else ""
    return (f"# Table 2 in miniature\n\n{scope}{cut}\n\n## Every row at one shared rate per scale (Pre-LN's best on seed "
            f"{SELECTION_SEED})\n\n{table2_text(t)}\n\n{failures_text(t)}\n\nThe shared rates:\n\n{selection_text(t)}\n\n"
            f"## Twice the shared rate (M and L)\n\n{table2_text(t, 'doubled')}\n\n"
            f"## Each row's val gap to Pre-LN, paired by seed\n\nMean, 95% interval, and the rule's reading (ahead: the interval "
            f"below 0; behind: above 0; open: neither; a failed seed counts against its side).\n\n{gaps_text(t)}\n\n"
            f"## Each arm at its own rate at M\n\n{tuned_text(t)}\n\n## Rank orders against the paper's\n\n"
            f"A row with a failed seed ranks last (tied with any other such row); Kendall's tau-b over the rows that have a place.\n\n"
            f"{ranks_text(t)}\n\n## The paper's claims at this scale\n\n" + "\n".join(f"- {line}" for line in claims(t)) + "\n")


def gap_points_of(t: Tabulation) -> list[GapPoint]:
    """Each row's held-out val gaps to Pre-LN at each depth, a panel per rate: gap_figure's points."""
    panels = {"shared": "AdamW, one shared rate per scale", "doubled": "AdamW, twice the shared rate"}
    cells = [(panel, s, m, mine, base) for kind, panel in panels.items() for s in DEPTHS for m in METHODS
             if m != BASELINE and (mine := t.at(kind, s, m)) is not None and (base := t.at(kind, s, BASELINE)) is not None]
    return [GapPoint("gpt2", panel, method_dirname(m), title(m), float(DEPTHS[s]), seed, gap)
            for panel, s, m, mine, base in cells for seed, gap in gap_values(mine, base).items() if gap is not None and not math.isnan(gap)]


ARM_DODGE = 0.04  # seven rows at each depth, side by side: at 12 layers six rows' crosses fell on one spot


def draw(t: Tabulation, out: Path) -> list[Path]:
    points = gap_points_of(t)
    if not points:
        return []
    return gap_figure(points, "depth", f"Table 2 in miniature: each row's val gap to Pre-LN (same seed) against depth, width {WIDTH}",
                      out, {method_dirname(m): m for m in METHODS}, arm_dodge=ARM_DODGE)


# -----------------------------------------------------------------------------
# The command

DATA_DIR = study.REPO_ROOT / "data" / "owt_char"
CORPUS = SHARED_DIR / "data" / "openwebtext_sample.jsonl"
ON_SPHERE = tuple(m for m in METHODS if method_settings(m)["connection"] in SPHERE_CONNECTIONS)

# run_cost.py's parts of a run, CPU seconds of one thread (GPT-2's block with bias, compiled per
# block, fp32, Tiny Shakespeare, 20 and 80 iterations, one case at a time, other work on the
# machine; docs/LOG.md, 2026-12-07): the fixed part (start-up, compile, checkpoints), the step,
# one periodic evaluation and the whole-split evaluation. Pre-LN stands for the rows off the
# sphere, 0.5-SpheretNorm for the rows on it.
MEASURED_COST: dict[tuple[int, bool], dict[str, float]] = {
    (12, False): {"fixed_s": 5.7, "step_ms": 56.3, "eval_s": 0.37, "full_eval_s": 1.76},
    (24, False): {"fixed_s": 5.9, "step_ms": 117.9, "eval_s": 0.74, "full_eval_s": 3.55},
    (36, False): {"fixed_s": 6.3, "step_ms": 180.1, "eval_s": 1.09, "full_eval_s": 5.28},
    (12, True): {"fixed_s": 6.9, "step_ms": 63.0, "eval_s": 0.45, "full_eval_s": 2.73},
    (24, True): {"fixed_s": 5.7, "step_ms": 139.7, "eval_s": 0.93, "full_eval_s": 6.48},
    (36, True): {"fixed_s": 8.7, "step_ms": 169.6, "eval_s": 1.26, "full_eval_s": 6.23},
}
# The OpenWebText sample's val split over Tiny Shakespeare's, in characters (docs/LOG.md, 2026-12-05).
VAL_SCALE = 391_606 / 111_540
# The most a run took two at a time beside other work over run_cost.py's CPU seconds for its step:
# E3's AdamW runs of 2,400 iterations at 12 x 128 in LLaMA's block took 0.28 to 0.32 s an iteration
# (docs/LOG.md, 2026-12-06) where run_cost.py measured a 0.144 s step (2026-12-07, the same shape
# and block, compiled per block): 1.9 to 2.2 times.
SLOWDOWN = 2.2
COST_SOURCE = ("low: run_cost.py's measured parts per depth, on the sphere or off it (MEASURED_COST, docs/LOG.md 2026-12-07), "
               f"the whole-split evaluation scaled by the web sample's val split (x{VAL_SCALE:.2f}), wall-clock = the runs' sum / "
               f"--jobs; high: {SLOWDOWN:g} times that, the slowest ratio of E3's 2,400-iteration runs (two at a time beside other "
               "work) to run_cost.py's step; runs of a depth and kind that have finished count at their own mean time in both")


def run_seconds(rows: list[dict[str, Any]], max_iters: int) -> dict[tuple[str, str], tuple[float, float]]:
    """Each (scale, method)'s seconds a run, low and high: the mean of its depth and kind's finished
    runs where there are some (their whole time: both), else run_cost.py's measured parts (one
    thread) and SLOWDOWN times them."""
    finished: dict[tuple[str, bool], list[float]] = {}
    for r in rows:
        if r.get("reused") and r.get("seconds") and r["status"] == "ok":
            finished.setdefault((r["scale"], r["method"] in ON_SPHERE), []).append(r["seconds"])
    out = {}
    for s in DEPTHS:
        for m in METHODS:
            c = MEASURED_COST[(DEPTHS[s], m in ON_SPHERE)]
            guess = c["fixed_s"] + max_iters * c["step_ms"] / 1000 + (EVALS + 1) * c["eval_s"] + c["full_eval_s"] * VAL_SCALE
            mine = finished.get((s, m in ON_SPHERE))
            out[(s, m)] = (statistics.fmean(mine),) * 2 if mine else (guess, SLOWDOWN * guess)
    return out


def runs_to_come(state: ScaleState | None, planned: int, most: int) -> int:
    """The runs a scale's plan may still add to the `planned` ones: none once the scale is complete,
    or, off the tuned scale, once Pre-LN's shared rate is chosen (the plan is then whole); else up
    to `most` (the dry run counted a whole M's unused grid extensions as an hour still to run)."""
    if state is not None and (state.complete or (state.shared.best is not None and state.scale != TUNED_SCALE)):
        return 0
    return max(most - planned, 0)


def span(low: float, high: float, jobs: int) -> str:
    """'40 min to 1.5 h': the seconds of runs from low to high, `jobs` at a time."""
    return " to ".join(f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h" for s in (low / jobs, high / jobs))


def time_left(sweep: Sweep, losses: Any, place: study.Place, seconds: dict[tuple[str, str], tuple[float, float]],
              cuts: int) -> dict[str, tuple[list[str], list[str], list[float]]]:
    """Each scale's plan under the first `cuts` cuts: its folders, their states (a dry run's words) and
    the seconds, low and high, of what is left (the runs to resume or run, and the runs the plan may
    still add at the mean of its scale's eight rows)."""
    states = study_states(losses, tuple(DEPTHS), cuts)
    method_of = {sweep.folder(p): p["method"] for st in states for p in st.points}
    out = {}
    for scale in DEPTHS:
        mine = list(dict.fromkeys(sweep.folder(p) for st in states if st.scale == scale for p in st.points))
        states_now = [place.listed.get(f, RUN_STATES[3]) for f in mine]
        to_come = runs_to_come(next((st for st in states if st.scale == scale), None), len(mine), most_runs(scale, cuts))
        left = [sum(seconds[(scale, method_of[f])][i] for f, st in zip(mine, states_now) if st in RUN_STATES[2:])
                + to_come * statistics.fmean(seconds[(scale, m)][i] for m in METHODS) for i in range(2)]
        out[scale] = (mine, states_now, left)
    return out


def cost_lines(sweep: Sweep, rows: list[dict[str, Any]], place: study.Place, max_iters: int, cuts: int) -> str:
    """The dry run's account: per scale, the runs of the plan now by state and the most it can hold,
    and the time of those left at --jobs at a time (a run not planned yet at the mean of its scale's
    eight rows); then the whole design, and what is left under each further cut of the declared
    order (a cut's runs that have ended cost nothing more, so they save nothing)."""
    losses, seconds = finished_losses(rows, table_metric(rows)), run_seconds(rows, max_iters)
    lines = [f"{NAME}: the plan now and the most each scale can hold (S whole, then M, then L), {place.jobs} at a time:"]
    plans = {n: time_left(sweep, losses, place, seconds, n) for n in range(cuts, len(CUT_ORDER) + 1)}
    for scale, (mine, states_now, left) in plans[cuts].items():
        counts = ", ".join(f"{states_now.count(s)} {s}" for s in RUN_STATES if states_now.count(s))
        off, on = seconds[(scale, BASELINE)], seconds[(scale, SPHERET[0])]
        lines.append(f"  {scale} ({DEPTHS[scale]} x {WIDTH}): {len(mine)} runs in the plan now ({counts or 'none yet: the scale before ends first'}), "
                     f"at most {most_runs(scale, cuts)}; {span(*left, place.jobs)} for what is left (a run: {off[0]:.0f} to {off[1]:.0f} s off "
                     f"the sphere, {on[0]:.0f} to {on[1]:.0f} s on it)")
    for n, plan in plans.items():
        total = [sum(left[i] for _, _, left in plan.values()) for i in range(2)]
        what = "whole design" if n == cuts else f"with --cuts {n} ({'; '.join(c.text for c in CUT_ORDER[:n])})"
        lines.append(f"  {what}: {span(*total, place.jobs)}.")
    lines.append(f"  Costs: {COST_SOURCE}.")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = study_parser(__doc__)
    add_length_options(p, DEFAULT_MAX_ITERS)
    p.add_argument("--cuts", type=int, default=0, help=f"apply the first N cuts of the declared order ({CUT_ORDER_TEXT}) (default 0)")
    p.add_argument("--tables_dir", default=None, help=f"where {TABLE_STEM}.md and .png go (default: --out_dir; docs to publish them)")
    p.add_argument("--mix_kernel_paths", action="store_true", help="tabulate runs of several kernel paths together (default: refuse)")
    add_place_options(p, f"out/{NAME}", dry_run=True, data_dir=DATA_DIR, corpus=str(CORPUS))
    return p.parse_known_args(argv)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    """Plan and run S, then M, then L (one design per stage, each the one before plus a scale),
    writing the tables after each; --dry_run and --table_only read the whole design once."""
    started = time.perf_counter()
    fixed = {k: "nothing (issue 64's protocol fixes it)" for k in (*SHAPE, *RECIPE, "learning_rate", "min_lr", "lr_decay_iters", "warmup_iters",
                                                                 "eval_interval", "n_layer")}
    check_overrides(overrides, {**RESERVED, **fixed, "seed": "nothing (seeds 1337 to 1340 are the design's)", "max_iters": "--max_iters"})
    scales = tuple(DEPTHS)
    stages = [scales] if args.dry_run or args.table_only else [scales[:k] for k in range(1, len(scales) + 1)]
    sweep = design(args.max_iters, stages[0], args.cuts)
    rows, place, yardsticks = start_study(sweep, args, overrides)  # the data and the declaration first
    for stage in stages[1:]:
        write_tables(rows, place, args, yardsticks)  # each scale's tables as it completes
        sweep = design(args.max_iters, stage, args.cuts)
        rows = run_sweep(sweep, place, yardsticks)
    if place.dry_run:
        print(cost_lines(sweep, rows, place, args.max_iters, args.cuts))
        return 0
    text = write_tables(rows, place, args, yardsticks)
    record = {"max_iters": args.max_iters, "cuts": args.cuts, **yardsticks.record(), "metric": table_metric(rows),
              "claims": claims(tabulate(rows, args.cuts)), "runs": rows}
    return publish(place.out_dir, NAME, f"{text}\n## Every run\n\n{markdown_table(rows, RUN_COLUMNS)}", record, [], rows, started)


def write_tables(rows: list[dict[str, Any]], place: study.Place, args: argparse.Namespace, yardsticks: Yardsticks) -> str:
    """TABLES_DIR/table2_miniature.md and .png from the rows; the page's text."""
    t = tabulate(rows, args.cuts)
    out = Path(args.tables_dir) if args.tables_dir else place.out_dir
    text = page_text(t, args.max_iters, corpus_title(place.data_dir), kernel_paths_line(rows, args.mix_kernel_paths), yardsticks.rules_text())
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{TABLE_STEM}.md").write_text(text, encoding="utf-8")
    written = draw(t, out / TABLE_STEM)
    print(f"Written: {', '.join(map(str, [out / f'{TABLE_STEM}.md', *written]))}", flush=True)
    return text


def main(argv: list[str] | None = None) -> int:
    return study_main(parse_args, run, argv)
