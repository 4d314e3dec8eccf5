"""common.get_device on cluster machines: a CPU-only torch on a GPU node, and CUDA asked for
where torch cannot give it.

The GPU is simulated: the NVIDIA driver's /proc directory and device node are pointed at tmp
paths, nvidia-smi is a stand-in script on PATH, and torch.cuda is monkeypatched. Nothing needs a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spheretnorm.runtime import device as common
from spheretnorm.runtime.device import DeviceError, get_device, nvidia_gpus_present

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A machine with no NVIDIA driver and a torch without CUDA; returns a bin dir on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setattr(common, "_NVIDIA_PROC_GPUS", tmp_path / "proc-nvidia-gpus")
    monkeypatch.setattr(common, "_NVIDIA_DEVICE_NODE", tmp_path / "dev-nvidia0")
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(common, "_mps_available", lambda: False)
    monkeypatch.setattr(common, "_warned_cpu_torch_on_gpu_machine", False)
    return bin_dir


@pytest.fixture
def gpu_driver(no_gpu: Path) -> None:
    """The NVIDIA driver sees two GPUs (its /proc entries), whatever torch was built for."""
    proc = common._NVIDIA_PROC_GPUS
    for bus_id in ("0000:17:00.0", "0000:2a:00.0"):
        (proc / bus_id).mkdir(parents=True)


def fake_nvidia_smi(bin_dir: Path, listing: str) -> None:
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '%s' '{listing}'\n")
    script.chmod(0o755)


# -----------------------------------------------------------------------------
# Detecting NVIDIA GPUs without torch


def test_no_driver_means_no_gpu(no_gpu: Path) -> None:
    assert nvidia_gpus_present() is False


def test_gpus_found_through_the_driver_proc_entries(gpu_driver: None) -> None:
    assert nvidia_gpus_present() is True


def test_empty_driver_proc_directory_is_no_gpu(no_gpu: Path) -> None:
    common._NVIDIA_PROC_GPUS.mkdir()
    assert nvidia_gpus_present() is False


def test_gpus_found_through_the_device_node(no_gpu: Path) -> None:
    common._NVIDIA_DEVICE_NODE.write_text("")
    assert nvidia_gpus_present() is True


def test_gpus_found_through_nvidia_smi(no_gpu: Path) -> None:
    fake_nvidia_smi(no_gpu, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1234)\n")
    assert nvidia_gpus_present() is True


def test_nvidia_smi_without_gpus_is_no_gpu(no_gpu: Path) -> None:
    fake_nvidia_smi(no_gpu, "No devices were found\n")
    assert nvidia_gpus_present() is False


# -----------------------------------------------------------------------------
# device=auto


def test_auto_on_a_gpu_machine_with_cpu_only_torch_warns_loudly(gpu_driver: None, capsys: pytest.CaptureFixture) -> None:
    assert get_device("auto") == "cpu"
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) >= 5 and all(line.startswith("WARNING") for line in lines)
    assert "NVIDIA GPUs" in err and "CPU-only build" in err
    assert "install a CUDA build of torch" in err and "--device=cpu" in err


def test_the_warning_is_printed_once_per_process(gpu_driver: None, capsys: pytest.CaptureFixture) -> None:
    get_device("auto")
    capsys.readouterr()
    assert get_device("auto") == "cpu"  # train.py asks twice
    assert capsys.readouterr().err == ""


def test_auto_on_a_cpu_machine_is_quiet(no_gpu: Path, capsys: pytest.CaptureFixture) -> None:
    assert get_device("auto") == "cpu"
    assert capsys.readouterr().err == ""


def test_auto_with_cuda_picks_cuda_quietly(gpu_driver: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert get_device("auto") == "cuda"
    assert capsys.readouterr().err == ""


def test_explicit_cpu_on_a_gpu_machine_is_quiet(gpu_driver: None, capsys: pytest.CaptureFixture) -> None:
    assert get_device("cpu") == "cpu"
    assert capsys.readouterr().err == ""


# -----------------------------------------------------------------------------
# Explicit CUDA without CUDA: one clear sentence


def one_sentence(message: str) -> bool:
    return "\n" not in message and message.endswith(".") and message.count(". ") == 0


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_with_a_cpu_only_torch_is_one_clear_error(gpu_driver: None, device: str) -> None:
    with pytest.raises(DeviceError) as info:
        get_device(device)
    message = str(info.value)
    assert one_sentence(message), message
    assert f"device={device!r}" in message and "CPU-only build" in message
    assert "install a CUDA build of torch" in message and "--device=cpu" in message


def test_cuda_with_a_cuda_torch_but_no_visible_gpu(no_gpu: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.6")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(DeviceError) as info:
        get_device("cuda")
    message = str(info.value)
    assert one_sentence(message), message
    assert "sees no usable GPU" in message and "CUDA_VISIBLE_DEVICES=''" in message


def test_cuda_index_past_the_visible_gpus(no_gpu: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert get_device("cuda:1") == "cuda:1"
    with pytest.raises(DeviceError, match=r"device='cuda:2' does not exist: 2 GPU\(s\) are visible, cuda:0 to cuda:1\."):
        get_device("cuda:2")


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "auto:0", "CUDA"])
def test_unknown_device_names_the_valid_ones(no_gpu: Path, device: str) -> None:
    with pytest.raises(DeviceError, match="use auto, cpu, cuda, cuda:N or mps"):
        get_device(device)


def test_mps_without_mps_is_a_clear_error(no_gpu: Path) -> None:
    with pytest.raises(DeviceError, match=r"device='mps' is not available"):
        get_device("mps")


def test_device_error_is_a_value_error() -> None:
    """Callers that already catch ValueError (the eval harness, scripts) keep working."""
    assert issubclass(DeviceError, ValueError)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch has no CUDA")
def test_train_with_cuda_and_no_cuda_prints_one_error_line() -> None:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "train.py", "config/shakespeare_char.py", "--device=cuda", "--max_iters=1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: device='cuda' needs CUDA"), result.stderr
