"""Zero-shot benchmarks of a checkpoint with lm-eval, reported as the paper's Tables 4 and 5.

    python eval/zero_shot.py --ckpt out/ckpt.pt --tasks paper
    python eval/zero_shot.py --ckpt out/ckpt.pt --tasks piqa,arc_easy --limit 200 --batch_size 32  # a quick look
    python eval/zero_shot.py --ckpt out/ckpt.pt --tasks paper --local_data ../shared/evaldata  # offline
    python -m eval.zero_shot ...  (the same)

--tasks paper means the paper's 11 benchmarks (PAPER_TASKS); any lm-eval task name works too.
The results JSON (default <ckpt stem>_zero_shot.json, or ckpt_zero_shot.json in a run folder)
gets the paper's columns under "paper_table". eval/README.md explains the columns, --limit
(partial results in <out stem>_limit<N>.json), --skip_missing and the offline modes. Bad
inputs print one line "error: ..." and exit with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import json
import math
import os
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from spheretnorm.runtime.imports import add_import_options, use_import_options
from spheretnorm.runtime.cli import HelpFormatter
from spheretnorm.zeroshot.errors import EvalError
from spheretnorm.zeroshot.offline import offline_mode


@dataclass(frozen=True)
class PaperColumn:
    """One column of the paper's Tables 4 and 5; key is the column name in paper_results.json."""

    task: str
    metric: str
    header: str
    percent: bool

    @property
    def key(self) -> str:
        return f"{self.task}/{self.metric}"


PAPER_COLUMNS = (
    PaperColumn("arc_challenge", "acc_norm", "ARC-C", True),
    PaperColumn("arc_easy", "acc_norm", "ARC-E", True),
    PaperColumn("boolq", "acc", "BoolQ", True),
    PaperColumn("hellaswag", "acc_norm", "HellaSwag", True),
    PaperColumn("lambada_openai", "acc", "LAMBADA", True),
    PaperColumn("openbookqa", "acc_norm", "OBQA", True),
    PaperColumn("piqa", "acc_norm", "PIQA", True),
    PaperColumn("sciq", "acc", "SciQ", True),
    PaperColumn("social_iqa", "acc", "SocialIQa", True),
    PaperColumn("winogrande", "acc", "WinoGrande", True),
    PaperColumn("lambada_openai", "perplexity", "LAMBADA ppl", False),
    PaperColumn("wikitext", "word_perplexity", "WikiText ppl", False),
)
PAPER_TASKS = tuple(dict.fromkeys(c.task for c in PAPER_COLUMNS))

OFFLINE_HINT = (
    "this machine may be offline: fill the HF datasets cache on a machine with network "
    "(python -m eval.prefetch --tasks paper, then HF_DATASETS_OFFLINE=1 here), read the benchmarks "
    "from their original files with --local_data DIR, or give task YAMLs with local data_files via "
    "--include_path DIR"
)


# -----------------------------------------------------------------------------
# Tasks


def split_task_list(spec: str) -> list[str]:
    """'paper,mmlu' -> the paper's tasks then mmlu, without duplicates."""
    names: list[str] = []
    for item in (s.strip() for s in spec.split(",")):
        names.extend(PAPER_TASKS if item == "paper" else [item] if item else [])
    if not names:
        raise EvalError("No task given; pass --tasks paper or a comma-separated list of lm-eval task names.")
    return list(dict.fromkeys(names))


def check_tasks_known(names: list[str], known: list[str]) -> None:
    """One EvalError naming every unknown task, with the closest known names."""
    known_set = set(known)
    problems = []
    for name in names:
        if name in known_set:
            continue
        close = difflib.get_close_matches(name, known, n=3)
        problems.append(f"{name!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    if problems:
        raise EvalError(
            f"Unknown task {', '.join(problems)}; `python -m eval.lm_eval_cli ls tasks` lists the known tasks."
        )


def make_task_manager(include_paths: list[str]) -> Any:
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_paths or None)


# -----------------------------------------------------------------------------
# Running lm-eval


def _hub_unreachable_types() -> tuple[type[BaseException], ...]:
    """The exceptions by which datasets / huggingface_hub say the hub cannot be reached."""
    types: list[type[BaseException]] = [ConnectionError]
    try:
        from datasets.exceptions import DatasetNotFoundError

        types.append(DatasetNotFoundError)
    except ImportError:
        pass
    try:
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

        types += [HfHubHTTPError, LocalEntryNotFoundError]
    except ImportError:
        pass
    return tuple(types)


