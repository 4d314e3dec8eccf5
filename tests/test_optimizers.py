"""The optimizer table (spheretnorm/optim.py): Muon's maths against an SVD and against
torch.optim.Muon, which parameters each optimizer owns, bad input, and a third optimizer
registered from a test module (tests/toy_optimizer.py) that trains, resumes, names its folder,
its W&B run and its table rows, and is told apart on reuse with no other edit.
FSDP2 (the whole-matrix orthogonalisation across ranks, sharded checkpoints): tests/test_fsdp.py."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

import toy_optimizer  # noqa: F401 (registers toy_sgd)
import train
from spheretnorm.experiments import grid
from spheretnorm.model import GPT, GPTConfig
from spheretnorm.optim import OPTIMIZERS, Muon, build_optimizer, newton_schulz
from spheretnorm.runtime.checkpoint import load_checkpoint
from spheretnorm.runtime.run_folder import earlier_run
from spheretnorm.runtime.config import ConfigError, config_help, parse_config
from spheretnorm.runtime.identity import run_conflicts, run_settings
from spheretnorm.runtime.methods import default_out_dir, resolve_paths, resolve_wandb_names
from test_train import data_dir, read_metrics, tiny_args, train_curves  # noqa: F401 (data_dir: a fixture)

# Tiny tensors: one thread each is many times faster on a shared two-core machine (conftest.one_thread),
# which keeps README's install check quick where other work holds the cores.
pytestmark = pytest.mark.usefixtures("one_thread")

# The quintic Newton-Schulz of Muon (coefficients 3.4445, -4.7750, 2.0315) does not converge to 1:
# after 5 steps every singular value of a matrix of full rank lies in about [0.68, 1.14].
NS_BAND = (0.6, 1.2)


@pytest.mark.parametrize("shape", [(64, 32), (32, 64), (48, 48)])
def test_newton_schulz_is_the_svds_orthogonal_factor_within_its_band(shape: tuple[int, int]) -> None:
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    x = newton_schulz(g, 5, torch.float64)
    # x = U f(S) V^T: the same singular vectors as g (U^T x V diagonal), the values in the band.
    core = u.T @ x @ vh.T
    off_diagonal = core - torch.diag(core.diagonal())
    assert off_diagonal.abs().max() < 1e-6
    assert NS_BAND[0] < core.diagonal().min() and core.diagonal().max() < NS_BAND[1]
    orthogonal = u @ vh
    assert (x - orthogonal).norm() / orthogonal.norm() < 0.35
    assert x.dtype == g.dtype and x.shape == g.shape


def test_muon_steps_as_torch_optim_muon_does() -> None:
    """The same maths as torch's Muon (momentum EMA, Nesterov, bf16 Newton-Schulz, decoupled decay,
    the 'original' shape factor), over three steps of two matrix shapes."""
    gen = torch.Generator().manual_seed(1)
    weights = [torch.randn(24, 16, generator=gen), torch.randn(16, 40, generator=gen)]
    ours = [torch.nn.Parameter(w.clone()) for w in weights]
    theirs = [torch.nn.Parameter(w.clone()) for w in weights]
    mine = Muon(ours, lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, ns_steps=5, shape_rule="original", ns_dtype=torch.bfloat16)
    reference = torch.optim.Muon(theirs, lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, ns_steps=5, adjust_lr_fn="original")
    for _ in range(3):
        grads = [torch.randn(w.shape, generator=gen) for w in weights]
        for params, opt in ((ours, mine), (theirs, reference)):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_one_muon_step_follows_the_written_update() -> None:
    """From no momentum, W1 = (1 - lr wd) W0 - lr sqrt(max(1, out/in)) NS(g): the momentum only
    scales g, which the orthogonalisation forgets."""
    gen = torch.Generator().manual_seed(2)
    w0, g = torch.randn(40, 16, generator=gen, dtype=torch.float64), torch.randn(40, 16, generator=gen, dtype=torch.float64)
    p = torch.nn.Parameter(w0.clone())
    p.grad = g.clone()
    Muon([p], lr=0.05, weight_decay=0.1, momentum=0.9, nesterov=True, ns_steps=5, shape_rule="original").step()
    expected = (1 - 0.05 * 0.1) * w0 - 0.05 * math.sqrt(40 / 16) * newton_schulz(g, 5, torch.float64)
    torch.testing.assert_close(p.detach(), expected, atol=1e-12, rtol=0)


def tiny_model(**keys) -> GPT:
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, **keys))


@pytest.mark.parametrize("block,connection", [("gpt2", "pre_ln"), ("llama", "p_spheret"), ("gpt2", "ngpt")])
def test_muon_owns_the_block_matrices_and_adamw_the_rest(block: str, connection: str) -> None:
    model = tiny_model(block=block, connection=connection)
    opt = build_optimizer(model, parse_config(["--optimizer=muon"], world_size=0).train)
    muon, adamw = opt.optimizers
    name = {id(p): n for n, p in model.named_parameters()}
    in_blocks = re.compile(r"^transformer\.h\.\d+\.")  # the block matrices: attention and MLP weights
    expected = {n for n, p in model.named_parameters() if p.dim() == 2 and in_blocks.match(n)}
    assert {name[id(p)] for g in muon.param_groups for p in g["params"]} == expected
    assert {name[id(p)] for g in adamw.param_groups for p in g["params"]} == set(name.values()) - expected
    # Every group scales its own peak rate; Muon's is muon_lr.
    assert all(g["peak_lr"] == 0.02 for g in muon.param_groups)
    decays = {g["weight_decay"] for g in muon.param_groups}
    assert decays == ({0.0} if connection == "ngpt" else {0.1})  # nGPT decays nothing


def test_adamw_is_the_default_and_one_torch_adamw() -> None:
    opt = build_optimizer(tiny_model(), parse_config([], world_size=0).train)
    (inner,) = opt.optimizers
    assert type(inner) is torch.optim.AdamW and opt.state_dict() == inner.state_dict()


@pytest.mark.parametrize("argv,message", [
    (["--muon_lr=0.01"], "muon_lr is a key of optimizer 'muon', not of optimizer 'adamw' (its keys: none); drop it or set optimizer=muon."),
    (["--optimizer=sgd_nope"], "optimizer='sgd_nope' is not valid. Choose one of: adamw, muon"),  # a name no test registers
    (["--optimizer=muon", "--muon_momentum=1"], "muon_momentum must be in [0, 1), got 1.0."),
    (["--optimizer=muon", "--muon_ns_steps=0"], "muon_ns_steps must be an integer from 1 to 50, got 0."),
    (["--optimizer=muon", "--muon_shape_scale=spectral"], "muon_shape_scale must be one of: original, match_rms_adamw, none, got spectral."),
    (["--optimizer=toy_sgd", "--mup_base_width=16"], "mup_base_width=16 asks for μP, which has no rule for optimizer 'toy_sgd'"),
    (["--optimizer=muonh", "--hyperball_radius=-1"], "hyperball_radius must be >= 0 and finite, got -1.0."),
    (["--optimizer=adamh", "--hyperball_lr=1.5"], "hyperball_lr must be in (0, 1], got 1.5."),
    (["--optimizer=adamh", "--muon_momentum=0.9"], "muon_momentum is a key of optimizer 'muon' and 'muonh', not of optimizer 'adamh'"),
    (["--optimizer=muonh", "--connection=ngpt"], "connection 'ngpt' renormalises its matrices after every step, which undoes MuonH's fixed Frobenius radius"),
    (["--optimizer=muon", "--fresh_optimizer=true"], "fresh_optimizer=true drops a resumed checkpoint's optimizer state, but init_from='scratch' resumes nothing"),
])
def test_bad_optimizer_keys_are_one_sentence(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(argv, world_size=0)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_help_lists_every_optimizers_keys() -> None:
    text = config_help()
    for key in ("--optimizer=adamw", "--muon_lr=0.02", "--muon_ns_steps=5", "--toy_momentum=0.9"):
        assert key in text, key


def test_a_resume_keeps_its_optimizer(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    train.main(tiny_args(data_dir, out, "--optimizer=muon", "--max_iters=2", "--eval_interval=2"))
    with pytest.raises(ConfigError) as info:
        train.main(tiny_args(data_dir, out, "--optimizer=adamw", "--max_iters=4", "--init_from=resume"))
    assert str(info.value) == (
        "Refusing to resume with optimizer='adamw': the checkpoint was trained with optimizer='muon', whose state does "
        "not carry over; pass --optimizer=muon to resume it, --fresh_optimizer=true to resume the weights with a new "
        "optimizer state, or start another out_dir."
    )
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 2  # nothing written
    rows = (out / "metrics.jsonl").read_text().splitlines()
    train.main(tiny_args(data_dir, out, "--optimizer=muon", "--max_iters=4", "--eval_interval=2", "--init_from=resume"))
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 4 and len((out / "metrics.jsonl").read_text().splitlines()) > len(rows)
    # Asked for, a fresh optimizer state: the weights and the iteration carry on under MuonH, whose
    # radii are the matrices' norms where it starts.
    weights = load_checkpoint(out / "ckpt.pt")["model"]
    train.main(tiny_args(data_dir, out, "--optimizer=muonh", "--max_iters=6", "--eval_interval=2", "--init_from=resume",
                         "--fresh_optimizer=true"))
    after = load_checkpoint(out / "ckpt.pt")
    assert after["train_config"]["optimizer"] == "muonh" and after["iter_num"] == 6
    matrices = [k for k, w in weights.items() if w.dim() == 2 and ".h." in k]
    radii = sorted(s["radius"].item() for s in after["optimizer"]["optimizers"][0]["state"].values())
    assert radii == pytest.approx(sorted(weights[k].norm().item() for k in matrices), rel=1e-6)
    assert sorted(after["model"][k].norm().item() for k in matrices) == pytest.approx(radii, rel=1e-5)


# -----------------------------------------------------------------------------
# A third optimizer from a test module: one entry, no other edit


def test_a_registered_optimizer_trains_and_resumes_exactly(data_dir: Path, tmp_path: Path) -> None:
    common = ("--optimizer=toy_sgd", "--toy_momentum=0.5", "--eval_interval=3", "--learning_rate=0.3", "--min_lr=0.03")
    straight, split = tmp_path / "straight", tmp_path / "split"
    train.main(tiny_args(data_dir, straight, "--max_iters=6", *common))
    train.main(tiny_args(data_dir, split, "--max_iters=3", *common))
    train.main(tiny_args(data_dir, split, "--max_iters=6", "--init_from=resume", *common))
    assert train_curves(split) == train_curves(straight) and sorted(train_curves(split)) == list(range(1, 7))
    losses = [r["val_loss"] for r in read_metrics(straight, "eval")]
    assert losses[-1] < losses[0]  # it learns
    state = load_checkpoint(straight / "ckpt.pt")
    assert state["train_config"]["optimizer"] == "toy_sgd" and state["train_config"]["optimizer_params"] == {"toy_momentum": 0.5}
    assert all("momentum_buffer" in s for s in state["optimizer"]["state"].values())


def test_a_registered_optimizers_key_names_the_folder_the_wandb_run_and_the_row(tmp_path: Path) -> None:
    parsed = parse_config(["config/openwebtext_s.py", "--optimizer=toy_sgd", "--toy_momentum=0.5"], world_size=1)
    folder = default_out_dir(parsed.train.config_name, parsed.model_config(), parsed.overrides)
    assert folder == str(Path("out", "openwebtext_s", "pre_ln+optimizer=toy_sgd+toy_momentum=0.5"))
    train_cfg = resolve_wandb_names(resolve_paths(parsed.train, parsed.model_config(), parsed.overrides), parsed.model_config())
    assert train_cfg.wandb_run_name == "openwebtext_s/pre_ln+optimizer=toy_sgd+toy_momentum=0.5"
    # Reuse: a folder of the same optimizer with another momentum is another run.
    saved = {**json.loads(json.dumps(run_settings(parsed))), "optimizer_params": {"toy_momentum": 0.5}}
    other = parse_config(["config/openwebtext_s.py", "--optimizer=toy_sgd", "--toy_momentum=0.7"], world_size=1)
    assert run_conflicts(saved, run_settings(parsed)) == []
    assert run_conflicts(saved, run_settings(other)) == ["toy_momentum: the run has 0.5, asked for 0.7"]
    # Restart: a folder holding only the start of a run with another momentum is another run's.
    folder = tmp_path / "started"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(saved))
    assert earlier_run(folder, run_settings(parsed)) is None
    assert "with other settings (toy_momentum: the run has 0.5, asked for 0.7)" in earlier_run(folder, run_settings(other))
    # Tables: two runs of pre_ln differing in the key are two rows named by it.
    flat = {k: v for k, v in saved.items() if k != "toy_momentum"}  # config.json nests an optimizer's keys
    runs = [grid.Run(tmp_path / str(m), {**flat, "optimizer_params": {"toy_momentum": m}, "method": "pre_ln"}, [], None) for m in (0.5, 0.7)]
    assert sorted(run.row for run in grid.index_runs(runs).values()) == ["pre_ln, toy_momentum=0.5", "pre_ln, toy_momentum=0.7"]
    assert grid.row_label("pre_ln, toy_momentum=0.5") == "Pre-LN, toy_momentum=0.5"


def test_the_optimizer_table_holds_the_shipped_entries_first() -> None:
    assert list(OPTIMIZERS)[:2] == ["adamw", "muon"] and "toy_sgd" in OPTIMIZERS


def test_an_optimizer_key_may_not_shadow_another_key() -> None:
    from spheretnorm.model import MethodParam
    from spheretnorm.optim import OptimizerRecipe, register_optimizer

    for key, owner in (("muon_lr", "optimizer 'muon'"), ("n_embd", "the model"), ("spheret_p", "the model")):
        with pytest.raises(ValueError, match=rf"optimizer 'shadow' declares \['{key}'\], already keys of {owner}"):
            register_optimizer("shadow")(type("Shadow", (OptimizerRecipe,), {"params": (MethodParam(key, 0.1, "x"),)}))
    assert "shadow" not in OPTIMIZERS


def test_a_studys_train_overrides_take_every_optimizers_keys() -> None:
    """The studies pass --key=value on to train.py: an optimizer's key (a shipped one, and one
    registered from this test module) is a train.py key there too."""
    overrides = ["--optimizer=toy_sgd", "--toy_momentum=0.5", "--hyperball_radius=1"]
    assert grid.check_overrides(overrides, {}) == overrides
    with pytest.raises(Exception, match="--toy_momentu is neither"):
        grid.check_overrides(["--toy_momentu=0.5"], {})


def test_a_train_row_shows_each_groups_own_rate_where_it_is_not_learning_rates(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Under Muon the matrices step at muon_lr's schedule, not learning_rate's (issue 65, item 5):
    the row's group_lrs holds both, in the ratio of the two peaks; an AdamW run's rows are as before."""
    train.main(tiny_args(data_dir, tmp_path / "muon", "--optimizer=muon", "--muon_lr=0.02", "--learning_rate=1e-3", "--max_iters=2", "--eval_interval=2"))
    rows = read_metrics(tmp_path / "muon", "train")
    assert rows and all(sorted(r["group_lrs"]) == pytest.approx(sorted([r["lr"], r["lr"] * 20])) for r in rows)
    assert "(groups " in capsys.readouterr().out
    train.main(tiny_args(data_dir, tmp_path / "adamw", "--max_iters=2", "--eval_interval=2"))
    assert not any("group_lrs" in r for r in read_metrics(tmp_path / "adamw", "train"))
    assert "(groups " not in capsys.readouterr().out
