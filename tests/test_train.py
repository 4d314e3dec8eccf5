"""Tests of the training script: it learns, resumes exactly, scales across processes without
changing the optimisation, survives pre-emption, refuses bad configs and unsafe resumes.

Every run uses a tiny model on a synthetic dataset written to tmp_path, so the tests need no
prepared data. Most runs call train.main in-process; the signal and torchrun tests need real
processes.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import train
from markov_data import VOCAB, write_markov_data  # noqa: F401  (test_mup imports VOCAB from here)
from spheretnorm.runtime.batches import EVAL_STREAM, TRAIN_STREAM, batch_offsets
from spheretnorm.runtime.schedule import learning_rate_at
from spheretnorm.runtime.run_folder import NonFiniteLossError
from spheretnorm.runtime.tracking import wandb_payload
from spheretnorm.runtime.checkpoint import load_checkpoint, load_model
from spheretnorm.runtime.config import ConfigError, grad_accum_steps, parse_config
from spheretnorm.runtime.identity import config_conflicts

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO.parent / "shared" / "reference" / "paper_results.json"
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A learnable token stream: each token has three likely successors (a random Markov chain)."""
    return write_markov_data(tmp_path_factory.mktemp("tiny_data"))


def tiny_args(data_dir: Path, out_dir: Path, *extra: str) -> list[str]:
    return [
        f"--data_dir={data_dir}",
        f"--out_dir={out_dir}",
        "--n_layer=2",
        "--n_head=2",
        "--n_embd=32",
        "--block_size=16",
        "--batch_size=4",
        "--global_batch_size=8",
        "--eval_iters=2",
        "--log_interval=1",
        "--warmup_iters=2",
        "--lr_decay_iters=40",
        "--learning_rate=3e-3",
        "--min_lr=3e-4",
        "--device=cpu",
        "--dtype=float32",
        "--wandb_log=false",
        *extra,
    ]


def read_metrics(out_dir: Path, kind: str) -> list[dict]:
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["kind"] == kind]


def train_losses(out_dir: Path) -> dict[int, float]:
    return {row["iter"]: row["train_loss"] for row in read_metrics(out_dir, "train")}


def train_curves(out_dir: Path) -> dict[int, tuple]:
    """Everything a train row holds except the timings."""
    keys = ("train_loss", "train_loss_avg200", "lr", "grad_norm", "tokens")
    return {row["iter"]: tuple(row[k] for k in keys) for row in read_metrics(out_dir, "train")}


# -----------------------------------------------------------------------------
# Training


TRAIN_FIELDS = {"iter", "tokens", "train_loss", "train_loss_avg200", "lr", "grad_norm", "tokens_per_s", "mfu", "elapsed_s"}
EVAL_FIELDS = {"iter", "tokens", "train_eval_loss", "val_loss", "val_ppl", "elapsed_s", "rms", "angle", "final_cosine", "step_sizes"}


@pytest.mark.parametrize("connection", ["pre_ln", "p_spheret"])
def test_tiny_model_trains_and_logs_every_field(data_dir: Path, tmp_path: Path, connection: str) -> None:
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=40", "--eval_interval=20", f"--connection={connection}"))

    rows = read_metrics(tmp_path, "train")
    assert [r["iter"] for r in rows] == list(range(1, 41))
    for row in rows:
        assert TRAIN_FIELDS <= set(row), TRAIN_FIELDS - set(row)
        assert row["mfu"] is None  # no known peak FLOPs on a CPU
    losses = [r["train_loss"] for r in rows]
    assert np.mean(losses[:5]) - np.mean(losses[-5:]) > 0.5, losses
    assert rows[-1]["train_loss_avg200"] == pytest.approx(np.mean(losses))

    evals = read_metrics(tmp_path, "eval")
    assert [r["iter"] for r in evals] == [0, 20, 40]
    for row in evals:
        assert EVAL_FIELDS <= set(row), EVAL_FIELDS - set(row)
        assert len(row["rms"]) == 3 and len(row["angle"]) == 4  # embedding + 2 blocks; 4 sublayers
        assert -1.0 <= row["final_cosine"] <= 1.0
        assert row["val_ppl"] == pytest.approx(math.exp(row["val_loss"]))
        assert len(row["step_sizes"]) == (4 if connection == "p_spheret" else 0)
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.5

    model = load_model(tmp_path / "ckpt.pt")
    assert model.config.connection == connection
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["method"] == ("p_spheret:0.5" if connection == "p_spheret" else "pre_ln")
    # The path of the sphere update (conftest.py runs the fused maths eagerly); none off the sphere.
    assert saved["sphere_kernels"] == ("fused_eager" if connection == "p_spheret" else None)


