"""Faults on the training path: pre-emption under torchrun, stuck peers, stops at any moment,
full disks, bad out_dirs, replaced runs, eval_only, broken config files.

The torchrun cases run two CPU ranks (gloo) of a tiny model, as a cluster job would, and check
what a user relies on: a checkpoint that loads, no worker left running, and a resume that
continues exactly as an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import train
from spheretnorm.runtime import run_folder
from spheretnorm.runtime.config import ConfigError
from spheretnorm.runtime.checkpoint import load_checkpoint
from spheretnorm.runtime.stopping import StartupStopped, StopSignal
from test_train import REPO, SUBPROCESS_ENV, data_dir, read_metrics, tiny_args, train_losses  # noqa: F401 (data_dir: a fixture)

STOP_WITHIN_S = 30  # the bound for a stop at any moment
MAX_ITERS = 400  # far more than a test waits for: every run here is stopped


def torchrun_cmd(data_dir: Path, out: Path, *extra: str) -> list[str]:
    args = tiny_args(data_dir, out, f"--max_iters={MAX_ITERS}", "--eval_interval=200", "--backend=gloo", *extra)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", *args]


def start(cmd: list[str]) -> subprocess.Popen:
    # Its own session: the test signals torchrun alone, as a scheduler does, never its workers too.
    return subprocess.Popen(cmd, cwd=REPO, env=SUBPROCESS_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_for_line(proc: subprocess.Popen, prefix: str, timeout_s: float = 240) -> list[str]:
    """Read the output up to a line starting with prefix (the run has reached that point)."""
    lines, deadline = [], time.time() + timeout_s
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return lines
        assert time.time() < deadline, "".join(lines[-20:])
    raise AssertionError(f"the run ended before {prefix!r}:\n" + "".join(lines[-30:]))


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def rank_pid(pids: list[int], rank: int) -> int:
    """The worker of that rank (torchrun starts them in no order that pgrep keeps)."""
    for pid in pids:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in env:
            return pid
    raise AssertionError(f"no worker of rank {rank} among {pids}")


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_all_gone(pids: list[int], timeout_s: float) -> None:
    """Every pid gone within timeout_s; survivors are killed (so no test leaves one) and reported."""
    deadline = time.time() + timeout_s
    while any(running(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    survivors = [p for p in pids if running(p)]
    for p in survivors:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    assert not survivors, f"processes {survivors} still ran {timeout_s} s after the stop"


@pytest.fixture(scope="module")
def reference(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """Train losses of an uninterrupted two-rank run, the yardstick of every resume."""
    out = tmp_path_factory.mktemp("reference")
    result = subprocess.run(torchrun_cmd(data_dir, out, "--max_iters=60"), cwd=REPO, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return train_losses(out)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGKILL])
def test_a_signal_to_torchrun_stops_every_worker_with_a_checkpoint(sig: signal.Signals, data_dir: Path, tmp_path: Path, reference: dict[int, float]) -> None:
    proc = start(torchrun_cmd(data_dir, tmp_path))
    wait_for_line(proc, "iter 20/")
    workers = children(proc.pid)
    assert len(workers) == 2, workers
    os.kill(proc.pid, sig)
    out, _ = proc.communicate(timeout=STOP_WITHIN_S + 10)
    wait_all_gone(workers, STOP_WITHIN_S)
    # SIGTERM: torchrun forwards it; SIGUSR1 and SIGKILL end torchrun itself, and the workers
    # notice their launcher is gone.
    ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    stop = read_metrics(tmp_path, "stop")[-1]
    assert stop["reason"] == "signal" and stop["exit_code"] == 0 and stop["checkpoint_iter"] == ckpt["iter_num"] >= 20
    if sig == signal.SIGTERM:  # rank 0's last line, before torchrun's own report: the stop was clean, the report expected
        lines = out.splitlines()
        said = next(i for i, line in enumerate(lines) if line.startswith("Stopped by SIGTERM") and "A torchrun report after this line" in line)
        assert str(tmp_path / "ckpt.pt") in lines[said] and "exits with status 0" in lines[said]
        assert not any("SignalException" in line for line in lines[:said]) and any("SignalException" in line for line in lines[said:]), out[-3000:]
    if sig != signal.SIGTERM:
        return  # the checkpoint is a signal's like SIGTERM's: one resume (6 s of torchrun) shows it continues the run
    # The resume continues exactly where the uninterrupted run went.
    result = subprocess.run(torchrun_cmd(data_dir, tmp_path, "--max_iters=60", "--init_from=auto"), cwd=REPO, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    resumed = train_losses(tmp_path)
    for it in range(ckpt["iter_num"] + 1, 61):
        assert resumed[it] == pytest.approx(reference[it], abs=1e-6), it


def test_a_stopped_peer_ends_the_job_within_dist_timeout(data_dir: Path, tmp_path: Path) -> None:
    timeout_s = 5
    proc = start(torchrun_cmd(data_dir, tmp_path, "--checkpoint_interval=10", f"--dist_timeout={timeout_s}"))
    # Iteration 20's checkpoint is written after its log line: freezing rank 1 at that line raced
    # with the save on a busy machine (the stop row then named iteration 10's checkpoint). Rank 0
    # logs iteration 21 only after iteration 20's save.
    wait_for_line(proc, "iter 21/")
    workers = children(proc.pid)
    frozen, reporter = rank_pid(workers, 1), rank_pid(workers, 0)
    os.kill(frozen, signal.SIGSTOP)  # rank 1 freezes, as a hung node would; rank 0 reports
    started = time.time()
    while running(reporter):  # rank 0 stops within dist_timeout (and the time to write its row)
        assert time.time() - started < timeout_s + 60, "rank 0 did not stop"
        time.sleep(0.2)
    # torchrun's SIGTERM to a frozen worker waits for it to run again (else 30 s, then SIGKILL):
    # the hung node coming back ends the job without that wait.
    os.kill(frozen, signal.SIGCONT)
    out, _ = proc.communicate(timeout=90)
    wait_all_gone(workers, 30)
    assert proc.returncode != 0
    assert f"a collective waited longer than dist_timeout={timeout_s} s" in out, out[-3000:]
    assert "pair.cc" not in out, out[-3000:]  # the frozen rank, woken to a gone peer: one line too, no gloo traceback
    stop = read_metrics(tmp_path, "stop")[-1]
    assert stop["reason"] == "peer_timeout" and stop["exit_code"] == 1
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == stop["checkpoint_iter"] >= 20


def test_sigterm_during_a_long_evaluation_stops_at_once(data_dir: Path, tmp_path: Path) -> None:
    args = tiny_args(data_dir, tmp_path, "--max_iters=100", "--eval_interval=10")
    train.main([*args, "--max_iters=10"])  # a checkpoint at iter 10
    proc = start([sys.executable, "train.py", *args, "--init_from=auto", "--eval_iters=100000"])
    wait_for_line(proc, "iter 20/")  # the evaluation of iter 20 starts now, and would take minutes
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGTERM)
    started = time.time()
    out, _ = proc.communicate(timeout=STOP_WITHIN_S)
    assert proc.returncode == 0 and time.time() - started < STOP_WITHIN_S, out[-2000:]
    assert "Stopped by SIGTERM at iter 20" in out
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == 20


def test_a_stop_during_start_up_writes_nothing(data_dir: Path, tmp_path: Path) -> None:
    proc = start([sys.executable, "train.py", *tiny_args(data_dir, tmp_path / "run", "--max_iters=100")])
    # Well inside start-up (importing torch alone takes longer): 1.5 s raced an idle machine's
    # whole start-up (about 1.8 s here), and the stop then came during training.
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=STOP_WITHIN_S)
    # Before train.py installs its handler the default action ends it (-SIGTERM); after, it exits 0.
    assert proc.returncode in (0, -signal.SIGTERM), out[-2000:]
    assert "Traceback" not in out
    assert not (tmp_path / "run" / "ckpt.pt").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_stop_signal_in_start_up_interrupts_at_once_and_one_held_back_stops_training_before_it_begins() -> None:
    # The handler's two start-up paths, in this process and without timing: the one a subprocess
    # test reaches only when its signal lands after train.py installed the handler.
    before = signal.getsignal(signal.SIGTERM)
    with StopSignal() as stop, pytest.raises(StartupStopped, match="SIGTERM"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # not reached: the handler raises at the next bytecode
    with StopSignal() as stop:
        stop.signum = signal.SIGUSR1  # as if it came in a stretch the handler could not interrupt
        with pytest.raises(StartupStopped, match="SIGUSR1"):
            stop.training_started()
    with StopSignal() as stop:
        stop.training_started()
        os.kill(os.getpid(), signal.SIGTERM)  # once training runs, only a flag
        assert stop.requested and stop.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before  # put back


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))


def test_a_full_disk_keeps_the_last_checkpoint(data_dir: Path, tmp_path: Path) -> None:
    """A checkpoint write that fails (a file-size limit stands in for a full disk) is one line; the
    previous checkpoint stays as it was, and no temporary file is left to keep the disk full."""
    args = tiny_args(data_dir, tmp_path, "--eval_interval=2")
    train.main([*args, "--max_iters=2"])
    before = (tmp_path / "ckpt.pt").read_bytes()
    result = subprocess.run([sys.executable, "train.py", *args, "--max_iters=4", "--init_from=auto"], cwd=REPO, env=SUBPROCESS_ENV,
                            capture_output=True, text=True, timeout=300, preexec_fn=_limit_file_size)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: could not write") and str(tmp_path / "ckpt.pt") in last and "(iter 2) is untouched" in last
    assert (tmp_path / "ckpt.pt").read_bytes() == before
    assert not (tmp_path / "ckpt.pt.tmp").exists()


@pytest.mark.parametrize("kind", ["file", "unwritable"])
def test_a_bad_out_dir_is_one_line(data_dir: Path, tmp_path: Path, kind: str) -> None:
    if kind == "file":
        out = tmp_path / "taken"
        out.write_text("not a folder")
        expected = "is a file"
    else:
        out = Path("/proc/spheretnorm-test")  # refused even to root, unlike a chmod
        expected = "cannot be written to"
    result = subprocess.run([sys.executable, "train.py", *tiny_args(data_dir, out, "--max_iters=2")], cwd=REPO, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert expected in result.stderr.strip().splitlines()[-1] and str(out) in result.stderr


def test_overwrite_replaces_the_whole_run(data_dir: Path, tmp_path: Path) -> None:
    """The old checkpoint goes with the old log: a crash before the new run's first save must not
    let init_from=auto resume the replaced run."""
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=4", "--eval_interval=2"))
    with pytest.raises(RuntimeError, match="deliberate crash"):
        train.main(tiny_args(data_dir, tmp_path, "--max_iters=4", "--eval_interval=2", "--overwrite=true", "--debug_crash_at_iter=1"))
    assert not (tmp_path / "ckpt.pt").exists()
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=2", "--eval_interval=2", "--init_from=auto"))
    assert [r["iter"] for r in read_metrics(tmp_path, "train")] == [1, 2]  # a fresh run, nothing mixed in


def test_eval_only_evaluates_the_checkpoint_or_refuses(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(ConfigError, match="eval_only=true evaluates the checkpoint in out_dir, and there is none"):
        train.main(tiny_args(data_dir, tmp_path, "--eval_only=true"))
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=4", "--eval_interval=4"))
    saved = read_metrics(tmp_path, "eval")[-1]["val_loss"]
    capsys.readouterr()
    train.main(tiny_args(data_dir, tmp_path, "--eval_only=true"))  # no init_from: still the checkpoint
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["iter"] == 4 and row["val_loss"] == pytest.approx(saved, abs=1e-6)


def test_a_broken_config_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("n_layer = 2\nlearning_rate = = 3\n")
    result = subprocess.run([sys.executable, "train.py", str(bad)], cwd=REPO, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"Config file '{bad}' is not valid Python (line 2" in result.stderr
    raising = tmp_path / "raising.py"
    raising.write_text("import os\nn_layer = int(os.environ['NO_SUCH_VARIABLE'])\n")
    result = subprocess.run([sys.executable, "train.py", str(raising)], cwd=REPO, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "failed when run (KeyError" in result.stderr


class ReaderGone:
    """A console pipe whose reader (tee) goes away when `gone` is set: every write then fails."""

    def __init__(self) -> None:
        self.gone = False
        self.text: list[str] = []

    def write(self, text: str) -> int:
        if self.gone:
            raise BrokenPipeError(32, "Broken pipe")
        self.text.append(text)
        return len(text)

    def flush(self) -> None:
        if self.gone:
            raise BrokenPipeError(32, "Broken pipe")

    def isatty(self) -> bool:
        return False


def signal_at(step: int, monkeypatch: pytest.MonkeyPatch, console: ReaderGone | None = None, sig: signal.Signals = signal.SIGTERM) -> None:
    """`sig` arrives during optimizer step `step` (and the console's reader goes, as Ctrl-C to
    `train.py | tee` ends tee): set as the handler would, without a real signal's timing."""
    original = train.Trainer.train_step

    def train_step(self: train.Trainer, at: int, stop: train.StopSignal) -> tuple:
        if at == step:
            stop.signum = sig
            if console is not None:
                console.gone = True
        return original(self, at, stop)

    monkeypatch.setattr(train.Trainer, "train_step", train_step)


