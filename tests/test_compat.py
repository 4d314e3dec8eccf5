"""Behaviour kept across the restructuring: a checkpoint written before it still loads, resumes
and samples exactly as it did, and the same seed still gives the same losses.

tests/data/ckpt_v1/ holds a p_spheret checkpoint (format spheretnorm-ckpt-v1) written by the
code before the package layout (commit 968fab7), with the losses and samples that code
printed (golden.json); tests/markov_data.py rebuilds its token stream.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import train
from markov_data import write_markov_data
from spheretnorm.runtime.checkpoint import CHECKPOINT_FORMAT
from spheretnorm.runtime.checkpoint import load_checkpoint, load_model
from spheretnorm.model import GPT

HERE = Path(__file__).resolve().parent / "data" / "ckpt_v1"
REPO = HERE.parents[2]
GOLDEN = json.loads((HERE / "golden.json").read_text())


@pytest.fixture(scope="module")
def golden_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_markov_data(tmp_path_factory.mktemp("golden") / "data", with_vocabulary=True)


def metrics(out_dir: Path, kind: str, field: str) -> dict[str, float]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {str(r["iter"]): r[field] for r in rows if r["kind"] == kind}


def test_old_checkpoint_loads() -> None:
    ckpt = load_checkpoint(HERE / "p_spheret_iter6.pt")
    assert ckpt["format"] == CHECKPOINT_FORMAT and "connection_params" not in ckpt["model_config"]
    assert ckpt["model_config"]["spheret_p"] == 0.5  # at the top level, as GPTConfig fields were written then
    model = load_model(ckpt)
    # Read into today's form: the connection's parameter in connection_params, the keys of the
    # other connections (dyt_alpha, keel_alpha, peri_embed_ln) left out.
    assert model.config.connection == "p_spheret" and model.config.connection_params == {"spheret_p": 0.5}
    assert model.config.spheret_p == 0.5 and not hasattr(model.config, "dyt_alpha")


def test_same_seed_same_losses(golden_data: Path, tmp_path: Path) -> None:
    train.main([*GOLDEN["train_args"], f"--data_dir={golden_data}", f"--out_dir={tmp_path}", "--max_iters=6"])
    got = metrics(tmp_path, "train", "train_loss")
    want = {k: v for k, v in GOLDEN["train_loss"].items() if int(k) <= 6}
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-6), k


def test_old_checkpoint_resumes_exactly(golden_data: Path, tmp_path: Path) -> None:
    shutil.copy(HERE / "p_spheret_iter6.pt", tmp_path / "ckpt.pt")
    train.main([*GOLDEN["train_args"], f"--data_dir={golden_data}", f"--out_dir={tmp_path}", *GOLDEN["resume_args"]])
    got = metrics(tmp_path, "train", "train_loss")
    for k in ("7", "8", "9", "10"):
        assert got[k] == pytest.approx(GOLDEN["train_loss"][k], abs=1e-6), k
    assert metrics(tmp_path, "eval", "val_loss")["10"] == pytest.approx(GOLDEN["val_loss"]["10"], abs=1e-6)


def test_old_checkpoint_samples_the_same_text() -> None:
    result = subprocess.run(
        [sys.executable, "sample.py", str(HERE / "p_spheret_iter6.pt"), *GOLDEN["sample_args"]],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == GOLDEN["sample_stdout"]
