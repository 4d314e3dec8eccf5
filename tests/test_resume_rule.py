"""One resume rule (issue 65, item 3): `train.py --out_dir=RUN --init_from=resume` starts from the
run's own settings as `train.py RUN/config.json --init_from=resume` does, the command line changing
only the keys it names; a resume that finds no checkpoint names the folder it looked in and the
form that resumes the run that was meant, never --init_from=auto (which would start a new one)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import train
from markov_data import write_markov_data
from spheretnorm.runtime.config import ConfigError, parse_config
from test_train_step import train_args

# Settings a resume under the defaults would lose: each differs from its default.
OWN = ("--learning_rate=2e-3", "--weight_decay=0.05", "--global_batch_size=4", "--beta2=0.98")


def config_of(run: Path) -> dict:
    return json.loads((run / "config.json").read_text())


def train_rows(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["iter"], r["train_loss"]) for r in rows if r["kind"] == "train"]


def test_resuming_a_folder_by_out_dir_keeps_its_own_settings_as_its_config_json_does(tmp_path: Path) -> None:
    data, run = write_markov_data(tmp_path / "data"), tmp_path / "run"
    train.main(train_args(data, run, *OWN, "--max_iters=2", "--eval_interval=2"))
    twin = tmp_path / "twin"
    shutil.copytree(run, twin)
    train.main([f"--out_dir={run}", "--init_from=resume", "--max_iters=4"])
    train.main([str(twin / "config.json"), "--init_from=resume", "--max_iters=4"])
    resumed = config_of(run)
    assert {k: resumed[k] for k in ("learning_rate", "weight_decay", "global_batch_size", "beta2", "data_dir")} == {
        "learning_rate": 2e-3, "weight_decay": 0.05, "global_batch_size": 4, "beta2": 0.98, "data_dir": str(data)}
    assert resumed["settings_history"] == [{"iter": 2, "changed": {"max_iters": [2, 4]}}]  # the one key named
    assert train_rows(run) == train_rows(twin) and [i for i, _ in train_rows(run)] == [1, 2, 3, 4]  # the two forms are one


def test_a_folder_that_lost_its_config_json_resumes_from_its_checkpoints_settings(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A folder copied with its ckpt.pt and metrics.jsonl but not its config.json resumed under
    train.py's defaults: the default data set (missing here, an error), or with --dataset given, the
    default rates and batch, each said as a "changed key" and trained with."""
    data, run = write_markov_data(tmp_path / "data"), tmp_path / "run"
    train.main(train_args(data, run, *OWN, "--max_iters=2", "--eval_interval=2"))
    twin = tmp_path / "twin"
    shutil.copytree(run, twin)
    (run / "config.json").unlink()
    capsys.readouterr()
    train.main([f"--out_dir={run}", "--init_from=resume", "--max_iters=4"])
    assert f"NOTE: {run} had no config.json; wrote it from the settings ckpt.pt records (iteration 2)" in capsys.readouterr().out
    train.main([str(twin / "config.json"), "--init_from=resume", "--max_iters=4"])
    resumed = config_of(run)
    assert {k: resumed[k] for k in ("learning_rate", "weight_decay", "global_batch_size", "beta2", "data_dir")} == {
        "learning_rate": 2e-3, "weight_decay": 0.05, "global_batch_size": 4, "beta2": 0.98, "data_dir": str(data)}
    assert resumed["settings_history"] == [{"iter": 2, "changed": {"max_iters": [2, 4]}}]  # the one key named
    assert train_rows(run) == train_rows(twin) and [i for i, _ in train_rows(run)] == [1, 2, 3, 4]


def test_nothing_is_written_back_for_another_command_or_a_folder_without_a_checkpoint(tmp_path: Path) -> None:
    from spheretnorm.runtime.checkpoint import restore_run_config

    empty = tmp_path / "empty"
    empty.mkdir()
    assert restore_run_config([f"--out_dir={empty}", "--init_from=resume"]) is None  # the resume says there is nothing to resume
    assert not (empty / "config.json").exists()
    config = tmp_path / "mine.py"
    config.write_text("learning_rate = 5e-4\n")
    (empty / "ckpt.pt").write_bytes(b"not read")  # a command that does not resume by --out_dir alone never opens it
    for argv in ([str(config), f"--out_dir={empty}", "--init_from=resume"], [f"--out_dir={empty}", "--init_from=auto"],
                 [f"--out_dir={empty}", "--init_from=resume", "--eval_only=true"], [f"--out_dir={empty}"]):
        assert restore_run_config(argv) is None and not (empty / "config.json").exists()


