"""A CPU study's declaration and its plan: the CPU model, the Sweep spec (its axes, points, run
folders and table columns), each point's train.py settings, the losses a plan ranks, the rows'
names, and the follow-up rule that selects each group's rate on its selection seed (BestRate).

A plan is a function of the finished runs' losses alone (plan_points); nothing here starts a
process or writes a file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from spheretnorm.optim import OPTIMIZERS
from spheretnorm.experiments.grid import FINISHED, STALLED, STOPPED_COLLAPSE, STUCK_AT_UNIGRAM, parse_numbers
from spheretnorm.experiments.stats import Rule
from spheretnorm.runtime.cli import REPO_ROOT, UsageError
from spheretnorm.runtime.config import ConfigError, ParsedConfig, config_keys, parse_config
from spheretnorm.runtime.methods import method_args

DATASET = "shakespeare_char"
DEFAULT_DATA_DIR = REPO_ROOT / "data" / DATASET


# The model and batch of every CPU study; each script adds its schedule. Block 64 x batch 16
# keeps a step near half a second on one core. Compiled, fp32: the fastest path measured for
# these shapes (docs/LOG.md, 2026-12-04: a step 1.5x faster than eager; bf16 autocast is slower
# still on a CPU without native bf16); --compile=false gives the eager path, which the LOG's runs
# before 2026-12-04 used. Each run's config.json records the path (kernel_path).
CPU_MODEL: dict[str, Any] = {
    "dataset": DATASET,
    "n_layer": 24,
    "n_head": 4,
    "n_embd": 128,
    "block_size": 64,
    "batch_size": 16,
    "global_batch_size": 16,
    "eval_iters": 10,
    "log_interval": 10,
    "device": "cpu",
    "dtype": "float32",
    "compile": True,
    "compile_scope": "blocks",  # since 2026-12-07: one compile per block at any depth (studies before it: model)
    "wandb_log": False,
}


# Keys the studies set per run, and the option to use instead (the method's keys: check_overrides).
RESERVED = {
    "dataset": "--data_dir (this study trains on shakespeare_char)",
    "data_dir": "--data_dir",
    "out_dir": "--out_dir",
    "init_from": "nothing (a finished run is reused, an unfinished one resumes from its checkpoint)",
    "config_name": "nothing (it is <dataset>_<layers>x<width>)",
}


def parse_number_list(spec: str, what: str, kind: type) -> list[Any]:
    """Comma-separated numbers of an option (--seeds 1337,1338; --lrs 1e-3,3e-3); floats must be positive."""
    try:
        values = [kind(s) for s in spec.split(",") if s.strip()]
    except ValueError:
        values = []
    if not values or (kind is float and any(v <= 0 for v in values)):
        example = "1337,1338" if kind is int else "1e-3,3e-3"
        raise UsageError(f"--{what} {spec!r} is not valid; give comma-separated {'integers' if kind is int else 'positive numbers'} such as {example}.")
    return values


def as_args(settings: dict[str, Any]) -> list[str]:
    return [f"--{k}={v}" for k, v in settings.items()]


def parse_train_args(argv: list[str]) -> ParsedConfig:
    """spheretnorm.runtime.config's parse of a study's train.py arguments; a bad key or value is a UsageError."""
    try:
        return parse_config(argv, world_size=1)
    except ConfigError as e:
        raise UsageError(str(e)) from None


def study_name(parsed: ParsedConfig) -> str:
    """'shakespeare_char_24x128': the config_name (and W&B group) of a study's runs."""
    model = parsed.model_config()
    return f"{parsed.train.dataset}_{model.n_layer}x{model.n_embd}"


# -----------------------------------------------------------------------------
# The declarative sweep: a study's spec, and the train.py settings and folder of each of its points


