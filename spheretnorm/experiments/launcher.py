"""Launch the paper's grid: 8 methods x 3 scales x 2 datasets = 48 torchrun training runs.

    python scripts/launch.py --dry_run                                   # print all 48 commands
    python scripts/launch.py --methods pre_ln,p_spheret:0.5 --scales S --datasets openwebtext
    python scripts/launch.py --mode print > grid.sh                      # a shell script of the commands
    python scripts/launch.py --mode slurm --nnodes 2 --batch_size=8      # one sbatch job per run
    python scripts/launch.py --mode slurm --sbatch_args="--partition=gpu --account=lab --time=12:00:00"
    python scripts/launch.py --nnodes 2 --node_rank 0 --rdzv_endpoint node0:29500   # on each node
    python scripts/launch.py --stage zero_shot --scales L --eval_args "--local_data ../shared/evaldata"

Each run is `train.py config/<dataset>_<scale>.py --connection=... [--<method parameter>=...]
--out_dir=<runs_root>/<dataset>_<scale>/<method>` (e.g. out/openwebtext_s/p_spheret-0.5); its W&B
name is its folder's, <dataset>_<scale>/<method folder>, and its W&B group <dataset>_<scale>, as
train.py sets them (add --wandb_log=true). Any other --key=value is passed to every train.py command.

Modes: local runs the commands one after another on this machine (every GPU per run);
print writes them to stdout; slurm submits one `sbatch scripts/slurm_train.sh ...` job per run
(that script resumes from the checkpoint when SLURM requeues the job), with --sbatch_args and
SLURM's SBATCH_* variables (SBATCH_PARTITION, SBATCH_ACCOUNT, SBATCH_TIMELIMIT, ...) for what the
cluster wants; --nproc_per_node and --nnodes default to SBATCH_GPUS_PER_NODE and SBATCH_NODES.
Before anything runs or is submitted, the grid is checked: a dataset not prepared, W&B online
without an API key, a config that does not parse or a batch size that does not divide stops it
with one line per problem (--dry_run and print only warn). --dry_run prints what a
mode would run without running it. A multi-node local launch runs this script on every node
with the same arguments and its own --node_rank; the nodes meet at --rdzv_endpoint.

A run is skipped when it has finished: its metrics.jsonl has an eval row at iter >= max_iters
(train.py evaluates at the last iteration), when train.py stopped it for good (its metrics.jsonl
ends with a stop row for a collapse or a non-finite loss: reported as "stopped: collapse", since a
resume would stop again), and when its folder holds a run with other settings (reported, never
overwritten; the other runs are still planned). A run that ends with a non-zero exit status is
reported by what the status means (train.py's EXIT_* codes: crashed, stopped: collapse, ...). Every command carries
--init_from=auto, so a run resumes from its checkpoint whenever one exists by the time it
starts. --stage zero_shot runs eval/zero_shot.py on finished runs that have no
ckpt_zero_shot.json yet; scripts/tables.py reads those files for Tables 4 and 5.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from spheretnorm.runtime.run_folder import CKPT_NAME
from spheretnorm.experiments.grid import (
    PAPER_DATASETS,
    PAPER_SCALES,
    ZERO_SHOT_NAME,
    check_overrides,
    config_conflicts,
    config_file,
    exit_text,
    has_checkpoint,
    is_evaluated,
    is_finished,
    last_eval_iter,
    parse_choices,
    parse_methods,
    stopped_row,
)
from spheretnorm.runtime.cli import REPO_ROOT, HelpFormatter, UsageError
from spheretnorm.runtime.methods import method_args, run_name
from spheretnorm.runtime.config import method_dirname
from spheretnorm.runtime.config import ConfigError, TrainConfig, parse_config, resolve_paths, resolve_wandb_names
from spheretnorm.runtime.token_files import META_FILE
from spheretnorm.runtime.tracking import check_wandb

MODES = ("local", "print", "slurm")
STAGES = ("train", "zero_shot")
SLURM_SCRIPT = "scripts/slurm_train.sh"
# Keys the launcher sets itself, and the option to use instead (the method's keys: check_overrides).
RESERVED = {
    "dataset": "--datasets",
    "out_dir": "--runs_root",
    "init_from": "nothing (every run gets --init_from=auto: it resumes from a checkpoint by itself)",
    # One value for every run would give all runs of a method the same folder or W&B name.
    "config_name": "nothing (it is <dataset>_<scale>, as the config file's name)",
    "wandb_run_name": "nothing (each run is named after its folder, <dataset>_<scale>/<method folder>)",
}


@dataclass
class GridRun:
    """One training run of the grid, as train.py will see it."""

    dataset: str
    scale: str
    method: str
    name: str  # also the W&B run name: <config_name>/<method>
    out_dir: Path
    max_iters: int
    train_args: list[str]  # everything after train.py
    train: TrainConfig  # as train.py will resolve it on the cluster (data_dir, W&B keys)
    conflicts: list[str] = field(default_factory=list)  # settings where out_dir's run differs

    @property
    def slug(self) -> str:
        """The name as a job or rendezvous id: 'openwebtext_s-p_spheret-0.5'."""
        return self.name.replace("/", "-").replace(":", "-")

    @property
    def path(self) -> Path:
        """out_dir on this machine: commands run in the repository root, so it is relative to that."""
        return REPO_ROOT / self.out_dir

    @property
    def finished(self) -> bool:
        return is_finished(self.path, self.max_iters)

    def args(self) -> list[str]:
        """train.py arguments; auto resumes from a checkpoint that exists when the command runs
        (a printed grid may run much later, a SLURM job may be requeued)."""
        return [*self.train_args, "--init_from=auto"]


def build_grid(
    methods: list[str], scales: list[str], datasets: list[str], runs_root: Path, overrides: list[str], world_size: int
) -> list[GridRun]:
    """The runs of datasets x scales x methods; every command's config is parsed (and so checked)
    here, and every problem found is reported together, once each."""
    runs, problems = [], []
    for dataset in datasets:
        for scale in scales:
            config = str(config_file(dataset, scale).relative_to(REPO_ROOT))
            for method in methods:
                args = [config, *method_args(method), *overrides]
                try:
                    # The commands run in the repository root; this script may run anywhere.
                    parsed = parse_config([str(REPO_ROOT / config), *args[1:]], world_size=world_size)
                except ConfigError as e:
                    problems.append(f"{dataset} {scale} {method}: {e}")
                    continue
                config_name = parsed.train.config_name
                out_dir = runs_root / config_name / method_dirname(method)
                model = parsed.model_config()
                train = resolve_wandb_names(resolve_paths(parsed.train, model, parsed.overrides), model)
                conflicts = config_conflicts(REPO_ROOT / out_dir, parsed)
                runs.append(
                    GridRun(dataset, scale, method, run_name(config_name, method), out_dir, parsed.train.max_iters,
                            [*args, f"--out_dir={out_dir}"], train, conflicts)
                )
    if problems:
        raise UsageError("\n".join(dict.fromkeys(problems)))
    return runs


def preflight(runs: list[GridRun]) -> list[str]:
    """What would make the jobs of this grid fail in their first second, each problem once:
    a dataset not prepared, W&B online without an API key."""
    problems = []
    for run in runs:
        data_dir = Path(run.train.data_dir)
        data_dir = data_dir if data_dir.is_absolute() else REPO_ROOT / data_dir
        missing = [name for name in ("train.bin", "val.bin", META_FILE) if not (data_dir / name).is_file()]
        if missing:
            problems.append(
                f"dataset {run.train.dataset} is not prepared: {data_dir} lacks {', '.join(missing)}; "
                f"run `python data/prepare.py {run.train.dataset}` first (or pass --data_dir=...)."
            )
        try:
            check_wandb(run.train)
        except ConfigError as e:
            problems.append(str(e))
    return list(dict.fromkeys(problems))


# -----------------------------------------------------------------------------
# Commands


@dataclass
class Layout:
    nproc_per_node: int
    nnodes: int
    node_rank: int
    rdzv_endpoint: str | None
    sbatch_args: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


def torchrun_command(run: GridRun, layout: Layout) -> list[str]:
    if layout.nnodes == 1:
        launcher = ["torchrun", "--standalone", f"--nproc_per_node={layout.nproc_per_node}"]
    else:
        launcher = [
            "torchrun",
            f"--nnodes={layout.nnodes}",
            f"--nproc_per_node={layout.nproc_per_node}",
            f"--node_rank={layout.node_rank}",
            f"--rdzv_id={run.slug}",  # one rendezvous per run, so consecutive runs never meet
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint={layout.rdzv_endpoint}",
        ]
    return [*launcher, "train.py", *run.args()]


def sbatch_command(run: GridRun, layout: Layout, wrapped: list[str] | None = None) -> list[str]:
    """sbatch of scripts/slurm_train.sh for training, or of `wrapped` (one GPU) for evaluation.

    layout.sbatch_args (partition, account, QOS, time limit, ...) go to sbatch as they are; what
    they leave out comes from SLURM's own SBATCH_* variables, then from the script's defaults.
    """
    options = [
        "sbatch",
        f"--job-name=spheretnorm-{run.slug}",
        f"--output={run.out_dir}/slurm-%x-%j.out",
        *layout.sbatch_args,
    ]
    if wrapped is not None:
        return [*options, "--nodes=1", "--gpus-per-node=1", f"--wrap={shlex.join(wrapped)}"]
    return [
        *options,
        f"--nodes={layout.nnodes}",
        f"--gpus-per-node={layout.nproc_per_node}",
        f"--export=ALL,GPUS_PER_NODE={layout.nproc_per_node}",
        SLURM_SCRIPT,
        *run.args(),
    ]


def zero_shot_command(run: GridRun, eval_args: list[str]) -> list[str]:
    return [
        "python",
        "eval/zero_shot.py",
        f"--ckpt={run.out_dir / CKPT_NAME}",
        "--tasks=paper",
        f"--out={run.out_dir / ZERO_SHOT_NAME}",
        *eval_args,
    ]


def plan(runs: list[GridRun], stage: str, mode: str, layout: Layout, eval_args: list[str]) -> tuple[list[tuple[GridRun, list[str]]], list[str]]:
    """([(run, command) to run], [why each other run is skipped])."""
    todo, skipped = [], []
    for run in runs:
        if run.conflicts:
            skipped.append(conflict_reason(run))
            continue
        if stage == "train":
            if run.finished:
                skipped.append(f"{run.name}: finished (eval at iter {last_eval_iter(run.path)} >= max_iters {run.max_iters}) in {run.out_dir}")
                continue
            stop = stopped_row(run.path)
            if stop is not None:  # resuming would stop again at the same point
                skipped.append(f"{run.name}: stopped: {stop['reason'].replace('_', '-')} at iter {stop['iter']} in {run.out_dir}; move that folder away (or change its settings) to run it again")
                continue
            command = sbatch_command(run, layout) if mode == "slurm" else torchrun_command(run, layout)
        else:
            if not run.finished:
                skipped.append(f"{run.name}: not finished training, nothing to evaluate in {run.out_dir}")
                continue
            if is_evaluated(run.path):  # a --limit result does not count
                skipped.append(f"{run.name}: already evaluated ({run.out_dir / ZERO_SHOT_NAME})")
                continue
            command = zero_shot_command(run, eval_args)
            if mode == "slurm":
                command = sbatch_command(run, layout, wrapped=command)
        todo.append((run, command))
    return todo, skipped


def conflict_reason(run: GridRun) -> str:
    return (
        f"{run.name}: {run.out_dir} holds a run with other settings ({'; '.join(run.conflicts)}); "
        "move that folder away or use another --runs_root to run it"
    )


def warn_conflicts(runs: list[GridRun]) -> None:
    """On stderr, so that skipped runs stand out even when stdout is a generated script."""
    clashing = [run.name for run in runs if run.conflicts]
    if clashing:
        print(
            f"warning: {len(clashing)} of {len(runs)} runs skipped, their folders hold runs with other "
            f"settings ({', '.join(clashing)}); the skip lines say which settings differ.",
            file=sys.stderr,
        )


def describe(run: GridRun, stage: str) -> str:
    state = "resume" if stage == "train" and has_checkpoint(run.path) else "new"
    return f"# {run.name} ({stage}, {state}) -> {run.out_dir}"


def print_plan(todo: list[tuple[GridRun, list[str]]], skipped: list[str], stage: str) -> None:
    """Shell-ready: commands on their own lines, everything else as # comments."""
    for run, command in todo:
        print(describe(run, stage))
        print(shlex.join(command))
    for reason in skipped:
        print(f"# skip {reason}")
    print(f"# {len(todo) + len(skipped)} runs: {len(todo)} to run, {len(skipped)} skipped")


