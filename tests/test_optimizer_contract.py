"""The optimizer contract (issue 47): every group's rate is its own peak scaled by the schedule,
a resume trains under the current settings (or refuses a key the state fixes), checkpoints load
with plain torch.load, and tests generated for every registered optimizer (a user's module too:
`python -m pytest tests/test_optimizer_contract.py --imports=my_module`, docs/OPTIMIZERS.md):
its rate key moves the loss within 3 steps, a 2+2 resume is bit-exact, each of its keys changed
on resume is applied or refused as the code's table says, and 2 FSDP ranks train as one process."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

import lion_optimizer  # noqa: F401 (registers fixture_lion, with its own rate key fixture_lion_lr)
import train
from markov_data import write_markov_data
from resume_pairs import resumed_pairs
from spheretnorm.cluster import grid_plan, grid_runs
from spheretnorm.model import CONNECTIONS, GPT, GPTConfig
from spheretnorm.mup import lr_scale, param_kind
from spheretnorm.optim import OPTIMIZERS, build_optimizer, group_settings
from spheretnorm.runtime.checkpoint import rng_from_plain, rng_to_plain
from spheretnorm.runtime.checkpoint import load_checkpoint
from spheretnorm.runtime.cli import UsageError
from spheretnorm.runtime.config import OPTIMIZER_FIELDS, RESUME_FIXED_KEYS, ConfigError, TrainConfig, config_from_dict, parse_config
from spheretnorm.runtime.device import rng_state, set_rng_state
from spheretnorm.runtime.schedule import apply_schedule, learning_rate_at

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = Path(__file__).resolve().parent.parent

TINY = ("--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4", "--global_batch_size=8",
        "--eval_iters=1", "--log_interval=1", "--warmup_iters=2", "--lr_decay_iters=40", "--learning_rate=3e-3",
        "--min_lr=3e-4", "--device=cpu", "--dtype=float32", "--wandb_log=false", "--eval_interval=100")
# Keys an optimizer needs in these tests beyond its defaults (MuonH at its initial radius barely moves a tiny model).
EXTRA = {"muonh": ("--hyperball_radius=1",)}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_markov_data(tmp_path_factory.mktemp("contract_data"))


def run(data_dir: Path, out: Path, *extra: str) -> list[float]:
    """Train in this process; the train losses it logged (this session's and earlier ones')."""
    train.main([f"--data_dir={data_dir}", f"--out_dir={out}", *TINY, *extra])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["train_loss"] for r in rows if r["kind"] == "train"]


def saved_groups(out: Path, inner: int | None = None) -> list[dict[str, Any]]:
    """The optimizer's param groups in the checkpoint (those the run trained with last); inner:
    those of one inner optimizer only (Muon's: 0)."""
    state = load_checkpoint(out / "ckpt.pt")["optimizer"]
    states = state.get("optimizers", [state])
    return [g for s in (states if inner is None else states[inner:inner + 1]) for g in s["param_groups"]]


# -----------------------------------------------------------------------------
# 1. Each group scales its own peak rate


def test_a_users_optimizer_trains_at_its_own_rate_key(data_dir: Path, tmp_path: Path) -> None:
    slow = run(data_dir, tmp_path / "slow", "--optimizer=fixture_lion", "--fixture_lion_lr=1e-5", "--max_iters=3")
    fast = run(data_dir, tmp_path / "fast", "--optimizer=fixture_lion", "--fixture_lion_lr=3e-2", "--max_iters=3")
    assert slow[0] == fast[0] and slow[2] != fast[2]  # the same start, then fixture_lion_lr decides
    factor = learning_rate_at(2, TrainConfig(learning_rate=3e-3, min_lr=3e-4, warmup_iters=2, lr_decay_iters=40)) / 3e-3
    assert all(g["lr"] == pytest.approx(3e-2 * factor, rel=1e-12) for g in saved_groups(tmp_path / "fast"))


def old_rate(group: dict[str, Any], names: dict[int, str], step: int, cfg: TrainConfig, model: GPT, hidden_peak: float | None) -> float:
    """A group's rate by the schedule of earlier commits: learning_rate_at(step) * lr_scale, with
    lr_scale the μP factor of an AdamW group, or (peak * μP factor) / learning_rate of a hidden one."""
    ratio, p = model.config.mup_ratio, group["params"][0]
    kind = param_kind(names[id(p)], p)
    if hidden_peak is not None:
        step_rule = OPTIMIZERS[cfg.optimizer].hidden_step(cfg.optimizer_params)
        scale = hidden_peak * (lr_scale("hidden", ratio, step_rule) if ratio != 1.0 else 1.0) / cfg.learning_rate
    else:
        rule = CONNECTIONS[model.config.connection].optimizer_rule(names[id(p)], p)
        scale = (lr_scale(kind, ratio) if ratio != 1.0 else 1.0) * rule.lr_factor
    return learning_rate_at(step, cfg) * scale


@pytest.mark.parametrize("optimizer", ["adamw", "muon", "adamh", "muonh"])
@pytest.mark.parametrize("width,base", [(32, 0), (72, 8)])  # μP at 1/9: (lr / 9) / lr is not 1/9 at lr 1.1e-3
def test_built_in_optimizers_keep_every_rate_of_earlier_commits_bit_for_bit(optimizer: str, width: int, base: int) -> None:
    cfg = parse_config([f"--optimizer={optimizer}", "--learning_rate=1.1e-3", "--min_lr=1.1e-4", "--warmup_iters=10",
                        "--lr_decay_iters=100"], world_size=0).train
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=width, block_size=16, vocab_size=64, mup_base_width=base))
    opt = build_optimizer(model, cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    inner = list(opt)
    for step in (0, 3, 9, 10, 37, 99, 150):
        apply_schedule(opt.param_groups, step, cfg)
        for i, o in enumerate(inner):
            peak = cfg.optimizer_params.get(OPTIMIZERS[optimizer].rate_key) if i == 0 and len(inner) > 1 else None
            assert [g["lr"] for g in o.param_groups] == [old_rate(g, names, step, cfg, model, peak) for g in o.param_groups]


# -----------------------------------------------------------------------------
# 2. A resume applies the current settings, or refuses


def test_a_resume_applies_changed_weight_decay_and_beta2(data_dir: Path, tmp_path: Path) -> None:
    run(data_dir, tmp_path, "--max_iters=2")
    run(data_dir, tmp_path, "--max_iters=4", "--init_from=resume", "--weight_decay=0.5", "--beta2=0.5")
    groups = saved_groups(tmp_path)
    assert sorted(g["weight_decay"] for g in groups) == [0.0, 0.5] and {tuple(g["betas"]) for g in groups} == {(0.9, 0.5)}
    recorded = json.loads((tmp_path / "config.json").read_text())
    assert recorded["weight_decay"] == 0.5 and recorded["beta2"] == 0.5


def test_a_changed_learning_rate_on_resume_leaves_muons_rate_at_muon_lr(data_dir: Path, tmp_path: Path) -> None:
    run(data_dir, tmp_path, "--optimizer=muon", "--max_iters=2")
    run(data_dir, tmp_path, "--optimizer=muon", "--max_iters=4", "--init_from=resume", "--learning_rate=6e-3", "--muon_momentum=0.8")
    muon = saved_groups(tmp_path, inner=0)
    factor = learning_rate_at(3, TrainConfig(learning_rate=6e-3, min_lr=3e-4, warmup_iters=2, lr_decay_iters=40)) / 6e-3
    assert [g["lr"] for g in muon] == pytest.approx([0.02 * factor] * len(muon), rel=1e-12)  # not doubled with learning_rate
    assert {g["momentum"] for g in muon} == {0.8}


def test_a_resume_refuses_a_radius_the_optimizer_state_holds(data_dir: Path, tmp_path: Path) -> None:
    run(data_dir, tmp_path, "--optimizer=adamh", "--max_iters=2")
    with pytest.raises(ConfigError, match=r"^Refusing to resume with hyperball_radius=1\.0: .* pass --hyperball_radius=0\.0"):
        run(data_dir, tmp_path, "--optimizer=adamh", "--max_iters=4", "--init_from=resume", "--hyperball_radius=1")


# -----------------------------------------------------------------------------
# 4. Generated for every registered optimizer (a user's module: --imports=MODULE)


def rate_values(optimizer: str) -> tuple[str, float]:
    """The optimizer's rate key and a valid value of it (the sweep's key: OptimizerRecipe.rate_key)."""
    key = OPTIMIZERS[optimizer].rate_key
    if key == "learning_rate":
        return key, 3e-3
    return key, next(p.default for p in OPTIMIZERS[optimizer].params if p.key == key)


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_the_rate_key_moves_the_loss_within_3_steps(optimizer: str, data_dir: Path, tmp_path: Path) -> None:
    key, value = rate_values(optimizer)
    common = (f"--optimizer={optimizer}", "--max_iters=3", *EXTRA.get(optimizer, ()))
    base = run(data_dir, tmp_path / "base", *common, f"--{key}={value}")
    faster = run(data_dir, tmp_path / "faster", *common, f"--{key}={value * 4}")
    assert base[:3] != faster[:3], f"{key} changed nothing in 3 steps of {optimizer}"


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_a_2_plus_2_resume_is_bit_exact(optimizer: str, data_dir: Path, tmp_path: Path) -> None:
    common = (f"--optimizer={optimizer}", "--dropout=0.1", *EXTRA.get(optimizer, ()))  # dropout: the RNG streams too
    whole = run(data_dir, tmp_path / "whole", *common, "--max_iters=4")
    run(data_dir, tmp_path / "split", *common, "--max_iters=2")
    split = run(data_dir, tmp_path / "split", *common, "--max_iters=4", "--init_from=resume")
    assert split == whole
    a, b = (load_checkpoint(tmp_path / d / "ckpt.pt")["model"] for d in ("whole", "split"))
    assert all(torch.equal(a[k], b[k]) for k in a)


# A changed key on resume, for every key of every registered optimizer: its own (its MethodParam
# declarations) and the shared ones it builds its groups from (runtime/config/train_config.py's
# OPTIMIZER_FIELDS). The code's own table decides which outcome is right: a key in the recipe's
# resume_fixed (or a RESUME_FIXED training key) is refused in one sentence, every other is
# applied (optim.apply_group_settings), so the groups are those the new settings build and the
# step after the resume differs from a resume without the change.

SHARED_KEYS = tuple(k for k in OPTIMIZER_FIELDS if k not in ("optimizer", "optimizer_params"))


def contract_args(optimizer: str) -> tuple[str, ...]:
    return (f"--optimizer={optimizer}", *EXTRA.get(optimizer, ()))


def train_settings(optimizer: str, *extra: str) -> TrainConfig:
    return parse_config([*TINY, *contract_args(optimizer), *extra], world_size=0).train


def key_value(cfg: TrainConfig, key: str) -> Any:
    return cfg.optimizer_params[key] if key in cfg.optimizer_params else getattr(cfg, key)


def as_arg(key: str, value: Any) -> str:
    return f"--{key}={str(value).lower() if isinstance(value, bool) else value}"


def candidate_values(optimizer: str, key: str, value: Any) -> list[Any]:
    """Other values of `key` to try, nearest first: half or twice a number, the next integer, the
    other boolean, another of the choices a text key's MethodParam lists (must='one of: a, b')."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1]
    if isinstance(value, float):
        return [value / 2, value * 2] if value else [0.5]
    declared = next((p for p in OPTIMIZERS[optimizer].params if p.key == key), None)
    choices = declared.must.partition("one of:")[2] if declared is not None else ""
    return [c.strip() for c in choices.split(",") if c.strip() and c.strip() != value]


def changed_value(optimizer: str, key: str) -> Any:
    """A valid value of `key` other than the one the contract runs train with; None if none is known."""
    value = key_value(train_settings(optimizer), key)
    for candidate in candidate_values(optimizer, key, value):
        try:
            cfg = train_settings(optimizer, as_arg(key, candidate))
        except (ConfigError, SystemExit, ValueError):
            continue
        if key_value(cfg, key) != value:
            return candidate
    return None


def fresh_groups(optimizer: str, *extra: str, model_config: GPTConfig | None = None) -> list[dict[str, Any]]:
    """The group settings these settings build on a model (TINY's, unless given), every rate at its
    peak (lr: the schedule's)."""
    torch.manual_seed(0)
    model = GPT(model_config or GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64))
    return [comparable(g) for g in group_settings(build_optimizer(model, train_settings(optimizer, *extra)))]


def comparable(group: dict[str, Any]) -> dict[str, Any]:
    """A group's settings but its parameters and its scheduled rate, lists as tuples (a state_dict's betas)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in group.items() if k not in ("params", "lr")}


def resume_keys(optimizer: str) -> list[str]:
    """The keys of `optimizer` a resume may see changed: its own, and each shared key whose change
    changes the groups it builds (Lion's rate is fixture_lion_lr, so learning_rate is not one of Lion's)."""
    own = [p.key for p in OPTIMIZERS[optimizer].params]
    base = fresh_groups(optimizer)
    shared = [k for k in SHARED_KEYS if (v := changed_value(optimizer, k)) is not None and fresh_groups(optimizer, as_arg(k, v)) != base]
    return own + shared


def refused_on_resume(optimizer: str, key: str) -> bool:
    """The code's table: keys the optimizer state fixes (OptimizerRecipe.resume_fixed) and the
    training keys whose state would not fit (RESUME_FIXED_KEYS: the optimizer itself)."""
    return key in OPTIMIZERS[optimizer].resume_fixed or key in RESUME_FIXED_KEYS


RESUME_CASES = [(name, key) for name in OPTIMIZERS for key in resume_keys(name)]


@pytest.fixture(scope="module")
def two_steps(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """Per optimizer, once: a folder trained 2 steps, and a copy resumed for a 3rd step unchanged."""
    return resumed_pairs(run, data_dir, tmp_path_factory, contract_args)


def step_tensors(ckpt: dict[str, Any]) -> list[torch.Tensor]:
    """What a step leaves: the weights, then every tensor of the optimizer's state."""
    states = ckpt["optimizer"].get("optimizers", [ckpt["optimizer"]])
    moments = [t for s in states for per_param in s["state"].values() for t in per_param.values() if isinstance(t, torch.Tensor)]
    return [*ckpt["model"].values(), *moments]


@pytest.mark.parametrize("optimizer,key", RESUME_CASES, ids=[f"{o}-{k}" for o, k in RESUME_CASES])
def test_a_changed_key_on_resume_is_applied_or_refused(optimizer: str, key: str, two_steps: Callable[[str], tuple[Path, Path]],
                                                        data_dir: Path, tmp_path: Path) -> None:
    value = changed_value(optimizer, key)
    if value is None:  # a text key whose MethodParam lists no other value (must='one of: a, b')
        pytest.skip(f"no second valid value of {key} is known: write must='one of: ...' in its MethodParam")
    saved, unchanged = two_steps(optimizer)
    out = tmp_path / "run"
    shutil.copytree(saved, out)
    resume = (*contract_args(optimizer), as_arg(key, value), "--max_iters=3", "--init_from=resume")
    if refused_on_resume(optimizer, key):
        with pytest.raises((ConfigError, SystemExit)) as refused:
            run(data_dir, out, *resume)
        message = str(refused.value)
        assert f"{key}=" in message and "\n" not in message, message
        assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 2  # the checkpoint as it was
        return
    run(data_dir, out, *resume)
    changed, same = (load_checkpoint(d / "ckpt.pt") for d in (out, unchanged))
    assert changed["iter_num"] == 3
    # The groups the new settings build (every key of them, each rate at its peak), not the checkpoint's.
    groups = [comparable(g) for s in changed["optimizer"].get("optimizers", [changed["optimizer"]]) for g in s["param_groups"]]
    fresh = fresh_groups(optimizer, as_arg(key, value), model_config=config_from_dict(changed["model_config"]))
    assert groups == fresh, f"{key}={value} was not applied on resume of {optimizer}"
    # And the step took it: the weights or the optimizer's state differ from an unchanged resume's.
    a, b = step_tensors(changed), step_tensors(same)
    assert len(a) == len(b) and any(not torch.equal(x, y) for x, y in zip(a, b)), f"{key}={value} changed nothing in {optimizer}'s step"


# Two ranks under FSDP2 train as one process does, for every registered optimizer: one torchrun
# of tests/optimizer_fsdp_worker.py trains each FSDP_STEPS steps sharded (the weights built whole,
# then sharded: one process's), and here one process trains the same arguments; the losses and
# the weights after the last step are compared. An optimizer that cannot run sharded must refuse
# at the start in one sentence naming itself and fsdp. LLaMA's block: GPT-2's key bias has a zero
# gradient up to rounding, which Adam's normalisation turns into whole steps that differ with the
# order of the reduction (MuonH's AdamW part: 1.3e-4 after 3 steps); it changes no loss.
FSDP_STEPS = 3
# tests/test_fsdp.py's tolerance: the ranks' reduce-scatter sums the gradients in another order
# than one process's accumulation, so the last bits differ (here at most 2.4e-7 in a loss and
# 1.8e-7 in a weight); a shard's norm taken for the whole matrix's moves a weight by 1e-4.
FSDP_TOLERANCE = 1e-5


def registering_modules() -> list[str]:
    """The modules whose import registered the optimizers not built in (lion_optimizer, --imports)."""
    return sorted({cls.__module__ for cls in OPTIMIZERS.values()} - {"spheretnorm.optim"})


def module_roots(names: list[str]) -> list[str]:
    """The folder each module imports from (its file less its dotted path), for the workers' PYTHONPATH."""
    files = [Path(sys.modules[name].__file__).resolve() for name in names]
    return [str(f.parents[name.count(".") + (f.name == "__init__.py")]) for name, f in zip(names, files)]


def fsdp_args(optimizer: str) -> list[str]:
    return [*TINY, *contract_args(optimizer), "--block=llama", f"--max_iters={FSDP_STEPS}"]


@pytest.fixture(scope="module")
def sharded(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One torchrun of the worker over every registered optimizer: its results, and its folder."""
    out = tmp_path_factory.mktemp("fsdp_contract")
    modules = registering_modules()
    plan = {"modules": modules, "data_dir": str(data_dir), "steps": FSDP_STEPS, "runs": {name: fsdp_args(name) for name in OPTIMIZERS}}
    (out / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "SPHERETNORM_EAGER_KERNELS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), str(REPO / "tests"), *module_roots(modules), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "tests" / "optimizer_fsdp_worker.py"), str(out / "plan.json"), str(out)]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"results": json.loads((out / "results.json").read_text()), "out": out}


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_2_rank_fsdp_trains_as_one_process_does(optimizer: str, sharded: dict[str, Any], data_dir: Path, tmp_path: Path) -> None:
    got = sharded["results"][optimizer]
    if "refused" in got:  # allowed: a refusal at the start, in one sentence that names the optimizer and fsdp
        message = got["refused"]
        assert optimizer in message and "fsdp" in message.replace(optimizer, "") and "\n" not in message, message
        return
    assert "error" not in got, f"{optimizer} failed under --parallel=fsdp:\n{got.get('error')}"
    alone = run(data_dir, tmp_path, *fsdp_args(optimizer))
    assert len(got["losses"]) == len(alone) == FSDP_STEPS
    assert max(abs(a - b) for a, b in zip(got["losses"], alone)) < FSDP_TOLERANCE, (got["losses"], alone)
    sharded_weights = torch.load(sharded["out"] / f"{optimizer}.pt", weights_only=True)
    whole = load_checkpoint(tmp_path / "ckpt.pt")["model"]
    diffs = {n: (w - whole[n]).abs().max().item() for n, w in sharded_weights.items()}
    assert max(diffs.values()) < FSDP_TOLERANCE, sorted(diffs.items(), key=lambda d: -d[1])[:3]


# -----------------------------------------------------------------------------
# 7. Checkpoints load with plain torch.load


def test_a_checkpoint_loads_with_torch_load_weights_only(data_dir: Path, tmp_path: Path) -> None:
    run(data_dir, tmp_path, "--max_iters=1")
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 1 and isinstance(ckpt["rng"][0]["numpy"]["keys"], torch.Tensor)


def test_the_plain_rng_state_restores_every_stream() -> None:
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.standard_normal()  # a cached Gaussian in numpy's state
    saved = rng_to_plain(rng_state())
    draws = (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist())
    set_rng_state(rng_from_plain(saved))
    assert (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist()) == draws


# -----------------------------------------------------------------------------
# 8. The launcher without torchrun on PATH


def test_the_launcher_says_in_one_line_when_torchrun_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no torchrun
    job = grid_runs.Job(None, "train", ["torchrun", "--standalone", "train.py"])  # type: ignore[arg-type]
    with pytest.raises(UsageError) as refused:
        grid_plan.execute([job], "local")
    message = str(refused.value)
    assert message.startswith("torchrun was not found on PATH;") and "torch.distributed.run" in message and "\n" not in message