@dataclass(frozen=True)
class Point:
    """One run of a sweep: its value of each row key (method, lr, seed, ...), in any order given."""

    pairs: tuple[tuple[str, Any], ...]

    @property
    def values(self) -> dict[str, Any]:
        return dict(self.pairs)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def but(self, **changes: Any) -> "Point":
        """This point with some values changed or added: its baseline, its twin at the base width."""
        return point(**{**self.values, **changes})


def point(**values: Any) -> Point:
    # Sorted by key, so that points built in any order compare and hash equal.
    return Point(tuple(sorted(values.items(), key=lambda kv: kv[0])))


@dataclass(frozen=True)
class Axis:
    """One dimension of a sweep: a row key and its values. A value that is a dict sets several row
    keys at once, a variant such as {'method': 'p_spheret:0.5', 'alpha_index': 'sublayer'}."""

    key: str
    values: tuple[Any, ...]

    def items(self) -> list[dict[str, Any]]:
        return [dict(v) if isinstance(v, dict) else {self.key: v} for v in self.values]


@dataclass(frozen=True)
class Column:
    """A column of a Markdown table: its header, the row key (or a function of the row) it shows."""

    header: str
    value: str | Callable[[dict[str, Any]], Any]
    fmt: str = ""
    align: str = "--:"

    def cell(self, row: dict[str, Any]) -> str:
        value = row.get(self.value) if isinstance(self.value, str) else self.value(row)
        return "-" if value is None else format(value, self.fmt)


@dataclass(frozen=True)
class Sweep:
    """What a study declares; run_sweep does the rest. A point's train.py settings are the base,
    its method's arguments, its row keys that are train.py keys (seed, block, spheret_p, ...), then
    what `settings` derives from it (learning_rate and min_lr from lr, ...), which wins."""

    name: str  # the runs' config_name and the stem of <name>.md and <name>.json
    base: dict[str, Any]  # train.py settings of every run
    axes: tuple[Axis, ...]  # outermost first: runs go in this order, so a sweep cut short has whole outer values
    folder: Callable[[Point], str]  # a run's folder under --out_dir; points that share a folder share its run
    columns: tuple[Column, ...] = ()  # the table of runs
    settings: Callable[[Point], dict[str, Any]] = lambda p: {}
    label: Callable[[Point], str] | None = None  # a row's name; None: distinct_labels
    baseline: Callable[[Point], Point] | None = None  # the run each row is compared with, seed by seed
    keep: Callable[[Point], bool] = lambda p: True  # which points of the axes' product run
    follow_up: Callable[["Sweep", dict[Point, float]], list[Point]] | None = None  # the plan, from the finished runs' losses
    extra: Callable[[Point, Path], dict[str, Any]] | None = None  # more row keys, read from the run's folder
    diagnostics: bool = False  # whether rows hold the last evaluation's diagnostic summaries
    rules: tuple[Rule, ...] = ()  # decision rules on each variant's gaps to its baseline, declared before the runs (declare)

    def values(self, key: str) -> tuple[Any, ...]:
        """The values of the axis named key."""
        return next(axis.values for axis in self.axes if axis.key == key)

    def row_keys(self) -> list[str]:
        return list(dict.fromkeys(k for axis in self.axes for item in axis.items() for k in item))


def grid_points(sweep: Sweep) -> list[Point]:
    """The axes' product, outermost axis first, less the points sweep.keep leaves out."""
    combos: list[dict[str, Any]] = [{}]
    for axis in sweep.axes:
        combos = [{**c, **item} for c in combos for item in axis.items()]
    return [p for p in (point(**c) for c in combos) if sweep.keep(p)]


def plan_points(sweep: Sweep, done: dict[Point, float]) -> list[Point]:
    """Every run the sweep holds now, given the final losses of its finished runs."""
    return sweep.follow_up(sweep, done) if sweep.follow_up else grid_points(sweep)


def method_settings(key: str) -> dict[str, Any]:
    """A method key's train.py settings: {'connection': 'p_spheret', 'spheret_p': '0.5'}."""
    return dict(arg[2:].split("=", 1) for arg in method_args(key))