@pytest.mark.parametrize("parallel, healthy_name, stop_name", [("ddp", "ckpt.pt", "ckpt.stop.pt"), ("fsdp", "ckpt.dcp", "ckpt.stop.dcp")])
def test_a_stop_during_a_collapse_streak_saves_beside_the_healthy_checkpoint(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, parallel: str, healthy_name: str, stop_name: str
) -> None:
    args = tiny_args(data_dir, tmp_path, "--eval_interval=2", f"--parallel={parallel}", "--backend=gloo")
    train.main([*args, "--max_iters=2"])  # the healthy checkpoint, iter 2
    healthy = load_checkpoint(tmp_path / healthy_name)["iter_num"]
    # Every evaluation now raises the alarm (a streak, never long enough to stop); SIGTERM at step 5
    # with stdout's reader gone: the stop is a stop all the same, its state beside the healthy one.
    console = ReaderGone()
    with monkeypatch.context() as patch:
        signal_at(4, patch, console)
        patch.setattr(sys, "stdout", console)
        train.main([*args, "--max_iters=8", "--init_from=auto", "--collapse_cosine=1e-6", "--collapse_evals=100"])
    stop = read_metrics(tmp_path, "stop")[-1]
    assert stop["reason"] == "signal" and stop["checkpoint_iter"] == 5, stop
    assert "checkpoint saved to" in stop["message"] and stop_name in stop["message"]
    assert load_checkpoint(tmp_path / healthy_name)["iter_num"] == healthy == 2
    assert load_checkpoint(tmp_path / stop_name)["iter_num"] == 5
    # A reader given the run folder (sample.py, zero-shot, export) takes the newer state too.
    from spheretnorm.runtime.checkpoint import resolve_checkpoint

    chosen, why = resolve_checkpoint(tmp_path)
    assert chosen.name == stop_name and f"{stop_name} is the newer" in why, why
    # The resume starts from the latest state and says so; its healthy save replaces both.
    capsys.readouterr()
    train.main([*args, "--max_iters=6", "--init_from=auto"])
    out = capsys.readouterr().out
    assert "resumed from iter 5" in out and f"{stop_name} is the newer; resuming from {tmp_path / stop_name}" in out and f"Delete {stop_name} to resume from {healthy_name}" in out, out
    assert load_checkpoint(tmp_path / healthy_name)["iter_num"] == 6 and not (tmp_path / stop_name).exists()