def test_resume_is_exact(data_dir: Path, tmp_path: Path) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ("--eval_interval=10", "--connection=p_spheret")
    train.main(tiny_args(data_dir, straight, "--max_iters=20", *common))
    train.main(tiny_args(data_dir, split, "--max_iters=10", *common))
    train.main(tiny_args(data_dir, split, "--max_iters=20", "--init_from=resume", *common))

    assert train_curves(split) == train_curves(straight)  # bit-identical, every iteration once
    assert sorted(train_curves(split)) == list(range(1, 21))
    assert [r["val_loss"] for r in read_metrics(split, "eval")] == [r["val_loss"] for r in read_metrics(straight, "eval")]
    a, b = load_checkpoint(straight / "ckpt.pt"), load_checkpoint(split / "ckpt.pt")
    assert a["iter_num"] == b["iter_num"] == 20
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


def test_resume_after_a_crash_drops_the_abandoned_rows(data_dir: Path, tmp_path: Path) -> None:
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    train.main(tiny_args(data_dir, straight, "--max_iters=20", "--eval_interval=10"))
    with pytest.raises(NonFiniteLossError):
        train.main(tiny_args(data_dir, crashed, "--max_iters=20", "--eval_interval=10", "--debug_nan_at_iter=15"))
    assert max(train_losses(crashed)) == 14  # rows 11..14 were written after the checkpoint at 10

    train.main(tiny_args(data_dir, crashed, "--max_iters=20", "--eval_interval=10", "--init_from=resume"))
    assert train_curves(crashed) == train_curves(straight)
    assert [r["iter"] for r in read_metrics(crashed, "eval")] == [0, 10, 20]


