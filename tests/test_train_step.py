"""The one training step (runtime/step.py) and its loss terms (runtime/loss_terms.py): a z-loss
registered from a module outside the package (tests/zloss_term.py) through --imports reaches
train.py, bench.py and the coordinate check; with no term on, every number is what it was."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

import bench
import train
from markov_data import write_markov_data
from spheretnorm.experiments import coordinates
from spheretnorm.model import GPT, MethodParam
from spheretnorm.runtime.checkpoint import load_checkpoint
from spheretnorm.runtime.cli import UsageError
from spheretnorm.runtime.config import ConfigError, config_help, parse_config
from spheretnorm.runtime.checkpoint import atomic_torch_save
from spheretnorm.runtime.imports import consent_to_recorded_imports
from spheretnorm.runtime.loss_terms import LOSS_TERMS, register_loss_term
from spheretnorm.runtime.run_folder import LossTermError, NonFiniteLossError

# (train_loss, grad_norm) of iterations 1-4 of train_args("pre_ln"), as train.py logged them
# before the step became runtime/step.py (commit 1806087; the same bit for bit on the machine
# they were recorded on, and for bench.py's step and the coordinate check's).
RECORDED = [(3.833540439605713, 1.4995968341827393), (3.835966110229492, 1.2249242067337036),
            (3.741783380508423, 1.0717406272888184), (3.688760995864868, 1.0802361965179443)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_markov_data(tmp_path_factory.mktemp("step_data"))


def forget_z_loss() -> None:
    """tests/zloss_term.py neither imported nor trusted, as in a fresh process (the module stays importable)."""
    LOSS_TERMS.pop("fixture_z_loss", None)
    sys.modules.pop("zloss_term", None)
    consent_to_recorded_imports(False)


@pytest.fixture
def z_loss_module() -> Iterator[None]:
    """tests/zloss_term.py imported by the test (--imports=zloss_term), then gone, as in a fresh process."""
    yield
    forget_z_loss()


def train_args(data_dir: Path, out_dir: Path, *extra: str) -> list[str]:
    return [f"--data_dir={data_dir}", f"--out_dir={out_dir}", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16",
            "--batch_size=4", "--global_batch_size=8", "--eval_iters=2", "--log_interval=1", "--warmup_iters=2",
            "--lr_decay_iters=40", "--learning_rate=3e-3", "--min_lr=3e-4", "--device=cpu", "--dtype=float32",
            "--wandb_log=false", "--max_iters=4", "--eval_interval=4", "--collapse_evals=0", *extra]


def train_rows(out_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["kind"] == "train"]


# -----------------------------------------------------------------------------
# train.py


def test_without_a_loss_term_train_py_logs_the_losses_recorded_before(data_dir: Path, tmp_path: Path) -> None:
    train.main(train_args(data_dir, tmp_path / "run"))
    rows = train_rows(tmp_path / "run")
    assert [(r["train_loss"], r["grad_norm"]) for r in rows] == [pytest.approx(pair, abs=1e-6) for pair in RECORDED]
    assert not any("train_loss_total" in r for r in rows)


def test_a_z_loss_of_ones_own_module_changes_the_trajectory_and_logs_its_total(data_dir: Path, tmp_path: Path, z_loss_module: None) -> None:
    """--fixture_z_loss=0 (the term registered, off) is bit for bit the run without the module; --fixture_z_loss=0.05
    trains otherwise, its train_loss (Table 2's) stays the cross-entropy and the total has a key of its own."""
    train.main(train_args(data_dir, tmp_path / "plain"))
    train.main(train_args(data_dir, tmp_path / "off", "--imports=zloss_term", "--fixture_z_loss=0"))
    train.main(train_args(data_dir, tmp_path / "on", "--imports=zloss_term", "--fixture_z_loss=0.05"))
    plain, off, on = (train_rows(tmp_path / name) for name in ("plain", "off", "on"))
    assert [(r["train_loss"], r["grad_norm"]) for r in off] == [(r["train_loss"], r["grad_norm"]) for r in plain]
    assert not any("train_loss_total" in r for r in off)
    # The first step's cross-entropy is of the same weights and tokens: the logged loss holds no term.
    assert on[0]["train_loss"] == plain[0]["train_loss"]
    assert on[0]["grad_norm"] != plain[0]["grad_norm"] and on[-1]["train_loss"] != plain[-1]["train_loss"]
    assert all(r["train_loss_total"] > r["train_loss"] for r in on)
    recorded = json.loads((tmp_path / "on" / "config.json").read_text())
    assert recorded["loss_params"] == {"fixture_z_loss": 0.05} and recorded["imports"] == ["zloss_term"]
    ckpt = load_checkpoint(tmp_path / "on" / "ckpt.pt")
    assert ckpt["train_config"]["loss_params"] == {"fixture_z_loss": 0.05}


# -----------------------------------------------------------------------------
# A resume of a run with a loss term of its own module (issue 67, item 1)


def test_help_lists_the_keys_of_the_modules_imports_names(z_loss_module: None, capsys: pytest.CaptureFixture) -> None:
    """train.py printed --help before it imported anything, so a loss term's keys were missing (issue 65, item 5)."""
    train.main(["--help"])
    assert "--fixture_z_loss" not in capsys.readouterr().out
    train.main(["--imports=zloss_term", "--help"])
    assert "--fixture_z_loss=0" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="module 'no_such_module_here' could not be imported"):
        train.main(["--imports=no_such_module_here", "-h"])


