"""The Hugging Face export of a connection defined outside the package (spheretnorm/hf/folder.py).

Such a connection exports by shipping the file of its module beside model.py, its imports of the
model core made relative: tests/deepnorm_connection.py, whose class reads a module-level constant
through a module-level function, trains, exports and loads with transformers in a process that
cannot import spheretnorm. A module the folder cannot ship (one that imports the training runtime,
say) is refused in one sentence, before any file is written.
"""

from __future__ import annotations

import os

# No network here: transformers must not try the hub (set before it is imported).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import importlib.util
import re
import sys
import types
from pathlib import Path
from typing import Iterator

import pytest
import torch

import deepnorm_connection
import train
from deepnorm_connection import DeepNorm
from markov_data import VOCAB, write_markov_data
from spheretnorm.hf import export_cli
from spheretnorm.hf import folder as hf_folder
from spheretnorm.hf.folder import HFFolderError, export_hf
from spheretnorm.model import CONNECTIONS, GPT, GPTConfig, register_connection
from spheretnorm.runtime.checkpoint import checkpoint_state
from spheretnorm.runtime.checkpoint import load_checkpoint, load_model
from test_export_hf import logits_of, standalone_logits, trained_like
from test_train import tiny_args

NAME = "deepnorm_own_module"
CORE = ["chunked_loss", "kernels", "keys", "model", "mup", "retractions"]
SHIPPED = {"configuration_spheretnorm.py", "modeling_spheretnorm.py", "connection_spheretnorm.py", *(f"{m}.py" for m in CORE)}


@pytest.fixture
def deepnorm() -> Iterator[type]:
    register_connection(NAME)(DeepNorm)
    yield DeepNorm
    del CONNECTIONS[NAME]  # the registry-driven tests of other files must not see it


def char_checkpoint(model: GPT) -> dict:
    itos = [chr(ord("A") + i) for i in range(VOCAB)]
    return {**checkpoint_state(model), "iter_num": 2, "data_meta": {"tokenizer": "char", "vocab_size": VOCAB, "itos": itos}}


def import_file(path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The module of a file, imported as `name` (in sys.modules until the test ends)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def random_ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(seed))


# -----------------------------------------------------------------------------
# Shipped, and loaded without spheretnorm


def test_a_connection_from_its_own_module_trains_exports_and_loads_without_spheretnorm(deepnorm: type, tmp_path: Path) -> None:
    from transformers.dynamic_module_utils import get_relative_import_files

    run = tmp_path / "run"
    data = write_markov_data(tmp_path / "data", with_vocabulary=True)
    train.main(tiny_args(data, run, "--max_iters=2", "--eval_interval=2", f"--connection={NAME}", "--branch_gain=0.5"))
    ckpt = load_checkpoint(run / "ckpt.pt")
    assert ckpt["model_config"]["connection_params"] == {"branch_gain": 0.5}
    folder = export_hf(ckpt, tmp_path / "elsewhere" / "deepnorm")

    # The module's file, whole, beside the core; transformers copies every one of the files.
    assert {p.name for p in folder.glob("*.py")} == SHIPPED | {"deepnorm_connection.py"}
    assert {Path(f).name for f in get_relative_import_files(folder / "modeling_spheretnorm.py")} == (SHIPPED - {"modeling_spheretnorm.py"}) | {"deepnorm_connection.py"}
    shipped = (folder / "deepnorm_connection.py").read_text()
    source = Path(deepnorm_connection.__file__).read_text()
    assert shipped == source.replace("import spheretnorm.model as core", "from . import model as core").replace(
        "from spheretnorm.model import Connection", "from .model import Connection")
    assert f"\nCONNECTION = register_connection({NAME!r})(DeepNorm)\n" in (folder / "connection_spheretnorm.py").read_text()

    ids = random_ids()
    (theirs,) = standalone_logits([folder], ids, tmp_path)
    torch.testing.assert_close(theirs, logits_of(load_model(ckpt).eval(), ids), atol=1e-5, rtol=0)


def test_two_exports_of_one_name_in_one_process_each_run_their_own_code(deepnorm: type, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A second version of the module (another exponent), exported into a folder of the same name:
    transformers maps a configuration class to the first model class it loaded for it, so each
    folder's configuration class must be its own (its module-cache entry covers all the code)."""
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=VOCAB, connection=NAME)
    first = trained_like(GPT(config))
    source = Path(deepnorm_connection.__file__).read_text()
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "deepnorm_connection.py").write_text(source.replace("DEEPNORM_EXPONENT = 0.25", "DEEPNORM_EXPONENT = 0.5"))
    second_class = import_file(tmp_path / "v2" / "deepnorm_connection.py", "deepnorm_v2", monkeypatch).DeepNorm
    CONNECTIONS[NAME] = second_class  # the name's class from now on (the fixture removes it at the end)
    second = GPT(config).eval()
    second.load_state_dict(first.state_dict())
    ids = random_ids(1)
    assert not torch.allclose(logits_of(first, ids), logits_of(second, ids), atol=1e-3)

    folders = []
    for label, model, cls in (("a", first, DeepNorm), ("b", second, second_class)):
        CONNECTIONS[NAME] = cls  # the export builds the checkpoint's model, and ships the module, of the class registered
        folders.append(export_hf(char_checkpoint(model), tmp_path / label / "model"))
    theirs = standalone_logits(folders, ids, tmp_path)
    torch.testing.assert_close(theirs[0], logits_of(first, ids), atol=1e-5, rtol=0)
    torch.testing.assert_close(theirs[1], logits_of(second, ids), atol=1e-5, rtol=0)


