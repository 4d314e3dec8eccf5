"""What commit 3ab3f93 wrote still loads, and computes what it computed then.

tests/data/legacy_3ab3f93/ holds, for every connection in both blocks, a checkpoint that the
train.py of commit 3ab3f93 wrote at iteration 2 (optimizer state included), and three Hugging
Face folders its scripts/export_hf.py wrote (gpt2 pre_ln as a plain GPT2LMHeadModel, gpt2
p_spheret and llama ngpt with their own code). The folders' byte-identical files (tokenizer,
generation config, the model code) are stored once, in hf-shared/; hf-shared/folders.json
names the files each folder had, and the `exported` fixture puts each folder back together. expected.json and logits.pt hold what the old
code computed from them: the losses of resuming each checkpoint to iteration 4, the logits on
a fixed input (also with every matrix scaled by 10, where the sphere connections differ; see
make_fixtures.py, which wrote these files and says how it was run), sample.py's output, and,
for the folders, the logits transformers gives and the val loss of train.py --init_from=hf:DIR.

The pairs come from expected.json, not from today's registry: a connection dropped since is a
failure here, not a silently shorter list. This file imports only the stable entry points
(train, sample, markov_data) and two loaders, wherever the package keeps them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

# No network: transformers must not try the hub (set before it is imported).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

import sample
import train
from markov_data import write_markov_data

HERE = Path(__file__).resolve().parent / "data" / "legacy_3ab3f93"
EXPECTED = json.loads((HERE / "expected.json").read_text())
LOGITS: dict[str, torch.Tensor] = torch.load(HERE / EXPECTED["logits_file"], map_location="cpu", weights_only=True)
INPUT_IDS = torch.tensor(EXPECTED["input_ids"])
PAIRS = list(EXPECTED["pairs"])
EXPORTS = list(EXPECTED["exports"])

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run faster on one thread


def load_model(path):
    try:
        from spheretnorm.runtime.checkpoint import load_model as new_load  # the layout after the restructuring
    except ImportError:
        from spheretnorm.model import GPT

        return GPT.from_checkpoint(path)
    return new_load(path)


def load_folder_model(folder):
    from spheretnorm.hf.folder import load_folder_model as load  # keeps this name

    return load(folder)


SHARED = HERE / "hf-shared"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{folder name: the folder as export_hf.py wrote it}: its own files and its shared ones."""
    shared = json.loads((SHARED / "folders.json").read_text())
    root = tmp_path_factory.mktemp("exports")
    folders = {}
    for name in EXPORTS:
        folder = EXPECTED["exports"][name]["folder"]
        folders[name] = Path(shutil.copytree(HERE / folder, root / folder))
        for file in shared[folder]:
            shutil.copy2(SHARED / file, folders[name] / file)
    return folders


def registered_connections() -> set[str] | None:
    """The names in today's registry, or None where it cannot be imported from spheretnorm.model."""
    try:
        from spheretnorm.model import CONNECTIONS
    except ImportError:
        return None
    return set(CONNECTIONS)


def scaled(model: torch.nn.Module, factor: float = EXPECTED["scale"]) -> torch.nn.Module:
    """As make_fixtures.py: every parameter of 2 or more dimensions multiplied by factor, in place."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(factor)
    return model


def logits_of(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out = model(INPUT_IDS)
    return out[0] if isinstance(out, tuple) else out.logits


def assert_logits(got: torch.Tensor, key: str) -> None:
    torch.testing.assert_close(got, LOGITS[key], atol=1e-5, rtol=0, msg=lambda m: f"{key}: {m}")


def read_metrics(out_dir: Path, kind: str, field: str) -> dict[str, float]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {str(r["iter"]): r[field] for r in rows if r["kind"] == kind}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The token stream the checkpoints were trained on (with a character per token, for sample.py)."""
    return write_markov_data(tmp_path_factory.mktemp("legacy_data"), with_vocabulary=True)


# -----------------------------------------------------------------------------
# The fixtures themselves


def test_the_fixtures_cover_every_connection_in_both_blocks() -> None:
    recorded = {(p["connection"], p["block"]) for p in EXPECTED["pairs"].values()}
    assert recorded == {(c, b) for c in EXPECTED["connections"] for b in EXPECTED["blocks"]}
    assert len(PAIRS) == 22 and set(EXPECTED["blocks"]) == {"gpt2", "llama"}
    assert set(LOGITS) == {*PAIRS, *EXPORTS} | {f"{k}/scaled" for k in (*PAIRS, *EXPORTS)}


