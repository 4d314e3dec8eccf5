"""The loss-term contract (issue 65, item 5): tests generated for every registered loss term (a
user's module too: `python -m pytest tests/test_loss_term_contract.py --imports=my_module`,
docs/ARCHITECTURE.md, "Adding a loss term"): at its default the term is a run without it bit for
bit, switched on it changes the losses within 3 steps, a 2+2 resume with it on is bit-exact, and
each of its keys changed on resume is applied and said, as the resume rule says of every loss key."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

import train
from markov_data import write_markov_data
from resume_pairs import resumed_pairs
from spheretnorm.model import MethodParam
from spheretnorm.runtime.config import RESUME_FIXED_KEYS
from spheretnorm.runtime.loss_terms import LOSS_TERMS, register_loss_term
from spheretnorm.runtime.checkpoint import load_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

# The optimizer contract's tiny model (tests/test_optimizer_contract.py), on the Markov data.
TINY = ("--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4", "--global_batch_size=8",
        "--eval_iters=1", "--log_interval=1", "--warmup_iters=2", "--lr_decay_iters=40", "--learning_rate=3e-3",
        "--min_lr=3e-4", "--device=cpu", "--dtype=float32", "--wandb_log=false", "--eval_interval=100")
ROW_KEYS = ("train_loss", "train_loss_total", "grad_norm")  # what a train row says of the step (not its timing)


# -----------------------------------------------------------------------------
# The fixture term (tests/zloss_term.py), registered for this module's tests only


def fixture_term(module_name: str = "zloss_term") -> tuple[Any, str, Any]:
    """The fixture module, the name of the term it registers and the term, imported for
    collection, then the registry and sys.modules left as they were: tests/test_train_step.py
    checks what a process that never imported it sees (--help without --fixture_z_loss)."""
    had_module = module_name in sys.modules
    before = set(LOSS_TERMS)
    module = importlib.import_module(module_name)
    name = next(n for n, fn in LOSS_TERMS.items() if fn.__module__ == module_name)
    term = LOSS_TERMS[name]
    if name not in before:
        del LOSS_TERMS[name]
    if not had_module:
        del sys.modules[module_name]
    return module, name, term


FIXTURE_MODULE, FIXTURE_NAME, FIXTURE_TERM = fixture_term()
TERMS = sorted({*LOSS_TERMS, FIXTURE_NAME})  # every registered term: the fixture's, and --imports=MODULE's


@pytest.fixture(scope="module", autouse=True)
def fixture_term_registered() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, FIXTURE_MODULE.__name__, FIXTURE_MODULE)
        patch.setitem(LOSS_TERMS, FIXTURE_NAME, FIXTURE_TERM)
        yield


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_markov_data(tmp_path_factory.mktemp("loss_contract_data"))


def run(data_dir: Path, out: Path, *extra: str) -> list[dict[str, Any]]:
    """Train in this process; the train rows it logged (this session's and earlier ones'), their ROW_KEYS."""
    train.main([f"--data_dir={data_dir}", f"--out_dir={out}", *TINY, *extra])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in ROW_KEYS if k in r} for r in rows if r["kind"] == "train"]


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(out / "ckpt.pt")["model"]


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# -----------------------------------------------------------------------------
# The values the contract trains with, from the term's declared keys


def switch(term: str) -> MethodParam:
    """The key that switches `term` on (its first: runtime/loss_terms.py)."""
    return LOSS_TERMS[term].params[0]


def declared(term: str, key: str) -> MethodParam:
    return next(p for p in LOSS_TERMS[term].params if p.key == key)


def as_arg(key: str, value: Any) -> str:
    return f"--{key}={str(value).lower() if isinstance(value, bool) else value}"


def candidate_values(param: MethodParam, value: Any) -> list[Any]:
    """Other values of param's key to try, in order: the other boolean, the next integer, a tenth
    and other powers of ten for a number at 0 (a weight, off), half or twice any other number,
    another of the choices a text key lists (must='one of: a, b')."""
    kind = param.kind or type(value)
    if kind is bool:
        return [not value]
    if kind is int:
        return [1, -1] if value is None else [value + 1, value - 1]
    if kind is float:
        return [0.1, 0.01, 1.0, 1e-3, -0.1] if not value else [value / 2, value * 2]
    choices = param.must.partition("one of:")[2]
    return [c.strip() for c in choices.split(",") if c.strip() and c.strip() != value]


def changed_value(param: MethodParam, value: Any) -> Any:
    """The first candidate that param accepts and that differs from value; None if none is known."""
    for candidate in candidate_values(param, value):
        try:
            if param.checked(candidate) != value:
                return candidate
        except ValueError:
            continue
    return None


def on_value(term: str) -> Any:
    """The switch's value that turns `term` on in these tests: the one it declares
    (register_loss_term's contract_value), else one derived from the switch's default."""
    declared_value = getattr(LOSS_TERMS[term], "contract_value", None)
    value = declared_value if declared_value is not None else changed_value(switch(term), switch(term).default)
    if value is None:
        pytest.skip(f"no value that switches {term} on is known: give @register_loss_term({term!r}, ..., contract_value=...)")
    return value


def on_args(term: str) -> tuple[str, ...]:
    return (as_arg(switch(term).key, on_value(term)),)


# -----------------------------------------------------------------------------
# 1. Off at its default, bit for bit; 2. on, it changes the losses within 3 steps


@pytest.fixture(scope="module")
def without_terms(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """A 3-step run with no loss term registered at all (as before any existed): its folder and rows."""
    out = tmp_path_factory.mktemp("without_terms") / "run"
    with pytest.MonkeyPatch.context() as patch:
        for name in list(LOSS_TERMS):
            patch.delitem(LOSS_TERMS, name)
        rows = run(data_dir, out, "--max_iters=3")
    return out, rows


@pytest.mark.parametrize("term", TERMS)
def test_at_its_default_the_term_trains_as_a_run_without_it_bit_for_bit(
    term: str, data_dir: Path, tmp_path: Path, without_terms: tuple[Path, list[dict[str, Any]]]
) -> None:
    plain_dir, plain = without_terms
    off = run(data_dir, tmp_path, as_arg(switch(term).key, switch(term).default), "--max_iters=3")
    assert off == plain  # the same losses and gradient norms, and no train_loss_total: nothing added
    assert same_weights(tmp_path, plain_dir)


@pytest.mark.parametrize("term", TERMS)
def test_switched_on_the_term_changes_the_losses_within_3_steps(
    term: str, data_dir: Path, tmp_path: Path, without_terms: tuple[Path, list[dict[str, Any]]]
) -> None:
    on = run(data_dir, tmp_path, *on_args(term), "--max_iters=3")
    plain = without_terms[1]
    assert [r["train_loss"] for r in on] != [r["train_loss"] for r in plain], f"{term} on changed no loss in 3 steps"
    assert all("train_loss_total" in r for r in on)  # the loss the gradient is of, logged where a term is on


# -----------------------------------------------------------------------------
# 3. A 2+2 resume with the term on is 4 straight iterations, bit for bit


@pytest.mark.parametrize("term", TERMS)
def test_a_2_plus_2_resume_with_the_term_on_is_bit_exact(term: str, data_dir: Path, tmp_path: Path) -> None:
    common = (*on_args(term), "--dropout=0.1")  # dropout: the RNG streams resume too
    whole = run(data_dir, tmp_path / "whole", *common, "--max_iters=4")
    run(data_dir, tmp_path / "split", *common, "--max_iters=2")
    split = run(data_dir, tmp_path / "split", *common, "--max_iters=4", "--init_from=resume")
    assert split == whole
    assert same_weights(tmp_path / "split", tmp_path / "whole")


# -----------------------------------------------------------------------------
# 4. A changed key on resume: applied and said
#
# The code's rule: a resume refuses only the keys whose state would not carry over
# (RESUME_FIXED_KEYS, identity.check_resume_keys; an optimizer's own resume_fixed). A loss term
# holds no state (a function of the step's logits) and may declare no training key
# (check_registration), so every change of its keys is applied from the next step on and named in
# the changed-keys NOTE (with_recorded_loss_terms, identity.resume_changes). The switch is tried
# both ways: turned off, and at another value that keeps the term on.


def resume_values(term: str) -> list[tuple[str, Any]]:
    """(key, value) for each change a resume of the term's on-run is tried with."""
    key = switch(term).key
    values = [(key, switch(term).default)]
    other_on = changed_value(switch(term), on_value(term))
    if other_on is not None and other_on != switch(term).default:
        values.append((key, other_on))
    for param in LOSS_TERMS[term].params[1:]:
        value = changed_value(param, param.default)
        if value is not None:
            values.append((param.key, value))
    return values


def resume_cases() -> list[tuple[str, str, Any]]:
    cases = []
    for term in TERMS:
        try:
            cases += [(term, key, value) for key, value in resume_values(term)]
        except pytest.skip.Exception:  # no on-value known: the tests above say so, once per test
            continue
    return cases


def collected_cases() -> list[tuple[str, str, Any]]:
    """resume_cases with the fixture term registered (collection runs outside fixture_term_registered)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(LOSS_TERMS, FIXTURE_NAME, FIXTURE_TERM)
        return resume_cases()


RESUME_CASES = collected_cases()


@pytest.fixture(scope="module")
def two_steps(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """Per term, once: a folder trained 2 steps with the term on, and a copy resumed for a 3rd step unchanged."""
    return resumed_pairs(run, data_dir, tmp_path_factory, on_args)


@pytest.mark.parametrize("term,key,value", RESUME_CASES, ids=[f"{t}-{k}={v}" for t, k, v in RESUME_CASES])
def test_a_changed_key_on_resume_is_applied_and_said(term: str, key: str, value: Any, data_dir: Path, tmp_path: Path,
                                                     two_steps: Callable[[str], tuple[Path, Path]],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert key not in RESUME_FIXED_KEYS  # the rule above: were a loss key ever fixed, this test would test its refusal
    saved, unchanged = two_steps(term)
    out = tmp_path / "run"
    shutil.copytree(saved, out)
    before = load_checkpoint(saved / "ckpt.pt")["train_config"]["loss_params"][key]
    capsys.readouterr()
    rows = run(data_dir, out, *on_args(term), as_arg(key, value), "--max_iters=3", "--init_from=resume")
    assert f"{key}: {before!r} -> {declared(term, key).checked(value)!r}" in capsys.readouterr().out  # the NOTE says it
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["iter_num"] == 3 and ckpt["train_config"]["loss_params"][key] == declared(term, key).checked(value)
    turned_off = key == switch(term).key and value == switch(term).default
    assert ("train_loss_total" in rows[2]) != turned_off  # the third step with the term on, or off as asked
    assert not same_weights(out, unchanged), f"{key}={value} on resume changed nothing in {term}'s step"


# -----------------------------------------------------------------------------
# A term's own value for the contract (register_loss_term's contract_value)


def test_a_term_may_declare_the_value_the_contract_trains_it_with() -> None:
    key = MethodParam("fixture_mode", "off", "a text switch the tests cannot derive an on-value of")
    try:
        register_loss_term("fixture_mode_term", key, contract_value="hinge")(lambda logits, targets, train: logits.sum() * 0)
        assert on_value("fixture_mode_term") == "hinge"
    finally:
        LOSS_TERMS.pop("fixture_mode_term", None)


def test_a_contract_value_that_leaves_the_term_off_is_refused_in_one_sentence() -> None:
    key = MethodParam("fixture_weight", 0.0, "a weight (0: off)", check=lambda v: v >= 0, must=">= 0")
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError) as refused:
            register_loss_term("fixture_weight_term", key, contract_value=bad)
        message = str(refused.value)
        assert f"contract_value={bad!r}" in message and "fixture_weight other than its default 0.0" in message and "\n" not in message
    assert "fixture_weight_term" not in LOSS_TERMS