@contextlib.contextmanager
def hub_errors_as_eval_error(source_note: str = "", hub_off: str | None = None) -> Iterator[None]:
    """Turn a hub dataset that cannot be loaded (offline, no cache) into one EvalError with the offline hint.

    source_note (which tasks came from --local_data and which need the hub) goes into that error,
    and hub_off (why the hub is off: '--local_data', 'HF_DATASETS_OFFLINE=1') when it is.
    """
    try:
        yield
    except _hub_unreachable_types() as exc:
        note = f" {source_note};" if source_note else ""
        off = f" the hub is off here ({hub_off}) and the HF cache does not hold it;" if hub_off else ""
        reason = " ".join(str(exc).split())  # one line, whatever datasets put in its message
        raise EvalError(f"lm-eval could not load a dataset ({type(exc).__name__}: {reason});{note}{off} {OFFLINE_HINT}.") from None


def task_configs(tasks: list[str], task_manager: Any) -> dict[str, dict[str, Any]]:
    """{task: its YAML config, includes merged} of the tasks that have one (groups and Python tasks have none)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    configs = {}
    for task in tasks:
        entry = task_manager.task_index.get(task)
        path = getattr(entry, "yaml_path", None)
        if path is None:
            continue
        try:
            config = load_yaml(str(path), resolve_func=False)
        except Exception:  # noqa: BLE001 - lm-eval reports a broken YAML itself, in its own words
            continue
        if isinstance(config, dict) and "task" in config:
            configs[task] = config
    return configs


def _data_file_paths(data_files: Any) -> list[str]:
    """The paths of a dataset_kwargs.data_files value: a string, a list, or {split: string or list}."""
    if isinstance(data_files, str):
        return [data_files]
    if isinstance(data_files, list):
        return [p for item in data_files for p in _data_file_paths(item)]
    if isinstance(data_files, dict):
        return [p for item in data_files.values() for p in _data_file_paths(item)]
    return []


def task_yaml_problem(config: dict[str, Any], known_metrics: set[str]) -> str | None:
    """What in a task YAML (includes merged) lm-eval would fail on only while evaluating, as a phrase; None if nothing.

    Checked: a dataset_path, metric names lm-eval knows (a !function metric is the task's own
    code and not checked), and the local data_files / data_dir it names.
    """
    if config.get("custom_dataset") is None and (not isinstance(config.get("dataset_path"), str) or not config["dataset_path"].strip()):
        return "has no dataset_path (the Hugging Face dataset, or json / csv / parquet with local data_files)"
    for item in config.get("metric_list") or []:
        metric = item.get("metric") if isinstance(item, dict) else None
        if not isinstance(metric, str):
            return f"has a metric_list entry {item!r} without a metric name"
        if "/" in metric or "." in metric:  # a !function (its path, unresolved here) or an evaluate module path
            continue
        if metric not in known_metrics:
            return f"names the metric {metric!r}, which lm-eval does not know (known: {', '.join(sorted(known_metrics))})"
    kwargs = config.get("dataset_kwargs") if isinstance(config.get("dataset_kwargs"), dict) else {}
    for data_file in _data_file_paths(kwargs.get("data_files")):
        if "://" in data_file:
            continue
        if any(c in data_file for c in "*?["):
            import glob

            if not glob.glob(os.path.expanduser(data_file), recursive=True):
                return f"has data_files {data_file!r}, which matches no file"
        elif not Path(data_file).expanduser().is_file():
            return f"has data_files {data_file!r}, which is no file"
    data_dir = kwargs.get("data_dir")
    if isinstance(data_dir, str) and "://" not in data_dir and not Path(data_dir).expanduser().is_dir():
        return f"has data_dir {data_dir!r}, which is no folder"
    return None


def check_user_task_yamls(tasks: list[str], task_manager: Any, include_paths: list[str]) -> None:
    """Refuse, before the model loads, a requested task from --include_path whose YAML lm-eval would fail on mid-run.

    One EvalError naming the YAML file and what is wrong in it.
    """
    from lm_eval.api import metrics as _  # noqa: F401 - registers the built-in metrics
    from lm_eval.api.registry import METRIC_REGISTRY

    roots = [Path(p).resolve() for p in include_paths]
    known = set(METRIC_REGISTRY)
    for task, config in task_configs(tasks, task_manager).items():
        path = Path(str(getattr(task_manager.task_index.get(task), "yaml_path", ""))).resolve()
        if not any(path.is_relative_to(root) for root in roots):
            continue  # lm-eval's own tasks, and the --local_data ones this module writes
        problem = task_yaml_problem(config, known)
        if problem:
            raise EvalError(
                f"Task {task!r} from --include_path: {path} {problem}; fix the YAML (lm-eval's task format, "
                "https://github.com/EleutherAI/lm-evaluation-harness/blob/main/docs/task_guide.md)."
            )


def check_hub_free(tasks: list[str], task_manager: Any, hub_off: str) -> None:
    """With the hub off, refuse in one sentence the tasks whose datasets come from the hub and are not in the HF cache.

    Run before the model loads: lm-eval would otherwise fail on them only when it builds the tasks.
    """
    from spheretnorm.zeroshot.offline import cache_dirs, uncached_hub_dataset

    needing = {t: d for t, config in task_configs(tasks, task_manager).items() if (d := uncached_hub_dataset(config))}
    if not needing:
        return
    many = len(needing) > 1
    if "--local_data" in hub_off:
        instead = "or evaluate " + ("them" if many else "it") + " in a separate run without --local_data"
    elif "did not answer" in hub_off:  # offline.hub_unreachable's reason: no variable to drop
        instead = "or run on a machine that reaches the hub (HF_ENDPOINT names another address)"
    else:
        instead = "or run without the offline variables on a machine with network"
    raise EvalError(
        f"Task{'s' if many else ''} {', '.join(needing)} need{'' if many else 's'} the Hugging Face hub "
        f"dataset{'s' if many else ''} {', '.join(needing.values())}, but the hub is off here ({hub_off}) and the HF cache "
        f"({', '.join(map(str, cache_dirs()))}) does not hold {'them' if many else 'it'}; fill the cache on a machine "
        f"with network (python -m eval.prefetch --tasks {','.join(needing)}) and copy it here, {instead}."
    )


def run_lm_eval(
    lm: Any, tasks: list[str], task_manager: Any, source_note: str = "", hub_off: str | None = None, **kwargs: Any
) -> dict[str, Any]:
    """lm_eval.simple_evaluate, zero-shot, with unreachable hub datasets turned into an EvalError."""
    import lm_eval

    # Per-sample outputs stay out of the results (as in lm-eval's own results JSON): they can be
    # tens of MB for the paper's tasks. Pass log_samples=True to keep them.
    kwargs = {"num_fewshot": 0, "log_samples": False, **kwargs}
    with hub_errors_as_eval_error(source_note, hub_off):
        return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=task_manager, **kwargs)


# -----------------------------------------------------------------------------
# The paper's table


def paper_row(results: dict[str, Any]) -> dict[str, float | None]:
    """{"task/metric": value as printed in the paper (percent or perplexity), or None if not run}."""
    row: dict[str, float | None] = {}
    for col in PAPER_COLUMNS:
        value = results.get("results", {}).get(col.task, {}).get(f"{col.metric},none")
        row[col.key] = None if value is None else float(value) * (100.0 if col.percent else 1.0)
    return row


# -----------------------------------------------------------------------------
# Limited (--limit) results: partial, never final


def limit_text(limit: int | float) -> str:
    """'200' for a count, '0.1' for a fraction: the N of _limit<N> file names."""
    return str(limit) if isinstance(limit, int) else f"{limit:g}"


def default_results_path(ckpt: Path) -> Path:
    """<ckpt stem>_zero_shot.json beside a checkpoint; for a run folder, inside it under its
    ckpt.pt's name (ckpt_zero_shot.json), which is where the tables and the launcher look."""
    from spheretnorm.runtime.checkpoint import is_sharded_checkpoint
    from spheretnorm.runtime.run_folder import CKPT_NAME

    if ckpt.is_dir() and not is_sharded_checkpoint(ckpt):
        ckpt = ckpt / CKPT_NAME
    return ckpt.with_name(ckpt.stem + "_zero_shot.json")