def run_settings(sweep: Sweep, p: Point) -> dict[str, Any]:
    """The train.py settings of one point (see Sweep), --config_name included."""
    own = {k: v for k, v in p.pairs if k in config_keys()}
    method = method_settings(p["method"]) if "method" in p.values else {}
    return {"config_name": sweep.name, **sweep.base, **method, **own, **sweep.settings(p)}


@dataclass
class Place:
    """Where and how a sweep runs: its folders, the user's train.py overrides, the run options."""

    out_dir: Path
    data_dir: Path
    overrides: list[str] = field(default_factory=list)
    jobs: int = 2
    threads: int = 1
    table_only: bool = False  # run nothing: only the runs already in their folders count
    dry_run: bool = False  # as table_only, and print the runs the plan holds
    listed: dict[str, str] = field(default_factory=dict)  # dry run: folder -> its state, as printed
    declared: dict[str, Any] = field(default_factory=dict)  # the sweep's declaration (declare), once start_study made it
    recorded: dict[str, dict[str, Any]] = field(default_factory=dict)  # the record's rows by run folder, as last written (check_row)
    code: dict[str, Any] = field(default_factory=dict)  # the repository's commit this call runs (code_version), asked once

    @staticmethod
    def of(args: Any, overrides: list[str]) -> "Place":
        # Absolute from where the command starts: the runs start in the repository root, and a
        # relative folder would be another one there (the sweep then found none of its runs).
        return Place(Path(args.out_dir).absolute(), Path(args.data_dir).absolute(), overrides, positive_count(args.jobs, "jobs"),
                     positive_count(args.threads, "threads"), getattr(args, "table_only", False), getattr(args, "dry_run", False))


def positive_count(value: int, option: str) -> int:
    """The value of --jobs or --threads, refused below 1 before anything runs (0 divided the dry
    run's estimate; -1 printed 'at -1 at a time')."""
    if value < 1:
        raise UsageError(f"--{option} {value} is not valid; give a positive integer, such as 1 or 2.")
    return value


def train_argv(sweep: Sweep, p: Point, place: Place) -> list[str]:
    """train.py's arguments for a point: its settings, the folders, then the user's overrides."""
    folders = {"data_dir": place.data_dir, "out_dir": place.out_dir / sweep.folder(p)}
    return as_args({**run_settings(sweep, p), **folders}) + place.overrides


def narrowed(sweep: Sweep, specs: list[str]) -> Sweep:
    """The sweep with some axes cut to some of their values: --axis spheret_p=0.25,4."""
    axes = {axis.key: axis for axis in sweep.axes}
    for spec in specs:
        key, _, values = spec.partition("=")
        if key not in axes:
            raise UsageError(f"--axis {spec!r} names no axis of {sweep.name}; its axes are: {', '.join(axes)}.")
        wanted = [v.strip() for v in values.split(",") if v.strip()]
        valid = [value_text(v) for v in axes[key].values]
        if not wanted or any(v not in valid for v in wanted):
            raise UsageError(f"--axis {spec!r} is not valid; give {key}= and some of: {', '.join(valid)}.")
        axes[key] = Axis(key, tuple(v for v in axes[key].values if value_text(v) in wanted))
    return replace(sweep, axes=tuple(axes.values()))


# -----------------------------------------------------------------------------
# The loss a plan (and a table) ranks, and the runs that count for it


FULL_METRIC = "val_loss_full"  # the final eval row's loss over the whole val split (non-overlapping windows)
SAMPLED_METRIC = "val_loss"  # the eval_iters random batches every evaluation has; what runs before FULL_METRIC have


def table_metric(rows: Iterable[dict[str, Any]]) -> str:
    """The loss a table (and the plan's selection) ranks: FULL_METRIC where every run that ran to
    its end has it, else SAMPLED_METRIC for all, so that no table compares one run's whole split
    with another's sampled batches."""
    trained = [r for r in rows if r["status"] in FINISHED]  # the ones with a final eval row at max_iters
    return FULL_METRIC if trained and all(r.get(FULL_METRIC) is not None for r in trained) else SAMPLED_METRIC


