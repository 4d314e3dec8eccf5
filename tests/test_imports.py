"""The imports key (spheretnorm/runtime/imports.py): a connection in a module of the user's own folder.

The module is docs/ARCHITECTURE.md's own example ("Adding a deep connection"), written to
my_ideas/gain.py in a project folder (tmp_path, a namespace package: no __init__.py). Each command
runs in a process of its own from that folder, as a user runs them: train.py is given the key once;
the resume, sample.py, the export and the tables find it recorded, and import it with the user's
consent (--trust_recorded_imports=true, tests/test_trust_imports.py). Tests in this process register
what they import only until they end (user_modules), so the registry-driven tests of other files
never see it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch

import bench
import sample
import train
from markov_data import write_markov_data
from spheretnorm.cluster import launcher
from spheretnorm.experiments import grid, tabulate
from spheretnorm.hf import export_cli
from spheretnorm.model import CONNECTIONS, GPT, GPTConfig, LayerNorm, RMSNorm
from spheretnorm.runtime.checkpoint import checkpoint_state, read_torch_file, save_safetensors_checkpoint
from spheretnorm.runtime.checkpoint import load_checkpoint
from spheretnorm.runtime.cli import UsageError
from spheretnorm.runtime.config import ConfigError, parse_config
from spheretnorm.runtime.imports import consent_to_recorded_imports
from spheretnorm.runtime.methods import canonical_method
from spheretnorm.zeroshot.errors import EvalError
from spheretnorm.zeroshot.harness import load_eval_model
from test_train import tiny_args

REPO = Path(__file__).resolve().parents[1]
MODULE = "my_ideas.gain"
NAME = "gain_pre_ln"  # the example's connection
TITLE = "Pre-LN x0.25"  # its title at res_gain=0.25 (the class's `title`)
HOW_TO_FIX = "; check the name and that its folder is on PYTHONPATH or the current folder."


def doc_example() -> str:
    """The first Python block of ARCHITECTURE.md's "Adding a deep connection"."""
    section = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8").split("## Adding a deep connection", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project folder holding my_ideas/gain.py, the doc's example."""
    (tmp_path / "my_ideas").mkdir()
    (tmp_path / "my_ideas" / "gain.py").write_text(doc_example(), encoding="utf-8")
    return tmp_path


@pytest.fixture
def user_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The user's modules and the connections the test registers are gone after it (PYTHONPATH
    too). Only my_ideas' modules leave sys.modules: a library the test imported along the way
    (triton, under an export) may not be imported twice in one process."""
    connections = set(CONNECTIONS)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # restored at the end
    yield
    consent_to_recorded_imports(False)
    forget_the_example()
    for name in set(CONNECTIONS) - connections:
        del CONNECTIONS[name]


def forget_the_example() -> None:
    """As in a fresh process: the example's module not imported, its connection not registered."""
    CONNECTIONS.pop(NAME, None)
    for name in [name for name in sys.modules if name.split(".")[0] == "my_ideas"]:
        del sys.modules[name]


