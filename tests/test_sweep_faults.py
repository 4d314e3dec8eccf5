"""scripts/fair_sweep.py and the sweep engine under a stop signal, a second sweep and bad input.

A. kill -INT of the sweep's process reaches its running train.py jobs (they checkpoint and exit),
   no new job starts, and the sweep says how to resume; exit status 128 + the signal.
B. Two sweeps over one --out_dir never train one folder together (a flock in the run folder),
   and a dry run says a folder another sweep trains is in progress.
C. A dry run writes nothing (no data prepared, no folder made) and ends with the number of runs
   and an estimate of their time; where the real run would (re)prepare --data_dir, a note says so.
   An --out_dir that is a file or cannot be made, a --data_dir that cannot be written, and a run's
   config.json that is not JSON, are one line with exit status 2.

A stand-in train.py (a few lines of Python) plays the jobs; nothing trains.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from spheretnorm.experiments import fair_comparison, study, sweep_runner

# A train.py stand-in: says it started, then waits; SIGINT makes it write "stopped" and exit 0,
# as train.py does after its checkpoint.
FAKE_TRAIN = '''import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def stop(signum, frame):
    (out / "stopped").write_text(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGINT, stop)
(out / "started").write_text("")
time.sleep(20)
'''

SMALL = ["--blocks", "gpt2", "--arms", "pre_ln", "--lrs", "1e-3,2e-3", "--seeds", "1,2", "--max_iters", "50", "--warmup_iters", "5"]


@pytest.fixture
def fake_train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    monkeypatch.setattr(sweep_runner, "train_command", lambda job: [sys.executable, str(script), str(job.out_dir)])
    return script


def jobs(tmp_path: Path, n: int) -> list[study.Job]:
    return [study.Job(f"run{i}", [], tmp_path / f"run{i}", 10) for i in range(n)]


def signal_when(path: Path, sig: int) -> threading.Thread:
    """Send `sig` to this process once `path` exists (the first job has started)."""

    def wait() -> None:
        deadline = time.monotonic() + 15
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), sig)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def test_a_stop_signal_reaches_the_running_job_and_starts_no_other(tmp_path: Path, fake_train: Path) -> None:
    first, second = jobs(tmp_path, 2)
    queue = [first, second]
    signal_when(first.out_dir / "started", signal.SIGINT)
    # Not default_int_handler itself: a shell's background job starts Python with SIGINT ignored.
    before = signal.getsignal(signal.SIGINT)
    started = time.monotonic()
    try:
        with pytest.raises(study.SweepStopped) as stopped:
            study.schedule(lambda free: [queue.pop(0) for _ in range(min(free, len(queue)))], lambda result: None, 1, 1, lambda: len(queue))
    except KeyboardInterrupt:
        pytest.fail("SIGINT stopped the sweep only; its train.py ran on")
    assert time.monotonic() - started < 10  # the job did not sleep to its end
    assert (first.out_dir / "stopped").read_text() == "SIGINT"
    assert not second.out_dir.exists()  # no new job after the signal
    assert stopped.value.signum == signal.SIGINT and stopped.value.stopped == ["run0"]
    assert "run the same command again to resume" in str(stopped.value)
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back


def test_a_run_that_exits_0_before_its_end_is_not_reported_done(tmp_path: Path) -> None:
    (job,) = jobs(tmp_path, 1)  # train.py stopped by a signal exits 0 with its checkpoint saved
    job.out_dir.mkdir()
    result = study.JobResult(job, 0, 12.0, "")
    assert "stopped before its end" in study.job_status_line(result, 1, 1) and ": done in" not in study.job_status_line(result, 1, 1)
    (job.out_dir / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "iter": job.max_iters, "val_loss": 2.0}) + "\n")
    assert study.job_status_line(result, 1, 1).startswith(f"[1/1] {job.label}: done in 12 s")


def test_a_run_restored_from_its_record_is_reused_and_a_cut_one_is_not(tmp_path: Path, fake_train: Path) -> None:
    # A run record keeps config.json and metrics.jsonl, not ckpt.pt: its final evaluation is there.
    restored, cut = jobs(tmp_path, 2)
    for job, last in ((restored, restored.max_iters), (cut, restored.max_iters - 5)):
        job.out_dir.mkdir()
        (job.out_dir / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "iter": last, "val_loss_full": 2.0}) + "\n")
    assert study.run_state(restored) == "finished" and study.run_state(cut) == "to run"
    result = study.run_job(restored, 1)
    assert result.reused and not (restored.out_dir / "started").exists()
    assert "already finished" in study.job_status_line(result, 1, 1)


def test_a_folder_another_sweep_trains_is_left_to_it(tmp_path: Path, fake_train: Path) -> None:
    (job,) = jobs(tmp_path, 1)
    job.out_dir.mkdir()
    with study.folder_lock(job.out_dir) as held:  # the other sweep
        assert held
        assert study.run_state(job) == "in progress in another sweep"
        result = study.run_job(job, 1)
        assert result.busy and not result.reused and not (job.out_dir / "started").exists()
        assert "in progress in another sweep" in study.job_status_line(result, 1, 1)
    assert study.run_state(job) == "to run"


def test_a_dry_run_writes_nothing_and_says_how_many_runs_and_how_long(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out, data = tmp_path / "out", tmp_path / "no_data"
    assert fair_comparison.main(["--dry_run", "--out_dir", str(out), "--data_dir", str(data), *SMALL]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no data prepared, no folder made
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.endswith("(to run)") for line in lines) == 2
    assert lines[-1].startswith("fair_sweep: 2 runs in the plan now (2 to run); the follow-ups may add up to 4 more (at most 6). Time: about ")
    # --max_iters 50, no finished run to time: the compiled path's fixed part (each block compiled, the
    # default compile_scope), 50 steps, six evaluations (at 0, 10, ..., 50: eval_interval is max_iters // 5)
    # of about 6 steps each and the whole split of about 30.
    fc = fair_comparison
    assert (fc.EVAL_STEPS, fc.FULL_EVAL_STEPS) == (6, 30)
    steps = (50 + 6 * 6 + 30) * fc.SECONDS_PER_STEP[True]
    per_run = fc.RUN_FIXED_SECONDS["compiled_blocks"] + steps
    assert f"about {per_run:.0f} s for the 2 to run or resume" in lines[-1]
    assert lines[-1].endswith(f"at 2 at a time (about {per_run:.0f} s a run, estimated).")
    # Twice the width, about twice the time (12 x 128 runs took about 2.2x the 12 x 64 ones).
    assert fc.main(["--dry_run", "--out_dir", str(out), "--data_dir", str(data), *SMALL, "--n_embd=128"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"(about {per_run + steps:.0f} s a run, estimated).")
    # Twice the iterations: twice the steps and evaluations (eval_interval doubles too), the same whole split.
    assert fc.main(["--dry_run", "--out_dir", str(out), "--data_dir", str(data), *SMALL, "--max_iters=100"]) == 0
    longer = fc.RUN_FIXED_SECONDS["compiled_blocks"] + (100 + 6 * 6 + 30) * fc.SECONDS_PER_STEP[True]
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"(about {longer:.0f} s a run, estimated).")
    # The eager path: no compile, a slower step.
    assert fc.main(["--dry_run", "--out_dir", str(out), "--data_dir", str(data), *SMALL, "--compile=false"]) == 0
    eager = fc.RUN_FIXED_SECONDS["eager"] + (50 + 6 * 6 + 30) * fc.SECONDS_PER_STEP[False]
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"(about {eager:.0f} s a run, estimated).")
    # The whole model compiled as one graph: a compile that grows with depth (SMALL is 12 layers: 1x; 36: 3x).
    for layers in (12, 36):
        assert fc.main(["--dry_run", "--out_dir", str(out), "--data_dir", str(data), *SMALL, "--compile_scope=model",
                        f"--n_layer={layers}"]) == 0
        whole = 40.0 * layers / 12 + (50 + 6 * 6 + 30) * fc.SECONDS_PER_STEP[True] * layers / 12
        assert capsys.readouterr().out.splitlines()[-1].endswith(f"(about {whole:.0f} s a run, estimated).")


# A dry run only looks, so a folder it cannot make (proc) is found when the sweep runs.
@pytest.mark.parametrize("kind,dry_run", [("file", False), ("under-a-file", False), ("proc", False), ("file", True), ("under-a-file", True)])
def test_an_out_dir_that_cannot_hold_the_runs_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, kind: str, dry_run: bool) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    out = {"file": a_file, "under-a-file": a_file / "out", "proc": Path("/proc/spheretnorm-test/out")}[kind]
    argv = ["--out_dir", str(out), "--data_dir", str(tmp_path / "no_data"), *SMALL, *(["--dry_run"] if dry_run else [])]
    assert fair_comparison.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --out_dir") and str(out) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def write_play(path: Path, words: tuple[str, ...]) -> Path:
    """A made-up play long enough to prepare as characters, its text set by `words`."""
    path.write_text("\n".join(f"{who}: the {what} is near." for who in ("ANN", "BEN") for what in words) * 60, encoding="utf-8")
    return path


def folder_state(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Each file of a folder: its bytes and its mtime in nanoseconds."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def test_a_dry_run_with_another_input_leaves_the_prepared_data_and_says_it_would_prepare(tmp_path: Path,
                                                                                          capsys: pytest.CaptureFixture) -> None:
    # A dry run whose --input differed from the text data_dir was prepared from prepared it afresh.
    data = tmp_path / "data"
    study.ensure_data(data, str(write_play(tmp_path / "first.txt", ("sea", "king"))))
    before = folder_state(data)
    other = write_play(tmp_path / "second.txt", ("rain", "ring"))
    capsys.readouterr()
    assert fair_comparison.main(["--dry_run", "--out_dir", str(tmp_path / "out"), "--data_dir", str(data), "--input", str(other), *SMALL]) == 0
    assert folder_state(data) == before
    assert not (tmp_path / "out").exists()
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    assert notes == [f"note: {data} holds shakespeare_char not prepared from the characters of --input {other}; the sweep would "
                     "prepare them there afresh first, replacing its files (a dry run writes nothing)"]
    # The --input it was prepared from: kept, so no such note.
    assert fair_comparison.main(["--dry_run", "--out_dir", str(tmp_path / "out"), "--data_dir", str(data), "--input", str(tmp_path / "first.txt"),
                                 *SMALL]) == 0
    assert not any(line.startswith("note: ") and "prepare" in line for line in capsys.readouterr().out.splitlines())


def test_a_data_dir_that_cannot_be_written_is_one_line_naming_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture) -> None:
    # The study said "choose a writable --out_dir", data/prepare.py's option, for its --data_dir.
    from spheretnorm.data import pipeline

    data, play = tmp_path / "data", write_play(tmp_path / "play.txt", ("sea", "king"))
    data.mkdir()
    data.chmod(0o555)
    try:
        if os.access(data, os.W_OK):  # root writes anyway: the prepared files' first write is refused instead
            def refuse(path: object, *args: object, **kwargs: object) -> object:
                if Path(str(path)).parent == data:
                    raise PermissionError(13, "Permission denied", str(path))
                return open(path, *args, **kwargs)

            monkeypatch.setattr(pipeline, "open", refuse, raising=False)
        assert fair_comparison.main(["--out_dir", str(tmp_path / "out"), "--data_dir", str(data), "--input", str(play), *SMALL]) == 2
    finally:
        data.chmod(0o755)
    err = capsys.readouterr().err
    assert err == f"error: --data_dir {str(data)!r} cannot be written to (Permission denied); give a writable folder.\n"
    assert list(data.iterdir()) == []


def test_a_run_whose_config_is_not_json_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "out" / "gpt2" / "pre_ln" / "lr0.001_s1"
    run.mkdir(parents=True)
    (run / "config.json").write_text('{"n_layer": 12,')
    assert fair_comparison.main(["--dry_run", "--out_dir", str(tmp_path / "out"), "--data_dir", str(tmp_path / "no_data"), *SMALL]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {run / 'config.json'} is not JSON")


def test_a_resumed_runs_time_is_its_whole_time_not_its_last_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stopped by a signal and resumed by the next sweep: the job that finished it ran its
    last part only; train.py's clock (elapsed_s) carries across the resume, so the table's time is the run's."""
    monkeypatch.setattr(sweep_runner, "train_command", lambda job: [sys.executable, "-c", "pass"])
    fresh, stopped = jobs(tmp_path, 2)
    stopped.out_dir.mkdir()
    (stopped.out_dir / "ckpt.pt").write_bytes(b"")  # what the stop left
    first, second = study.run_job(fresh, 1), study.run_job(stopped, 1)
    assert not first.resumed and second.resumed
    final = {"kind": "eval", "iter": 600, "elapsed_s": 400.0, "diag_s": 1.0, "full_eval_s": 20.0}
    assert study.run_seconds(second, final) == 421.0 + study.START_UP_SECONDS  # not the 0.1 s the last job took
    assert study.run_seconds(first, final) == first.seconds  # a run trained start to end in one job: its wall-clock
    assert study.run_seconds(second, None) == second.seconds  # no evaluation row: what was measured


