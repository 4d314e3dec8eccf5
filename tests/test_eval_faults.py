"""Damaged local benchmark files: eval/zero_shot.py --local_data refuses them in one sentence.

Each case writes one benchmark's release files with one fault (a renamed field, a null field,
a record that is not an object, binary bytes) and runs eval/zero_shot.py as a user does, as a
subprocess from the repository root. The command must exit non-zero, name the damaged file on
the last line of stderr and print no traceback. The files are checked before lm-eval indexes
its tasks or the checkpoint is loaded, so each case takes about as long as the imports.
"""

from __future__ import annotations

import os

# No network here: datasets / huggingface_hub must not try the hub (set before they are imported).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from spheretnorm.runtime.checkpoint import checkpoint_state
from spheretnorm.model import GPT, GPTConfig

REPO = Path(__file__).resolve().parents[1]
BINARY = bytes(range(256)) * 4  # no UTF-8 text: every byte value, NUL included

# One record of each benchmark in its release format (the fields eval/README.md lists).
ARC = {"id": "q1", "question": {"stem": "Which tool measures mass?", "choices": [{"text": "balance", "label": "A"}, {"text": "ruler", "label": "B"}]}, "answerKey": "A"}
RECORDS: dict[str, dict[str, Any]] = {
    "piqa/valid.jsonl": {"goal": "Open a jar.", "sol1": "Twist the lid.", "sol2": "Freeze the lid."},
    "lambada_openai/lambada_test.jsonl": {"text": "She opened the door and greeted her friend Anna"},
    "arc/ARC-Easy-Test.jsonl": ARC,
    "openbookqa/test.jsonl": ARC,
    "boolq/dev.jsonl": {"question": "is water wet", "title": "Water", "answer": True, "passage": "Water is a liquid."},
    "socialiqa/dev.jsonl": {"context": "Tracy went home.", "question": "Why?", "answerA": "tired", "answerB": "hungry", "answerC": "bored", "correct": "A"},
    "winogrande/dev.jsonl": {"qID": "w1", "sentence": "Sarah beat Maria so _ won.", "option1": "Sarah", "option2": "Maria", "answer": "1"},
    "hellaswag/hellaswag_val.jsonl": {"ind": 1, "activity_label": "Cooking", "ctx_a": "A man cooks.", "ctx_b": "he", "ctx": "A man cooks. he", "endings": ["eats.", "sings.", "runs.", "sleeps."], "label": 0, "source_id": "x", "split": "val", "split_type": "indomain"},
}
TASK_OF = {
    "piqa/valid.jsonl": "piqa", "piqa/valid-labels.lst": "piqa", "lambada_openai/lambada_test.jsonl": "lambada_openai",
    "arc/ARC-Easy-Test.jsonl": "arc_easy", "openbookqa/test.jsonl": "openbookqa", "boolq/dev.jsonl": "boolq",
    "socialiqa/dev.jsonl": "social_iqa", "winogrande/dev.jsonl": "winogrande", "hellaswag/hellaswag_val.jsonl": "hellaswag",
    "sciq/test.json": "sciq", "wikitext2/wiki.test.raw": "wikitext",
}


def renamed(record: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    return {(new if k == old else k): v for k, v in record.items()}


# (damaged file, its content); the other files a task needs are written healthy.
CASES: dict[str, tuple[str, bytes]] = {
    "piqa: fields renamed": ("piqa/valid.jsonl", json.dumps(renamed(RECORDS["piqa/valid.jsonl"], "goal", "question")).encode()),
    "piqa: labels binary": ("piqa/valid-labels.lst", BINARY),
    "lambada: null text": ("lambada_openai/lambada_test.jsonl", b'{"text": null}\n'),
    "arc: null choice text": ("arc/ARC-Easy-Test.jsonl", json.dumps({**ARC, "question": {**ARC["question"], "choices": [{"text": None, "label": "A"}]}}).encode()),
    "openbookqa: stem renamed": ("openbookqa/test.jsonl", json.dumps({**ARC, "question": renamed(ARC["question"], "stem", "text")}).encode()),
    "boolq: null passage": ("boolq/dev.jsonl", json.dumps({**RECORDS["boolq/dev.jsonl"], "passage": None}).encode()),
    "social_iqa: record a list": ("socialiqa/dev.jsonl", b'["Tracy went home.", "Why?"]\n'),
    "winogrande: null option": ("winogrande/dev.jsonl", json.dumps({**RECORDS["winogrande/dev.jsonl"], "option1": None}).encode()),
    "hellaswag: binary": ("hellaswag/hellaswag_val.jsonl", BINARY),
    "hellaswag: null endings": ("hellaswag/hellaswag_val.jsonl", json.dumps({**RECORDS["hellaswag/hellaswag_val.jsonl"], "endings": None}).encode()),
    "sciq: fields renamed": ("sciq/test.json", b'[{"question": "q?", "answer": "a", "distractor1": "b", "distractor2": "c", "distractor3": "d", "support": ""}]'),
    "wikitext: binary": ("wikitext2/wiki.test.raw", BINARY),
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real checkpoint, so that nothing but the benchmark file can be the fault."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=50304))
    path = tmp_path_factory.mktemp("ckpt") / "ckpt.pt"
    torch.save({**checkpoint_state(model), "iter_num": 0, "data_meta": {"tokenizer": "gpt2"}}, path)
    return path


def write_damaged(data: Path, relative: str, content: bytes) -> Path:
    """The damaged file, and the healthy companion files its task reads."""
    companions = {"piqa/valid.jsonl": json.dumps(RECORDS["piqa/valid.jsonl"]) + "\n", "piqa/valid-labels.lst": "0\n"}
    if TASK_OF[relative] == "piqa":
        for name, text in companions.items():
            (data / name).parent.mkdir(parents=True, exist_ok=True)
            (data / name).write_text(text)
    path = data / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_zero_shot_refuses_a_damaged_benchmark_file_in_one_line(case: str, ckpt: Path, tmp_path: Path) -> None:
    relative, content = CASES[case]
    path = write_damaged(tmp_path / "data", relative, content)
    argv = ["--ckpt", ckpt, "--tasks", TASK_OF[relative], "--local_data", tmp_path / "data", "--limit", "2", "--bootstrap_iters", "0", "--out", tmp_path / "r.json"]
    proc = subprocess.run([sys.executable, "eval/zero_shot.py", *map(str, argv)], cwd=REPO, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    assert proc.returncode != 0, output
    assert str(path) in proc.stderr.strip().splitlines()[-1], output