def command(cwd: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, str(REPO / script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


# -----------------------------------------------------------------------------
# Across processes


def test_a_connection_of_the_users_folder_travels_through_every_command(project: Path, user_modules: None,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_markov_data(project / "data", with_vocabulary=True)
    run = project / "runs" / "openwebtext_s" / f"{NAME}-0.25"
    ok(command(project, "train.py", *tiny_args(data, run, f"--imports={MODULE}", f"--connection={NAME}", "--res_gain=0.25",
                                               "--dataset=openwebtext", "--max_iters=2", "--eval_interval=2")))
    assert json.loads((run / "config.json").read_text())["imports"] == [MODULE]

    # The resume names neither the module nor the connection: the checkpoint records both, and the flag consents.
    ok(command(project, "train.py", *tiny_args(data, run, "--init_from=resume", "--max_iters=4", "--eval_interval=2",
                                               "--trust_recorded_imports=true")))
    ckpt = read_torch_file(run / "ckpt.pt")  # unchecked: load_checkpoint would import my_ideas.gain in this process
    assert ckpt["iter_num"] == 4 and ckpt["train_config"]["imports"] == [MODULE]
    assert ckpt["model_config"]["connection"] == NAME and ckpt["model_config"]["connection_params"] == {"res_gain": 0.25}

    # The row is named by the class's title, as in the process that registered it (not 'gain_pre_ln:0.25').
    assert TITLE in ok(command(project, "scripts/tables.py", "--runs_root", str(project / "runs"), f"--imports={MODULE}"))

    # The other commands run here, each as in a fresh process (forget_the_example: a process
    # start each would cost seconds), with no flag naming the module: only the consent to import what it records.
    monkeypatch.chdir(project)
    forget_the_example()
    trust = "--trust_recorded_imports=true"
    assert sample.main([str(run / "ckpt.pt"), "--start=A", "--num_samples=1", "--max_new_tokens=4", "--device=cpu", trust])
    forget_the_example()
    # eval/zero_shot.py reads the checkpoint (importing the module) and refuses only its characters' tokenizer.
    with pytest.raises(EvalError, match="was trained with the 'char' tokenizer, but zero-shot benchmarks need"):
        load_eval_model(run / "ckpt.pt")
    assert NAME in CONNECTIONS
    forget_the_example()
    export_cli.main(["--ckpt", str(run / "ckpt.pt"), "--out", str(project / "hf"), trust])
    assert json.loads((project / "hf" / "config.json").read_text())["imports"] == [MODULE]
    assert (project / "hf" / "gain.py").is_file()  # the module's file ships with the folder
    # A fine-tune of the exported folder imports the module its config.json records, and records it in turn.
    forget_the_example()
    train.main(tiny_args(data, project / "tuned", f"--init_from=hf:{project / 'hf'}", "--max_iters=1", "--eval_interval=1", trust))
    assert json.loads((project / "tuned" / "config.json").read_text())["imports"] == [MODULE]


def test_an_absent_module_is_one_sentence_and_exit_status_2(project: Path) -> None:
    result = command(project, "train.py", "--imports=my_ideas.gian", f"--connection={NAME}", "--res_gain=0.25")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("error: imports: module 'my_ideas.gian' could not be imported "
                             f"(ModuleNotFoundError: No module named 'my_ideas.gian'){HOW_TO_FIX}\n")


def test_a_checkpoint_whose_module_is_absent_here_is_one_line(project: Path, tmp_path_factory: pytest.TempPathFactory,
                                                              user_modules: None, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(project)
    parsed = parse_config([f"--imports={MODULE}", f"--connection={NAME}"], world_size=1)
    model = GPT(parsed.model_config(vocab_size=8, n_layer=1, n_head=1, n_embd=8, block_size=4))
    path = project / "ckpt.pt"
    torch.save({**checkpoint_state(model), "train_config": {"imports": parsed.train.imports}}, path)
    # Elsewhere, where the module is not: sample.py says which module is missing, in one line.
    forget_the_example()
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    assert sample.cli([str(path), "--device=cpu", "--trust_recorded_imports=true"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: Checkpoint {str(path)!r} records imports=['{MODULE}']: module '{MODULE}' could not be imported "
                   f"(ModuleNotFoundError: No module named 'my_ideas'){HOW_TO_FIX}\n")


# -----------------------------------------------------------------------------
# In this process


def test_the_module_is_imported_before_any_other_key_is_checked(project: Path, user_modules: None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    config = project / "mine.py"
    config.write_text(f'imports = ["{MODULE}"]\nconnection = "{NAME}"\nres_gain = 0.25\n')
    parsed = parse_config([str(config), "--n_layer=2"], world_size=1)
    assert parsed.train.imports == [MODULE] and parsed.model_config().connection_params == {"res_gain": 0.25}
    # A key of the user's module's folder, never a setting of the run: no '+imports=' folder suffix.
    assert "imports" not in parsed.overrides
    assert str(project) in os.environ["PYTHONPATH"].split(os.pathsep)  # the jobs it starts find it too
    # A run folder's config.json (train.py RUN/config.json --eval_only=true) holds the key too.
    (project / "config.json").write_text(json.dumps({"imports": [MODULE], "connection": NAME, "connection_params": {"res_gain": 0.25}}))
    forget_the_example()
    trusted = parse_config([str(project / "config.json"), "--trust_recorded_imports=true"], world_size=1)
    assert trusted.model_config().connection_params == {"res_gain": 0.25}
    # Several, comma-separated; the last value given wins, as for any key.
    assert parse_config([str(config), "--imports=json, my_ideas.gain"], world_size=1).train.imports == ["json", MODULE]


@pytest.mark.parametrize("value, message", [
    ("--imports=my ideas", "imports: 'my ideas' is not a module name; give dotted module names such as my_ideas.deepnorm"),
    ("--imports=my_ideas.broken", "imports: module 'my_ideas.broken' could not be imported (ZeroDivisionError: division by zero)" + HOW_TO_FIX),
])
def test_a_bad_name_or_a_broken_module_is_one_sentence_naming_it(value: str, message: str, project: Path, user_modules: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    (project / "my_ideas" / "broken.py").write_text("RATE = 1 / 0\n")
    with pytest.raises(ConfigError) as info:
        parse_config([value, f"--connection={NAME}"], world_size=1)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_an_unknown_connection_says_that_a_users_own_needs_the_key() -> None:
    hint = "a connection of your own module needs --imports=MODULE (imports = [...] in a config file)."
    with pytest.raises(ConfigError) as info:
        parse_config([f"--connection={NAME}"], world_size=1)
    assert str(info.value).startswith(f"connection={NAME!r} is not valid.") and str(info.value).endswith(hint)
    with pytest.raises(UsageError) as info:
        canonical_method(f"{NAME}:0.25")
    assert str(info.value).startswith(f"Unknown method '{NAME}:0.25'; valid methods are: ") and str(info.value).endswith(hint)


@pytest.mark.parametrize("block, norm", [("gpt2", LayerNorm), ("llama", RMSNorm)])
def test_the_doc_example_uses_the_blocks_own_norm(block: str, norm: type, project: Path, user_modules: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    parse_config([f"--imports={MODULE}"], world_size=1)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=16, connection=NAME, block=block))
    assert all(type(c.ln) is norm for b in model.transformer.h for c in (b.conn_attn, b.conn_mlp))


def test_the_launcher_imports_before_reading_the_methods_and_passes_the_key_on(project: Path, user_modules: None,
                                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                                 capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(project)
    assert launcher.main(["--dry_run", f"--imports={MODULE}", "--methods", f"{NAME}:0.25", "--scales", "S",
                          "--datasets", "openwebtext", "--runs_root", str(project / "grid")]) == 0
    out = capsys.readouterr().out
    planned = [line for line in out.splitlines() if line.startswith("torchrun")]
    assert len(planned) == 1 and f"--connection={NAME} --res_gain=0.25 --imports={MODULE}" in planned[0]
    # The jobs run in the repository root: a printed command needs the module's folder on PYTHONPATH.
    assert f"# note: --imports found modules in {project}, which is not on sys.path: " in out
    assert out.count(f"PYTHONPATH={project}") == 1 and os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(project)


def test_the_readers_of_run_folders_import_what_config_json_records_with_consent(project: Path, user_modules: None,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """scripts/tables.py and scripts/plot.py (tabulate.scan_runs), the launcher and the studies (grid.load_run):
    without consent the row keeps the method's own name, and nothing is imported."""
    monkeypatch.chdir(project)
    run = project / "runs" / f"{NAME}-0.25"
    run.mkdir(parents=True)
    config = {"imports": [MODULE], "method": f"{NAME}:0.25", "dataset": "openwebtext", "max_iters": 2, "n_layer": 2, "n_head": 2, "n_embd": 32}
    (run / "config.json").write_text(json.dumps(config))
    (run / "metrics.jsonl").write_text("")
    for read in (lambda: tabulate.scan_runs(project / "runs"), lambda: grid.load_run(run)):
        forget_the_example()
        consent_to_recorded_imports(False)
        read()
        assert MODULE not in sys.modules
        consent_to_recorded_imports(True)
        read()
        assert grid.row_label(f"{NAME}:0.25") == TITLE


def test_bench_imports_before_reading_its_connections(project: Path, user_modules: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    opts, rest = bench.parse_bench_args([f"--imports={MODULE}", f"--connections=pre_ln,{NAME}", "--n_layer=2"])
    assert opts.connections == ["pre_ln", NAME] and rest == [f"--imports={MODULE}", "--n_layer=2"]


def test_the_pytest_option_runs_the_generated_tests_over_the_users_connection(project: Path) -> None:
    args = ["-m", "pytest", str(REPO / "tests" / "test_model.py"), "-p", "no:cacheprovider", "-v", "-k", NAME]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, *args, f"--imports={MODULE}"], cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"test_every_connection_trains[{NAME}] PASSED" in result.stdout
    assert f"test_optimizer_groups[{NAME}] PASSED" in result.stdout  # its own optimizer_rule, too


def test_a_safetensors_export_keeps_the_imports_of_the_train_config_only(tmp_path: Path) -> None:
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=8))
    recorded = {"imports": ["json"], "out_dir": "/home/me/private/run"}
    path = save_safetensors_checkpoint({**checkpoint_state(model), "train_config": recorded}, tmp_path / "ckpt.safetensors")
    assert load_checkpoint(path)["train_config"] == {"imports": ["json"]}
    path = save_safetensors_checkpoint(checkpoint_state(model), tmp_path / "none.safetensors")
    assert load_checkpoint(path)["train_config"] is None
