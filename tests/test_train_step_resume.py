"""Resume and a user's modules (issue 47, item 6): a resume of one's own run whose command line
names the user's connection and optimizer needs --trust_recorded_imports=true at most, never the
module list again; without it, one sentence names the recorded modules and both ways to consent.
An unknown --optimizer gets the same --imports hint as an unknown --connection."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterator

import pytest

import train
from markov_data import write_markov_data
from spheretnorm.model import CONNECTIONS
from spheretnorm.optim import OPTIMIZERS
from spheretnorm.runtime.config import ConfigError, parse_config
from spheretnorm.runtime.imports import consent_to_recorded_imports
from test_train_step import train_args

MODULE = "mine_ideas"
SOURCE = '''
from spheretnorm.model import CONNECTIONS, register_connection
from spheretnorm.optim import OPTIMIZERS, register_optimizer


@register_connection("mine")
class Mine(CONNECTIONS["pre_ln"]):
    title = "Mine"


@register_optimizer("mine_adamw")
class MineAdamW(OPTIMIZERS["adamw"]):
    title = "Mine's AdamW"
'''


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The current folder holds the user's module; it and what it registered are gone after the test."""
    (tmp_path / f"{MODULE}.py").write_text(SOURCE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "")
    yield tmp_path
    forget_the_module()
    consent_to_recorded_imports(False)


def forget_the_module() -> None:
    """As in a fresh process: the module not imported, its entries not registered."""
    CONNECTIONS.pop("mine", None)
    OPTIMIZERS.pop("mine_adamw", None)
    sys.modules.pop(MODULE, None)


def test_a_resume_of_ones_own_run_needs_the_trust_flag_alone(project: Path) -> None:
    data, run = write_markov_data(project / "data"), project / "run"
    names = ("--connection=mine", "--optimizer=mine_adamw")
    train.main(train_args(data, run, f"--imports={MODULE}", *names, "--max_iters=2", "--eval_interval=2"))
    forget_the_module()
    resume = train_args(data, run, *names, "--init_from=resume", "--max_iters=3", "--eval_interval=3")
    with pytest.raises(ConfigError) as refused:
        train.main(resume)
    message = str(refused.value)
    assert f"records imports=['{MODULE}']" in message and "\n" not in message  # one sentence naming the module
    assert f"--imports={MODULE} to import the modules you name" in message and "--trust_recorded_imports=true" in message
    assert MODULE not in sys.modules
    train.main([*resume, "--trust_recorded_imports=true"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in rows if r["kind"] == "train"] == [1, 2, 3]
    assert json.loads((run / "config.json").read_text())["imports"] == [MODULE]


@pytest.mark.parametrize("key", ["connection", "optimizer"])
def test_an_unknown_name_says_that_ones_own_needs_imports(key: str) -> None:
    with pytest.raises(ConfigError, match=f"an? {key} of your own module needs --imports=MODULE"):
        parse_config([f"--{key}=mine_unregistered"])
