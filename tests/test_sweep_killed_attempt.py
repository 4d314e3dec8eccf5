"""A sweep's run killed before its first checkpoint (SIGKILL, a machine lost) starts again.

Such a run leaves config.json and metrics.jsonl past iteration 0 and nothing to resume from;
train.py refuses to start over them. The sweep sets that attempt's files aside and trains the run
from iteration 0: same seed, same settings, so the same losses as a run never interrupted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from markov_data import write_markov_data
from spheretnorm.experiments import study
from spheretnorm.experiments.sweep_runner import set_aside_killed_attempt


def tiny_job(data_dir: Path, out_dir: Path) -> study.Job:
    argv = [f"--data_dir={data_dir}", f"--out_dir={out_dir}", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16",
            "--batch_size=4", "--global_batch_size=4", "--eval_iters=2", "--eval_interval=4", "--log_interval=1", "--max_iters=12",
            "--warmup_iters=2", "--lr_decay_iters=12", "--learning_rate=3e-3", "--min_lr=3e-4", "--device=cpu", "--dtype=float32",
            "--compile=false", "--wandb_log=false", "--seed=7"]
    return study.make_job("tiny", argv, out_dir)


def train_losses(out_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["iter"]: r["train_loss"] for r in rows if r["kind"] == "train"}


def kill_before_first_checkpoint(out_dir: Path, at_iter: int) -> None:
    """What SIGKILL at `at_iter` leaves when no checkpoint had been written yet."""
    for ckpt in out_dir.glob("ckpt*"):
        ckpt.unlink()
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line).get("iter", 0) <= at_iter and json.loads(line)["kind"] in ("train", "eval")]
    (out_dir / "metrics.jsonl").write_text("\n".join(kept) + "\n")


def test_a_run_killed_before_its_first_checkpoint_starts_again_with_the_same_losses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    data = write_markov_data(tmp_path / "data")
    job = tiny_job(data, tmp_path / "run")
    first = study.run_job(job, 1)
    assert first.returncode == 0 and not first.set_aside
    whole = train_losses(job.out_dir)
    assert max(whole) == 12

    kill_before_first_checkpoint(job.out_dir, at_iter=9)  # evaluated at 0, 4 and 8
    assert study.run_state(job) == "to run"
    again = study.run_job(job, 1)
    assert again.returncode == 0, (job.out_dir / "train.log").read_text()[-2000:]
    assert train_losses(job.out_dir) == whole  # trained from iteration 0: the same run
    assert "an earlier attempt stopped at iter 9 before its first checkpoint" in again.set_aside
    line = study.job_status_line(again, 1, 1)
    assert ": done (an earlier attempt stopped at iter 9" in line and "started again from iteration 0) in " in line
    killed = [json.loads(x) for x in (job.out_dir / "metrics.jsonl.killed-1").read_text().splitlines()]
    assert max(r["iter"] for r in killed) == 9 and (job.out_dir / "config.json.killed-1").is_file()

    # A second such death keeps the first attempt's files and numbers the next.
    kill_before_first_checkpoint(job.out_dir, at_iter=5)
    assert "metrics.jsonl.killed-2" in study.run_job(job, 1).set_aside
    assert (job.out_dir / "metrics.jsonl.killed-1").is_file() and train_losses(job.out_dir) == whole


def test_a_folder_with_zero_shot_results_is_left_to_train_py(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "iter": 4, "val_loss": 2.0}) + "\n")
    (out / "ckpt_zero_shot.json").write_text("{}")
    assert set_aside_killed_attempt(out) == ""
    assert sorted(p.name for p in out.iterdir()) == ["ckpt_zero_shot.json", "config.json", "metrics.jsonl"]
    (out / "ckpt_zero_shot.json").unlink()
    assert "killed-1" in set_aside_killed_attempt(out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json.killed-1", "metrics.jsonl.killed-1"]


def test_a_start_that_only_evaluated_iteration_0_needs_nothing_set_aside(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "iter": 0, "val_loss": 4.0}) + "\n")
    assert set_aside_killed_attempt(out) == ""  # train.py starts over it on its own (earlier_run)
    assert os.path.exists(out / "metrics.jsonl")
