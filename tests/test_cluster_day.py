"""A cluster user's day with scripts/launch.py: sbatch options as clusters want them, and grids
refused before submission when their jobs would fail at start.

A stand-in `sbatch` first on PATH records each call's arguments and the SBATCH_* variables it
sees (SLURM itself reads those and lets them win over the script's #SBATCH lines).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from markov_data import write_markov_data

REPO = Path(__file__).resolve().parents[1]

FAKE_SBATCH = r'''#!{python}
import json, os, sys
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "env": {{k: v for k, v in os.environ.items() if k.startswith("SBATCH_")}}}}) + "\n")
print("Submitted batch job 42")
'''


@pytest.fixture
def cluster(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(FAKE_SBATCH.format(python=sys.executable))
    sbatch.chmod(0o755)
    log = tmp_path / "sbatch.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SBATCH_", "WANDB_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", FAKE_LOG=str(log), NETRC=str(tmp_path / "no_netrc"), OMP_NUM_THREADS="1")
    return {"env": env, "log": log, "data": write_markov_data(tmp_path / "data"), "root": tmp_path / "runs"}


def launch(cluster: dict, *argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/launch.py", "--mode", "slurm", "--runs_root", str(cluster["root"]), "--scales", "S", *argv],
        cwd=REPO, env={**cluster["env"], **env}, capture_output=True, text=True, timeout=120,
    )


def submitted(cluster: dict) -> list[dict]:
    log = cluster["log"]
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def test_sbatch_options_and_variables_reach_the_job(cluster: dict) -> None:
    result = launch(
        cluster, "--methods", "pre_ln,p_spheret:0.5", "--datasets", "openwebtext", f"--data_dir={cluster['data']}",
        "--sbatch_args", "--partition=gpu --account=lab --qos=high --time=12:00:00 --cpus-per-task=16",
        SBATCH_RESERVATION="maintenance-free", SBATCH_GPUS_PER_NODE="a100:4",
    )
    assert result.returncode == 0, result.stderr
    jobs = submitted(cluster)
    assert len(jobs) == 2
    for job in jobs:
        argv = job["argv"]
        for option in ("--partition=gpu", "--account=lab", "--qos=high", "--time=12:00:00", "--cpus-per-task=16"):
            assert option in argv, argv
        assert argv.index("--partition=gpu") < argv.index("scripts/slurm_train.sh")  # an sbatch option, not train.py's
        assert job["env"]["SBATCH_RESERVATION"] == "maintenance-free"
        # The launcher's GPU count follows SLURM's variable, so torchrun and the allocation agree.
        assert "--gpus-per-node=4" in argv and "--export=ALL,GPUS_PER_NODE=4" in argv


def test_layout_options_in_sbatch_args_are_refused(cluster: dict) -> None:
    result = launch(cluster, "--methods", "pre_ln", "--datasets", "openwebtext", "--sbatch_args=--nodes=4")  # one option: "=" form
    assert result.returncode == 2 and "--nodes, which the launcher sets from --nnodes" in result.stderr
    assert submitted(cluster) == []


def test_a_grid_whose_jobs_would_fail_at_start_submits_nothing(cluster: dict) -> None:
    missing = cluster["root"].parent / "not_prepared"
    result = launch(cluster, "--methods", "pre_ln,geonorm", "--datasets", "openwebtext", f"--data_dir={missing}", "--wandb_log=true")
    assert result.returncode == 2
    assert submitted(cluster) == []
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: nothing was started, 2 problem(s)")
    assert len(lines) == 3  # one line per problem, however many runs share it
    assert any("dataset openwebtext is not prepared" in line and str(missing) in line for line in lines)
    assert any("needs a W&B API key" in line for line in lines)
    # W&B offline from W&B's own variable is no problem; the data still is.
    result = launch(cluster, "--methods", "pre_ln", "--datasets", "openwebtext", f"--data_dir={missing}", "--wandb_log=true", WANDB_MODE="offline")
    assert result.returncode == 2 and "W&B" not in result.stderr and "not prepared" in result.stderr


def test_a_config_error_of_several_runs_is_named_once_each(cluster: dict) -> None:
    result = launch(cluster, "--methods", "pre_ln,geonorm", "--datasets", "openwebtext", "--batch_size=24")
    assert result.returncode == 2 and submitted(cluster) == []
    errors = [line for line in result.stderr.splitlines() if "not divisible" in line]
    assert len(errors) == 2  # one per run: each names its method


def test_zero_shot_jobs_check_batches_against_one_gpu(cluster: dict, tmp_path: Path) -> None:
    """An evaluation job takes one GPU: a training batch size that suits 8 GPUs must not matter."""
    result = launch(cluster, "--stage", "zero_shot", "--methods", "pre_ln", "--datasets", "openwebtext", "--batch_size=24", "--global_batch_size=120")
    assert result.returncode == 0, result.stderr


def test_gpu_check_help_runs_nothing(tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--help"], cwd=tmp_path, env={**os.environ, "OUT": str(tmp_path / "out")},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "One GPU check of the fused sphere update" in result.stdout
    assert "nvidia-smi" not in result.stdout + result.stderr and not (tmp_path / "out").exists()