@pytest.mark.parametrize("under_torchrun", [False, True])
def test_a_clean_stop_says_its_checkpoint_and_exit_status_in_the_runs_last_line(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, under_torchrun: bool
) -> None:
    """Ctrl-C during step 3: the run's own last line says the stop was clean, where its checkpoint
    is and the exit status; under torchrun, that the launcher's report after it is expected (issue 66, item 8)."""
    signal_at(2, monkeypatch, sig=signal.SIGINT)
    monkeypatch.setattr(StopSignal, "under_torchrun", property(lambda self: under_torchrun))
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=10", "--eval_interval=100"))
    last = capsys.readouterr().out.splitlines()[-1]
    said = f"Stopped by SIGINT at iter 3; checkpoint saved to {tmp_path / 'ckpt.pt'}. A clean stop: this process exits with status 0; resume with --init_from=auto."
    launcher = " A torchrun report after this line (a SignalException traceback, torchrun's exit status 1) is expected: the launcher got the signal too."
    assert last == said + (launcher if under_torchrun else "")
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == 3
    stop = read_metrics(tmp_path, "stop")[-1]
    assert stop["exit_code"] == 0 and stop["message"] == said.partition(" A clean stop")[0]  # the row keeps the stop's own words


class FillsUp:
    """metrics.jsonl's file on a disk with `room` bytes left: a write past it puts part of its
    data down, then fails as a full disk does."""

    def __init__(self, file: Any, room: int) -> None:
        self.file, self.room = file, room

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            self.file.write(data[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)


def test_a_full_disk_at_the_metrics_log_is_one_line_with_whole_rows(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened = run_folder.MetricsLog.__init__

    def on_a_full_disk(self: run_folder.MetricsLog, path: Path, resume_iter: int | None) -> None:
        opened(self, path, resume_iter)
        self._file = FillsUp(self._file, 3000)  # the iter-0 eval row and a few train rows fit

    monkeypatch.setattr(run_folder.MetricsLog, "__init__", on_a_full_disk)
    with pytest.raises(run_folder.WriteFailed) as stopped:
        train.main(tiny_args(data_dir, tmp_path, "--max_iters=20", "--eval_interval=10"))
    message = str(stopped.value)
    assert message.startswith("No space left on device: " + str(tmp_path / "metrics.jsonl")) and "\n" not in message, message
    text = (tmp_path / "metrics.jsonl").read_text()
    assert text.endswith("\n") and all(json.loads(line) for line in text.splitlines())  # whole rows only
    last = json.loads(text.splitlines()[-1])["iter"]
    saved = load_checkpoint(tmp_path / "ckpt.pt")["iter_num"]
    assert saved == last + 2 and f"checkpoint saved to {tmp_path / 'ckpt.pt'}" in message  # the row after the last fails, the next step stops


GLOO_PEER_KILLED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:11394: "
    "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application."
)


def test_a_lost_peer_is_one_line_naming_the_rank(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gloo's error when the other rank was SIGKILLed (or ended while this one was stopped), as train.py raises it."""
    assert "rank 1 lost its connection to rank 0" in str(run_folder.machine_failure(RuntimeError(GLOO_PEER_KILLED), 5, "kept", rank=1, world_size=2))
    assert "to another rank (at [127.0.0.1]:11394)" in str(run_folder.machine_failure(RuntimeError(GLOO_PEER_KILLED), 5, "kept", rank=0, world_size=4))

    def lost(self: train.Trainer, at: int, stop: train.StopSignal) -> tuple:
        raise RuntimeError(GLOO_PEER_KILLED)

    monkeypatch.setattr(train.Trainer, "train_step", lost)
    with pytest.raises(run_folder.PeerLost) as stopped:
        train.main(tiny_args(data_dir, tmp_path, "--max_iters=4"))
    assert str(stopped.value).startswith("rank 0 lost its connection to another rank (at [127.0.0.1]:11394)")
    assert read_metrics(tmp_path, "stop")[-1]["reason"] == "peer_lost"
