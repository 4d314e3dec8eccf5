"""Which checkpoint of a run folder a resume and every reader takes (issue 48, points 2 and 3):
one rule, by iteration, stated in the one line that names the file taken; equal iterations take
the healthy ckpt.pt; a stop's file claiming an iteration past max_iters, or damaged, is not taken,
and the line says so. In-process: one training run, then copies of its checkpoint.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import sample
import train
from spheretnorm.runtime.checkpoint import atomic_torch_save, read_torch_file, resolve_checkpoint, resume_checkpoint
from spheretnorm.runtime.config import ConfigError, parse_config
from test_train import data_dir, tiny_args  # noqa: F401 (data_dir: a fixture)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:  # noqa: F811
    """A run folder whose ckpt.pt holds iter 4 (max_iters=4)."""
    out = tmp_path_factory.mktemp("run")
    train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=4"))
    return out


def run_with_stop(trained: Path, tmp_path: Path, stop_iter: int) -> Path:
    """A copy of the run with a ckpt.stop.pt beside its ckpt.pt: a copy of it claiming `stop_iter`."""
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    atomic_torch_save({**read_torch_file(out / "ckpt.pt"), "iter_num": stop_iter}, out / "ckpt.stop.pt")
    return out


def choice(data_dir: Path, out: Path, *extra: str) -> tuple[Path, str | None]:  # noqa: F811
    return resume_checkpoint(parse_config(tiny_args(data_dir, out, "--init_from=resume", *extra)).train)


def test_a_stale_stop_checkpoint_loses_the_resume_that_the_line_announces(
    trained: Path, tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture  # noqa: F811
) -> None:
    out = run_with_stop(trained, tmp_path, 2)
    capsys.readouterr()
    train.main(tiny_args(data_dir, out, "--init_from=resume", "--max_iters=5", "--eval_interval=5"))
    printed = capsys.readouterr().out
    assert f"holds ckpt.pt (iter 4) and ckpt.stop.pt (iter 2); ckpt.pt is the newer; resuming from {out / 'ckpt.pt'}." in printed
    assert "resumed from iter 4" in printed and read_torch_file(out / "ckpt.pt")["iter_num"] == 5


@pytest.mark.parametrize("stop_iter, taken, said", [
    (4, "ckpt.pt", "holds ckpt.pt (iter 4) and ckpt.stop.pt (iter 4), the same iteration; ckpt.pt is taken"),
    (10**9, "ckpt.pt", "holds ckpt.pt (iter 4); ckpt.stop.pt claims iter 1000000000, past the run's max_iters=4, so it is not taken"),
    (3, "ckpt.pt", "holds ckpt.pt (iter 4) and ckpt.stop.pt (iter 3); ckpt.pt is the newer"),
])
def test_every_reader_and_the_resume_take_the_same_file_by_one_rule(
    stop_iter: int, taken: str, said: str, trained: Path, tmp_path: Path, data_dir: Path  # noqa: F811
) -> None:
    out = run_with_stop(trained, tmp_path, stop_iter)
    assert resolve_checkpoint(out) == (out / taken, said)
    path, line = choice(data_dir, out, "--max_iters=4")
    assert path == out / taken and line == f"NOTE: out_dir {str(out)!r} {said}; resuming from {out / taken}."
    path, line = choice(data_dir, out, "--max_iters=4", "--eval_only=true")
    assert path == out / taken and line.endswith(f"; evaluating {out / taken}.")


def test_a_newer_stop_checkpoint_is_taken_and_named(trained: Path, tmp_path: Path, data_dir: Path) -> None:  # noqa: F811
    out = run_with_stop(trained, tmp_path, 6)
    path, line = choice(data_dir, out, "--max_iters=8")
    assert path == out / "ckpt.stop.pt" and f"ckpt.stop.pt is the newer; resuming from {path}, a stop's state" in line
    assert "Delete ckpt.stop.pt to resume from ckpt.pt instead." in line


def damage(out: Path, kind: str) -> None:
    """A stop's checkpoint beside the good ckpt.pt, damaged as `kind` says."""
    stop = out / "ckpt.stop.pt"
    if kind == "truncated":
        stop.write_bytes((out / "ckpt.pt").read_bytes()[:300])
    elif kind == "empty":
        stop.write_bytes(b"")
    elif kind == "random":
        stop.write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)).numpy().tobytes())
    elif kind == "no-iteration":
        ckpt = read_torch_file(out / "ckpt.pt")
        del ckpt["iter_num"]
        atomic_torch_save(ckpt, stop)
    elif kind == "a-folder":
        stop.mkdir()
    elif kind == "dcp-without-meta":
        (out / "ckpt.stop.dcp").mkdir()
        (out / "ckpt.stop.dcp" / ".metadata").write_bytes(b"")


@pytest.mark.parametrize("kind", ["truncated", "empty", "random", "no-iteration", "a-folder", "dcp-without-meta"])
def test_a_damaged_stop_file_leaves_the_good_checkpoint_readable_and_is_named(
    kind: str, trained: Path, tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture  # noqa: F811
) -> None:
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    damage(out, kind)
    stop_name = "ckpt.stop.dcp" if kind == "dcp-without-meta" else "ckpt.stop.pt"
    chosen, why = resolve_checkpoint(out)
    assert chosen == out / "ckpt.pt" and why.startswith(f"holds ckpt.pt (iter 4); {stop_name} beside it is damaged (") and why.endswith("), so it is not taken")
    capsys.readouterr()
    assert sample.checkpoint_file(out) == out / "ckpt.pt"
    assert capsys.readouterr().err == f"sample.py: {str(out)!r} {why}; sampling from {out / 'ckpt.pt'}\n"
    path, line = choice(data_dir, out, "--max_iters=4")
    assert path == out / "ckpt.pt" and f"{stop_name} beside it is damaged" in line and "\n" not in line


def test_a_damaged_stop_file_alone_is_no_checkpoint_to_resume(trained: Path, tmp_path: Path, data_dir: Path) -> None:  # noqa: F811
    out = tmp_path / "run"
    out.mkdir()
    (out / "ckpt.stop.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"has no checkpoint to resume: ckpt\.stop\.pt beside it is damaged \("):
        choice(data_dir, out, "--max_iters=4")