def results_path(ckpt: str | Path, out: str | None, limit: int | float | None) -> Path:
    """Where results go: --out or default_results_path; a --limit run appends _limit<N>.

    Partial results never take the final file's name, whoever chose it (launch.py passes --out),
    so nothing that checks for the final file mistakes them for a finished evaluation.
    """
    final = Path(out) if out else default_results_path(Path(ckpt))
    if limit is None:
        return final
    suffix = f"_limit{limit_text(limit)}"
    stem = final.stem if final.stem.endswith(suffix) else final.stem + suffix
    return final.with_name(stem + (final.suffix or ".json"))


def limited_marker(limit: int | float, results: dict[str, Any]) -> dict[str, Any]:
    """The "limited" entry of partial results: the limit and how many examples each task used."""
    n_samples = results.get("n-samples", {})
    return {
        "limit": limit,
        "examples": {task: n.get("effective") for task, n in n_samples.items()},
        "note": "partial results from --limit: not final, not comparable with the paper",
    }


def results_limit(results: dict[str, Any]) -> int | float | None:
    """The --limit of a results JSON, or None for a full evaluation.

    Reads the "limited" marker, and lm-eval's own config.limit for files written before it existed.
    """
    marker = results.get("limited")
    if isinstance(marker, dict) and marker.get("limit") is not None:
        return marker["limit"]
    config = results.get("config")
    return config.get("limit") if isinstance(config, dict) else None


