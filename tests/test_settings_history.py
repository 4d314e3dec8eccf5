"""A run's settings history (issue 65, item 4): a resume that changes a key leaves the change in the
record, so that 10 iterations at one value and 2 at another never read as a run of the last value;
config.json records what ran besides the keys (the CPU thread count, the data's source)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import train
from markov_data import write_markov_data
from spheretnorm.runtime.checkpoint import load_checkpoint
from spheretnorm.runtime.config import TrainConfig, read_run_config
from spheretnorm.runtime.identity import changes_text, history_label, resume_changes, settings_labels
from test_train_step import train_args


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_each_resume_that_changes_a_key_is_kept_in_config_checkpoint_and_metrics(tmp_path: Path) -> None:
    data, run = write_markov_data(tmp_path / "data"), tmp_path / "run"
    source = {"kind": "local", "files": [{"path": "/corpora/web.jsonl", "format": "jsonl", "sha256": "ab" * 32, "documents": 831}]}
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps({**meta, "source": source}))  # as data/prepare.py records it
    train.main(train_args(data, run, "--max_iters=2", "--eval_interval=2", "--weight_decay=0.1"))
    first = json.loads((run / "config.json").read_text())
    assert first["settings_history"] == [] and first["cpu_threads"] == torch.get_num_threads()
    assert first["data_source"] == source  # the corpus, where the dataset's name says only its format

    train.main(train_args(data, run, "--init_from=resume", "--max_iters=3", "--eval_interval=3", "--weight_decay=0.05"))
    change = {"iter": 2, "changed": {"eval_interval": [2, 3], "weight_decay": [0.1, 0.05], "max_iters": [2, 3]}}
    assert json.loads((run / "config.json").read_text())["settings_history"] == [change]
    assert load_checkpoint(run / "ckpt.pt")["settings_history"] == [change]
    assert [r for r in rows(run) if r["kind"] == "resume"] == [{"kind": "resume", **change}]

    # A resume that changes nothing adds nothing; the next change is appended, the first kept.
    train.main(train_args(data, run, "--init_from=resume", "--max_iters=4", "--eval_interval=4", "--weight_decay=0.05"))
    history = json.loads((run / "config.json").read_text())["settings_history"]
    assert history == [change, {"iter": 3, "changed": {"eval_interval": [3, 4], "max_iters": [3, 4]}}]
    label = history_label(json.loads((run / "config.json").read_text()))
    assert label == "weight_decay 0.1 -> 0.05 at iter 2"  # the length and the logging are no change of what it trains
    assert [r["iter"] for r in rows(run) if r["kind"] == "resume"] == [2, 3]
    assert [r["iter"] for r in rows(run) if r["kind"] == "train"] == [1, 2, 3, 4]  # the resume rows are no train rows

    # Read back as a config (train.py RUN/config.json), the record's own keys stay out of the settings.
    assert not {"settings_history", "cpu_threads", "data_source"} & set(read_run_config(str(run / "config.json")))


def test_a_resume_on_another_thread_count_is_a_change_of_the_run() -> None:
    ckpt = {"train_config": {"weight_decay": 0.1, "lr_decay_iters": 50_000}, "cpu_threads": 2}  # as a checkpoint records them
    cfg = TrainConfig(weight_decay=0.1)
    assert resume_changes(cfg, ckpt, 1) == {"cpu_threads": [2, 1]}
    assert resume_changes(cfg, ckpt, 2) == {}
    assert resume_changes(cfg, {"train_config": ckpt["train_config"]}, 1) == {}  # a checkpoint from before the count was kept
    assert resume_changes(cfg, ckpt, None) == {}  # on an accelerator there is no CPU thread count
    changed = resume_changes(TrainConfig(weight_decay=0.05, init_from="resume"), ckpt, 1)
    assert changed == {"weight_decay": [0.1, 0.05], "cpu_threads": [2, 1]}  # how the command runs (init_from) is no change
    assert changes_text(changed) == "weight_decay: 0.1 -> 0.05; cpu_threads: 2 -> 1"


def test_a_row_label_says_that_a_runs_keys_changed_part_way() -> None:
    plain = {"optimizer": "adamw", "weight_decay": 0.05, "settings_history": []}
    changed = {**plain, "settings_history": [{"iter": 10, "changed": {"weight_decay": [0.1, 0.05], "log_interval": [1, 10]}},
                                             {"iter": 20, "changed": {"cpu_threads": [2, 1]}}]}
    assert history_label(plain) == "" and history_label({"optimizer": "adamw"}) == ""  # recorded before histories were kept
    assert history_label(changed) == "weight_decay 0.1 -> 0.05 at iter 10; cpu_threads 2 -> 1 at iter 20"
    cell = ("shakespeare_char", "12x128", "pre_ln")
    labels = settings_labels([cell, cell], [plain, changed])
    assert labels == ["", "changed part-way: weight_decay 0.1 -> 0.05 at iter 10; cpu_threads 2 -> 1 at iter 20"]


@pytest.mark.parametrize("history", [None, "text", [5], [{"iter": 3}], [{"iter": 3, "changed": {"seed": 5}}]])
def test_a_malformed_history_labels_nothing(history: object) -> None:
    assert history_label({"settings_history": history}) == ""
