"""The grid's runs, as train.py will see them (GridRun, build_grid: every command's config parsed and
checked), their folders, the layout of their processes, and the commands that run them (torchrun,
eval/zero_shot.py); a Job is one such command of the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spheretnorm.experiments.grid import ZERO_SHOT_NAME, config_file, is_finished
from spheretnorm.runtime.cli import REPO_ROOT, UsageError
from spheretnorm.runtime.config import RESTART_FREE_KEYS, ConfigError, TrainConfig, parse_config
from spheretnorm.runtime.identity import config_conflicts, run_settings
from spheretnorm.runtime.methods import found_run_folder, method_args, method_dirname, resolve_paths, resolve_wandb_names
from spheretnorm.runtime.run_folder import OutDirError, check_folder
from spheretnorm.runtime.token_files import META_FILE
from spheretnorm.runtime.tracking import check_wandb


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
    settings: dict[str, Any] | None = None  # what train.py compares with out_dir's config.json (earlier_run)

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
                folder = grid_folder(method, parsed.overrides, runs_root / config_name)
                out_dir = runs_root / config_name / folder
                model = parsed.model_config()
                try:
                    train = resolve_wandb_names(resolve_paths(parsed.train, model, parsed.overrides), model)
                except ConfigError as e:  # WANDB_MODE of this shell: the same for every run, said once
                    problems.append(str(e))
                    continue
                conflicts = config_conflicts(REPO_ROOT / out_dir, parsed)
                settings = run_settings(parsed)  # what train.py compares with out_dir's config.json
                runs.append(
                    GridRun(dataset, scale, method, f"{config_name}/{folder}", out_dir, parsed.train.max_iters,
                            [*args, f"--out_dir={out_dir}"], train, conflicts, settings)
                )
    if problems:
        raise UsageError("\n".join(dict.fromkeys(problems)))
    return runs


def grid_folder(method: str, overrides: dict[str, Any], parent: Path) -> str:
    """A grid run's folder under parent (<runs_root>/<config_name>, from the repository root): the
    method's, and a suffix naming every key the command line sets to a value that computes otherwise
    (identity.run_suffix: '+optimizer=muon'), so the grid of another setting never lands in the paper
    grid's folders; keys a restart may change (max_iters) are left out, so a grid is extended in place.
    A folder an earlier form of the suffix named (methods.found_run_folder) is found again."""
    kept = {k: v for k, v in overrides.items() if k not in RESTART_FREE_KEYS}
    return Path(found_run_folder(str(parent / method_dirname(method)), kept, REPO_ROOT)).name


def check_run_folders(runs: list[GridRun], runs_root: str) -> None:
    """Every run folder can be made under --runs_root: refused before the first job starts or is
    submitted, never halfway through the grid."""
    for run in runs:
        try:
            check_folder(run.path, "run folder")
        except OutDirError as e:
            raise UsageError(f"--runs_root {runs_root!r} cannot hold the run folders: {e}") from None


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


def zero_shot_command(run: GridRun, eval_args: list[str]) -> list[str]:
    return [
        "python",
        "eval/zero_shot.py",
        f"--ckpt={run.out_dir}",  # the run folder: eval/zero_shot.py takes its newest checkpoint when it starts
        "--tasks=paper",
        f"--out={run.out_dir / ZERO_SHOT_NAME}",
        *eval_args,
    ]


def job_name(run: GridRun, stage: str) -> str:
    """The SLURM job name of a run's training or zero-shot job: what squeue is asked for."""
    return f"spheretnorm-{run.slug}" if stage == "train" else f"spheretnorm-zero_shot-{run.slug}"


@dataclass(eq=False)
class Job:
    """One command of the plan: a run's training, or its zero-shot evaluation."""

    run: GridRun
    stage: str  # "train" or "zero_shot"
    command: list[str]
    # The training job this one waits for (sbatch --dependency=afterok): one planned here, or the
    # id of one already queued.
    after: Job | str | None = None
    note: str = ""  # said with the plan line
    job_id: str | None = None  # once submitted

    @property
    def name(self) -> str:
        return job_name(self.run, self.stage)
