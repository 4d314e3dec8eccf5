"""A connection defined here, in the test file only, runs through the whole pipeline.

It declares what it needs as any connection does (model.py's Connection): a method parameter
(`res_gain`), its own optimizer rule (no weight decay on the token embedding) and a step after
each optimizer step (token embeddings renormalised to unit rows, as nGPT does). Nothing outside
this file knows it: train.py, the launcher's --dry_run and the tables must all read what they need
from the class; the Hugging Face export, which ships a connection's module, refuses this one,
whose module imports the training runtime.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import train
from spheretnorm.hf import export_cli
from spheretnorm.optim import build_optimizer
from spheretnorm.runtime.config import TrainConfig
from spheretnorm.cluster import launcher as launch
from spheretnorm.runtime import methods
from spheretnorm.runtime.methods import method_dirname
from spheretnorm.experiments import grid as runs, tabulate as tables
from spheretnorm.runtime.config import parse_config
from spheretnorm.runtime.methods import method_key
from spheretnorm.model import CONNECTIONS, GPT, Connection, LayerNorm, MethodParam, OptimRule, register_connection
from spheretnorm.runtime.checkpoint import load_checkpoint
from markov_data import write_markov_data
from test_train import tiny_args

NAME = "gain_pre_ln"


class GainPreLN(Connection):
    """Pre-LN with a fixed gain on the branch: h = h + res_gain * F(LN(h))."""

    title = "Pre-LN x{res_gain:g}"
    params = (MethodParam("res_gain", 0.5, "the fixed gain of the residual branch"),)

    def __init__(self, config, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.ln = LayerNorm(config.n_embd, bias=config.bias)
        self.gain = config.res_gain

    def forward(self, h, sublayer):
        return h + self.gain * sublayer(self.ln(h))

    @classmethod
    def optimizer_rule(cls, name: str, p: torch.nn.Parameter) -> OptimRule:
        return OptimRule(decay=p.dim() >= 2 and "wte" not in name)

    @classmethod
    def after_optimizer_step(cls, model: torch.nn.Module) -> None:
        wte = model.transformer.wte.weight
        wte.div_(wte.norm(dim=-1, keepdim=True))


@pytest.fixture
def char_data(tmp_path: Path) -> Path:
    """test_train's token stream with a character vocabulary, so that a tokenizer can be exported."""
    return write_markov_data(tmp_path / "data", with_vocabulary=True)


@pytest.fixture
def gain_connection():
    register_connection(NAME)(GainPreLN)
    yield GainPreLN
    del CONNECTIONS[NAME]  # the registry-driven tests of other files must not see it


def test_the_class_alone_defines_the_method(gain_connection) -> None:
    parsed = parse_config([f"--connection={NAME}", "--res_gain=0.25"], world_size=1)
    cfg = parsed.model_config(vocab_size=64)
    assert cfg.res_gain == 0.25 and cfg.connection_params == {"res_gain": 0.25}
    assert method_key(cfg) == f"{NAME}:0.25"
    assert methods.method_args(f"{NAME}:0.25") == [f"--connection={NAME}", "--res_gain=0.25"]
    assert method_dirname(f"{NAME}:0.25") == f"{NAME}-0.25"
    assert methods.display_name(f"{NAME}:0.25") == "Pre-LN x0.25"
    assert methods.canonical_method(NAME) == f"{NAME}:0.5"  # the declared default
    with pytest.raises(methods.UsageError, match="res_gain must be a float"):
        methods.method_model_keys(f"{NAME}:big")
    # The parameter is the method's, not a setting: a run's folder takes no '+res_gain=' suffix.
    with pytest.raises(methods.UsageError, match="use --methods"):
        runs.check_overrides(["--res_gain=0.3"], {})
    # Its optimizer rule: the token embedding (tied head) is not decayed, other matrices are.
    model = GPT(cfg)
    opt = build_optimizer(model, TrainConfig(weight_decay=0.1, learning_rate=1e-3, min_lr=0.0, beta1=0.9, beta2=0.95), "cpu")
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert id(model.transformer.wte.weight) not in decayed and id(model.transformer.h[0].mlp.c_fc.weight) in decayed


def test_train_launch_tables_and_export(gain_connection, char_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "runs" / "openwebtext_s" / f"{NAME}-0.25"
    args = tiny_args(char_data, run, "--max_iters=4", "--eval_interval=4", f"--connection={NAME}", "--res_gain=0.25", "--dataset=openwebtext")
    train.main(args)
    ckpt = load_checkpoint(run / "ckpt.pt")
    assert ckpt["model_config"]["connection_params"] == {"res_gain": 0.25}
    # The after-step hook ran: every token embedding row has unit norm after the last step.
    rows = ckpt["model"]["transformer.wte.weight"].norm(dim=-1)
    torch.testing.assert_close(rows, torch.ones_like(rows))
    config = json.loads((run / "config.json").read_text())
    assert config["method"] == f"{NAME}:0.25"

    # A resume continues with the checkpoint's parameter.
    train.main([*args[:-4], "--max_iters=6", "--eval_interval=2", "--init_from=resume", f"--connection={NAME}", "--res_gain=0.25", "--dataset=openwebtext"])
    assert load_checkpoint(run / "ckpt.pt")["iter_num"] == 6

    # The launcher plans it from the method key alone (in a fresh grid: the run above is a smoke run).
    capsys.readouterr()
    assert launch.main(["--dry_run", "--runs_root", str(tmp_path / "grid"), "--methods", f"{NAME}:0.25", "--scales", "S", "--datasets", "openwebtext"]) == 0
    planned = [line for line in capsys.readouterr().out.splitlines() if line.startswith("torchrun")]
    assert len(planned) == 1 and f"--connection={NAME} --res_gain=0.25" in planned[0]

    # The tables find the run and name it by the class's title.
    assert tables.main(["--runs_root", str(tmp_path / "runs")]) == 0
    assert "Pre-LN x0.25" in capsys.readouterr().out

    # The Hugging Face export ships the file of a connection's module, which this file cannot be:
    # it imports the training runtime. Refused in one line, before any file is written
    # (tests/test_export_own_module.py exports a connection from a module of its own).
    folder = tmp_path / "hf"
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        export_cli.main(["--ckpt", str(run / "ckpt.pt"), "--out", str(folder)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and not folder.exists()
    assert err.startswith(f"error: Connection {NAME!r} cannot be exported: its module {__file__} imports spheretnorm.hf (line ")