def results_skipped(results: dict[str, Any]) -> dict[str, str]:
    """{task: reason} of the tasks a --skip_missing evaluation left out ({} for none)."""
    skipped = results.get("skipped")
    return dict(skipped) if isinstance(skipped, dict) else {}


def incomplete_reason(results: dict[str, Any]) -> str | None:
    """Why a results JSON is not a final evaluation (--limit, tasks skipped), or None when it is.

    What decides whether a run is evaluated (spheretnorm/experiments/grid.py's is_evaluated) should ask this.
    """
    limit = results_limit(results)
    if limit is not None:
        return f"partial results of a --limit {limit_text(limit)} evaluation"
    skipped = results_skipped(results)
    if skipped:
        return f"tasks skipped for lack of their files: {', '.join(skipped)}"
    return None


def format_paper_table(row: dict[str, float | None], label: str, skipped: dict[str, str] | None = None) -> str:
    """A markdown table in the layout of the paper's Tables 4 and 5 (accuracies in %); skipped tasks say so."""
    skipped = skipped or {}

    def cell(col: PaperColumn) -> str:
        value = row[col.key]
        return "skipped" if col.task in skipped else "-" if value is None else f"{value:.2f}"

    headers = ["model"] + [c.header for c in PAPER_COLUMNS]
    cells = [label] + [cell(c) for c in PAPER_COLUMNS]
    widths = [max(len(h), len(v)) for h, v in zip(headers, cells)]

    def line(items: list[str]) -> str:
        return "| " + " | ".join(s.rjust(w) for s, w in zip(items, widths)) + " |"

    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", line(cells)])


def model_label(config: dict[str, Any]) -> str:
    """The method key of paper_results.json, e.g. 'pre_ln' or 'p_spheret:0.5'."""
    from spheretnorm.runtime.config import config_from_dict
    from spheretnorm.runtime.methods import method_key

    return method_key(config_from_dict(config))


# -----------------------------------------------------------------------------
# Outputs


def check_results_file(path: Path) -> None:
    """Before any evaluation: an EvalError when the results file cannot be written where it goes
    (its folder read-only, a file in its path, a folder of its name), so that it is not found out
    only at the end (say_replacing says, once every input is checked, that it replaces one)."""
    if path.is_dir():
        raise EvalError(f"The results file {str(path)!r} is a folder; give --out a file name such as results.json.")
    folder = next(p for p in (path.parent, *path.parents) if p.exists())  # made when the results are written
    try:
        if not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{str(folder)!r} is a file")
        tempfile.TemporaryFile(dir=folder).close()  # the atomic write's temporary file goes there too
    except OSError as exc:
        raise EvalError(
            f"Cannot write the results file {str(path)!r} ({exc.strerror or exc}); give --out a file in a writable folder."
        ) from None


def say_replacing(path: Path) -> None:
    """A NOTE line on stderr where the results file holds an earlier evaluation's results, said once
    the inputs that are quick to check are (a command refused for its local files replaces nothing,
    so it says nothing of it), before the slow task index."""
    if path.is_file():
        print(f"NOTE: {path} holds earlier results; this evaluation replaces them when it ends.", file=sys.stderr)


def write_results(results: dict[str, Any], path: Path) -> None:
    """The results JSON, written to a temporary name beside path and renamed: no partial file on failure.

    A full disk (or any OSError) is one EvalError naming the file.
    """
    from lm_eval.utils import handle_non_serializable

    from spheretnorm.runtime.atomic import WriteError, write_text_atomically

    try:
        write_text_atomically(path, json.dumps(results, indent=2, default=handle_non_serializable) + "\n")
    except WriteError as exc:
        raise EvalError(str(exc)) from None


