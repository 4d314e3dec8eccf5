"""Tests of training on a cluster (issue 10, points 5, 6, 7, 9 and 10): run folders of changed
settings, no silent overwrite and init_from=auto, --help of every entry point, progress and the
W&B key check, and checkpoints that cannot run code when loaded; and (a SLURM day's issue,
points 1 and 7) the final checkpoint that a run reaching max_iters always writes, whatever the
collapse alarm says, and the line a resume prints.

Training runs use the tiny model and synthetic data of test_train.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from spheretnorm.runtime import validation
from spheretnorm.runtime.validation import EvalProgress
from spheretnorm.runtime.tracking import check_wandb, format_duration, wandb_key_source
from spheretnorm.runtime.checkpoint import CHECKPOINT_FORMAT
from spheretnorm.runtime.checkpoint import load_checkpoint
from spheretnorm.model import GPTConfig
from spheretnorm.experiments import grid
from spheretnorm.cluster import grid_runs, launcher as launch
from spheretnorm.runtime.run_folder import CollapseError
from test_train import SUBPROCESS_ENV, data_dir, read_metrics, tiny_args, train_curves  # noqa: F401 (fixture)
from spheretnorm.runtime.config import (
    MODEL_KEYS,
    TRAIN_KEYS,
    ConfigError,
    TrainConfig,
    config_help,
    key_help,
    parse_config,
)
from spheretnorm.runtime.identity import run_suffix
from spheretnorm.runtime.methods import resolve_paths

REPO = Path(__file__).resolve().parents[1]
OWT_S = str(REPO / "config" / "openwebtext_s.py")


def out_dir_of(*argv: str) -> str:
    parsed = parse_config(list(argv), world_size=1)
    return resolve_paths(parsed.train, parsed.model_config(), parsed.overrides).out_dir


# -----------------------------------------------------------------------------
# Point 5: a run with changed settings never shares the paper run's folder


def test_changed_settings_get_their_own_default_folder() -> None:
    paper = os.path.join("out", "openwebtext_s", "pre_ln")
    assert out_dir_of(OWT_S) == paper
    # Where and how a run works or logs, and the method (already in the name), change nothing.
    assert out_dir_of(OWT_S, "--device=cpu", "--wandb_log=true", "--eval_interval=5") == paper
    assert out_dir_of(OWT_S, "--connection=geonorm") == os.path.join("out", "openwebtext_s", "geonorm")
    assert out_dir_of(OWT_S, "--n_layer=12", "--max_iters=50000") == paper  # the config's own values
    smoke = out_dir_of(OWT_S, "--max_iters=20", "--n_layer=2", "--n_head=2")
    assert smoke == os.path.join("out", "openwebtext_s", "pre_ln+max_iters=20+n_head=2+n_layer=2")
    assert out_dir_of(OWT_S, "--max_iters=20", "--out_dir=mine") == "mine"  # explicit wins

    many = ["--max_iters=20", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--learning_rate=1e-3"]
    long_dir = out_dir_of(OWT_S, *many)
    # Too long for every pair: the first ones readable, up to 60 characters, then the hash of all of them.
    assert re.fullmatch(r"out/openwebtext_s/pre_ln\+block_size=16\+learning_rate=0.001\+max_iters=20\+n_embd=32\+overrides-[0-9a-f]{8}",
                        long_dir.replace(os.sep, "/"))
    assert out_dir_of(OWT_S, *reversed(many)) == long_dir  # the same settings find the same folder
    assert out_dir_of(OWT_S, *many[:-1], "--learning_rate=2e-3") != long_dir
    assert run_suffix({"device": "cpu", "out_dir": "x"}) == ""


def earlier_hash_suffix(settings: dict) -> str:
    """The suffix earlier code gave settings too long for a name: '+overrides-' and 8 hex digits of their JSON, alone."""
    return "+overrides-" + hashlib.sha1(json.dumps(dict(sorted(settings.items())), sort_keys=True, default=str).encode()).hexdigest()[:8]


def test_a_folder_named_by_the_earlier_hash_alone_is_found_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before issue 66 a long suffix was '+overrides-<hash>' alone; the same command resumes that folder
    (train.py's default out_dir and the launcher's grid folder) rather than starting a new run beside it."""
    many = ["--max_iters=20", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--learning_rate=1e-3"]
    parsed = parse_config([OWT_S, *many], world_size=1)
    earlier = earlier_hash_suffix(parsed.overrides)
    monkeypatch.chdir(tmp_path)  # train.py's default out_dir is relative to where it runs
    new_dir = out_dir_of(OWT_S, *many)
    assert new_dir.endswith(earlier) and new_dir != os.path.join("out", "openwebtext_s", "pre_ln" + earlier)  # the same hash, after the keys
    old_dir = Path("out", "openwebtext_s", "pre_ln" + earlier)
    old_dir.mkdir(parents=True)
    assert out_dir_of(OWT_S, *many) == str(old_dir)
    Path(new_dir).mkdir(parents=True)  # a run under the current name wins over the earlier one
    assert out_dir_of(OWT_S, *many) == new_dir
    grid_root = Path("runs", "openwebtext_s")  # the launcher's, under the repository root
    monkeypatch.setattr(grid_runs, "REPO_ROOT", tmp_path)
    overrides = {k: v for k, v in parsed.overrides.items() if k != "max_iters"}  # a grid is extended in place: no max_iters
    assert grid_runs.grid_folder("pre_ln", parsed.overrides, grid_root) == "pre_ln" + run_suffix(overrides)
    (tmp_path / grid_root / ("pre_ln" + earlier_hash_suffix(overrides))).mkdir(parents=True)
    assert grid_runs.grid_folder("pre_ln", parsed.overrides, grid_root) == "pre_ln" + earlier_hash_suffix(overrides)
    from spheretnorm.runtime.identity import earlier_run_suffixes

    assert earlier_run_suffixes({"n_layer": 2}) == [] and earlier_run_suffixes({"dataset": "my data"}) == []  # names that never changed


def test_smoke_run_leaves_the_paper_folder_and_the_grid_alone(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)  # train.py's default out_dir is relative to where it runs
    smoke = [
        OWT_S, f"--data_dir={data_dir}", "--max_iters=2", "--n_layer=2", "--n_head=2", "--n_embd=32",
        "--block_size=16", "--batch_size=4", "--global_batch_size=8", "--eval_iters=2", "--device=cpu",
        "--dtype=float32",
    ]  # fmt: skip
    train.main(smoke)
    out = capsys.readouterr().out
    runs_root = tmp_path / "out"
    (folder,) = (runs_root / "openwebtext_s").iterdir()
    assert folder.name.startswith("pre_ln+") and (folder / "ckpt.pt").is_file()
    assert f"so this run writes to {os.path.join('out', 'openwebtext_s', folder.name)}, not " in out

    # The 48-run grid's launcher still plans the paper run of that cell.
    filters = ["--dry_run", "--runs_root", str(runs_root), "--methods", "pre_ln,geonorm", "--scales", "S", "--datasets", "openwebtext"]
    assert launch.main(filters) == 0
    planned = [line for line in capsys.readouterr().out.splitlines() if line.startswith("torchrun")]
    assert len(planned) == 2 and f"--out_dir={runs_root / 'openwebtext_s' / 'pre_ln'}" in planned[0]


# -----------------------------------------------------------------------------
# Point 6: init_from=scratch never silently replaces a checkpoint; init_from=auto


def test_scratch_over_a_checkpoint_needs_overwrite(data_dir: Path, tmp_path: Path) -> None:
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=4", "--eval_interval=4"))
    before = (tmp_path / "ckpt.pt").read_bytes()

    with pytest.raises(ConfigError, match=r"ckpt\.pt already exists.*--init_from=resume.*--overwrite=true"):
        train.main(tiny_args(data_dir, tmp_path, "--max_iters=2", "--eval_interval=2"))
    assert (tmp_path / "ckpt.pt").read_bytes() == before

    train.main(tiny_args(data_dir, tmp_path, "--max_iters=2", "--eval_interval=2", "--overwrite=true"))
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == 2
    assert sorted(train_curves(tmp_path)) == [1, 2]  # a fresh run's rows only


def test_init_from_auto_starts_then_resumes_exactly(data_dir: Path, tmp_path: Path) -> None:
    straight, auto = tmp_path / "straight", tmp_path / "auto"
    train.main(tiny_args(data_dir, straight, "--max_iters=6", "--eval_interval=3"))
    train.main(tiny_args(data_dir, auto, "--max_iters=3", "--eval_interval=3", "--init_from=auto"))  # no ckpt: scratch
    train.main(tiny_args(data_dir, auto, "--max_iters=6", "--eval_interval=3", "--init_from=auto"))  # resumes
    assert train_curves(auto) == train_curves(straight)
    assert [r["iter"] for r in read_metrics(auto, "eval")] == [0, 3, 6]
    ckpt = load_checkpoint(auto / "ckpt.pt")
    assert ckpt["iter_num"] == 6
    assert isinstance(ckpt["rng"][0]["numpy"]["keys"], torch.Tensor)  # numpy's RNG state in a tensor: plain torch.load reads it


def test_launcher_commands_use_init_from_auto(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert launch.main(["--dry_run", "--runs_root", str(tmp_path), "--methods", "pre_ln", "--scales", "S", "--datasets", "openwebtext"]) == 0
    (command,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("torchrun")]
    assert command.endswith("--init_from=auto")


# -----------------------------------------------------------------------------
# Point 7: --help of every entry point


def test_every_config_key_has_one_line_of_help() -> None:
    helps = key_help()
    for key in (*MODEL_KEYS, *TRAIN_KEYS):
        assert helps.get(key, "").strip(), f"{key} has no help: give its field a trailing comment"
        assert "\n" not in helps[key]
    text = config_help({"--steps=20": "timed steps per connection"})
    assert "  --steps=20" in text and "timed steps per connection" in text
    for key in (*MODEL_KEYS, *TRAIN_KEYS):
        assert f"--{key}=" in text, key
    assert re.search(r"--init_from=scratch +auto: resume if out_dir has ckpt\.pt; hf:DIR: .* \[one of: scratch, resume, auto, hf:DIR\]", text)
    assert re.search(r"--n_embd=768 +width of the hidden states", text)
    assert "--max_iters=" not in config_help(train_keys=False)


# (entry point, strings its --help must show: option names and defaults)
HELP_EXPECTATIONS = [
    ("train.py", ["--max_iters=50000", "--learning_rate=0.0006", "--n_layer=12", "--init_from=scratch", "--overwrite=false"]),
    ("bench.py", ["--n_layer=12", "--block_size=1024"]),
    ("sample.py", ["--num_samples", "--max_new_tokens", "--temperature", "--top_k", "--seed"]),
    ("data/prepare.py", ["--batch_size", "(default: 512)", "--seed", "2357"]),
    ("eval/zero_shot.py", ["--ckpt", "--tasks", "--limit", "--local_data"]),
    ("scripts/launch.py", ["--methods", "(default: paper)", "--runs_root", "(default: out)", "(default: local)"]),
    ("scripts/lr_sweep.py", ["--lrs", "(default 1e-3,3e-3)", "--max_iters"]),
    ("scripts/reproduce_cpu.py", ["--max_iters", "(default 400)", "(default paper)"]),
    ("scripts/plot.py", ["--smooth", "(default 0.9", "--runs_root"]),
    ("scripts/tables.py", ["--format", "(default: markdown)", "(default: runs)"]),
    ("scripts/export_hf.py", ["--ckpt", "--out", "--format", "(default: hf)"]),
    ("scripts/consolidate.py", ["folder", "--out", "(default: ckpt.pt beside the folder;", "--replace_newer", "--trust_recorded_imports"]),
    ("scripts/run_cost.py", ["--shapes", "(default: 12x128,24x128,12x256,36x128)", "--paths", "--blocks", "--iters", "(default: 20,80;"]),
    ("scripts/norm_drift.py", ["--n_layer", "(default: 36)", "--device", "(default: cpu)"]),
    ("scripts/coord_check.py", ["--widths", "(default: 64,128,256,512,1024)", "--lr", "(default 0.003)"]),
    ("scripts/mup_transfer.py", ["--widths", "(default: 64,256)", "--lrs", "--max_iters", "(default 250)"]),
    ("scripts/depth_study.py", ["--seeds", "(default 1337,1338)", "--warmup_iters", "(default 400)", "--table_only"]),
    ("scripts/fair_sweep.py", ["--lrs", "(default 1e-3,2e-3,4e-3,8e-3)", "--arms", "--max_iters", "(default 600)", "--table_only", "--dry_run", "--wide"]),
    ("scripts/table2_mini.py", ["--max_iters", "(default 2400)", "--cuts", "--tables_dir", "--dry_run", "--table_only"]),
    ("scripts/block_study.py", ["--seeds", "(default 1337,1338)", "--ngpt_lrs", "(default 1e-3,3e-3,1e-2)", "--max_iters", "(default 800)", "--table_only"]),
    ("scripts/jacobian.py", ["--ckpt", "--tokens", "(default 4)", "--scope", "(default self)", "--steps", "--imports", "--trust_recorded_imports"]),
    ("scripts/memory_check.py", ["scripts/memory_check.py", "BLOCK_BYTES_PER_D"]),
    ("scripts/bench_update.py", ["--rows", "(default 16384", "--small_rows", "--impls", "(default reference,auto)", "--device"]),
]


def test_help_covers_every_script_entry_point() -> None:
    listed = {name for name, _ in HELP_EXPECTATIONS}
    for path in sorted((REPO / "scripts").glob("*.py")):
        if 'if __name__ == "__main__"' in path.read_text():
            assert f"scripts/{path.name}" in listed, f"add scripts/{path.name} to HELP_EXPECTATIONS"


@pytest.mark.parametrize("entry, expected", HELP_EXPECTATIONS, ids=[e for e, _ in HELP_EXPECTATIONS])
def test_help_lists_keys_with_defaults(entry: str, expected: list[str]) -> None:
    if not (REPO / entry).is_file():
        pytest.skip(f"{entry} does not exist yet")
    result = subprocess.run(
        [sys.executable, entry, "--help"], cwd=REPO, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps lines anywhere
    missing = [s for s in expected if s not in text]
    assert not missing, f"{entry} --help lacks {missing}:\n{result.stdout}"


# -----------------------------------------------------------------------------
# Point 9: progress on the console, and W&B that cannot fail unnoticed


def test_console_shows_progress_eta_and_eval_batches(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=4", "--eval_interval=4", "--log_interval=2"))
    out = capsys.readouterr().out
    assert re.search(r"^iter 1/4 \| loss .* \| ETA \?$", out, re.M), out  # the first step at once, before log_interval
    assert [row["iter"] for row in read_metrics(tmp_path, "train")] == [2, 4]  # its row still every log_interval
    assert re.search(r"^iter 2/4 \| loss .* tok/s .* \| ETA \d+s$", out, re.M), out
    assert re.search(r"^iter 4/4 \| .* \| ETA 0s$", out, re.M), out
    for split in ("train", "val"):
        assert len(re.findall(rf"^eval {split} 2/2 batches in \d+\.\d s$", out, re.M)) == 2, out  # iters 0 and 4
    assert "\r" not in out  # captured output is not a terminal: no updating line


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_eval_progress_updates_one_line_on_a_terminal() -> None:
    term = FakeTerminal()
    progress = EvalProgress(enabled=True, stream=term)
    progress.start("val", 3)
    for done in (1, 2, 3):
        progress.update(done)
    progress.finish()
    text = term.getvalue()
    assert "\reval val 1/3 batches\reval val 2/3 batches" in text
    assert re.search(r"\reval val 3/3 batches in \d+\.\d s *\n$", text)
    assert text.count("\n") == 1
    quiet = FakeTerminal()
    EvalProgress(enabled=False, stream=quiet).finish()  # ranks other than 0 print nothing
    assert quiet.getvalue() == ""


def test_a_long_evaluation_in_a_log_file_says_how_far_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    log = io.StringIO()
    progress = EvalProgress(enabled=True, stream=log)
    progress.start("train", 200)
    progress.update(1)  # at once: nothing yet
    monkeypatch.setattr(validation.time, "time", lambda: progress.started + validation.EVAL_PROGRESS_EVERY_S)
    progress.update(7)
    progress.update(8)  # within the next interval: no second line
    assert log.getvalue() == f"eval train 7/200 batches, {validation.EVAL_PROGRESS_EVERY_S:.0f} s so far\n"


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 42.4, 187, 7500, -3)] == ["0s", "42s", "3m07s", "2h05m", "0s"]


@pytest.fixture
def no_wandb_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An environment with no W&B key anywhere; returns the netrc path wandb would read."""
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    netrc_path = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(netrc_path))
    return netrc_path


def test_wandb_online_without_a_key_stops_before_training(data_dir: Path, tmp_path: Path, no_wandb_key: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"needs a W&B API key.*WANDB_API_KEY.*--wandb_mode=offline"):
        train.main([*tiny_args(data_dir, out, "--max_iters=2"), "--wandb_log=true"])
    assert not out.exists()  # stopped before any work

    online = TrainConfig(wandb_log=True)
    no_wandb_key.write_text("machine example.com login me password secret\n")
    with pytest.raises(ConfigError):
        check_wandb(online)  # a netrc entry for another host does not count
    no_wandb_key.write_text("machine api.wandb.ai login user password 0123456789abcdef\n")
    assert wandb_key_source() == str(no_wandb_key)
    check_wandb(online)


@pytest.mark.parametrize("opt_out", [{"wandb_mode": "offline"}, {"wandb_mode": "disabled"}, {"wandb_log": False}])
def test_wandb_check_lets_the_user_opt_out(opt_out: dict, no_wandb_key: Path) -> None:
    check_wandb(TrainConfig(**{"wandb_log": True, **opt_out}))


def test_wandb_key_from_the_environment(no_wandb_key: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert wandb_key_source() is None
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef")
    assert wandb_key_source() == "WANDB_API_KEY"
    check_wandb(TrainConfig(wandb_log=True))


# -----------------------------------------------------------------------------
# Point 10: a checkpoint carrying a pickled callable is refused and never runs


class Payload:
    """Unpickling this runs code: it writes the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def write_malicious_checkpoint(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": CHECKPOINT_FORMAT, "model_config": vars(GPTConfig()), "model": {}, "x": Payload(marker)}, path)
    return path


def test_malicious_checkpoint_is_refused_without_running(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    path = write_malicious_checkpoint(tmp_path / "evil.pt", marker)
    with pytest.raises(ValueError, match=rf"Checkpoint '{re.escape(str(path))}' contains disallowed objects \([^)]*exec[^)]*\)"):
        load_checkpoint(path)
    assert not marker.exists()


def test_resume_from_a_malicious_checkpoint_is_a_config_error(data_dir: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    write_malicious_checkpoint(tmp_path / "run" / "ckpt.pt", marker)
    with pytest.raises(ConfigError, match="contains disallowed objects"):
        train.main(tiny_args(data_dir, tmp_path / "run", "--init_from=auto"))
    assert not marker.exists()


# -----------------------------------------------------------------------------
# A SLURM day, point 1: a run that reaches max_iters always leaves its final checkpoint

# A tiny deep model driven into collapse (final_cosine near 1 from iter 5 on): tests/test_diagnostics.py's.
COLLAPSING = ("--connection=geonorm", "--n_layer=8", "--eval_interval=5", "--warmup_iters=1", "--learning_rate=0.1", "--min_lr=0.01")


def test_a_suspect_final_state_is_checkpointed(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """final_cosine above collapse_cosine at the last two evaluations (of 3 before a stop): the run
    ends at max_iters, exit 0, and its final state is saved all the same (mid-run it would not be)."""
    train.main(tiny_args(data_dir, tmp_path, *COLLAPSING, "--max_iters=10", "--collapse_evals=3"))
    out = capsys.readouterr().out
    evals = read_metrics(tmp_path, "eval")
    assert [r["iter"] for r in evals] == [0, 5, 10] and all(r["final_cosine"] > 0.95 for r in evals[1:])
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == 10
    assert "(1 of 3 evaluations before the collapse stop); this state is not checkpointed." in out  # iter 5
    assert "(2 of 3 evaluations before the collapse stop); this is the final state (iter 10): it is checkpointed all the same" in out
    assert re.search(r"^Done: iter 10, .*; checkpoint .*ckpt\.pt \(iter 10\); \d+ checkpoint write\(s\) this session, [\d.]+ s in all\. Its final_cosine is above collapse_cosine=0\.95", out, re.M), out
    assert read_metrics(tmp_path, "stop") == []
    assert grid.is_finished(tmp_path, 10)


def test_a_collapse_stop_at_the_final_evaluation_saves_the_final_state(data_dir: Path, tmp_path: Path) -> None:
    """The alarm decides whether a run stops (exit status 3, its stop row), not whether the last state is saved."""
    with pytest.raises(CollapseError, match=r"for 2 evaluations in a row \(iter 10\).*the final state is saved all the same"):
        train.main(tiny_args(data_dir, tmp_path, *COLLAPSING, "--max_iters=10", "--collapse_evals=2"))
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == 10
    (stop,) = read_metrics(tmp_path, "stop")
    assert stop["reason"] == "collapse" and stop["exit_code"] == 3 and stop["checkpoint_iter"] == 10


def test_the_launcher_counts_a_run_without_ckpt_as_not_finished(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"kind": "eval", "iter": 20, "val_loss": 3.0}\n')
    assert grid.reached_max_iters(tmp_path, 20) and not grid.is_finished(tmp_path, 20)
    (tmp_path / "ckpt.pt").write_bytes(b"")
    assert grid.is_finished(tmp_path, 20) and not grid.is_finished(tmp_path, 21)


# -----------------------------------------------------------------------------
# A SLURM day, point 7: a resume says where it starts


def test_a_resume_prints_the_iteration_it_starts_from(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=4", "--eval_interval=4"))
    assert "resumed from" not in capsys.readouterr().out  # a fresh run
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=6", "--eval_interval=3", "--init_from=auto"))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resumed from")]
    assert lines == [f"resumed from iter 4 ({tmp_path / 'ckpt.pt'})"]