def test_every_recorded_connection_is_still_registered() -> None:
    registry = registered_connections()
    if registry is not None:
        missing = [c for c in EXPECTED["connections"] if c not in registry]
        assert not missing, f"connections of 3ab3f93 no longer registered: {missing}"
    for name in PAIRS:  # wherever the registry lives: a model of each connection is built
        pair = EXPECTED["pairs"][name]
        config = load_model(HERE / pair["checkpoint"]).config
        assert (config.connection, config.block) == (pair["connection"], pair["block"]), name


# -----------------------------------------------------------------------------
# Checkpoints of every connection in both blocks


@pytest.mark.parametrize("name", PAIRS)
def test_checkpoint_gives_the_recorded_logits(name: str) -> None:
    pair = EXPECTED["pairs"][name]
    model = load_model(HERE / pair["checkpoint"]).eval()
    assert (model.config.connection, model.config.block) == (pair["connection"], pair["block"])
    assert_logits(logits_of(model), name)
    assert_logits(logits_of(scaled(model)), f"{name}/scaled")


@pytest.mark.parametrize("name", PAIRS)
def test_resuming_gives_the_recorded_losses(name: str, data_dir: Path, tmp_path: Path) -> None:
    pair = EXPECTED["pairs"][name]
    shutil.copy(HERE / pair["checkpoint"], tmp_path / "ckpt.pt")
    train.main([*pair["train_args"], f"--data_dir={data_dir}", f"--out_dir={tmp_path}", *EXPECTED["resume_args"]])
    losses = read_metrics(tmp_path, "train", "train_loss")
    assert sorted(losses) == sorted(pair["train_loss"]) == ["3", "4"], losses
    for it, want in pair["train_loss"].items():
        assert math.isfinite(losses[it]) and losses[it] == pytest.approx(want, abs=1e-6), (name, it)
    val = read_metrics(tmp_path, "eval", "val_loss")
    assert val["4"] == pytest.approx(pair["val_loss"]["4"], abs=1e-6), name


@pytest.mark.parametrize("name", PAIRS)
def test_sample_py_prints_the_recorded_text(name: str, capsys: pytest.CaptureFixture) -> None:
    pair = EXPECTED["pairs"][name]
    capsys.readouterr()
    sample.main([str(HERE / pair["checkpoint"]), *EXPECTED["sample_args"]])
    assert capsys.readouterr().out == pair["sample_stdout"]


# -----------------------------------------------------------------------------
# Exported Hugging Face folders


@pytest.mark.parametrize("name", EXPORTS)
def test_transformers_loads_the_exported_folder(name: str, exported: dict[str, Path]) -> None:
    transformers = pytest.importorskip("transformers")
    export = EXPECTED["exports"][name]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(exported[name]), trust_remote_code=True).eval()
    assert type(hf).__name__ == export["hf_class"]
    assert_logits(logits_of(hf), name)
    assert_logits(logits_of(scaled(hf)), f"{name}/scaled")


@pytest.mark.parametrize("name", EXPORTS)
def test_the_folder_loads_back_as_our_model(name: str, exported: dict[str, Path]) -> None:
    export = EXPECTED["exports"][name]
    model = load_folder_model(exported[name]).eval()
    assert (model.config.connection, model.config.block) == (export["connection"], export["block"])
    assert_logits(logits_of(model), name)  # the old code's folder, our model: the same logits
    assert_logits(logits_of(scaled(model)), f"{name}/scaled")


@pytest.mark.parametrize("name", EXPORTS)
def test_train_py_init_from_the_folder_evaluates_as_before(name: str, exported: dict[str, Path], data_dir: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    export = EXPECTED["exports"][name]
    capsys.readouterr()
    train.main([f"--init_from=hf:{exported[name]}", f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'run'}",
                *export["eval_only_args"]])  # fmt: skip
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert rows, "train.py --eval_only printed no result row"
    assert rows[-1]["val_loss"] == pytest.approx(export["eval_only_val_loss"], abs=1e-6)
    assert rows[-1]["train_eval_loss"] == pytest.approx(export["eval_only_train_eval_loss"], abs=1e-6)