def execute(todo: list[tuple[GridRun, list[str]]], mode: str) -> int:
    """Run (local) or submit (slurm) the commands; returns the number that failed."""
    if mode == "slurm" and shutil.which("sbatch") is None:
        raise UsageError("sbatch was not found on PATH; run --mode slurm on a SLURM login node, or add --dry_run to print the commands.")
    failed = []
    for i, (run, command) in enumerate(todo, start=1):
        print(f"[{i}/{len(todo)}] {run.name}: {shlex.join(command)}", flush=True)
        run.path.mkdir(parents=True, exist_ok=True)  # SLURM's --output folder must exist
        status = subprocess.run(command, cwd=REPO_ROOT).returncode
        if status != 0:
            print(f"[{i}/{len(todo)}] {run.name} {exit_text(status)}; continuing.", flush=True)
            failed.append(run.name)
    print(f"{len(todo) - len(failed)} of {len(todo)} {'submitted' if mode == 'slurm' else 'completed'}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return len(failed)


# -----------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
        allow_abbrev=False,  # so an unknown --key=value is a train.py override, never a prefix match
    )
    p.add_argument("--methods", default="paper", help="'paper' (the 8 of the paper), 'all', or a comma-separated list such as pre_ln,p_spheret:0.5")
    p.add_argument("--scales", default=",".join(PAPER_SCALES), help="comma-separated subset of S,M,L")
    p.add_argument("--datasets", default=",".join(PAPER_DATASETS), help="comma-separated subset of fineweb_edu,openwebtext")
    p.add_argument("--mode", choices=MODES, default="local", help="run the commands here, print them, or submit them with sbatch")
    p.add_argument("--stage", choices=STAGES, default="train", help="train, or zero_shot (evaluate finished runs)")
    p.add_argument("--dry_run", action="store_true", help="print the commands instead of running them")
    p.add_argument("--runs_root", default="out", help="the run folders go to RUNS_ROOT/<dataset>_<scale>/<method>; relative to the repository root (default: out)")
    p.add_argument("--nproc_per_node", type=int, default=env_int("SBATCH_GPUS_PER_NODE", 8), help="GPUs per node (default: $SBATCH_GPUS_PER_NODE, else 8)")
    p.add_argument("--nnodes", type=int, default=env_int("SBATCH_NODES", 1), help="nodes per run (default: $SBATCH_NODES, else 1)")
    p.add_argument("--sbatch_args", default="", help="options for every sbatch call, as one string: --sbatch_args=\"--partition=gpu --account=lab --qos=high --time=12:00:00 --cpus-per-task=16\"; SLURM's SBATCH_* variables work too")
    p.add_argument("--node_rank", type=int, default=0, help="this node's rank, for a multi-node local launch")
    p.add_argument("--rdzv_endpoint", default=None, help="HOST:PORT where the nodes of a multi-node local launch meet")
    p.add_argument("--eval_args", default="", help="extra arguments for eval/zero_shot.py, as one string")
    return p.parse_known_args(argv)


