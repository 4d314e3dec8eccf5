"""Checkpoint writes timed apart from the steps (issue 62, part 2: a study run's parts): the train
row after a write carries its seconds (ckpt_s), the stop row the session's total, the last line
the count and total."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

import train
from markov_data import write_markov_data

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ("--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4", "--global_batch_size=8",
        "--eval_iters=1", "--log_interval=1", "--warmup_iters=2", "--learning_rate=3e-3", "--min_lr=3e-4",
        "--device=cpu", "--dtype=float32", "--wandb_log=false", "--always_save_checkpoint=true")


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_each_write_shows_in_the_next_train_row_and_the_last_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_markov_data(tmp_path / "data")
    train.main([f"--data_dir={data}", f"--out_dir={tmp_path / 'run'}", *TINY, "--max_iters=6", "--eval_interval=2"])
    train_rows = {r["iter"]: r for r in rows(tmp_path / "run") if r["kind"] == "train"}
    # Evaluations at 2 and 4 save (always_save_checkpoint); the rows of iterations 3 and 5 follow them.
    timed = sorted(i for i, r in train_rows.items() if "ckpt_s" in r)
    assert timed == [3, 5], train_rows
    assert all(train_rows[i]["ckpt_s"] > 0 for i in timed)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    # Three writes: iterations 2, 4 and the final one at 6.
    assert last.startswith("Done: iter 6,") and "; 3 checkpoint write(s) this session, " in last and last.endswith(" s in all."), last


def test_the_stop_row_holds_the_sessions_write_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_markov_data(tmp_path / "data")
    steps = {"n": 0}
    real_step = train.Trainer.train_step

    def step_then_signal(self, *args, **kwargs):  # a SIGINT during the third step
        steps["n"] += 1
        if steps["n"] == 3:
            signal.raise_signal(signal.SIGINT)
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(train.Trainer, "train_step", step_then_signal)
    train.main([f"--data_dir={data}", f"--out_dir={tmp_path / 'run'}", *TINY, "--max_iters=20", "--eval_interval=2"])
    stop = [r for r in rows(tmp_path / "run") if r["kind"] == "stop"]
    assert len(stop) == 1 and stop[0]["reason"] == "signal", stop
    assert stop[0]["ckpt_write_s"] > 0  # the write at iteration 2 and the stop's own, at 3