def test_a_resume_says_which_rows_of_the_previous_attempt_it_drops(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The stop row a tool may have read, and the rows past the checkpoint, leave metrics.jsonl in one line (issue 66, item 8)."""
    with pytest.raises(NonFiniteLossError):
        train.main(tiny_args(data_dir, tmp_path, "--max_iters=20", "--eval_interval=10", "--debug_nan_at_iter=13"))
    capsys.readouterr()
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=20", "--eval_interval=10", "--init_from=resume"))
    lines = [line for line in capsys.readouterr().out.splitlines() if "drops" in line]
    assert lines == ["NOTE: resuming from iteration 10, metrics.jsonl drops the previous attempt's stop row (non_finite at iter 12) "
                     "and 2 row(s) past iteration 10, which the checkpoint does not hold."]
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=22", "--eval_interval=10", "--init_from=resume"))
    assert "drops" not in capsys.readouterr().out  # a clean end leaves nothing to drop


def test_nan_stops_without_touching_the_last_checkpoint(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(NonFiniteLossError, match=r"loss became nan at iter 8.*untouched"):
        train.main(tiny_args(data_dir, tmp_path, "--max_iters=20", "--eval_interval=5", "--debug_nan_at_iter=8"))
    ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    assert ckpt["iter_num"] == 5
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())
    assert not (tmp_path / "ckpt.pt.tmp").exists()
    assert max(train_losses(tmp_path)) == 7  # the bad step is never logged


def test_resume_takes_the_model_config_from_the_checkpoint(data_dir: Path, tmp_path: Path) -> None:
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=2", "--eval_interval=2", "--connection=geonorm"))

    with pytest.raises(ConfigError, match=r"connection: checkpoint has 'geonorm'.*'pre_ln'"):
        train.main(tiny_args(data_dir, tmp_path, "--max_iters=4", "--init_from=resume", "--connection=pre_ln"))
    with pytest.raises(ConfigError, match="n_embd"):
        train.main(tiny_args(data_dir, tmp_path, "--max_iters=4", "--init_from=resume", "--n_embd=64"))
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == 2  # refused before any work

    # Without --connection the checkpoint's connection is used, not the default pre_ln.
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=4", "--eval_interval=2", "--init_from=resume"))
    ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    assert ckpt["iter_num"] == 4 and ckpt["model_config"]["connection"] == "geonorm"


def test_resume_without_checkpoint_is_a_clear_error(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no checkpoint"):
        train.main(tiny_args(data_dir, tmp_path / "nothing", "--init_from=resume"))


def wait_for(predicate, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.time() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"train.py exited early:\n{proc.communicate()[0]}")
        if time.time() > deadline:
            proc.kill()
            raise AssertionError(f"timed out:\n{proc.communicate()[0]}")
        time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
def test_preemption_signal_saves_a_checkpoint_and_exits_zero(data_dir: Path, tmp_path: Path, sig: signal.Signals) -> None:
    args = tiny_args(data_dir, tmp_path, "--max_iters=100000", "--eval_interval=100000")
    proc = subprocess.Popen(
        [sys.executable, "train.py", *args], cwd=REPO, env=SUBPROCESS_ENV,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    metrics = tmp_path / "metrics.jsonl"
    wait_for(lambda: metrics.is_file() and '"kind": "train"' in metrics.read_text(), 120, proc)
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    last = output.strip().splitlines()[-1]  # the run's own last line says the stop, its checkpoint and the status
    assert last.startswith(f"Stopped by {sig.name}") and f"{tmp_path / 'ckpt.pt'}" in last and "exits with status 0" in last, output[-2000:]

    ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    assert ckpt["iter_num"] == max(train_losses(tmp_path)) >= 1
    load_model(ckpt)  # loadable


def test_cli_reports_config_errors_with_exit_code_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "train.py", "--learning_rat=1e-3", f"--out_dir={tmp_path / 'out'}"],
        cwd=REPO, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "Unknown config key 'learning_rat'" in result.stderr and "learning_rate" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_torchrun_two_processes_match_one(data_dir: Path, tmp_path: Path) -> None:
    """Same global batch: 1 process x 4 micro-steps == 2 processes x 2 micro-steps (gloo)."""
    common = ("--max_iters=6", "--eval_interval=3", "--batch_size=2", "--connection=cay_spheret")
    train.main(tiny_args(data_dir, tmp_path / "one", *common))
    result = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "train.py", *tiny_args(data_dir, tmp_path / "two", *common), "--backend=gloo",
        ],
        cwd=REPO, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 process(es) x 2 seqs x 2 micro-steps" in result.stdout

    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == list(range(1, 7))
    for it in one:
        assert two[it] == pytest.approx(one[it], abs=1e-5), it
    for a, b in zip(read_metrics(tmp_path / "one", "eval"), read_metrics(tmp_path / "two", "eval")):
        assert b["val_loss"] == pytest.approx(a["val_loss"], abs=1e-5)
    assert load_checkpoint(tmp_path / "two" / "ckpt.pt")["iter_num"] == 6


def test_a_configuration_error_under_torchrun_is_said_once(data_dir: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "train.py", *tiny_args(data_dir, tmp_path / "run", "--learning_rate=-1"), "--backend=gloo"],
        cwd=REPO, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error: ")]
    assert errors == ["error: learning_rate must be a finite number >= 0, got -1.0."], result.stderr[-2000:]
    assert not (tmp_path / "run").exists()


# -----------------------------------------------------------------------------
# Configuration


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--n_layr=2"], r"Unknown config key 'n_layr'.*Did you mean n_layer"),
        (["--n_layer=two"], r"--n_layer='two': expected an integer"),
        (["--compile=maybe"], r"expected true or false"),
        (["--learning_rate=fast"], r"expected a number"),
        (["--connection=spheret"], r"connection='spheret' is not valid.*Choose one of: pre_ln"),
        (["--dtype=fp8"], r"dtype='fp8' is not valid"),
        (["--n_embd=100", "--n_head=12"], r"not divisible by n_head"),
        (["--global_batch_size=100", "--batch_size=16"], r"global_batch_size=100 is not divisible"),
        (["n_layer=2"], r"expected a config file"),
        (["--n_layer"], r"--key=value"),
    ],
)
def test_bad_config_is_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(argv, world_size=1)


def test_config_values_are_typed() -> None:
    parsed = parse_config(
        ["--max_iters=5e4", "--learning_rate=6e-4", "--compile=True", "--keel_alpha=None", "--peak_flops=1e15"],
        world_size=1,
    )
    assert parsed.train.max_iters == 50_000 and isinstance(parsed.train.max_iters, int)
    assert parsed.train.learning_rate == 6e-4 and parsed.train.compile is True
    assert parsed.model_keys == {"keel_alpha": None}
    assert parsed.train.peak_flops == 1e15


def test_config_file_keys_are_checked(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text("import math\n_helper = 3\nangle_max = math.pi / 8\nn_layer = 2\nlearning_rate = 1\n")
    parsed = parse_config([str(good), "--n_layer=3"], world_size=1)
    assert parsed.model_keys == {"angle_max": math.pi / 8, "n_layer": 3}  # the command line wins
    assert parsed.train.learning_rate == 1.0 and parsed.train.config_name == "good"

    for body, message in [
        ("learning_rat = 1e-3\n", r"'learning_rat' \(in .*bad.py\).*learning_rate"),
        ('n_layer = "12"\n', r"n_layer = '12' \(in .*bad.py\): expected an integer"),
        ("bias = 1\n", r"expected true or false"),
    ]:
        bad = tmp_path / "bad.py"
        bad.write_text(body)
        with pytest.raises(ConfigError, match=message):
            parse_config([str(bad)], world_size=1)


def test_gradient_accumulation_keeps_the_global_batch() -> None:
    assert grad_accum_steps(128, 16, 8) == 1
    assert grad_accum_steps(128, 16, 1) == 8
    assert grad_accum_steps(128, 8, 4) == 4
    with pytest.raises(ConfigError, match="batch_size \\* world_size = 16 \\* 3"):
        grad_accum_steps(128, 16, 3)
    with pytest.raises(ConfigError):
        parse_config(["--batch_size=16"], world_size=3)


def test_bad_config_stops_before_any_work(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        train.main(tiny_args(data_dir, tmp_path / "out", "--max_iter=3"))
    assert not (tmp_path / "out").exists()


SCALE_FILES = {"s": "S", "m": "M", "l": "L"}


@pytest.mark.skipif(not PAPER.is_file(), reason="../shared/reference/paper_results.json is absent")
@pytest.mark.parametrize("dataset", ["openwebtext", "fineweb_edu"])
@pytest.mark.parametrize("suffix", list(SCALE_FILES))
def test_paper_configs_carry_the_paper_values(dataset: str, suffix: str) -> None:
    paper = json.loads(PAPER.read_text())
    shared, scale = paper["shared_hparams"], paper["scales"][SCALE_FILES[suffix]]
    parsed = parse_config([str(REPO / "config" / f"{dataset}_{suffix}.py")], world_size=8)
    t, m = parsed.train, parsed.model_config()
    assert t.dataset == dataset and t.config_name == f"{dataset}_{suffix}"
    assert (m.n_layer, m.n_head, m.n_embd) == (scale["n_layer"], scale["n_head"], scale["n_embd"])
    assert (t.learning_rate, t.min_lr) == (scale["learning_rate"], scale["min_lr"])
    assert (t.beta1, t.beta2, t.weight_decay, t.grad_clip) == (
        shared["beta1"], shared["beta2"], shared["weight_decay"], shared["grad_clip"]
    )
    assert (t.max_iters, t.lr_decay_iters, t.warmup_iters) == (
        shared["max_iters"], shared["lr_decay_iters"], shared["warmup_iters"]
    )
    assert (t.batch_size, t.global_batch_size, t.seed) == (
        shared["batch_size_per_gpu"], shared["global_batch_sequences"], shared["seed"]
    )
    assert t.global_batch_size * m.block_size == shared["tokens_per_update"]
    assert (m.block_size, m.vocab_size, m.bias, m.dropout) == (
        shared["block_size"], shared["vocab_size"], shared["bias"], shared["dropout"]
    )
    assert t.compile is shared["torch_compile"] and t.dtype == "auto"  # auto is bf16 on CUDA
    assert grad_accum_steps(t.global_batch_size, t.batch_size, 8) == 1  # the paper's 8 GPUs


def test_shakespeare_char_config_parses() -> None:
    parsed = parse_config([str(REPO / "config" / "shakespeare_char.py")], world_size=1)
    assert parsed.train.dataset == "shakespeare_char"
    assert parsed.model_config().n_layer <= 6  # small enough for a CPU


# -----------------------------------------------------------------------------
# Pieces


def test_learning_rate_schedule() -> None:
    cfg = parse_config(["--warmup_iters=10", "--lr_decay_iters=100", "--learning_rate=1.0", "--min_lr=0.1"], 1).train
    lrs = [learning_rate_at(s, cfg) for s in range(120)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)  # linear warm-up from 0
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # then decays monotonically
    assert lrs[55] == pytest.approx(0.55)  # half way through the cosine: the midpoint
    assert lrs[100] == lrs[119] == pytest.approx(0.1)


def test_lr_decay_iters_not_given_follows_max_iters() -> None:
    """A shortened run (--max_iters=200) decayed nothing: lr_decay_iters stayed at its config's 2,000."""
    shakespeare = str(REPO / "config" / "shakespeare_char.py")
    short = parse_config([shakespeare, "--max_iters=200"], 1)
    assert short.train.lr_decay_iters == 200 and short.derived == ("lr_decay_iters",)
    assert learning_rate_at(199, short.train) == pytest.approx(short.train.min_lr, rel=0.01)  # the cosine ends with the run
    assert short.overrides == {"max_iters": 200}  # the folder is the one this command always had: pre_ln+max_iters=200
    # The commands that set nothing keep their schedules: the config's 2,000, the paper's 50,000.
    assert parse_config([shakespeare], 1).train.lr_decay_iters == 2000
    assert parse_config([str(REPO / "config" / "openwebtext_s.py")], 8).train.lr_decay_iters == 50_000
    given = parse_config([shakespeare, "--max_iters=200", "--lr_decay_iters=2000"], 1)
    assert given.train.lr_decay_iters == 2000 and given.derived == () and given.overrides == {"max_iters": 200, "lr_decay_iters": 2000}


def test_a_resume_keeps_the_lr_decay_iters_its_checkpoint_recorded(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Resumed without --lr_decay_iters, a run keeps the schedule it trained with (its checkpoint's),
    whether an earlier command gave it or it followed that command's max_iters; each start says which.
    (A resume by --out_dir starts from the run's config.json, which records the value: issue 65's
    one resume rule; a folder that lost it has it written back from the checkpoint. The checkpoint's
    value is kept where no file gives one: a config file given that does not set it.)"""
    def args(out: Path, *extra: str) -> list[str]:
        return [a for a in tiny_args(data_dir, out, "--eval_interval=4", *extra) if not a.startswith("--lr_decay_iters")]

    old = tmp_path / "old"  # as earlier code ran it: lr_decay_iters recorded, here 6
    train.main([*args(old, "--max_iters=4"), "--lr_decay_iters=6"])
    capsys.readouterr()
    # The same run to the launcher and the studies (config_conflicts), not another one they would skip.
    assert config_conflicts(old, parse_config(args(old, "--max_iters=8"), 1)) == []
    (old / "config.json").unlink()  # the checkpoint alone records the schedule
    plain = tmp_path / "plain.py"  # a config file that sets no schedule: read instead of the config.json written back from the checkpoint
    plain.write_text("# nothing of the schedule\n")
    train.main([str(plain), *args(old, "--max_iters=8", "--init_from=resume")])
    assert "NOTE: not given, so lr_decay_iters=6, as the checkpoint records" in capsys.readouterr().out
    assert json.loads((old / "config.json").read_text())["lr_decay_iters"] == 6
    lrs = {r["iter"]: r["lr"] for r in read_metrics(old, "train")}
    assert lrs[6] < lrs[5] and lrs[7] == lrs[8] == pytest.approx(3e-4)  # decayed by 6, then min_lr (50,000 or 8 would not be)

    new = tmp_path / "new"  # not given: it follows the first command's max_iters, 4, and the extension keeps that
    train.main(args(new, "--max_iters=4"))
    assert "NOTE: not given, so lr_decay_iters=4, following max_iters" in capsys.readouterr().out
    train.main(args(new, "--max_iters=8", "--init_from=resume"))  # config.json gives lr_decay_iters=4: no NOTE needed
    assert "lr_decay_iters" not in capsys.readouterr().out and json.loads((new / "config.json").read_text())["lr_decay_iters"] == 4
    assert [r["lr"] for r in read_metrics(new, "train") if r["iter"] > 4] == pytest.approx([3e-4] * 4)


def test_batch_of_a_step_does_not_depend_on_the_world_size() -> None:
    offsets = batch_offsets(1337, TRAIN_STREAM, 7, 8, 1000, 16)
    assert np.array_equal(offsets, batch_offsets(1337, TRAIN_STREAM, 7, 8, 1000, 16))
    assert not np.array_equal(offsets, batch_offsets(1337, TRAIN_STREAM, 8, 8, 1000, 16))
    assert not np.array_equal(offsets, batch_offsets(1337, EVAL_STREAM, 7, 8, 1000, 16))
    assert offsets.min() >= 0 and offsets.max() < 1000 - 16


def test_wandb_payload_flattens_diagnostics() -> None:
    row = {"kind": "eval", "iter": 5, "val_loss": 2.0, "rms": [1.0, 2.0], "angle": [0.1], "final_cosine": 0.2, "step_sizes": [], "val_ppl": None}
    assert wandb_payload(row) == {
        "val_loss": 2.0,
        "diag.rms/layer_00": 1.0,  # a section per series: a deep run's layers stay together
        "diag.rms/layer_01": 2.0,
        "diag/rms_mean": 1.5,
        "diag/rms_first": 1.0,
        "diag/rms_last": 2.0,
        "diag.angle/sublayer_00": 0.1,
        "diag/angle_mean": 0.1,
        "diag/angle_first": 0.1,
        "diag/angle_last": 0.1,
        "diag/final_cosine": 0.2,
    }


class FakeWandb:
    """Stands in for the wandb module: records init arguments and logged payloads."""

    def __init__(self) -> None:
        self.inits: list[dict] = []
        self.logged: list[tuple[int, dict]] = []

    def init(self, **kwargs):
        self.inits.append(kwargs)
        fake = self

        class Run:
            id = kwargs.get("id") or "run123"

            def log(self, payload: dict, step: int) -> None:
                fake.logged.append((step, payload))

            def finish(self) -> None:
                pass

        return Run()


def test_wandb_gets_config_metrics_and_diagnostics(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    common = ("--eval_interval=2", "--wandb_log=true", "--wandb_mode=offline", "--connection=p_spheret", "--spheret_p=0.25")
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=2", "--config_name=tiny_s", *common))
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=4", "--config_name=tiny_s", "--init_from=resume", *common))

    first, second = fake.inits
    assert first["group"] == "tiny_s" and first["name"] == f"tiny_s/{tmp_path.name}"  # the run folder's name
    assert first["mode"] == "offline" and first["id"] is None
    assert first["config"]["connection"] == "p_spheret" and first["config"]["method"] == "p_spheret:0.25"
    assert first["config"]["n_layer"] == 2 and first["config"]["learning_rate"] == 3e-3
    assert second["id"] == "run123" and second["resume"] == "allow"  # the same W&B run continues

    keys = set().union(*(payload for _, payload in fake.logged))
    assert {"train_loss", "train_loss_avg200", "val_loss", "val_ppl", "lr", "grad_norm", "tokens_per_s"} <= keys
    assert {"diag.rms/layer_00", "diag.rms/layer_02", "diag.angle/sublayer_03", "diag/final_cosine", "diag.step_sizes/sublayer_03"} <= keys
    assert [step for step, payload in fake.logged if "val_loss" in payload] == [0, 2, 4]


def test_wandb_environment_variables_and_names(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B's own variables are honoured (command-line keys still win), and a smoke run's name is
    its folder's, never the paper run's."""
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))  # no key anywhere: online would be refused
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "theirs")
    monkeypatch.setenv("WANDB_ENTITY", "lab")
    monkeypatch.setenv("WANDB_RUN_GROUP", "sweep-7")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_files"))
    train.main(tiny_args(data_dir, tmp_path / "a", "--max_iters=2", "--eval_interval=2", "--wandb_log=true"))
    train.main(tiny_args(data_dir, tmp_path / "b", "--max_iters=2", "--eval_interval=2", "--wandb_log=true", "--wandb_project=mine", "--wandb_group=g"))
    env_run, flag_run = fake.inits
    assert (env_run["mode"], env_run["project"], env_run["entity"], env_run["group"]) == ("offline", "theirs", "lab", "sweep-7")
    assert env_run["dir"] is None  # wandb itself puts its files in WANDB_DIR
    assert (flag_run["project"], flag_run["group"]) == ("mine", "g")

    from spheretnorm.runtime.config import parse_config
    from spheretnorm.runtime.methods import resolve_paths, resolve_wandb_names

    def wandb_name(*argv: str) -> str:
        parsed = parse_config([str(REPO / "config" / "openwebtext_s.py"), *argv], world_size=1)
        train_cfg = resolve_paths(parsed.train, parsed.model_config(), parsed.overrides)
        return resolve_wandb_names(train_cfg, parsed.model_config()).wandb_run_name

    assert wandb_name("--connection=geonorm") == "openwebtext_s/geonorm"
    assert wandb_name("--connection=geonorm", "--n_layer=2", "--max_iters=30") == "openwebtext_s/geonorm+max_iters=30+n_layer=2"