def z_loss_run(data_dir: Path, out_dir: Path) -> Path:
    """A run trained 2 iterations with --imports=zloss_term --fixture_z_loss=0.05, then the module forgotten."""
    train.main(train_args(data_dir, out_dir, "--imports=zloss_term", "--fixture_z_loss=0.05", "--max_iters=2", "--eval_interval=2"))
    forget_z_loss()
    return out_dir


def resume(data_dir: Path, out_dir: Path, *extra: str) -> None:
    train.main(train_args(data_dir, out_dir, "--init_from=resume", *extra))


def test_a_resume_without_consent_refuses_to_drop_the_recorded_loss_term(data_dir: Path, tmp_path: Path, z_loss_module: None) -> None:
    """The module is importable, but the run records it: without --imports or
    --trust_recorded_imports the resume stops in one sentence naming both, and runs nothing. (Its
    config.json, which a resume starts from since issue 65's one resume rule, is the first reader
    to ask; the checkpoint asks likewise where config.json is gone.)"""
    out = z_loss_run(data_dir, tmp_path / "run")
    with pytest.raises(ConfigError) as refusal:
        resume(data_dir, out)
    message = str(refusal.value)
    assert "config.json' records imports=['zloss_term']" in message and "\n" not in message
    (out / "config.json").unlink()
    with pytest.raises(ConfigError) as refusal:
        resume(data_dir, out)
    message = str(refusal.value)
    assert "(its loss_params fixture_z_loss) records imports=['zloss_term']" in message and "\n" not in message
    assert "--imports=zloss_term" in message and "--trust_recorded_imports=true" in message
    assert "zloss_term" not in sys.modules
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["iter_num"] == 2 and ckpt["train_config"]["loss_params"] == {"fixture_z_loss": 0.05}


