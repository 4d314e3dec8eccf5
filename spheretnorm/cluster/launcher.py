"""Launch the paper's grid: 8 methods x 3 scales x 2 datasets = 48 torchrun training runs.

    python scripts/launch.py --dry_run                                   # print all 48 commands
    python scripts/launch.py --methods pre_ln,p_spheret:0.5 --scales S --datasets openwebtext
    python scripts/launch.py --mode print > grid.sh                      # a shell script of the commands
    python scripts/launch.py --mode slurm --nnodes 2 --batch_size=8      # one sbatch job per run
    python scripts/launch.py --mode slurm --sbatch_args="--partition=gpu --account=lab --time=12:00:00"
    python scripts/launch.py --nnodes 2 --node_rank 0 --rdzv_endpoint node0:29500   # on each node
    python scripts/launch.py --stage zero_shot --scales L --eval_args "--local_data ../shared/evaldata"
    python scripts/launch.py --mode slurm --chain_zero_shot              # + each run's zero-shot job, afterok

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
with one line per problem (--dry_run and print only warn), and so does a --runs_root that cannot
hold the run folders. --sbatch_args may not set what the launcher sets (the job's name, log,
nodes, GPUs, tasks, --export), in any form sbatch reads (-N2, -N 2, --nodes=2, --nodes 2), nor hold
a bare word, an option without its value or one option twice; SBATCH_NODES and
SBATCH_GPUS_PER_NODE must be counts: each is refused in one line before anything is submitted.
--dry_run prints what a
mode would run without running it. A multi-node local launch runs this script on every node
with the same arguments and its own --node_rank; the nodes meet at --rdzv_endpoint.

A run is skipped when it has finished: its metrics.jsonl has an eval row at iter >= max_iters
(train.py evaluates at the last iteration), when train.py stopped it for good (its metrics.jsonl
ends with a stop row for a collapse or a non-finite loss: reported as "stopped: collapse", since a
resume would stop again), and when its folder holds a run with other settings (reported, never
overwritten; the other runs are still planned). A run that ends with a non-zero exit status is
reported by what the status means (train.py's EXIT_* codes: crashed, stopped: collapse, ...). Every command carries
--init_from=auto, so a run resumes from its checkpoint whenever one exists by the time it
starts. A run counts as finished only when its ckpt.pt is there too: one that reached max_iters
without it (a folder from before train.py always saved the final state) trains again, with
--overwrite=true; any other folder that holds an earlier run's history (an evaluation past iter 0,
zero-shot results) but no ckpt.pt is skipped, saying so, since train.py refuses to start over it
(spheretnorm/runtime/run_folder.py, earlier_run). --stage
zero_shot runs eval/zero_shot.py on finished runs that have no ckpt_zero_shot.json yet;
scripts/tables.py reads those files for Tables 4 and 5.

--mode slurm submits nothing twice. It asks squeue which of the user's jobs of this grid (by job
name: spheretnorm-<run> for training, spheretnorm-zero_shot-<run> for evaluation) are queued or
running, and reads the lock each submission leaves in its run folder (slurm_train.lock,
slurm_zero_shot.lock: the job id); a run whose job is still listed is skipped, one line saying
which job, and a lock whose job squeue no longer lists is stale and ignored. Every job id is
also recorded in the run folder's slurm_jobs.json (a damaged one is kept as slurm_jobs.json.damaged,
said in a line). sbatch is given --sbatch_timeout (default 300 s) to answer, then stopped and its lock released
(squeue and scontrol SQUEUE_TIMEOUT_S, a line saying what went unchecked);
a job id sbatch returns for a second run is not recorded; a lock or record that is a folder is
refused before the first submission; a record that cannot be written (a full disk) is one line
naming the submitted job id. --chain_zero_shot (with --stage train) also
submits each run's zero-shot job with --dependency=afterok:<training job id>, so it starts when
training has succeeded (after a job already queued, too; a finished run's evaluation at once).
The variables HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, TRANSFORMERS_OFFLINE and WANDB_MODE, when set
here, are passed to every job by name in its --export.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path

from spheretnorm.cluster import slurm
from spheretnorm.cluster.grid_plan import execute, plan, print_plan, warn_conflicts
from spheretnorm.cluster.grid_runs import Layout, build_grid, check_run_folders, job_name, preflight
from spheretnorm.cluster.sbatch import parse_sbatch_args
from spheretnorm.experiments.grid import PAPER_DATASETS, PAPER_SCALES, SCALES, check_overrides, parse_choices
from spheretnorm.runtime.cli import HelpFormatter, UsageError
from spheretnorm.runtime.config import ConfigError
from spheretnorm.runtime.imports import folders_off_sys_path, imports_of_overrides
from spheretnorm.runtime.methods import parse_methods

MODES = ("local", "print", "slurm")
STAGES = ("train", "zero_shot")
# Keys the launcher sets itself, and the option to use instead (the method's keys: check_overrides).
RESERVED = {
    "dataset": "--datasets",
    "out_dir": "--runs_root",
    "init_from": "nothing (every run gets --init_from=auto: it resumes from a checkpoint by itself)",
    # One value for every run would give all runs of a method the same folder or W&B name.
    "config_name": "nothing (it is <dataset>_<scale>, as the config file's name)",
    "wandb_run_name": "nothing (each run is named after its folder, <dataset>_<scale>/<method folder>)",
}


def imports_notes(overrides: list[str]) -> list[str]:
    """What a job needs to find the modules of --imports that came from this folder, not sys.path:
    the jobs started here inherit it on PYTHONPATH (runtime/imports.py), a printed command does not."""
    return [
        f"--imports found modules in {folder}, which is not on sys.path: the jobs started here get it on PYTHONPATH; "
        f"run printed commands with PYTHONPATH={shlex.quote(folder)}"
        for folder in folders_off_sys_path(imports_of_overrides(overrides))
    ]


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
        allow_abbrev=False,  # so an unknown --key=value is a train.py override, never a prefix match
    )
    p.add_argument("--methods", default="paper", help="'paper' (the 8 of the paper), 'all', or a comma-separated list such as pre_ln,p_spheret:0.5")
    p.add_argument("--scales", default=",".join(PAPER_SCALES), help=f"comma-separated subset of {','.join(SCALES)} (default {','.join(PAPER_SCALES)}, the paper's; XL trains with FSDP, as its config sets)")
    p.add_argument("--datasets", default=",".join(PAPER_DATASETS), help="comma-separated subset of fineweb_edu,openwebtext")
    p.add_argument("--mode", choices=MODES, default="local", help="run the commands here, print them, or submit them with sbatch")
    p.add_argument("--stage", choices=STAGES, default="train", help="train, or zero_shot (evaluate finished runs)")
    p.add_argument("--dry_run", action="store_true", help="print the commands instead of running them")
    p.add_argument("--runs_root", default="out", help="the run folders go to RUNS_ROOT/<dataset>_<scale>/<method>; relative to the repository root (default: out)")
    p.add_argument("--nproc_per_node", type=int, default=None, help="GPUs per node (default: $SBATCH_GPUS_PER_NODE, else 8)")
    p.add_argument("--nnodes", type=int, default=None, help="nodes per run (default: $SBATCH_NODES, else 1)")
    p.add_argument("--sbatch_args", default="", help="options for every sbatch call, as one string: --sbatch_args=\"--partition=gpu --account=lab --qos=high --time=12:00:00 --cpus-per-task=16\"; SLURM's SBATCH_* variables work too")
    p.add_argument("--sbatch_timeout", type=float, default=slurm.SBATCH_TIMEOUT_S,
                   help=f"seconds to wait for each sbatch to answer before stopping it (default {slurm.SBATCH_TIMEOUT_S:g}); a line says when it waits")
    p.add_argument("--node_rank", type=int, default=0, help="this node's rank, for a multi-node local launch")
    p.add_argument("--rdzv_endpoint", default=None, help="HOST:PORT where the nodes of a multi-node local launch meet")
    p.add_argument("--eval_args", default="", help="extra arguments for eval/zero_shot.py, as one string")
    p.add_argument(
        "--chain_zero_shot", action="store_true",
        help="with --mode slurm --stage train: also submit each run's zero-shot job, held until its training job succeeds (sbatch --dependency=afterok:<training job id>)",
    )
    return p.parse_known_args(argv)


def env_count(name: str, default: int, env: dict[str, str] | None = None) -> int:
    """A count from a SLURM variable such as SBATCH_GPUS_PER_NODE ('8' or 'a100:8'), else default
    when it is unset; any other value is refused (sbatch itself would read it too)."""
    env = os.environ if env is None else env
    text = env.get(name, "").strip()
    if not text:
        return default
    match = re.fullmatch(r"(?:[A-Za-z0-9_-]*:)?(\d+)", text)
    if match is None or int(match.group(1)) < 1:
        form = "a whole number >= 1 or TYPE:COUNT such as a100:8" if name == "SBATCH_GPUS_PER_NODE" else "a whole number >= 1"
        option = LAYOUT_VARIABLES.get(name, "")
        raise UsageError(f"{name}={env[name]!r} is not a count the launcher can use; set it to {form}, or unset it{f' and pass {option}' if option else ''}.")
    return int(match.group(1))


# The SLURM variables the launcher's layout options default to.
LAYOUT_VARIABLES = {"SBATCH_GPUS_PER_NODE": "--nproc_per_node", "SBATCH_NODES": "--nnodes"}


def check_layout(args: argparse.Namespace) -> Layout:
    """The layout of every job, and the sbatch options, checked before anything runs."""
    for name, variable, default in (("nproc_per_node", "SBATCH_GPUS_PER_NODE", 8), ("nnodes", "SBATCH_NODES", 1)):
        if getattr(args, name) is None:
            setattr(args, name, env_count(variable, default))
        elif args.mode == "slurm":  # sbatch reads the variable too, whatever the command line says
            env_count(variable, default)
    for name in ("nproc_per_node", "nnodes"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be a positive integer, got {getattr(args, name)}.")
    if not 0 <= args.node_rank < args.nnodes:
        raise UsageError(f"--node_rank {args.node_rank} is not valid with --nnodes {args.nnodes}; use 0 to {args.nnodes - 1}.")
    if args.chain_zero_shot and (args.mode, args.stage) != ("slurm", "train"):
        bad = f"--mode {args.mode}" if args.mode != "slurm" else f"--stage {args.stage}"
        raise UsageError(f"--chain_zero_shot does not work with {bad}; it needs --mode slurm and --stage train (it queues each run's zero-shot job after its training job).")
    multi_node_local = args.nnodes > 1 and args.mode != "slurm" and args.stage == "train"
    if multi_node_local and not args.rdzv_endpoint:
        raise UsageError("--nnodes > 1 outside SLURM needs --rdzv_endpoint HOST:PORT (the address of one of the nodes).")
    return Layout(args.nproc_per_node, args.nnodes, args.node_rank, args.rdzv_endpoint, parse_sbatch_args(args.sbatch_args))


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    try:
        if not args.sbatch_timeout > 0:
            raise UsageError(f"--sbatch_timeout {args.sbatch_timeout:g} is not valid; give a positive number of seconds, such as 300.")
        layout = check_layout(args)
        check_overrides(overrides, RESERVED)
        runs = build_grid(
            parse_methods(args.methods),
            parse_choices(args.scales, SCALES, "scales"),
            parse_choices(args.datasets, PAPER_DATASETS, "datasets"),
            Path(args.runs_root),
            overrides,
            layout.world_size if args.stage == "train" else 1,  # an evaluation job takes one GPU
        )
        queue = None
        if args.mode == "slurm":  # what is already queued or running is not submitted again
            queue = slurm.Queue.ask([job_name(run, stage) for run in runs for stage in STAGES])
        todo, skipped = plan(runs, args.stage, args.mode, layout, shlex.split(args.eval_args), queue, args.chain_zero_shot)
        notes = [*(queue.notes if queue is not None else []), *imports_notes(overrides)]
        warn_conflicts(runs)
        problems = preflight([job.run for job in todo if job.stage == "train"])
        if args.dry_run or args.mode == "print":
            for problem in problems:  # a plan may be printed on a machine without the data
                print(f"warning: {problem}", file=sys.stderr)
            print_plan(todo, skipped, notes)
            return 0
        if problems:
            raise UsageError(f"nothing was started, {len(problems)} problem(s) would make the jobs fail at start:\n" + "\n".join(problems))
        check_run_folders([job.run for job in todo], args.runs_root)
        if queue is not None:
            slurm.check_slurm_files(todo)
        for note in notes:
            print(f"note: {note}")
        for reason in skipped:
            print(f"skip {reason}")
        failed = slurm.submit(todo, queue, len(skipped), args.sbatch_timeout) if queue is not None else execute(todo, args.mode)
        return 1 if failed else 0
    except (UsageError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