def test_bench_reports_every_requested_connection(tmp_path: Path) -> None:
    import bench

    out = tmp_path / "bench.json"
    report = bench.main([
        "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=8", "--batch_size=2", "--vocab_size=32",
        "--device=cpu", "--connections=pre_ln,geonorm", "--compile=off", "--steps=2", "--warmup=1", f"--json={out}",
    ])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    rows = report["results"]
    assert [(r["method"], r["mode"]) for r in rows] == [("pre_ln", "eager"), ("geonorm", "eager")]
    assert rows[0]["ratio_to_pre_ln"] == 1.0 and rows[1]["tokens_per_s"] > 0
    with pytest.raises(ConfigError, match="unknown"):
        bench.main(["--connections=pre_ln,nope"])


@pytest.mark.parametrize("connection", ["pre_ln", "p_spheret"])
def test_eval_only_with_the_runs_own_config_json(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, connection: str
) -> None:
    """A run folder's config.json is a config file: `train.py RUN/config.json --eval_only=true`
    evaluates the run as it was trained (the keys it records besides the configs, such as method
    and num_params, are skipped, not refused), and gives the last evaluation's val loss again."""
    from spheretnorm.runtime.config import KEY_HOLDERS, MODEL_KEYS, RUN_RECORD_KEYS, TRAIN_KEYS

    out = tmp_path / "run"
    train.main(tiny_args(data_dir, out, f"--connection={connection}", "--max_iters=2", "--eval_interval=2", "--collapse_evals=0"))
    recorded = json.loads((out / "config.json").read_text())
    # The list of recorded keys keeps step with what train.py writes.
    assert set(recorded) - set(TRAIN_KEYS) - set(MODEL_KEYS) - set(KEY_HOLDERS) == set(RUN_RECORD_KEYS)
    evals = read_metrics(out, "eval")
    want = evals[-1]["val_loss"]
    capsys.readouterr()
    train.main([str(out / "config.json"), "--eval_only=true"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"kind": "eval"')]
    assert rows and rows[-1]["val_loss"] == pytest.approx(want, abs=1e-6)
    assert read_metrics(out, "eval") == evals  # an evaluation writes nothing
    if connection != "pre_ln":
        return  # once is enough for what follows
    # Moved, and read from another working folder: the config.json is the run beside it, not the one it records.
    out.rename(tmp_path / "moved")
    monkeypatch.chdir(tmp_path)
    train.main([str(Path("moved") / "config.json"), "--eval_only=true"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"kind": "eval"')]
    assert rows and rows[-1]["val_loss"] == pytest.approx(want, abs=1e-6)


def test_a_config_json_that_is_no_run_config_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="holds a JSON list, not an object of keys; give the config.json that train.py wrote"):
        parse_config([str(bad)], world_size=1)
    bad.write_text('{"method": "pre_ln", "nonsense": 1}')
    with pytest.raises(ConfigError, match="Unknown config key 'nonsense'"):
        parse_config([str(bad)], world_size=1)


def test_a_resume_at_max_iters_without_its_final_evaluation_evaluates_it(data_dir: Path, tmp_path: Path) -> None:
    """A signal during the final evaluation leaves the final checkpoint but no eval row at
    max_iters; resuming then evaluates (so the run counts as finished) instead of ending at once."""
    out = tmp_path / "run"
    args = tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2", "--collapse_evals=0")
    train.main(args)
    evals = read_metrics(out, "eval")
    assert evals[-1]["iter"] == 4
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("".join(line + "\n" for line in lines if not (json.loads(line)["kind"] == "eval" and json.loads(line)["iter"] == 4)))
    train.main([*args, "--init_from=resume"])
    again = read_metrics(out, "eval")
    assert [r["iter"] for r in again] == [r["iter"] for r in evals]
    assert again[-1]["val_loss"] == pytest.approx(evals[-1]["val_loss"], abs=1e-6)
    train.main([*args, "--init_from=resume"])  # a finished run resumed evaluates nothing more
    assert [r["iter"] for r in read_metrics(out, "eval")] == [r["iter"] for r in evals]
