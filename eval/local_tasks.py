"""Offline copies of three of the paper's benchmarks as lm-eval tasks, from local files.

lm-eval's built-in tasks download their data from the Hugging Face hub. On a machine without
network, LAMBADA (OpenAI), WikiText-2 and PIQA can instead be read from their original files:

    python eval/zero_shot.py --ckpt out/ckpt.pt --tasks paper --local_data ../shared/evaldata

``write_local_tasks(data_dir, out_dir)`` writes one task YAML per benchmark into out_dir (plus
the jsonl conversions it needs) and returns their names. Each YAML *includes* lm-eval's own
built-in YAML, so the prompt, target and metrics are lm-eval's, and only the data source
changes. The tasks keep the built-in names (lambada_openai, wikitext, piqa), so with out_dir
on lm-eval's include path they replace the hub versions and the paper's table reads them.

data_dir layout (as in shared/evaldata; see its PROVENANCE.md):
    lambada_openai/lambada_test.jsonl    {"text": ...} per line, target = last word
    wikitext2/wiki.test.raw              WikiText-2 raw test split
    piqa/valid.jsonl, piqa/valid-labels.lst   PIQA validation and its labels (0/1 per line)

WikiText-2 is split into documents at its top-level ``= Title =`` headings (62 articles),
approximating the hub's EleutherAI/wikitext_document_level; word perplexity can differ from
the hub version in the last digits if that dataset's whitespace differs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import lm_eval.tasks
import yaml

from eval.errors import EvalError

LOCAL_TASKS = ("lambada_openai", "wikitext", "piqa")

LAMBADA_FILE = "lambada_openai/lambada_test.jsonl"
WIKITEXT_FILE = "wikitext2/wiki.test.raw"
PIQA_FILE = "piqa/valid.jsonl"
PIQA_LABELS_FILE = "piqa/valid-labels.lst"

# lm-eval's own YAML of each task, relative to the lm_eval/tasks folder.
_BUILTIN_YAML = {
    "lambada_openai": "lambada/lambada_openai.yaml",
    "wikitext": "wikitext/wikitext.yaml",
    "piqa": "piqa/piqa.yaml",
}

# A top-level WikiText heading line: " = Title = " (sections are " = = Title = = ").
_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")


def wikitext_documents(raw: str) -> list[str]:
    """Split WikiText raw text into articles, each starting at its title line."""
    docs: list[str] = []
    current: list[str] = []
    for line in raw.split("\n"):
        if _WIKITEXT_TITLE.match(line):
            if any(l.strip() for l in current):
                docs.append("\n".join(current))
            current = []  # blank lines before the first title belong to no article
        current.append(line)
    if any(l.strip() for l in current):
        docs.append("\n".join(current))
    return docs


def piqa_records(questions_jsonl: str, labels_lst: str) -> list[dict[str, Any]]:
    """PIQA items with their label merged in, the fields lm-eval's piqa task reads."""
    questions = [json.loads(line) for line in questions_jsonl.splitlines() if line.strip()]
    labels = [int(line) for line in labels_lst.split()]
    if len(questions) != len(labels):
        raise EvalError(f"PIQA has {len(questions)} questions but {len(labels)} labels; the two files do not match.")
    return [{**q, "label": label} for q, label in zip(questions, labels)]


def _builtin_yaml(task: str) -> Path:
    path = Path(lm_eval.tasks.__file__).parent / _BUILTIN_YAML[task]
    if not path.is_file():
        raise EvalError(f"This lm-eval version has no built-in {task} task at {path}, which the local copy includes.")
    return path


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _task_yaml(task: str, split: str, data_file: Path) -> dict[str, Any]:
    """The built-in task with its data read from one local json file."""
    return {
        "include": str(_builtin_yaml(task)),
        "task": task,
        "tag": [],  # don't let the local copy replace a built-in tag (e.g. "lambada") with itself
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {split: str(data_file.resolve())}},
        "training_split": None,
        "validation_split": split if split == "validation" else None,
        "test_split": split if split == "test" else None,
    }


def _require(data_dir: Path, relative: str) -> Path:
    path = data_dir / relative
    if not path.is_file():
        raise EvalError(f"Local benchmark file {str(path)!r} is missing; see eval/local_tasks.py for the expected layout.")
    return path


def write_local_tasks(data_dir: str | Path, out_dir: str | Path) -> list[str]:
    """Write lm-eval task YAMLs for LAMBADA, WikiText-2 and PIQA read from data_dir.

    Returns the task names; pass out_dir as lm-eval's include_path (TaskManager(include_path=...)).
    """
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lambada = _require(data_dir, LAMBADA_FILE)
    wiki_raw = _require(data_dir, WIKITEXT_FILE).read_text(encoding="utf-8")
    piqa = piqa_records(
        _require(data_dir, PIQA_FILE).read_text(encoding="utf-8"),
        _require(data_dir, PIQA_LABELS_FILE).read_text(encoding="utf-8"),
    )
    wiki = _write_jsonl(out_dir / "wikitext2_test_documents.jsonl", [{"page": d} for d in wikitext_documents(wiki_raw)])
    piqa_file = _write_jsonl(out_dir / "piqa_validation.jsonl", piqa)
    configs = {
        "lambada_openai": _task_yaml("lambada_openai", "test", lambada),
        "wikitext": _task_yaml("wikitext", "test", wiki),
        "piqa": _task_yaml("piqa", "validation", piqa_file),
    }
    for task, config in configs.items():
        (out_dir / f"local_{task}.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return list(configs)