def log_to_wandb(results: dict[str, Any], label: str, args: argparse.Namespace) -> None:
    """One W&B run with the paper's columns as metrics and table, and lm-eval's results in the summary.

    wandb itself honours WANDB_MODE (offline, disabled) and WANDB_DIR.
    """
    import wandb

    limit = results_limit(results)
    suffix = "" if limit is None else f"-limit{limit_text(limit)}"
    run = wandb.init(
        project=args.wandb_project,
        name=args.wandb_run_name or f"zero-shot-{label}{suffix}",
        job_type="zero_shot" if limit is None else "zero_shot_limited",  # partial numbers stay apart
        config={"ckpt": str(args.ckpt), "tasks": args.tasks, "limit": args.limit, "skipped": results_skipped(results), **results.get("config", {})},
    )
    row = results["paper_table"]
    values = {f"zero_shot/{k}": v for k, v in row.items() if v is not None}
    columns = [c.key for c in PAPER_COLUMNS]
    table = wandb.Table(columns=["model"] + columns, data=[[label] + [row[k] for k in columns]])
    run.log({**values, "zero_shot/paper_table": table})
    run.summary["zero_shot/results"] = results.get("results", {})
    run.finish()


# -----------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--ckpt", required=True, help="a checkpoint written by train.py (ckpt.pt, or the ckpt.dcp folder of --parallel=fsdp), or its run folder (the newer of the two)")
    p.add_argument("--tasks", default="paper", help="'paper' (the 11 benchmarks of Tables 4-5) or comma-separated lm-eval tasks")
    p.add_argument("--limit", type=float, default=None, help="at most N examples per task (a fraction if < 1); quick looks only: written to <out stem>_limit<N>.json and marked limited")
    p.add_argument("--batch_size", type=int, default=16, help="requests per forward pass")
    p.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 elsewhere), float32, bfloat16, float16")
    p.add_argument("--include_path", action="append", default=[], help="extra folder of lm-eval task YAMLs (repeatable); each requested task's YAML is checked first (dataset_path, metric names, local data_files). lm-eval's `!function` tag in a YAML imports and runs the Python file it names: a task folder is code, like a config file that is Python, so give only folders you trust")
    p.add_argument("--local_data", default=None, help="folder with the benchmarks' original release files, read instead of the hub (layout in eval/README.md)")
    p.add_argument("--skip_missing", action="store_true", help="with --local_data: leave out the tasks whose files are absent (listed as skipped in the table and the results JSON) instead of loading them from the hub")
    p.add_argument("--out", default=None, help="results JSON (default: <ckpt stem>_zero_shot.json beside the checkpoint, or ckpt_zero_shot.json inside a run folder given as --ckpt; with --limit, _limit<N> is appended)")
    p.add_argument("--bootstrap_iters", type=int, default=100000, help="lm-eval's bootstrap samples for standard errors (0: none)")
    p.add_argument("--wandb", action="store_true", help="log the table and results to Weights & Biases")
    p.add_argument("--wandb_project", default="spheretnorm")
    p.add_argument("--wandb_run_name", default=None)
    add_import_options(p)
    return p.parse_args(argv)


def check_limit(limit: float | None) -> None:
    """--limit is a count (>= 1) or a fraction in (0, 1); lm-eval would fail on anything else with a traceback."""
    if limit is not None and not (math.isfinite(limit) and limit > 0):
        raise EvalError(f"--limit {limit:g} is not valid; give a number of examples per task (>= 1) or a fraction between 0 and 1.")


def check_device(device: str) -> None:
    """A device name get_device knows (tpu is not one), checked before the slow task index; a CUDA
    device is left to the harness, which falls back to the CPU on a machine without CUDA."""
    from spheretnorm.runtime.device import DeviceError, get_device

    if device.startswith("cuda"):
        return
    try:
        get_device(device)
    except DeviceError as exc:  # its message is already the sentence: the device and the valid ones
        raise EvalError(str(exc)) from None


def _limit(value: float | None) -> int | float | None:
    """lm-eval reads an int as a count and a float below 1 as a fraction."""
    return int(value) if value is not None and value >= 1 else value


