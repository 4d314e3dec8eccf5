"""The plan: which of the grid's runs to train or evaluate and which to skip, saying why (plan,
plan_zero_shot: a run's zero-shot job chained to its training); printed as a shell script
(print_plan) or run here one after another (execute).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from spheretnorm.cluster.grid_runs import GridRun, Job, Layout, torchrun_command, zero_shot_command
from spheretnorm.cluster.sbatch import sbatch_command, with_dependency
from spheretnorm.cluster.slurm import Queue
from spheretnorm.experiments.grid import (
    ZERO_SHOT_NAME, checkpoint_path, exit_text, has_checkpoint, is_evaluated, last_eval_iter, reached_max_iters, stopped_row,
)
from spheretnorm.runtime.cli import REPO_ROOT, UsageError
from spheretnorm.runtime.run_folder import checkpoint_path as written_checkpoint  # the file or folder a run writes
from spheretnorm.runtime.run_folder import earlier_run


def plan(
    runs: list[GridRun], stage: str, mode: str, layout: Layout, eval_args: list[str],
    queue: Queue | None = None, chain_zero_shot: bool = False,
) -> tuple[list[Job], list[str]]:
    """([jobs to run], [why each other run is skipped]); queue (slurm) says what is already queued."""
    todo, skipped = [], []

    def add_zero_shot(run: GridRun, after: Job | str | None) -> None:
        job, reason = plan_zero_shot(run, mode, layout, eval_args, queue, after)
        todo.append(job) if job is not None else skipped.append(reason)

    for run in runs:
        if run.conflicts:
            skipped.append(f"{run.name}: {run.out_dir} holds a run with other settings ({'; '.join(run.conflicts)}); "
                           "move that folder away or use another --runs_root to run it")
            continue
        if stage == "zero_shot":
            add_zero_shot(run, None)
            continue
        if run.finished:
            skipped.append(f"{run.name}: finished (eval at iter {last_eval_iter(run.path)} >= max_iters {run.max_iters}, {checkpoint_path(run.path).name} there) in {run.out_dir}")
            if chain_zero_shot:
                add_zero_shot(run, None)
            continue
        stop = stopped_row(run.path)
        if stop is not None:  # resuming would stop again at the same point
            skipped.append(f"{run.name}: stopped: {stop['reason'].replace('_', '-')} at iter {stop['iter']} in {run.out_dir}; move that folder away (or change its settings) to run it again")
            continue
        active = queue.active(run, "train") if queue is not None else None
        if active is not None:
            skipped.append(f"{run.name}: {active.text}")
            if chain_zero_shot and active.job_id is not None:
                add_zero_shot(run, active.job_id)
            continue
        note = ""
        if reached_max_iters(run.path, run.max_iters):
            note = f"it reached max_iters {run.max_iters} but left no {written_checkpoint(run.train).name}, so it trains again"
            # Its settings are this grid's (config_conflicts): train.py may replace its files.
            run = replace(run, train_args=[*run.train_args, "--overwrite=true"]) if not run.train.overwrite else run
        elif not has_checkpoint(run.path) and not run.train.overwrite:
            earlier = earlier_run(run.path, run.settings)
            if earlier is not None:  # train.py would refuse to start over it
                skipped.append(
                    f"{run.name}: {run.out_dir} holds {earlier} but no {written_checkpoint(run.train).name} to resume; "
                    "move that folder away, or pass --overwrite=true to train it again from scratch"
                )
                continue
        command = sbatch_command(run, layout) if mode == "slurm" else torchrun_command(run, layout)
        job = Job(run, "train", command, note=note)
        todo.append(job)
        if chain_zero_shot:
            add_zero_shot(run, job)
    return todo, skipped


def plan_zero_shot(
    run: GridRun, mode: str, layout: Layout, eval_args: list[str], queue: Queue | None, after: Job | str | None
) -> tuple[Job | None, str]:
    """(the zero-shot job of run, "") or (None, why it is skipped); `after`: the training it waits for."""
    if after is None and not run.finished:
        if reached_max_iters(run.path, run.max_iters):
            return None, (
                f"{run.name}: reached max_iters {run.max_iters} but {run.out_dir} has no {written_checkpoint(run.train).name} to evaluate; "
                "train it again with --stage train (train.py now always saves the final state)"
            )
        training = queue.active(run, "train", submitting=False) if queue is not None else None
        queued = f"; its training job is queued ({training.text}): add --chain_zero_shot to a --stage train launch to evaluate it afterwards" if training else ""
        return None, f"{run.name}: not finished training, nothing to evaluate in {run.out_dir}{queued}"
    if is_evaluated(run.path):  # a --limit result does not count
        return None, f"{run.name}: already evaluated ({run.out_dir / ZERO_SHOT_NAME})"
    active = queue.active(run, "zero_shot") if queue is not None else None
    if active is not None:
        return None, f"{run.name}: {active.text}"
    command = zero_shot_command(run, eval_args)
    if mode == "slurm":
        command = sbatch_command(run, layout, wrapped=command)
    return Job(run, "zero_shot", command, after=after), ""


def warn_conflicts(runs: list[GridRun]) -> None:
    """On stderr, so that skipped runs stand out even when stdout is a generated script."""
    clashing = [run.name for run in runs if run.conflicts]
    if clashing:
        print(
            f"warning: {len(clashing)} of {len(runs)} runs skipped, their folders hold runs with other "
            f"settings ({', '.join(clashing)}); the skip lines say which settings differ.",
            file=sys.stderr,
        )


def describe(job: Job) -> str:
    run = job.run
    if job.stage == "train":
        state = "resume" if has_checkpoint(run.path) else "new"
    elif isinstance(job.after, Job):
        state = "after its training job succeeds"
    elif isinstance(job.after, str):
        state = f"after training job {job.after} succeeds"
    else:
        state = "new"
    return f"# {run.name} ({job.stage}, {state}) -> {run.out_dir}" + (f"; {job.note}" if job.note else "")


def print_plan(todo: list[Job], skipped: list[str], notes: list[str] = ()) -> None:
    """Shell-ready: commands on their own lines, everything else as # comments.

    A training job that a zero-shot job waits for is submitted with --parsable into a shell
    variable, and the zero-shot job's --dependency reads it. Each run folder is made before its
    first sbatch: sbatch does not create the folder of --output, and a job whose log cannot be
    opened fails without one.
    """
    waited_for = {id(job.after) for job in todo if isinstance(job.after, Job)}
    variables: dict[int, str] = {}
    made: set[Path] = set()
    for job in todo:
        print(describe(job))
        if job.command[0] == "sbatch" and job.run.out_dir not in made:
            made.add(job.run.out_dir)
            print(shlex.join(["mkdir", "-p", str(job.run.out_dir)]))
        if isinstance(job.after, Job) and id(job.after) in variables:
            dependency = f'--dependency=afterok:"${{{variables[id(job.after)]}%%;*}}"'
            line = f"{shlex.join(job.command[:1])} {dependency} {shlex.join(job.command[1:])}"
        elif isinstance(job.after, str):
            line = shlex.join(with_dependency(job.command, job.after))
        else:
            line = shlex.join(job.command)
        if id(job) in waited_for:
            variables[id(job)] = f"job_{len(variables) + 1}"
            line = f"{variables[id(job)]}=$({shlex.join([job.command[0], '--parsable', *job.command[1:]])})"
        print(line)
    for note in notes:
        print(f"# note: {note}")
    for reason in skipped:
        print(f"# skip {reason}")
    if any(job.stage != todo[0].stage for job in todo):
        print(f"# {len(todo)} jobs to run, {len(skipped)} skipped")
    else:
        print(f"# {len(todo) + len(skipped)} runs: {len(todo)} to run, {len(skipped)} skipped")


def check_torchrun_found(todo: list[Job]) -> None:
    """Refuse in one line, before any run starts, when torchrun is not on PATH (a venv's python
    called by its path leaves the venv's bin folder off PATH): subprocess would end in a traceback."""
    if any(job.command[0] == "torchrun" for job in todo) and shutil.which("torchrun") is None:
        bin_dir = Path(sys.executable).parent
        raise UsageError(
            f"torchrun was not found on PATH; activate the environment that has torch (source {bin_dir / 'activate'}) "
            f"or add {bin_dir} to PATH, then launch again (or run each printed command with {sys.executable} -m torch.distributed.run)."
        )


def execute(todo: list[Job], mode: str) -> int:
    """Run the commands one after another on this machine; returns the number that failed."""
    check_torchrun_found(todo)
    failed = []
    for i, job in enumerate(todo, start=1):
        run = job.run
        print(f"[{i}/{len(todo)}] {run.name}: {shlex.join(job.command)}" + (f" ({job.note})" if job.note else ""), flush=True)
        run.path.mkdir(parents=True, exist_ok=True)
        status = subprocess.run(job.command, cwd=REPO_ROOT).returncode
        if status != 0:
            print(f"[{i}/{len(todo)}] {run.name} {exit_text(status)}; continuing.", flush=True)
            failed.append(run.name)
    print(f"{len(todo) - len(failed)} of {len(todo)} completed" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return len(failed)
