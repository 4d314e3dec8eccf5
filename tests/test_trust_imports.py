"""Files cannot choose code to run (issue 48, point 1): the modules a checkpoint, a run folder's
config.json or an exported folder records under `imports` are imported only with the user's
consent (--imports naming them, or --trust_recorded_imports=true).

Each hostile file records a marker module that sits in the current folder (where a recorded
module is looked up) and leaves a file behind when it runs: it must never run. In-process: the
readers' own functions and commands' main(), no subprocess.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

import pytest

import sample
from spheretnorm.experiments import conditioning, tabulate
from spheretnorm.hf import export_cli
from spheretnorm.hf.folder import HFFolderError, folder_model_config
from spheretnorm.model import GPT, GPTConfig
from spheretnorm.runtime import imports
from spheretnorm.runtime.checkpoint import CheckpointError, atomic_torch_save, checkpoint_state
from spheretnorm.runtime.checkpoint import consolidation
from spheretnorm.runtime.checkpoint import load_checkpoint
from spheretnorm.runtime.config import ConfigError, TrainConfig, parse_config

MARKER = "marker_never_runs"
META = {"dataset": "openwebtext", "tokenizer": "gpt2", "vocab_size": 50257, "eot_token": 50256}
CONSENT = f"pass --imports={MARKER} to import the modules you name, or --trust_recorded_imports=true to import what the file records"


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The current folder, holding the marker module; consent is withdrawn again after the test."""
    (tmp_path / f"{MARKER}.py").write_text(f"open({str(tmp_path / 'RAN')!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    imports.consent_to_recorded_imports(False)
    sys.modules.pop(MARKER, None)


def never_ran(folder: Path) -> bool:
    return not (folder / "RAN").exists() and MARKER not in sys.modules


def hostile_checkpoint(path: Path, named: str = "", connection: str = "pre_ln") -> Path:
    """A checkpoint of a built-in `connection` whose train_config records the marker; `named`: the
    connection its config names instead, one that no built-in module defines."""
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=50304, connection=connection))
    state = {**checkpoint_state(model), "train_config": {**asdict(TrainConfig()), "imports": [MARKER]}, "iter_num": 0, "data_meta": META}
    state["model_config"]["connection"] = named or connection
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(state, path)
    return path


def test_a_checkpoint_of_a_built_in_connection_is_read_and_sampled_without_importing_what_it_records(folder: Path) -> None:
    path = hostile_checkpoint(folder / "run" / "ckpt.pt")
    assert load_checkpoint(path)["iter_num"] == 0
    assert sample.main([str(folder / "run"), "--start=Hi", "--temperature=0", "--max_new_tokens=2", "--num_samples=1", "--device=cpu"])
    assert never_ran(folder)


def test_a_checkpoint_that_needs_its_recorded_module_stops_in_one_line_naming_both_ways_to_consent(
    folder: Path, capsys: pytest.CaptureFixture
) -> None:
    path = hostile_checkpoint(folder / "ckpt.pt", named="evil_connection")
    assert sample.cli([str(path), "--device=cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"records imports=['{MARKER}']" in err and CONSENT in err
    with pytest.raises(CheckpointError, match="imported only with your consent"):
        load_checkpoint(path)
    assert never_ran(folder)


def test_consent_imports_what_the_checkpoint_records(folder: Path) -> None:
    path = hostile_checkpoint(folder / "ckpt.pt", named="evil_connection")
    imports.consent_to_recorded_imports(True)
    with pytest.raises(CheckpointError, match="connection"):  # the marker registers no connection
        load_checkpoint(path)
    assert (folder / "RAN").exists()


def test_a_run_folders_config_json_imports_nothing_without_consent(folder: Path) -> None:
    config = folder / "config.json"
    config.write_text(json.dumps({"imports": [MARKER], "connection": "pre_ln", "trust_recorded_imports": True}))
    parsed = parse_config([str(config), "--eval_only=true"], world_size=1)  # the file cannot consent for the user
    assert parsed.train.imports == [MARKER] and not parsed.train.trust_recorded_imports
    config.write_text(json.dumps({"imports": [MARKER], "connection": "evil_connection"}))
    with pytest.raises(ConfigError) as info:
        parse_config([str(config), "--eval_only=true"], world_size=1)
    assert f"{str(config)!r} records imports=['{MARKER}']" in str(info.value) and CONSENT in str(info.value)
    assert never_ran(folder)
    with pytest.raises(ConfigError, match="connection='evil_connection' is not valid"):
        parse_config([str(config), "--eval_only=true", "--trust_recorded_imports=true"], world_size=1)
    assert (folder / "RAN").exists()


def test_an_exported_folder_imports_nothing_without_consent(folder: Path) -> None:
    export_cli.main(["--ckpt", str(hostile_checkpoint(folder / "run" / "ckpt.pt", connection="geonorm")), "--out", str(folder / "hf")])
    config_path = folder / "hf" / "config.json"
    assert json.loads(config_path.read_text())["imports"] == [MARKER]
    assert folder_model_config(folder / "hf")["connection"] == "geonorm"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "connection": "evil_connection"}))
    with pytest.raises(HFFolderError) as info:
        folder_model_config(folder / "hf")
    assert CONSENT in str(info.value) and "\n" not in str(info.value)
    assert never_ran(folder)


