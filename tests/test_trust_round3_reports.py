"""What the launcher, the sweeps' tables, the tables and plots and the zero-shot reader used to
pass over without a word (issue 48, point 10): a scheduler command that hangs (each is given a
time to answer, then stopped, said in one line), a run folder holding only metrics rows, an eval
row past the run's max_iters, and one-word LAMBADA records. All in-process: the scheduler's
commands are stand-ins that time out."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest

from spheretnorm.cluster import launcher, slurm
from spheretnorm.experiments import figures, tabulate
from spheretnorm.experiments.study import Axis, Place, Sweep, grid_points, run_points
from spheretnorm.zeroshot.local_tasks import LAMBADA_FILE, convert_task


@pytest.fixture
def hanging_scheduler(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """sbatch, squeue and scontrol on PATH, each hanging until its timeout; the calls' keywords."""
    calls: list[dict[str, Any]] = []

    def run(command: list[str], **kwargs: Any) -> None:
        calls.append(kwargs)
        timeout = kwargs.get("timeout")
        assert timeout is not None and 0 < timeout < math.inf, f"{command[0]} is called without a timeout"
        raise subprocess.TimeoutExpired(command, timeout)

    monkeypatch.setattr(slurm.shutil, "which", lambda name: f"/stand_in/{name}")
    monkeypatch.setattr(slurm.subprocess, "run", run)
    return calls


def test_a_hanging_squeue_is_stopped_and_said(hanging_scheduler: list[dict[str, Any]]) -> None:
    queue = slurm.Queue.ask(["spheretnorm-x"])
    assert not queue.known and queue.problem == f"squeue did not answer within {slurm.SQUEUE_TIMEOUT_S:g} s and was stopped"


def test_a_hanging_scontrol_is_stopped_in_one_line(hanging_scheduler: list[dict[str, Any]], capsys: pytest.CaptureFixture) -> None:
    assert slurm.job_output_folder("42") is None
    err = capsys.readouterr().err
    assert err.startswith(f"warning: scontrol did not answer within {slurm.SQUEUE_TIMEOUT_S:g} s about job 42 and was stopped") and err.count("\n") == 1


def test_a_hanging_sbatch_is_stopped(hanging_scheduler: list[dict[str, Any]]) -> None:
    assert slurm.run_sbatch(["sbatch", "x"]) == (None, "", f"sbatch did not answer within {slurm.SBATCH_TIMEOUT_S:g} s and was stopped")
    assert len(hanging_scheduler) == 1


def test_a_slow_sbatch_is_said_to_be_waited_for_and_the_limit_can_be_set(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A hung slurmctld held the launcher 300 s in silence (issue 67, item 8): a line says it waits
    and for how long, and --sbatch_timeout sets the limit (a bad one refused in one line)."""
    import time

    def slow(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        time.sleep(0.3)
        return subprocess.CompletedProcess(command, 0, "Submitted batch job 7\n", "")

    monkeypatch.setattr(slurm.subprocess, "run", slow)
    monkeypatch.setattr(slurm, "SBATCH_WAIT_NOTE_S", 0.05)
    assert slurm.run_sbatch(["sbatch", "x"]) == (0, "Submitted batch job 7\n", "")
    out = capsys.readouterr().out
    assert out == f"note: waiting for sbatch to answer (it is stopped after {slurm.SBATCH_TIMEOUT_S:g} s; --sbatch_timeout=S sets that)\n"
    monkeypatch.setattr(slurm, "SBATCH_WAIT_NOTE_S", 5.0)
    assert slurm.run_sbatch(["sbatch", "x"])[0] == 0 and capsys.readouterr().out == ""  # a prompt answer: no line
    assert launcher.main(["--sbatch_timeout=0", "--dry_run"]) == 2
    assert "--sbatch_timeout 0 is not valid; give a positive number of seconds" in capsys.readouterr().err


def test_a_run_folder_of_metrics_rows_alone_is_named_by_the_sweeps_table(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sweep = Sweep(name="toy", base={"n_layer": 2}, folder=lambda p: f"s{p['seed']}", axes=(Axis("seed", (1, 2)),))
    (tmp_path / "s1").mkdir()
    (tmp_path / "s1" / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "iter": 10, "val_loss": 3.0}) + "\n")
    assert run_points(sweep, grid_points(sweep), Place(tmp_path, tmp_path, table_only=True)) == {}
    assert capsys.readouterr().out == f"note: {tmp_path / 's1'} holds metrics.jsonl but no config.json, so the table leaves its run out.\n"


def write_run(root: Path, eval_iters: list[int]) -> Path:
    """An openwebtext S run of pre_ln with max_iters 100 and eval rows at these iterations."""
    out = root / "openwebtext_s" / "pre_ln"
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({"dataset": "openwebtext", "method": "pre_ln", "max_iters": 100, "n_layer": 12, "n_head": 12, "n_embd": 768}))
    rows = [{"kind": "train", "iter": 100, "train_loss": 3.1, "train_loss_avg200": 3.2}, *({"kind": "eval", "iter": i, "val_loss": 3.0} for i in eval_iters)]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


@pytest.mark.parametrize("reader", ["tables", "plots"])
def test_an_eval_row_past_max_iters_is_one_warning(reader: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = write_run(tmp_path, [50, 100, 400, 500])
    runs = tabulate.load_runs(tmp_path) if reader == "tables" else figures.select_runs(tmp_path, "openwebtext", "S")
    assert [row["iter"] for row in runs[0].rows if row["kind"] == "eval"] == [50, 100, 400, 500]  # shown as before
    assert capsys.readouterr().err == (f"warning: {out / 'metrics.jsonl'} has 2 eval row(s) past the run's max_iters 100 (the first at iteration 400, "
                                       "line 4), which train.py never reaches; they are tabulated and plotted as they are.\n")


def test_a_run_that_ends_at_max_iters_says_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_run(tmp_path, [50, 100])
    tabulate.load_runs(tmp_path)
    assert capsys.readouterr().err == ""


def test_one_word_lambada_records_are_counted_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    texts = ["He looked at the dog and said hello to Harlin", "Shane", "a passage whose last word is Shane", " lonely "]
    (tmp_path / LAMBADA_FILE).parent.mkdir(parents=True)
    (tmp_path / LAMBADA_FILE).write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    assert convert_task(tmp_path, "lambada_openai") == [{"text": t} for t in texts]  # scored as lm-eval scores them
    assert capsys.readouterr().err == (f"warning: 2 of the 4 records of {tmp_path / LAMBADA_FILE} hold a single word (record 2 the first), "
                                       "which LAMBADA scores with no context to predict it from; the LAMBADA release has none, so check the file.\n")