# grid.classify's statuses of a run that did not learn, and what a table says of each, in "failed
# (seed 1338 collapsed)": each is a failure wherever one of them is (no mean, a gap against its side,
# a cross in a figure). The one table of them: UNSTABLE is its keys.
FAILURE_WORDS = {"diverged": "diverged", STOPPED_COLLAPSE: "collapsed", STUCK_AT_UNIGRAM: "stuck at unigram", STALLED: "stalled"}
UNSTABLE = tuple(FAILURE_WORDS)


def final_loss(row: dict[str, Any], metric: str = SAMPLED_METRIC) -> float:
    """What a follow-up rule and a table rank: the final loss by `metric` (table_metric), inf for a
    run that diverged or collapsed."""
    return row[metric] if row["status"] == "ok" and row.get(metric) is not None else math.inf


def has_ended(row: dict[str, Any]) -> bool:
    """Whether a run counts for the plan: trained to the end, or stopped for good (not failed, not
    still unfinished as a run in progress is, seen by --table_only)."""
    return row["status"] == "ok" or row["status"] in UNSTABLE


def current_plan(sweep: Sweep, rows: dict[Point, dict[str, Any]]) -> list[Point]:
    """The sweep's plan given the rows of its ended runs, selecting on the loss its table will show."""
    metric = table_metric(rows.values())
    return plan_points(sweep, {p: final_loss(r, metric) for p, r in rows.items() if has_ended(r)})


# -----------------------------------------------------------------------------
# The rows' names


def value_text(value: Any) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


def distinct_labels(sweep: Sweep, points: list[Point]) -> Callable[[Point], str]:
    """Rows named by their method and the settings in which its runs differ ('pre_ln, lr=0.003',
    'pre_ln, optimizer=muon'); the seed has its own column. The method is the point's, else the
    sweep's connection."""

    def method(p: Point) -> str:
        return str(p.get("method", sweep.base.get("connection", sweep.name)))

    keys = [k for k in sweep.row_keys() if k not in ("method", "seed")]
    varying: dict[str, list[str]] = {}
    for m in dict.fromkeys(map(method, points)):
        mine = [p for p in points if method(p) == m]
        varying[m] = [k for k in keys if len({value_text(p.get(k)) for p in mine}) > 1]
    return lambda p: ", ".join([method(p), *(f"{k}={value_text(p.get(k))}" for k in varying.get(method(p), keys))])


def name_rows(sweep: Sweep, points: list[Point], rows: dict[Point, dict[str, Any]], metric: str = SAMPLED_METRIC) -> list[dict[str, Any]]:
    """The rows in the plan's order, each with its name, and with a baseline its baseline's name
    and its loss by `metric` minus the same seed's baseline run's ('gap')."""
    name = sweep.label or distinct_labels(sweep, points)
    out = []
    for p in points:
        if p not in rows:
            continue
        row = {**rows[p], "name": name(p)}
        if sweep.baseline:
            base = rows.get(sweep.baseline(p), {})
            row["baseline"] = name(sweep.baseline(p))
            both = row.get(metric) is not None and base.get(metric) is not None
            row["gap"] = row[metric] - base[metric] if both else None
        out.append(row)
    return out


# -----------------------------------------------------------------------------
# An optimizer axis: each optimizer sweeps its own rate key (fair_comparison, lr_transfer)


GRID_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)  # an optimizer's default grid: its rate key's default times these


def default_grid(optimizer: str) -> tuple[float, ...]:
    """GRID_FACTORS times the optimizer's rate key's default (muon_lr 0.02: 0.005 to 0.08)."""
    key = OPTIMIZERS[optimizer].rate_key
    default = next(p.default for p in OPTIMIZERS[optimizer].params if p.key == key)
    return tuple(float(f"{default * f:.6g}") for f in GRID_FACTORS)