def evaluate_checkpoint(args: argparse.Namespace, hub_off: str | None = None) -> tuple[dict[str, Any], str]:
    """Run lm-eval as the arguments say; returns (results with "paper_table" added, model label).

    hub_off says why the hub is off (offline.hub_off_reason; the caller has entered
    offline.offline_mode), None when it is on.
    """
    from spheretnorm.runtime.device import DeviceError, announce_cpu_threads
    from spheretnorm.zeroshot.token_check import refuse_other_tokenizers, resolve_checkpoint_path

    check_limit(args.limit)
    check_device(args.device)
    ckpt = resolve_checkpoint_path(args.ckpt)  # fail fast, before lm-eval and its slow task index
    refuse_other_tokenizers(ckpt)
    limit = _limit(args.limit)
    out = results_path(args.ckpt, args.out, limit)
    check_results_file(out)  # not after an hour of evaluation
    from spheretnorm.zeroshot.harness import NanoGPTLM
    from spheretnorm.zeroshot.local_tasks import check_skip_missing, prepare_local_tasks

    tasks = split_task_list(args.tasks)
    for path in args.include_path:
        if not Path(path).is_dir():
            raise EvalError(f"--include_path {path!r} is not a folder of task YAMLs.")
    check_skip_missing(args.local_data, args.skip_missing)
    with tempfile.TemporaryDirectory(prefix="spheretnorm-local-tasks-") as local_dir:
        include_paths, source_note, skipped, local = list(args.include_path), "", {}, []
        if args.local_data:
            # Every task's files are checked, then read, here: before the slow task index and the model.
            plan = prepare_local_tasks(args.local_data, local_dir, tasks, args.skip_missing)
            include_paths.append(local_dir)
            tasks = [t for t in tasks if t not in plan.skipped]
            source_note, skipped, local = plan.source_note, plan.skipped, plan.local
        say_replacing(out)  # the local files checked: before the slow task index
        task_manager = make_task_manager(include_paths)
        check_tasks_known(tasks, task_manager.all_tasks)
        check_user_task_yamls(tasks, task_manager, list(args.include_path))
        if hub_off:
            check_hub_free([t for t in tasks if t not in local], task_manager, hub_off)
        announce_cpu_threads("cpu" if not args.device.startswith(("cuda", "mps")) else args.device)  # every input checked
        try:
            lm = NanoGPTLM(ckpt=ckpt, device=args.device, dtype=args.dtype, batch_size=args.batch_size)
        except DeviceError as exc:  # its message is already the sentence: the device and the valid ones
            raise EvalError(str(exc)) from None
        results = run_lm_eval(lm, tasks, task_manager, source_note, hub_off, limit=limit, bootstrap_iters=args.bootstrap_iters)
    results["paper_table"] = paper_row(results)
    if skipped:
        results["skipped"] = skipped
    if limit is not None:
        results["limited"] = limited_marker(limit, results)
    return results, model_label(asdict(lm.model.config))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The offline variables are set before lm-eval and datasets are first imported (offline.py).
    with offline_mode(args.local_data, probe_hub=True) as hub_off:
        try:
            return _evaluate_and_write(args, hub_off)
        except OSError as exc:
            error = full_disk_error(exc)
            if error is None:
                raise
            print(f"error: {error}", file=sys.stderr)
            return 2


def full_disk_error(exc: OSError) -> EvalError | None:
    """A full disk (or quota, or file-size limit) met anywhere in an evaluation, as one sentence
    naming the file: lm-eval and datasets write caches of their own besides the results file."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return None
    where = f" {str(exc.filename)!r}" if exc.filename else " a file"
    return EvalError(f"Cannot write{where} ({exc.strerror or exc}); the disk (or the file size limit) is full: free space and run again.")


def _evaluate_and_write(args: argparse.Namespace, hub_off: str | None) -> int:
    try:
        use_import_options(args, EvalError)  # before the checkpoint names a connection of the user's
        results, label = evaluate_checkpoint(args, hub_off)
        limit = results_limit(results)
        out = results_path(args.ckpt, args.out, limit)
        write_results(results, out)
    except EvalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from lm_eval.utils import make_table

    skipped = results_skipped(results)
    print(make_table(results))
    print(format_paper_table(results["paper_table"], label if limit is None else f"{label} (limit {limit_text(limit)})", skipped))
    if limit is not None:
        print(f"LIMITED: at most {limit_text(limit)} examples per task; partial numbers, not final.")
    for task, reason in skipped.items():
        print(f"SKIPPED: {task} ({reason}); not a complete paper evaluation.")
    print(f"results written to {out}")
    if args.wandb:
        log_to_wandb(results, label, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