def test_imports_of_the_core_become_relative_and_the_rest_stays() -> None:
    source = (
        "import math, spheretnorm.model as m\n"
        "from spheretnorm import model, mup as scaling\n"
        "from spheretnorm.model import (\n"
        "    Connection,\n"
        "    LayerNorm as LN,\n"
        ")  # the names of the core\n"
        "\n"
        "def eps() -> float:\n"
        "    from spheretnorm.retractions import EPS  # ünïcode before and after: offsets are bytes\n"
        "    return EPS  # ëë\n"
    )
    assert hf_folder.with_relative_core_imports(source, CORE, NAME, "mine.py") == (
        "import math; from . import model as m\n"
        "from . import model, mup as scaling\n"
        "from .model import Connection, LayerNorm as LN  # the names of the core\n"
        "\n"
        "def eps() -> float:\n"
        "    from .retractions import EPS  # ünïcode before and after: offsets are bytes\n"
        "    return EPS  # ëë\n"
    )


# -----------------------------------------------------------------------------
# Refused, with nothing written

ALLOWED = "a connection's module may import spheretnorm.chunked_loss, spheretnorm.kernels, spheretnorm.keys, spheretnorm.model, spheretnorm.mup, spheretnorm.retractions " \
          r"\(the folder ships them beside it\) and packages other than spheretnorm\.$"
REFUSED = {
    "runtime": ("from spheretnorm.runtime.config import config_from_dict", r"imports spheretnorm\.runtime\.config \(line 2\); " + ALLOWED),
    "hf-as": ("import torch, spheretnorm.hf.folder as hf", r"imports spheretnorm\.hf\.folder \(line 2\); " + ALLOWED),
    "package-submodule": ("from spheretnorm import runtime", r"imports spheretnorm\.runtime \(line 2\); " + ALLOWED),
    "relative": ("def helper():\n    from .helpers import x", r"imports \.helpers relatively \(line 3\); " + ALLOWED),
    "binds-spheretnorm": ("import spheretnorm.model", r"imports spheretnorm\.model without `as` \(line 2\), binding the name spheretnorm, which the folder "
                          r"has not; write `from spheretnorm import model` or `import spheretnorm\.model as model`\.$"),
}
MODULE_TEXT = "from spheretnorm.model import PostLN\n{line}\n\n\nclass Mine(PostLN):\n    pass\n"


def refused_export(connection: type, tmp_path: Path) -> HFFolderError:
    """The error of exporting a model running `connection` (registered for the call), checking
    that it is one sentence and that no file was written."""
    register_connection("mine")(connection)
    try:
        model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=VOCAB, connection="mine"))
        with pytest.raises(HFFolderError) as info:
            export_hf(char_checkpoint(model), tmp_path / "out")
    finally:
        del CONNECTIONS["mine"]
    message = str(info.value)
    assert message.startswith("Connection 'mine' cannot be exported: ") and message.endswith(".") and "\n" not in message
    assert ". " not in message  # one sentence
    assert not (tmp_path / "out").exists()
    return info.value


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_module_the_folder_cannot_ship_is_refused_before_any_file(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line, message = REFUSED[case]
    path = tmp_path / "mine_connection.py"
    path.write_text(MODULE_TEXT.format(line=line))
    module = import_file(path, f"mine_{case.replace('-', '_')}", monkeypatch)
    error = refused_export(module.Mine, tmp_path)
    assert str(error).startswith(f"Connection 'mine' cannot be exported: its module {path} ")
    assert re.search(message, str(error)), str(error)


def test_a_class_without_a_source_file_or_module_level_name_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notebook = types.ModuleType("notebook_cell")  # as a class typed into an interactive session
    monkeypatch.setitem(sys.modules, "notebook_cell", notebook)
    exec(MODULE_TEXT.format(line=""), notebook.__dict__)
    assert "which has no Python source file (an interactive session or a notebook, say); define it in a .py file" in str(refused_export(notebook.Mine, tmp_path))

    def local_class() -> type:
        class Local(DeepNorm):
            pass

        return Local

    assert "is no top-level name of" in str(refused_export(local_class(), tmp_path))


def test_a_module_named_like_a_shipped_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mine").mkdir()
    path = tmp_path / "mine" / "model.py"
    path.write_text(MODULE_TEXT.format(line=""))
    error = refused_export(import_file(path, "users_model", monkeypatch).Mine, tmp_path)
    assert "its module's file name model.py is taken in the folder by one of __init__, chunked_loss, configuration_spheretnorm, connection_spheretnorm, " in str(error)


def test_the_command_refuses_in_one_line_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "mine_connection.py"
    path.write_text(MODULE_TEXT.format(line=REFUSED["runtime"][0]))
    register_connection("mine")(import_file(path, "mine_cli", monkeypatch).Mine)
    try:
        model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=VOCAB, connection="mine"))
        torch.save(char_checkpoint(model), tmp_path / "ckpt.pt")
        with pytest.raises(SystemExit) as info:
            export_cli.main(["--ckpt", str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "hf")])
    finally:
        del CONNECTIONS["mine"]
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: Connection 'mine' cannot be exported: its module {path} imports spheretnorm.runtime.config (line 2); ")
    assert not (tmp_path / "hf").exists()