def test_with_consent_a_resume_keeps_the_term_or_applies_and_says_its_change(
    data_dir: Path, tmp_path: Path, z_loss_module: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """--trust_recorded_imports=true imports the recorded module; its key then follows the command
    line as every training key does: left out (the run's own 0.05, issue 65's one resume rule)
    the run continues as if it had not stopped (the same losses as the straight run), --fixture_z_loss=0
    turns the term off, said in the changed-keys NOTE. (With
    consent this held before issue 67 too, the checkpoint's reader importing what it records: the
    test keeps the refusal above from costing it.)"""
    train.main(train_args(data_dir, tmp_path / "straight", "--imports=zloss_term", "--fixture_z_loss=0.05"))
    straight = train_rows(tmp_path / "straight")
    forget_z_loss()
    kept = z_loss_run(data_dir, tmp_path / "kept")
    resume(data_dir, kept, "--trust_recorded_imports=true")
    resumed = train_rows(kept)
    assert [r["train_loss_total"] for r in resumed[2:]] == pytest.approx([r["train_loss_total"] for r in straight[2:]], abs=1e-6)
    forget_z_loss()
    off = z_loss_run(data_dir, tmp_path / "off")
    capsys.readouterr()
    resume(data_dir, off, "--trust_recorded_imports=true", "--fixture_z_loss=0")
    assert "fixture_z_loss: 0.05 -> 0.0" in capsys.readouterr().out
    rows = train_rows(off)
    assert [r["iter"] for r in rows] == [1, 2, 3, 4] and not any("train_loss_total" in r for r in rows[2:])
    assert load_checkpoint(off / "ckpt.pt")["train_config"]["loss_params"] == {"fixture_z_loss": 0.0}


def test_with_consent_a_folder_that_lost_its_config_json_gets_its_loss_term_back(data_dir: Path, tmp_path: Path, z_loss_module: None,
                                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The resume rule's write-back (checkpoint.restore_run_config) imports a checkpoint's recorded
    loss-term module with consent, as the resume does: config.json comes back with the term's key."""
    out = z_loss_run(data_dir, tmp_path / "run")
    (out / "config.json").unlink()
    capsys.readouterr()
    resume(data_dir, out, "--trust_recorded_imports=true")
    assert "had no config.json; wrote it from the settings ckpt.pt records (iteration 2)" in capsys.readouterr().out
    restored = json.loads((out / "config.json").read_text())
    assert restored["loss_params"] == {"fixture_z_loss": 0.05}  # the run's own, and the keys the command names changed:
    assert restored["settings_history"] == [{"iter": 2, "changed": {"eval_interval": [2, 4], "max_iters": [2, 4]}}]


def test_a_recorded_loss_key_that_no_module_declares_is_refused(data_dir: Path, tmp_path: Path, z_loss_module: None) -> None:
    """A checkpoint that records the term's keys but not its module: even with consent nothing
    declares them, and the resume says which module to import rather than drop them."""
    out = z_loss_run(data_dir, tmp_path / "run")
    ckpt = load_checkpoint(out / "ckpt.pt")
    atomic_torch_save({**ckpt, "train_config": {**ckpt["train_config"], "imports": []}}, out / "ckpt.pt")
    (out / "config.json").unlink()  # the folder's record of the module gone too (config.json is read first)
    with pytest.raises(ConfigError, match=r"records loss_params \['fixture_z_loss'\], which no registered loss term declares .*--imports=MODULE"):
        resume(data_dir, out, "--trust_recorded_imports=true")


def test_an_evaluation_of_a_z_loss_run_needs_no_consent(data_dir: Path, tmp_path: Path, z_loss_module: None, capsys: pytest.CaptureFixture[str]) -> None:
    """The validation loss is the cross-entropy alone: evaluating the run imports nothing."""
    out = z_loss_run(data_dir, tmp_path / "run")
    capsys.readouterr()
    resume(data_dir, out, "--eval_only=true")
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["val_loss"] > 0
    assert "zloss_term" not in sys.modules


# -----------------------------------------------------------------------------
# A loss term that breaks its contract (issue 67, item 4): one line naming it, not a traceback


@pytest.fixture
def broken_term() -> Iterator[dict[str, Callable[[torch.Tensor], Any]]]:
    """Loss term 'broken', on with --broken=1: its value is what the test puts under "value" makes of the logits."""
    behaviour: dict[str, Callable[[torch.Tensor], Any]] = {}

    @register_loss_term("broken", MethodParam("broken", 0.0, "a faulty term of the tests (0: off)"))
    def broken(logits: torch.Tensor, targets: torch.Tensor, train: Any) -> Any:
        return behaviour["value"](logits)

    yield behaviour
    LOSS_TERMS.pop("broken", None)


def nan_from_call(first_nan: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """A term's value, finite until its first_nan-th call (train_args's steps are two micro-batches each)."""
    calls = []

    def value(logits: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return logits.float().pow(2).mean() * (float("nan") if len(calls) >= first_nan else 1e-3)

    return value


FAULTY_TERMS = {  # what the term returns: (its value of the logits, what the one line says of it)
    "raises": (lambda logits: 1 / 0, "raised ZeroDivisionError: division by zero (at test_train_step.py:"),
    "per_token": (lambda logits: torch.logsumexp(logits.float(), dim=-1), "returned a tensor of shape (4, 16), not the scalar tensor"),
    "none": (lambda logits: None, "returned None, not the scalar tensor"),
    "integer": (lambda logits: torch.tensor(1), "returned a tensor of dtype torch.int64, not the scalar tensor"),
    "nan_at_first_step": (lambda logits: logits.float().mean() * float("nan"), "returned nan at iter 1, this session's first step"),
}


@pytest.mark.parametrize("case", FAULTY_TERMS)
def test_a_faulty_loss_term_stops_the_run_in_one_line_naming_it(case: str, data_dir: Path, tmp_path: Path,
                                                                broken_term: dict[str, Callable[[torch.Tensor], Any]]) -> None:
    """Before: a traceback through the step (raises), torch's "grad can be implicitly created only for
    scalar outputs" (per_token), a run that took None for no term (none) or trained an integer's
    nothing (integer), and "gradient norm became nan" naming no term (nan_at_first_step)."""
    broken_term["value"], said = FAULTY_TERMS[case]
    with pytest.raises(LossTermError) as stopped:
        train.main(train_args(data_dir, tmp_path / "run", "--broken=1"))
    message = str(stopped.value)
    assert message.startswith("loss term 'broken' ") and said in message and message.endswith(" --broken=0.0."), message
    assert "\n" not in message and stopped.value.exit_code == 2  # train.py's status of a bad config
    stop_row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert stop_row["kind"] == "stop" and stop_row["reason"] == "loss_term" and stop_row["message"] == message


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_loss_term_that_becomes_nan_later_is_a_non_finite_loss_naming_it(dtype: str, data_dir: Path, tmp_path: Path,
                                                                           broken_term: dict[str, Callable[[torch.Tensor], Any]]) -> None:
    """Before: "gradient norm became nan at iter 2" under float32, naming no term; under float16 the
    grad scaler skipped every step from there and the run ended 'Done' (status 0) with NaN totals."""
    broken_term["value"] = nan_from_call(3)  # the first micro-batch of iter 2
    with pytest.raises(NonFiniteLossError, match=r"^loss term 'broken' became nan at iter 2; stopping without saving: "):
        train.main(train_args(data_dir, tmp_path / "run", "--broken=1", f"--dtype={dtype}"))


def test_bench_and_the_coordinate_check_say_a_faulty_loss_term_in_one_line(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str],
                                                                          broken_term: dict[str, Callable[[torch.Tensor], Any]]) -> None:
    broken_term["value"] = lambda logits: None
    monkeypatch.setattr(sys, "argv", ["bench.py", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=8", "--vocab_size=48",
                                      "--batch_size=2", "--device=cpu", "--connections=pre_ln", "--steps=1", "--warmup=0", "--broken=1"])
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(str(Path(bench.__file__)), run_name="__main__")
    err = capsys.readouterr().err  # after bench's own progress lines
    assert ended.value.code == 2 and "Traceback" not in err, err
    assert err.splitlines()[-1].startswith("error: loss term 'broken' returned None, not the scalar tensor")
    argv = ["--widths=16,32", "--connections=pre_ln", "--n_layer=1", "--head_dim=8", "--steps=1", "--batch_size=2",
            "--loss_keys=broken=1", f"--data_dir={data_dir}", f"--out={tmp_path / 'coord'}"]
    assert coordinates.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: loss term 'broken' returned None, not the scalar tensor"), err


# -----------------------------------------------------------------------------
# bench.py and the coordinate check


def bench_weights(*extra: str) -> list[torch.Tensor]:
    """The weights after one bench.py step of a tiny Pre-LN model."""
    opts, rest = bench.parse_bench_args(["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=8", "--vocab_size=32",
                                         "--batch_size=2", "--device=cpu", "--connections=pre_ln", *extra])
    parsed = parse_config(rest, world_size=0)
    (variant,) = bench.build_variants(parsed.model_config(), parsed.train, opts, "cpu", "float32")
    variant.step()
    return [p.detach().clone() for p in variant.model.parameters()]


def test_bench_steps_with_the_z_loss(z_loss_module: None) -> None:
    plain = bench_weights()
    off, on = bench_weights("--imports=zloss_term", "--fixture_z_loss=0"), bench_weights("--imports=zloss_term", "--fixture_z_loss=0.05")
    assert all(torch.equal(a, b) for a, b in zip(plain, off))
    assert not all(torch.equal(a, b) for a, b in zip(plain, on))


def coordinate_trace(setup: coordinates.Setup) -> dict:
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(32, (2, 8), generator=g), torch.randint(32, (2, 8), generator=g)) for _ in range(2)]
    probe = torch.randint(32, (2, 8), generator=g)
    torch.manual_seed(0)
    return coordinates.trace(GPT(setup.model_config("pre_ln", 16, 0, 32)), setup, batches, probe)


def test_the_coordinate_check_steps_with_the_z_loss(z_loss_module: None) -> None:
    base = dict(n_layer=1, head_dim=8, block_size=8, batch_size=2, steps=2)
    plain = coordinate_trace(coordinates.Setup(**base))
    with pytest.raises(UsageError, match="'fixture_z_loss', which no registered loss term declares"):
        coordinates.parse_loss_keys("fixture_z_loss=0.05")
    __import__("zloss_term")
    assert coordinates.parse_loss_keys("fixture_z_loss=0.05") == (("fixture_z_loss", 0.05),)
    off = coordinate_trace(coordinates.Setup(**base, loss_keys=(("fixture_z_loss", 0.0),)))
    assert json.dumps(off) == json.dumps(plain)  # NaN (no hidden matrix) included
    assert coordinate_trace(coordinates.Setup(**base, loss_keys=(("fixture_z_loss", 0.05),)))["delta_rms"] != plain["delta_rms"]


def test_the_coordinate_check_takes_loss_keys_as_train_py_does_and_refuses_what_train_py_refuses(z_loss_module: None) -> None:
    """--fixture_z_loss=0.05, not only --loss_keys; an optimizer without a μP rule (one's own Lion) is
    refused before any model is built, as train.py refuses it (issue 65, item 5)."""
    __import__("zloss_term")
    args = coordinates.parse_args(["--widths=16,32", "--fixture_z_loss=0.05"])
    assert coordinates.key_pairs(args.train_keys) == (("fixture_z_loss", 0.05),)
    for bad in (["--bogus=1"], ["stray"], ["--fixture_z_loss=-1"]):
        with pytest.raises(UsageError):
            coordinates.key_pairs(bad)
    __import__("lion_optimizer")
    setup = coordinates.Setup(n_layer=1, head_dim=8)
    coordinates.check_optimizers(("adamw", "muon"), setup, ["pre_ln"], [16, 32])  # each has its μP rule
    with pytest.raises(UsageError, match="--optimizers fixture_lion: mup_base_width=16 asks for μP, which has no rule for optimizer 'fixture_lion'"):
        coordinates.check_optimizers(("fixture_lion",), setup, ["pre_ln"], [16, 32])
    assert coordinates.main(["--widths=16,32", "--head_dim=8", "--optimizers=fixture_lion", "--steps=1"]) == 2


# -----------------------------------------------------------------------------
# The key and the registry


def test_the_key_is_declared_once_listed_and_checked(z_loss_module: None) -> None:
    with pytest.raises(ConfigError, match="Unknown config key 'fixture_z_loss'"):
        parse_config(["--fixture_z_loss=0.1"])
    parsed = parse_config(["--imports=zloss_term", "--fixture_z_loss=0.1"])
    assert parsed.train.fixture_z_loss == 0.1 and parsed.train.loss_params == {"fixture_z_loss": 0.1}
    assert "fixture_z_loss" not in parsed.model_keys and parsed.overrides == {"imports": ["zloss_term"], "fixture_z_loss": 0.1}
    assert "(loss term fixture_z_loss)" in config_help()
    with pytest.raises(ConfigError, match=r"^fixture_z_loss must be >= 0, got -1.0.$"):
        parse_config(["--imports=zloss_term", "--fixture_z_loss=-1"])


@pytest.mark.parametrize("key, owner", [("learning_rate", "training"), ("muon_lr", "optimizer 'muon'"), ("spheret_p", "connection 'p_spheret'")])
def test_a_term_may_not_take_anothers_key(key: str, owner: str) -> None:
    with pytest.raises(ValueError, match=f"declares \\['{key}'\\], already keys of .*{owner}"):
        register_loss_term("stolen", MethodParam(key, 0.0, "a key that is taken"))(lambda logits, targets, train: logits.sum())
    assert "stolen" not in LOSS_TERMS
