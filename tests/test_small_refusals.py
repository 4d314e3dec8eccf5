"""Small refusals, each one sentence with nothing written: keys that would be ignored or
allocate without bound, damaged datasets and model folders, zero-shot arguments, W&B modes.

All in-process and cheap: a refusal happens before any model is built or any file written.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import train
from markov_data import write_markov_data
from spheretnorm.hf.folder import HFFolderError, folder_model_config, write_remote_model
from spheretnorm.model import GPT, GPTConfig
from spheretnorm.runtime.config import ConfigError, TrainConfig, wandb_mode
from spheretnorm.zeroshot import driver
from test_train import tiny_args


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_markov_data(tmp_path / "data", with_vocabulary=True)


def refused(args: list[str], match: str, out: Path) -> None:
    with pytest.raises(ConfigError, match=match):
        train.main(args)
    assert not out.exists(), "a refusal writes nothing"


def test_fsdp_init_without_fsdp_is_refused(data: Path, tmp_path: Path) -> None:
    refused(tiny_args(data, tmp_path / "run", "--fsdp_init=full"), r"fsdp_init=full applies to --parallel=fsdp only", tmp_path / "run")


def test_a_char_dataset_without_vocab_size_is_refused(data: Path, tmp_path: Path) -> None:
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "vocab_size"}))
    refused(tiny_args(data, tmp_path / "run"), r"meta.json has no vocab_size, which a char dataset needs", tmp_path / "run")


def test_a_train_bin_one_byte_too_long_is_refused(data: Path, tmp_path: Path) -> None:
    with open(data / "train.bin", "ab") as f:
        f.write(b"\0")
    refused(tiny_args(data, tmp_path / "run"), r"train.bin is \d+ bytes, not a whole number of 2-byte token ids", tmp_path / "run")


def test_sizes_a_key_may_ask_for_are_bounded(data: Path, tmp_path: Path) -> None:
    refused(tiny_args(data, tmp_path / "run", "--mlp_width=99999999999999"), r"mlp_width must be .* up to 1048576, got 99999999999999", tmp_path / "run")
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps({**meta, "vocab_size": 10**12}))
    refused(tiny_args(data, tmp_path / "run"), r"vocab_size=1000000000000, more than the 65536 ids", tmp_path / "run")


def test_integer_weights_in_a_model_folder_are_refused(tmp_path: Path) -> None:
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=16))
    (tmp_path / "hf").mkdir()
    write_remote_model(model, tmp_path / "hf", {})
    weights = tmp_path / "hf" / "model.safetensors"
    state = load_file(str(weights))
    state["transformer.wpe.weight"] = state["transformer.wpe.weight"].to(torch.int64)
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.raises(HFFolderError, match=r"holds weights that are not floating point \(transformer.wpe.weight is I64\)"):
        folder_model_config(tmp_path / "hf")


@pytest.mark.parametrize("argv, message", [
    (["--limit", "-1"], "error: --limit -1 is not valid; give a number of examples per task"),
    (["--device", "tpu"], "error: device='tpu'"),
])  # fmt: skip
def test_zero_shot_arguments_are_one_line(argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert driver.main(["--ckpt", str(tmp_path / "ckpt.pt"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err


def test_wandb_modes_follow_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "dryrun")  # wandb's older name for offline
    assert wandb_mode(TrainConfig(wandb_log=True)) == "offline"
    monkeypatch.setenv("WANDB_MODE", "bogus")
    assert wandb_mode(TrainConfig(wandb_log=False)) == "online"  # W&B is off: not this run's setting
    with pytest.raises(ConfigError, match=r"WANDB_MODE='bogus' is not valid; choose one of: online, offline, disabled, dryrun \(= offline\)"):
        wandb_mode(TrainConfig(wandb_log=True))


def test_a_full_disk_during_zero_shot_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cache = tmp_path / "cache" / "data.arrow"

    def fills_the_disk(args: object, hub_off: object) -> None:  # lm-eval's or datasets' own writes
        raise OSError(errno.ENOSPC, "No space left on device", str(cache))

    monkeypatch.setattr(driver, "evaluate_checkpoint", fills_the_disk)
    assert driver.main(["--ckpt", str(tmp_path / "ckpt.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: Cannot write {str(cache)!r} (No space left on device); the disk (or the file size limit) is full: free space and run again."]


def test_an_out_dir_that_is_a_dangling_link_names_its_missing_target(tmp_path: Path) -> None:
    """Was "cannot be written to (File exists)" (issue 67, item 8d)."""
    from spheretnorm.runtime.run_folder import OutDirError, check_out_dir

    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone" / "run")
    with pytest.raises(OutDirError) as info:
        check_out_dir(TrainConfig(out_dir=str(link)))
    assert str(info.value) == (
        f"out_dir {str(link)!r} is a link to {str(tmp_path / 'gone' / 'run')!r}, which does not exist; "
        "create that folder, or give another out_dir."
    )