def env_int(name: str, default: int) -> int:
    """An integer SLURM variable such as SBATCH_GPUS_PER_NODE ('8' or 'a100:8'), else default."""
    match = re.fullmatch(r"(?:[^:]*:)?(\d+)", os.environ.get(name, "").strip())
    return int(match.group(1)) if match else default


# sbatch options that the launcher derives from its own, so that torchrun and the batch-size
# checks agree with the allocation.
LAYOUT_OPTIONS = {"--nodes": "--nnodes", "-N": "--nnodes", "--gpus-per-node": "--nproc_per_node", "--job-name": "nothing (each job is named after its run)", "--output": "nothing (each job logs into its run folder)"}


def parse_sbatch_args(text: str) -> list[str]:
    try:
        options = shlex.split(text)
    except ValueError as e:
        raise UsageError(f"--sbatch_args {text!r} cannot be split into options ({e}).") from None
    for option in options:
        name = option.split("=", 1)[0]
        if name in LAYOUT_OPTIONS:
            raise UsageError(f"--sbatch_args sets {name}, which the launcher sets from {LAYOUT_OPTIONS[name]}; use that instead.")
    return options


def check_layout(args: argparse.Namespace) -> Layout:
    for name in ("nproc_per_node", "nnodes"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be a positive integer, got {getattr(args, name)}.")
    if not 0 <= args.node_rank < args.nnodes:
        raise UsageError(f"--node_rank {args.node_rank} is not valid with --nnodes {args.nnodes}; use 0 to {args.nnodes - 1}.")
    multi_node_local = args.nnodes > 1 and args.mode != "slurm" and args.stage == "train"
    if multi_node_local and not args.rdzv_endpoint:
        raise UsageError("--nnodes > 1 outside SLURM needs --rdzv_endpoint HOST:PORT (the address of one of the nodes).")
    return Layout(args.nproc_per_node, args.nnodes, args.node_rank, args.rdzv_endpoint, parse_sbatch_args(args.sbatch_args))


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    try:
        layout = check_layout(args)
        check_overrides(overrides, RESERVED)
        runs = build_grid(
            parse_methods(args.methods),
            parse_choices(args.scales, PAPER_SCALES, "scales"),
            parse_choices(args.datasets, PAPER_DATASETS, "datasets"),
            Path(args.runs_root),
            overrides,
            layout.world_size if args.stage == "train" else 1,  # an evaluation job takes one GPU
        )
        todo, skipped = plan(runs, args.stage, args.mode, layout, shlex.split(args.eval_args))
        warn_conflicts(runs)
        problems = preflight([run for run, _ in todo]) if args.stage == "train" else []
        if args.dry_run or args.mode == "print":
            for problem in problems:  # a plan may be printed on a machine without the data
                print(f"warning: {problem}", file=sys.stderr)
            print_plan(todo, skipped, args.stage)
            return 0
        if problems:
            raise UsageError(f"nothing was started, {len(problems)} problem(s) would make the jobs fail at start:\n" + "\n".join(problems))
        for reason in skipped:
            print(f"skip {reason}")
        return 1 if execute(todo, args.mode) else 0
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