def test_parse_takes_the_folders_config_for_a_resume_or_an_evaluation_and_nothing_else(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"out_dir": "/elsewhere", "learning_rate": 2e-3, "weight_decay": 0.05, "method": "pre_ln"}))
    for argv in (["--init_from=resume"], ["--init_from=resume", "--eval_only=false"]):
        parsed = parse_config([f"--out_dir={run}", *argv, "--weight_decay=0.01"])
        assert parsed.config_files == [str(run / "config.json")]
        assert (parsed.train.learning_rate, parsed.train.weight_decay, parsed.train.out_dir) == (2e-3, 0.01, str(run))
    # A new run's settings are the command's; an evaluation computes no loss term, so it needs no consent to the run's modules.
    for argv in (["--init_from=scratch"], ["--init_from=auto"], ["--eval_only=true"], ["--init_from=resume", "--eval_only=true"], []):
        assert parse_config([f"--out_dir={run}", *argv]).train.learning_rate != 2e-3
    config = tmp_path / "mine.py"
    config.write_text("learning_rate = 5e-4\n")
    parsed = parse_config([str(config), f"--out_dir={run}", "--init_from=resume"])  # a config file given is the one read
    assert parsed.config_files == [str(config)] and parsed.train.learning_rate == 5e-4


def test_a_resume_that_finds_no_checkpoint_names_the_folder_and_the_run_that_was_meant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_markov_data(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    base = [a for a in train_args(data, tmp_path / "unused") if not a.startswith("--out_dir=")]
    train.main([*base, "--max_iters=2", "--eval_interval=2"])  # the default folder: out/<config>/pre_ln+<changed keys>
    (made,) = [p for p in (tmp_path / "out").glob("*/*") if (p / "ckpt.pt").is_file()]
    with pytest.raises(ConfigError) as missing:
        train.main([*base, "--max_iters=2", "--eval_interval=2", "--weight_decay=0.05", "--init_from=resume"])
    message = str(missing.value)
    assert "\n" not in message and "holds no checkpoint" in message and "init_from=auto" not in message
    assert str(made.relative_to(tmp_path)) in message and f"--out_dir={made.relative_to(tmp_path)} --init_from=resume" in message
    with pytest.raises(ConfigError) as alone:
        train.main([*train_args(data, tmp_path / "nowhere"), "--init_from=resume"])
    assert "nowhere holds no checkpoint" in str(alone.value) and "--out_dir=RUN" in str(alone.value)


def test_a_run_read_back_never_injects_its_fault_again(tmp_path: Path) -> None:
    from spheretnorm.runtime.config import read_run_config

    (tmp_path / "config.json").write_text(json.dumps({"out_dir": "x", "debug_nan_at_iter": 15, "debug_crash_at_iter": 3, "max_iters": 20}))
    assert read_run_config(str(tmp_path / "config.json")) == {"out_dir": str(tmp_path), "max_iters": 20}


def test_a_config_files_optimizer_keys_follow_its_optimizer(tmp_path: Path) -> None:
    config = tmp_path / "muon_run.py"
    config.write_text("optimizer = 'muon'\nmuon_lr = 0.03\n")
    assert parse_config([str(config)]).train.optimizer_params["muon_lr"] == 0.03
    switched = parse_config([str(config), "--optimizer=adamw"])  # the file's Muon key goes with the file's Muon
    assert switched.train.optimizer == "adamw" and "muon_lr" not in switched.train.optimizer_params
    with pytest.raises(ConfigError, match="muon_lr is a key of optimizer 'muon'"):  # given on the command line: the user's, refused
        parse_config([str(config), "--optimizer=adamw", "--muon_lr=0.03"])
