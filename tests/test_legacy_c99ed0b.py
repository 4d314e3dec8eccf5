"""A sharded checkpoint of commit c99ed0b, from before optimizer groups had a peak_lr, still resumes.

tests/data/legacy_c99ed0b/run/ is the run folder (ckpt.dcp at iteration 4, config.json,
metrics.jsonl) of a 2-rank --parallel=fsdp run of commit c99ed0b, the last commit before issue 47
stamped each optimizer group's peak rate as "peak_lr"; expected.json holds the losses of iterations
5 to 7 that the old code itself logged when it resumed that folder on 2 ranks and on 1 process
(make_fixtures.py wrote both and says how it was run). Today's code resumes the folder as it did,
the missing group key filled with the group's rate as built.

Tolerance: the losses are float32 values near 3.8, whose spacing there is 2.4e-7. The old code and
today's run the same float32 operations in the same order on the same torch, so today they match
bit for bit; abs=1e-6 (4 spacings) leaves room for a later change of summation order, while a
resume that lost the optimizer state or trained at another rate moves them by 1e-3 or more.
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spheretnorm.runtime.checkpoint import CheckpointError
from test_fsdp import ENV, TORCHRUN, check
from test_train import REPO, data_dir, train_losses  # noqa: F401 (data_dir: a fixture)

HERE = Path(__file__).resolve().parent / "data" / "legacy_c99ed0b"
EXPECTED = json.loads((HERE / "expected.json").read_text())
LOSS_TOLERANCE = 1e-6  # see the module's docstring

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run faster on one thread


@pytest.fixture
def old_run(tmp_path: Path) -> Path:
    """A copy of the old run folder (a resume writes into it)."""
    return Path(shutil.copytree(HERE / EXPECTED["folder"], tmp_path / "run"))


def resume_command(nproc: int, data_dir: Path, out_dir: Path) -> list[str]:
    launcher = [*TORCHRUN, f"--nproc_per_node={nproc}"] if nproc > 1 else [sys.executable]
    return [*launcher, "train.py", *EXPECTED["train_args"], f"--data_dir={data_dir}", f"--out_dir={out_dir}", *EXPECTED["resume_args"]]


def val_losses(out_dir: Path) -> dict[int, float]:
    rows = map(json.loads, (out_dir / "metrics.jsonl").read_text().splitlines())
    return {row["iter"]: row["val_loss"] for row in rows if row["kind"] == "eval"}


def test_the_fixture_lacks_peak_lr_and_is_a_two_rank_save() -> None:
    """What the test below stands on: the folder holds no peak_lr, and two ranks wrote it."""
    index = (HERE / EXPECTED["folder"] / "ckpt.dcp" / ".metadata").read_bytes()
    assert b"param_groups.0.lr" in index and b"peak_lr" not in index
    assert EXPECTED["saved_by_processes"] == 2 and EXPECTED["resume_matches_straight_run"]


@pytest.mark.parametrize("nproc", [1, 2])
def test_an_old_sharded_checkpoint_resumes_with_the_old_codes_losses(old_run: Path, data_dir: Path, nproc: int) -> None:
    # The old code's losses were made with the fused maths in eager ops (make_fixtures.py): the same
    # path here (test_fsdp's ENV predates conftest's setting), which also keeps inductor, and the
    # exit-time abort a compile thread once caused in a gloo rank, out of the subprocesses.
    env = {**ENV, "SPHERETNORM_EAGER_KERNELS": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(resume_command(nproc, data_dir, old_run), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    check(result)
    assert f"resumed from iter {EXPECTED['saved_at']}" in result.stdout
    want = EXPECTED["resumed"][str(nproc)]
    got = train_losses(old_run)
    for it, loss in want["train_loss"].items():
        assert got[int(it)] == pytest.approx(loss, abs=LOSS_TOLERANCE), (it, nproc)
    for it, loss in want["val_loss"].items():
        assert val_losses(old_run)[int(it)] == pytest.approx(loss, abs=LOSS_TOLERANCE), (it, nproc)


def whole_model_and_optimizer(folder: Path):
    """The folder's model and an optimizer built from its train_config, as consolidation builds them."""
    from spheretnorm.optim import build_optimizer
    from spheretnorm.runtime.config import optimizer_settings
    from spheretnorm.runtime.checkpoint import load_checkpoint, load_model

    ckpt = load_checkpoint(folder, require=("optimizer", "train_config"))
    model = load_model(ckpt)
    return model, build_optimizer(model, optimizer_settings(ckpt["train_config"]))


def test_the_missing_peak_rate_is_the_groups_rate_as_built(old_run: Path) -> None:
    """Read whole (scripts/consolidate.py's path, which re-applies no settings after the load), each
    group's peak_lr is the run's learning_rate (AdamW without μP: every group's peak), while the
    rest of the group is the folder's (its rate at iteration 4, a step of the warm-up and decay)."""
    from spheretnorm.runtime.checkpoint import load_sharded

    model, optimizer = whole_model_and_optimizer(old_run / "ckpt.dcp")
    load_sharded(old_run / "ckpt.dcp", model, optimizer)
    learning_rate = float(next(a for a in EXPECTED["train_args"] if a.startswith("--learning_rate=")).partition("=")[2])
    assert [g["peak_lr"] for g in optimizer.param_groups] == [learning_rate] * 2
    assert all(g["lr"] != learning_rate for g in optimizer.param_groups)  # not rebuilt: loaded


def drop_from_index(folder: Path, key: str) -> None:
    """Remove one entry from the folder's DCP index (.metadata), as if the save had not written it."""
    path = folder / ".metadata"
    index = pickle.loads(path.read_bytes())
    del index.state_dict_metadata[key]
    path.write_bytes(pickle.dumps(index))


def test_any_other_missing_group_key_is_still_refused(old_run: Path) -> None:
    from spheretnorm.runtime.checkpoint import load_sharded

    folder = old_run / "ckpt.dcp"
    drop_from_index(folder, "optimizer.param_groups.1.eps")
    model, optimizer = whole_model_and_optimizer(folder)
    with pytest.raises(CheckpointError, match=r"damaged or not of this model .*optimizer\.param_groups\.1\.eps"):
        load_sharded(folder, model, optimizer)