def test_a_finished_runs_time_counts_its_start_up_and_final_evaluation() -> None:
    """A run found finished is timed as a whole (what the dry run's estimate uses): train.py's
    elapsed_s at the last evaluation leaves out the start-up and that evaluation's own work."""
    from spheretnorm.experiments.study import START_UP_SECONDS, finished_run_seconds

    final = {"kind": "eval", "iter": 600, "elapsed_s": 100.0, "eval_s": 0.5, "diag_s": 1.0, "full_eval_s": 9.0}
    assert finished_run_seconds(final) == 110.0 + START_UP_SECONDS
    assert finished_run_seconds({"kind": "eval", "iter": 600, "elapsed_s": 50.0}) == 50.0 + START_UP_SECONDS  # before the whole-split evaluation
    assert finished_run_seconds(None) is None


@pytest.mark.parametrize("content, says", [
    ("[]", "holds a JSON list, not an object of keys"),
    ("{not json", "is not valid JSON"),
    ('{"declared": []}', "holds a declaration that is not an object with a list of rule texts"),
    ('{"declared": {"rules": [5]}}', "holds a declaration that is not an object with a list of rule texts"),
    ('{"declared": {"rules": ["upper<<0"]}}', "declares a rule that cannot be read"),
])
def test_a_record_that_cannot_be_read_is_one_line_and_is_not_rewritten(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                        content: str, says: str) -> None:
    # A damaged record was a traceback (AttributeError, TypeError) or read as none and rewritten
    # without its declared rule (issue 67, item 3).
    out, data = tmp_path / "out", tmp_path / "no_data"
    out.mkdir()
    (out / "fair_sweep.json").write_text(content)
    for mode in (["--dry_run"], ["--table_only"]):
        assert fair_comparison.main([*mode, "--out_dir", str(out), "--data_dir", str(data), *SMALL]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and says in err[0] and "is never rewritten" in err[0], err
        assert (out / "fair_sweep.json").read_text() == content


def test_a_stop_row_without_its_message_is_classified(tmp_path: Path) -> None:
    from spheretnorm.experiments.grid import Run, classify

    run = Run(tmp_path, {"max_iters": 10}, [{"kind": "eval", "iter": 4, "val_loss": 3.0}, {"kind": "stop", "reason": "collapse"}], None)
    assert classify(run, None, 3.3) == ("stopped: collapse", "stopped (collapse)")


@pytest.mark.parametrize("grids", [["--grid", "pre_ln+adamw=1e-3", "--grid", "pre_ln+adamw=2e-3"],
                                   ["--optimizers", "muon", "--grid", "muon=0.01", "--grid", "muon=0.02"]])
def test_a_grid_given_twice_is_refused_not_replaced(tmp_path: Path, capsys: pytest.CaptureFixture, grids: list[str]) -> None:
    # The later --grid silently replaced the earlier one (issue 67, item 8).
    assert fair_comparison.main(["--dry_run", "--out_dir", str(tmp_path / "out"), "--data_dir", str(tmp_path / "d"), *SMALL, *grids]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is given twice" in err[0], err


def test_a_progress_line_comes_while_runs_go_on_and_none_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture) -> None:
    # Nothing was printed for minutes while runs went on (issue 66, item 3).
    script = tmp_path / "slow_train.py"
    script.write_text("import json, pathlib, sys, time\nout = pathlib.Path(sys.argv[1])\n"
                      "(out / 'metrics.jsonl').write_text(json.dumps({'kind': 'train', 'iter': 7}) + '\\n')\ntime.sleep(1.5)\n")
    monkeypatch.setattr(sweep_runner, "train_command", lambda job: [sys.executable, str(script), str(job.out_dir)])
    monkeypatch.setattr(sweep_runner, "PROGRESS_EVERY_S", 0.4)
    queue = jobs(tmp_path, 2)
    study.schedule(lambda free: [queue.pop(0) for _ in range(min(free, len(queue)))], lambda result: None, 1, 1, lambda: len(queue))
    out = capsys.readouterr().out.splitlines()
    first = [line for line in out if line.startswith("sweep: 0 runs ended, 1 running (run0 ")]
    assert first and "1 waiting; no run has ended here yet" in first[0], out
    later = [line for line in out if line.startswith("sweep: 1 run ended, 1 running (run1 at 7 of 10)")]
    assert later and "0 waiting; about 0 min left at 1 at a time (the mean of 1 run here)" in later[0], out
