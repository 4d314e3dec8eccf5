"""Every command runs from a clone without the package installed, and says in one line what to
install when a package it needs is missing (docs/ARCHITECTURE.md, "The commands").

Each command runs as a user runs it: `python PATH --help` in a subprocess, from a folder outside
the clone, with decoys first on PYTHONPATH. A decoy `spheretnorm` that fails on import stands
where an installed copy of the package would be found (site-packages and an editable install
come after PYTHONPATH), so a command passes only if it imports its own clone's package. Decoy
`torch`, `numpy` and `tiktoken` that raise as an absent module does stand for an environment
without them. The commands run in parallel: one subprocess each, most of their time importing torch.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from spheretnorm.runtime.cli import MISSING_PACKAGE_EXIT, explain_missing_packages
from test_layout import REPO, command_files

ABSENT_PACKAGES = ("torch", "numpy", "tiktoken")  # every command needs one of them
DECOY_PACKAGE = 'raise ImportError("a decoy spheretnorm was imported: the command did not put its own clone first")\n'
ABSENT_MODULE = "raise ModuleNotFoundError(f'No module named {__name__!r}', name=__name__)\n"
WORKERS = 4


def command_id(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def decoy_folder(root: Path, modules: dict[str, str]) -> Path:
    """A folder of packages, {name: the source of its __init__.py}, to put on PYTHONPATH."""
    for name, source in modules.items():
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(source, encoding="utf-8")
    return root


def run_all(argvs: dict[str, list[str]], cwd: dict[str, Path], pythonpath: Path) -> dict[str, subprocess.CompletedProcess]:
    """Every command's process, run WORKERS at a time; the environment sees the decoys first."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "PYTHONNOUSERSITE": "1", "WANDB_MODE": "disabled"}

    def run(name: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *argvs[name]], cwd=cwd[name], env=env, capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(zip(argvs, pool.map(run, argvs)))


def command_runs(outside: Path) -> tuple[dict[str, list[str]], dict[str, Path]]:
    """Each command file run by its path from outside the clone, and `python -m eval.lm_eval_cli`
    from the clone's root (as eval/README.md gives it)."""
    argvs = {command_id(path): [str(path), "--help"] for path in command_files()}
    cwd = dict.fromkeys(argvs, outside)
    argvs["-m eval.lm_eval_cli"], cwd["-m eval.lm_eval_cli"] = ["-m", "eval.lm_eval_cli", "--help"], REPO
    return argvs, cwd


# A command of each kind that runs past its imports (each pays torch's import, about a second of
# both cores): a top-level one, one of each folder, and the module form. That every other command
# of a folder puts its clone first before it imports the package is read from its source
# (test_layout.test_every_command_in_a_folder_bootstraps_before_its_first_package_import).
RUN_WHOLE = ("train.py", "scripts/tables.py", "eval/zero_shot.py", "data/prepare.py", "-m eval.lm_eval_cli")


@pytest.fixture(scope="module")
def without_the_installed_package(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    decoys = decoy_folder(tmp_path_factory.mktemp("decoys"), {"spheretnorm": DECOY_PACKAGE})
    argvs, cwd = command_runs(tmp_path_factory.mktemp("elsewhere"))
    return run_all({k: argvs[k] for k in RUN_WHOLE}, cwd, pythonpath=decoys)


@pytest.fixture(scope="module")
def without_torch_numpy_tiktoken(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    decoys = decoy_folder(tmp_path_factory.mktemp("absent"), dict.fromkeys(ABSENT_PACKAGES, ABSENT_MODULE))
    return run_all(*command_runs(tmp_path_factory.mktemp("elsewhere")), pythonpath=decoys)


COMMANDS = [*map(command_id, command_files()), "-m eval.lm_eval_cli"]


def test_the_command_list_is_every_file_of_the_command_folders() -> None:
    assert {"train.py", "scripts/tables.py", "eval/zero_shot.py", "data/prepare.py"} <= set(COMMANDS)
    assert "eval/__init__.py" not in COMMANDS


def test_the_commands_run_whole_are_commands() -> None:
    assert set(RUN_WHOLE) <= set(COMMANDS)


@pytest.mark.parametrize("command", RUN_WHOLE)
def test_a_command_runs_from_its_clone_without_the_package_installed(command: str, without_the_installed_package) -> None:
    result = without_the_installed_package[command]
    assert result.returncode == 0, f"{command} --help exited {result.returncode}:\n{result.stderr[-2000:]}"
    assert "usage" in result.stdout.lower(), result.stdout[:500]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_package_is_one_line_and_status_2(command: str, without_torch_numpy_tiktoken) -> None:
    result = without_torch_numpy_tiktoken[command]
    shown = "eval/lm_eval_cli.py" if command.startswith("-m ") else command
    lines = result.stderr.strip().splitlines()
    assert result.returncode == MISSING_PACKAGE_EXIT, f"{command} exited {result.returncode}:\n{result.stderr[-2000:]}"
    assert len(lines) == 1 and not result.stdout, result.stderr
    assert re.fullmatch(rf'{re.escape(shown)} needs (torch|numpy|tiktoken); install the project from .+: pip install -e "\.\[dev\]" .*', lines[0]), lines[0]


def hook_result(monkeypatch: pytest.MonkeyPatch, error: ModuleNotFoundError) -> list[BaseException]:
    """What the hook hands on to the previous excepthook (the traceback printer) for `error`."""
    handed_on: list[BaseException] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: handed_on.append(value))
    explain_missing_packages(str(REPO / "scripts" / "tables.py"))
    sys.excepthook(type(error), error, None)
    return handed_on


def test_a_missing_module_of_the_package_itself_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module of spheretnorm that is not there is a bug of the clone, not a package to install."""
    error = ModuleNotFoundError("No module named 'spheretnorm.gone'", name="spheretnorm.gone")
    assert hook_result(monkeypatch, error) == [error]
    unnamed = ModuleNotFoundError("raised by hand, without a name")
    assert hook_result(monkeypatch, unnamed) == [unnamed]


def test_a_missing_package_exits_2_with_the_command_and_the_package(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        hook_result(monkeypatch, ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib"))
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("scripts/tables.py needs matplotlib; install the project from ")