def rate_grids(optimizers: list[str], lrs: list[float], given: list[str]) -> dict[str, tuple[float, ...]]:
    """Each optimizer's rates: --lrs for one whose rate is learning_rate, --grid OPT=... or its default grid else."""
    grids = {}
    for item in given:
        name, sep, values = item.partition("=")
        if not sep or name not in optimizers:
            raise UsageError(f"--grid {item!r} must be OPT=R1,R2,... with OPT one of --optimizers ({', '.join(optimizers)}).")
        if name in grids:  # the later item silently replaced the earlier one
            raise UsageError(f"--grid {name}= is given twice; give one --grid {name}=R1,R2,... with every rate.")
        grids[name] = tuple(parse_numbers(values, float, f"grid {name}"))
    for name in optimizers:
        if name not in grids:
            grids[name] = tuple(lrs) if OPTIMIZERS[name].rate_key == "learning_rate" else default_grid(name)
    return {name: grids[name] for name in optimizers}


# -----------------------------------------------------------------------------
# A follow-up rule: each group at its own best rate, chosen on the selection seed


def swept_rates(lrs: list[float], losses: dict[float, float], extensions: int = 1) -> tuple[list[float], bool]:
    """(the rates a group sweeps with its first seed, whether all of them are finished), given the
    losses of its finished runs (inf: diverged or collapsed): lrs, plus up to `extensions` grid
    steps beyond the end where the best so far lies, so that the best is bracketed. A grid of one
    rate is a rate given, not chosen: it has no step to extend by."""
    rates = sorted(lrs)
    if len(rates) < 2:
        return rates, all(lr in losses for lr in rates)
    while True:
        if any(lr not in losses for lr in rates):
            return rates, False
        best = min(rates, key=lambda lr: losses[lr])
        if len(rates) - len(lrs) >= extensions or not math.isfinite(losses[best]) or best not in (rates[0], rates[-1]):
            return rates, True
        at_top = best == rates[-1]
        step = rates[-1] / rates[-2] if at_top else rates[1] / rates[0]  # the grid's factor at that end
        rates = sorted([*rates, extension_rate(best * step if at_top else best / step)])


def extension_rate(rate: float) -> float:
    """A rate one grid step past an end, as a user would give it: 6 significant digits (the folder
    names' precision), not 0.0010000091042 for 7.0711e-4 * sqrt(2). A record made before rates were
    rounded holds the unrounded rate in the same folder, which is the same run (identity.same_setting)."""
    return float(f"{rate:.6g}")


def refined_rates(rates: list[float], losses: dict[float, float]) -> list[float]:
    """The rates with the geometric midpoints (a sqrt(2) step on a grid of factor 2) between the
    best and each of its neighbours; at an end of the grid, the midpoint of one grid step beyond.
    A grid of one rate (a rate given) has no neighbours to refine towards."""
    if len(rates) < 2:
        return list(rates)
    best = rates.index(min(rates, key=lambda lr: losses[lr]))
    midpoints = []
    for side in (-1, 1):
        if 0 <= best + side < len(rates):
            neighbour = rates[best + side]
        else:  # one step of the grid's factor at that end
            neighbour = rates[best] * (rates[1] / rates[0] if side < 0 else rates[-1] / rates[-2]) ** side
        midpoints.append(float(f"{math.sqrt(rates[best] * neighbour):.6g}"))  # 6 digits: the folder names' precision
    return sorted({*rates, *midpoints})


