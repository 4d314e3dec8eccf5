"""Fill the Hugging Face cache with the datasets of lm-eval tasks, for offline compute nodes.

    python -m eval.prefetch --tasks paper          # on a machine with internet
    python eval/prefetch.py --tasks piqa,arc_easy  # the same, as a file

Each task's dataset is loaded exactly as lm-eval loads it (datasets.load_dataset with the task's
dataset_path, dataset_name and dataset_kwargs), so the cache then holds what lm-eval asks for.
Copy the printed cache folders (by default all of ~/.cache/huggingface) to the compute nodes,
set HF_DATASETS_OFFLINE=1 (and HF_HOME / HF_DATASETS_CACHE if they are not the default place),
and run eval/zero_shot.py there. Run with HF_DATASETS_OFFLINE=1 on a compute node, the same
command checks that every dataset loads from the cache. Bad inputs and an unreachable hub print
one line "error: ..." and exit with status 2.
"""

from __future__ import annotations

import sys


import argparse
from dataclasses import dataclass, field
from typing import Any, Callable

from spheretnorm.runtime.cli import HelpFormatter
from spheretnorm.zeroshot.errors import EvalError
from spheretnorm.zeroshot.driver import _hub_unreachable_types, check_tasks_known, make_task_manager, split_task_list
from spheretnorm.zeroshot.offline import offline_flags

SPLIT_KEYS = ("training_split", "validation_split", "test_split")


@dataclass(frozen=True)
class DatasetSpec:
    """What lm-eval loads for one task: load_dataset(path, name, **kwargs), and the splits it reads."""

    task: str
    path: str
    name: str | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    splits: tuple[str, ...] = ()  # the task's train/validation/test splits that are set
    eval_split: str = ""  # the one zero-shot evaluation reads: test if the task has one, else validation

    def describe(self) -> str:
        return self.path + (f" ({self.name})" if self.name else "")


def task_config(task: str, task_manager: Any) -> dict[str, Any]:
    """The task's YAML with its includes merged and its !function tags left unresolved."""
    from lm_eval.tasks._yaml_loader import load_yaml

    entry = task_manager.task_index.get(task)
    if entry is None or entry.yaml_path is None:
        raise EvalError(f"Task {task!r} has no task YAML to read its dataset from; prefetch takes single tasks such as arc_easy, not groups or Python tasks.")
    config = load_yaml(entry.yaml_path, resolve_func=False)
    if "task" not in config or "dataset_path" not in config:
        raise EvalError(f"{task!r} is a group or has no dataset_path in {entry.yaml_path}; pass its tasks one by one.")
    return config


def loader_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """dataset_kwargs as lm-eval passes them: datasets >= 4 no longer takes trust_remote_code."""
    import datasets
    from packaging.version import parse

    kwargs = dict(config.get("dataset_kwargs") or {})
    if parse(datasets.__version__) >= parse("4.0.0"):
        kwargs.pop("trust_remote_code", None)
    return kwargs


def dataset_spec(task: str, task_manager: Any) -> DatasetSpec:
    config = task_config(task, task_manager)
    splits = tuple(config[k] for k in SPLIT_KEYS if config.get(k))
    eval_split = config.get("test_split") or config.get("validation_split") or ""
    return DatasetSpec(task, config["dataset_path"], config.get("dataset_name"), loader_kwargs(config), splits, eval_split)


def dataset_specs(tasks: list[str], task_manager: Any) -> list[DatasetSpec]:
    check_tasks_known(tasks, task_manager.all_tasks)
    return [dataset_spec(task, task_manager) for task in tasks]


def _unreachable_message(spec: DatasetSpec, exc: BaseException) -> str:
    flags = offline_flags()
    why = f"{' and '.join(flags)} {'is' if len(flags) == 1 else 'are'} set and it is not in the cache" if flags else "the Hugging Face hub could not be reached"
    return (
        f"Could not fetch {spec.describe()} for task {spec.task} ({type(exc).__name__}: {exc}): {why}; "
        "run `python -m eval.prefetch` on a machine with internet and without HF_DATASETS_OFFLINE / HF_HUB_OFFLINE, "
        "then copy its Hugging Face cache here."
    )


def fetch(spec: DatasetSpec, load: Callable[..., Any]) -> dict[str, int]:
    """Load one task's dataset as lm-eval does; returns {split: rows}, checking the splits it reads."""
    try:
        dataset = load(path=spec.path, name=spec.name, **spec.kwargs)
    except _hub_unreachable_types() as exc:
        raise EvalError(_unreachable_message(spec, exc)) from None
    rows = {split: len(dataset[split]) for split in dataset}
    missing = [s for s in spec.splits if s not in rows]
    if missing:
        raise EvalError(f"{spec.describe()} has no split {', '.join(missing)} that task {spec.task} reads; it has {', '.join(rows)}.")
    return rows


def prefetch(specs: list[DatasetSpec], load: Callable[..., Any] | None = None, log: Callable[[str], None] = print) -> dict[str, dict[str, int]]:
    """Load every task's dataset (datasets.load_dataset unless `load` is given); {task: {split: rows}}.

    Tasks that share a dataset (path, name, kwargs) load it once.
    """
    if load is None:
        import datasets

        load = datasets.load_dataset
    done: dict[tuple[str, str | None, str], dict[str, int]] = {}
    fetched = {}
    for spec in specs:
        key = (spec.path, spec.name, repr(sorted(spec.kwargs.items())))
        if key not in done:
            done[key] = fetch(spec, load)
        fetched[spec.task] = done[key]
        sizes = ", ".join(f"{s} {n}" for s, n in done[key].items())
        log(f"{spec.task}: {spec.describe()}: {sizes} (evaluates {spec.eval_split})")
    return fetched


def cache_folders() -> list[str]:
    """Where datasets keeps prepared datasets and huggingface_hub the downloaded files."""
    import datasets.config
    from huggingface_hub import constants

    return [str(datasets.config.HF_DATASETS_CACHE), str(constants.HF_HUB_CACHE)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--tasks", default="paper", help="'paper' (the 11 benchmarks of Tables 4-5) or comma-separated lm-eval tasks (default: paper)")
    p.add_argument("--include_path", action="append", default=[], help="extra folder of lm-eval task YAMLs (repeatable)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        tasks = split_task_list(args.tasks)
        specs = dataset_specs(tasks, make_task_manager(list(args.include_path)))
        prefetch(specs)
    except EvalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    verb = "load from" if offline_flags() else "are now in"
    print(f"All {len(specs)} tasks' datasets {verb} the cache: {', '.join(cache_folders())}.")
    print("On the compute nodes: copy these folders, set HF_DATASETS_OFFLINE=1, and run eval/zero_shot.py.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