def test_tables_over_a_run_root_import_nothing_they_were_not_told_to(folder: Path) -> None:
    run = folder / "runs" / "pre_ln"
    run.mkdir(parents=True)
    config = {"imports": [MARKER], "method": "pre_ln", "dataset": "openwebtext", "max_iters": 2, "n_layer": 2, "n_head": 2, "n_embd": 32}
    (run / "config.json").write_text(json.dumps(config))
    (run / "metrics.jsonl").write_text("")
    tabulate.scan_runs(folder / "runs")
    assert tabulate.main(["--runs_root", str(folder / "runs")]) == 0
    assert never_ran(folder)


# -----------------------------------------------------------------------------
# Every reader of a checkpoint takes the same two options (issue 67, point 7)


def test_the_jacobian_asks_for_consent_by_options_it_takes(folder: Path, capsys: pytest.CaptureFixture) -> None:
    path = hostile_checkpoint(folder / "ckpt.pt", named="evil_connection")
    assert conditioning.main(["--ckpt", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and CONSENT in err and never_ran(folder)
    # Consent given: the recorded module runs (the marker registers no connection, so the model is then refused).
    assert conditioning.main(["--ckpt", str(path), "--trust_recorded_imports=true"]) == 2
    assert (folder / "RAN").exists() and "connection" in capsys.readouterr().err


def test_consolidate_imports_the_modules_named_before_it_reads_the_folder(folder: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        consolidation.main([str(folder / "absent.dcp"), f"--imports={MARKER}", "--trust_recorded_imports"])
    assert info.value.code == 2 and "is not a folder" in capsys.readouterr().err
    assert (folder / "RAN").exists() and imports.recorded_imports_trusted()


def test_a_fine_tune_that_names_the_folders_own_connection_imports_it_with_consent(folder: Path) -> None:
    """--init_from=hf:DIR --connection=NAME: NAME is checked only after the folder's recorded
    modules are imported (with consent), as on a resume; before, it was refused as unknown."""
    (folder / "hf").mkdir()
    (folder / "hf" / "config.json").write_text(json.dumps({"imports": [MARKER], "connection": "evil_connection"}))
    argv = [f"--init_from=hf:{folder / 'hf'}", "--connection=evil_connection"]
    with pytest.raises(ConfigError) as info:
        parse_config(argv, world_size=1)
    assert CONSENT in str(info.value) and "\n" not in str(info.value) and never_ran(folder)
    with pytest.raises(ConfigError, match="connection='evil_connection' is not valid"):  # the marker registers none
        parse_config([*argv, "--trust_recorded_imports=true"], world_size=1)
    assert (folder / "RAN").exists()


# -----------------------------------------------------------------------------
# A module that exits or is interrupted as it is imported (point 5)


@pytest.mark.parametrize("body, shown", [("import sys\nsys.exit(3)\n", "SystemExit: 3"), ("raise KeyboardInterrupt\n", "KeyboardInterrupt")])
def test_a_module_that_exits_at_import_is_one_line_naming_it_with_status_2(
    body: str, shown: str, folder: Path, capsys: pytest.CaptureFixture
) -> None:
    (folder / "quitter.py").write_text(body)
    with pytest.raises(ConfigError) as info:
        parse_config(["--imports=quitter"], world_size=1)  # train.py exits 2 on a ConfigError (3 is its collapse status)
    assert str(info.value).startswith(f"imports: module 'quitter' could not be imported ({shown})") and "\n" not in str(info.value)
    assert sample.cli(["--imports=quitter", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"module 'quitter' could not be imported ({shown})" in err