@dataclass(frozen=True)
class BestRate:
    """The rule 'each group (every axis but the rate and the seed) at its own best rate', chosen on
    the selection seed alone (Seeds), so that the held-out seeds' losses there are free of the
    choice (docs/EXPERIMENTS.md section 6). In the order to run them: every selection run, then
    the held-out seeds at the best rates, then at their neighbours (so a sweep cut short misses
    the least telling runs). The points sweep.keep leaves out are left out of the plan too; a
    group's rates differ by `grid`, not by keep, since the extension lies outside every grid.

    A sweep whose follow_up is a BestRate selects a rate: its table's summary is the held-out one
    (selected_summary), read with the same rate and seed keys as the plan, so that the statistics
    cannot pool the seed that chose with the seeds that did not."""

    extensions: int = 1  # grid steps past the end where the best lies (swept_rates)
    rate: str = "lr"
    seed: str = "seed"
    grid: Callable[[Point], tuple[float, ...]] | None = None  # a group's rates; None: the rate axis's values
    refine: bool = False  # once the grid is finished, the midpoints beside the best (refined_rates)
    neighbours: bool = True  # the held-out seeds at the best rate's neighbours too (False: issue 50's E3)

    def __call__(self, sweep: Sweep, done: dict[Point, float]) -> list[Point]:
        rate, seed = self.rate, self.seed
        axis_rates, seeds = tuple(sweep.values(rate)), Seeds.of(sweep.values(seed))
        groups = grid_points(Sweep(sweep.name, sweep.base, tuple(a for a in sweep.axes if a.key not in (rate, seed)), sweep.folder))
        sweeps: list[Point] = []
        at_best: list[Point] = []
        beside: list[Point] = []
        for group in groups:
            lrs = list(self.grid(group) if self.grid else axis_rates)
            losses = {lr: loss for lr in set(lrs) | {p[rate] for p in done} if (loss := done.get(group.but(**{rate: lr, seed: seeds.selection}))) is not None}
            rates, finished = swept_rates(lrs, losses, self.extensions)
            if self.refine and finished and math.isfinite(min(losses[lr] for lr in rates)):
                rates = refined_rates(rates, losses)
                finished = all(lr in losses for lr in rates)
            sweeps += [group.but(**{rate: lr, seed: seeds.selection}) for lr in rates]
            if not finished or not math.isfinite(min(losses[lr] for lr in rates)):
                continue  # still sweeping, or every rate diverged or collapsed: no best to seed
            best = rates.index(min(rates, key=lambda lr: losses[lr]))
            at_best += [group.but(**{rate: rates[best], seed: s}) for s in seeds.held_out]
            if self.neighbours:
                beside += [group.but(**{rate: lr, seed: s}) for lr in rates[max(best - 1, 0): best + 2] if lr != rates[best] for s in seeds.held_out]
        return [p for p in sweeps + at_best + beside if sweep.keep(p)]


best_rate_follow_up = BestRate  # a Sweep's follow_up that selects each group's rate on the selection seed


def selection_of(sweep: Sweep) -> BestRate | None:
    """The rate selection a sweep declares (its follow_up, where that is a BestRate), else None:
    a sweep that selects nothing, whose every seed counts alike (paired_seed_summary)."""
    return sweep.follow_up if isinstance(sweep.follow_up, BestRate) else None


@dataclass(frozen=True)
class Seeds:
    """A study's seeds: its best rate is chosen on `selection` alone, and the held-out seeds'
    losses at that rate are its headline, so that the luck of the choice does not flatter it."""

    selection: int
    held_out: tuple[int, ...]

    @staticmethod
    def of(values: Iterable[int]) -> "Seeds":
        """The first seed selects, the others are held out (a seed axis, --seeds)."""
        first, *others = values
        return Seeds(first, tuple(others))


def seed_order(seeds: list[int], selection: int | None) -> list[int]:
    """--seeds with the selection seed first (--selection_seed; None: the first of --seeds)."""
    if selection is None:
        return seeds
    if selection not in seeds:
        raise UsageError(f"--selection_seed {selection} is not one of --seeds ({', '.join(map(str, seeds))}); give one of them.")
    return [selection, *(s for s in seeds if s != selection)]
