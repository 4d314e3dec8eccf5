"""The ETA of train.py's console line (tracking.Progress), on a fake clock.

A session's first steps compile and its first evaluation compiles the eval graphs: the ETA
must come from the steady steps and evaluations alone, not from the wall time since the
start. The loop below calls RunLog as train.py's loop does (a step timer that leaves
evaluations out, log_train every log_interval steps, log_eval after each evaluation) while
a fake clock stands in for time.time, so no test waits for anything.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spheretnorm.runtime import tracking
from spheretnorm.runtime.config import TrainConfig
from spheretnorm.runtime.tracking import Progress, RunLog, evaluations_left


class FakeClock:
    """time.time for tracking.py: advances only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def eval_row(iter_num: int, seconds: float) -> dict:
    return {"kind": "eval", "iter": iter_num, "train_eval_loss": 2.0, "val_loss": 2.1, "val_ppl": 8.2, "eval_s": seconds}


def simulate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture, *, until: int,
             compile_s: float = 40.0, step_s: float = 1.0, first_eval_s: float = 30.0, eval_s: float = 5.0) -> dict[int, str]:
    """Train to iter `until` of 1000 (eval every 100, log every 10); the ETA printed at each log line."""
    clock = FakeClock()
    monkeypatch.setattr(tracking, "time", clock)
    cfg = TrainConfig(max_iters=1000, eval_interval=100, log_interval=10)
    progress = Progress(tmp_path / "ckpt.pt", tokens_per_step=100)
    log = RunLog(cfg, True, progress)  # never opened: prints, writes no file
    progress.start()
    clock.advance(first_eval_s)  # the evaluation at iter 0 compiles the forward
    log.log_eval(eval_row(0, first_eval_s))
    window = 0.0
    while progress.iter_num < until:
        seconds = compile_s if progress.iter_num == 0 else step_s  # the first step compiles
        clock.advance(seconds)
        window += seconds
        progress.iter_num += 1
        progress.recent_losses.append(2.0)
        if progress.iter_num % cfg.log_interval == 0:
            log.log_train(2.0, 0.5, 1e-3, window / cfg.log_interval, None)
            window = 0.0
        if progress.iter_num % cfg.eval_interval == 0:
            clock.advance(eval_s)
            log.log_eval(eval_row(progress.iter_num, eval_s))
    out = capsys.readouterr().out
    return {int(m[1]): m[2] for m in re.finditer(r"^iter (\d+)/1000 .*\| ETA (\S+)$", out, re.M)}


def test_eta_counts_steady_steps_and_evaluations_only(monkeypatch, tmp_path, capsys) -> None:
    etas = simulate(monkeypatch, tmp_path, capsys, until=210)
    # At iter 210: 790 steps of 1 s, and the 8 evaluations left (300, ..., 1000) of 5 s each.
    # The compile (40 s) and the first evaluation (30 s) are not the pace: the elapsed-time
    # ETA would say 289 s / 210 iters * 790 = 18m07s.
    assert etas[210] == "13m50s"
    # Before a steady evaluation is measured (only the first one, at iter 0): steps only.
    assert etas[20] == "16m20s"  # 980 s: the window of iters 11-20 is steady, 1-10 (compile) is not


def test_eta_before_any_steady_step_uses_the_steps_so_far(monkeypatch, tmp_path, capsys) -> None:
    """The first window holds the compile; with nothing else to go on, it sets the pace (no evaluation in it)."""
    etas = simulate(monkeypatch, tmp_path, capsys, until=10)
    assert etas[10] == "1h20m"  # (40 + 9) / 10 s per step * 990 steps = 4851 s


def test_evaluations_left() -> None:
    assert evaluations_left(210, 1000, 100) == 8
    assert evaluations_left(200, 1000, 100) == 8  # the one at 200 is done
    assert evaluations_left(950, 1010, 100) == 2  # 1000 and the final one at 1010
    assert evaluations_left(1000, 1000, 100) == 0
    assert evaluations_left(0, 1000, 0) == 0
