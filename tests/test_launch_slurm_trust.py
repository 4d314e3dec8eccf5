"""The launcher does not trust sbatch, squeue and the run folders' SLURM files too far.

sbatch that hangs (bounded, its lock released, said), squeue output that is not UTF-8, one job id
returned for two runs, a slurm_jobs.json cut short or of another shape (kept aside, said), a
lock or record that is a folder (refused before anything is submitted), a hand-edited lock, and
a full disk once a job is submitted (the line names the job id). All in-process, with the
stand-in SLURM of test_cluster_day; no traceback in any case.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spheretnorm.cluster import slurm
from test_cluster_day import cluster, submitted  # noqa: F401 (cluster: a fixture)
from test_launch_faults import refusal_class, run_launcher

ONE = ["--mode", "slurm", "--scales", "S", "--datasets", "openwebtext", "--methods", "pre_ln"]
TWO = [*ONE[:-1], "pre_ln,geonorm"]


def argv(cluster: dict, grid: list[str]) -> list[str]:
    return [*grid, "--runs_root", str(cluster["root"]), f"--data_dir={cluster['data']}"]


def stand_in(cluster: dict, name: str, body: str) -> None:
    """Replace the stand-in `name` (sbatch, squeue) by a Python script with this body."""
    path = Path(cluster["env"]["PATH"].split(os.pathsep)[0]) / name
    path.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")


def run_folder(cluster: dict, method: str = "pre_ln") -> Path:
    return cluster["root"] / "openwebtext_s" / method


def test_a_hanging_sbatch_is_stopped_and_its_lock_released(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    stand_in(cluster, "sbatch", "time.sleep(60)")
    monkeypatch.setattr(slurm, "SBATCH_TIMEOUT_S", 0.5)
    result = run_launcher(cluster, monkeypatch, capsys, argv(cluster, ONE), {})
    assert result["status"] == 1 and not result["trace"], result
    assert "sbatch did not answer within 0.5 s and was stopped; its lock is released" in result["out"]
    assert not (run_folder(cluster) / "slurm_train.lock").exists()


def test_sbatch_timeout_is_this_launchs_alone(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """--sbatch_timeout reaches sbatch through the call, not by rewriting slurm's default, which a
    later launch in the same process would have inherited."""
    stand_in(cluster, "sbatch", "time.sleep(60)")
    default = slurm.SBATCH_TIMEOUT_S
    result = run_launcher(cluster, monkeypatch, capsys, [*argv(cluster, ONE), "--sbatch_timeout=0.4"], {})
    assert result["status"] == 1 and "sbatch did not answer within 0.4 s and was stopped" in result["out"]
    assert slurm.SBATCH_TIMEOUT_S == default


def test_squeue_output_that_is_not_utf8_is_read(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    stand_in(cluster, "squeue", r'sys.stdout.buffer.write(b"7|RUNNING|None|caf\xe9-\xff\n")')
    result = run_launcher(cluster, monkeypatch, capsys, argv(cluster, ONE), {})
    assert result["status"] == 0 and not result["trace"], result
    assert len(submitted(cluster)) == 1


def test_one_job_id_for_two_runs_is_recorded_for_the_first_only(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    stand_in(cluster, "sbatch", 'print("Submitted batch job 42")')
    result = run_launcher(cluster, monkeypatch, capsys, argv(cluster, TWO), {})
    assert result["status"] == 1 and not result["trace"], result
    assert "sbatch returned job 42, which it already returned for openwebtext_s/pre_ln (train); not recorded" in result["out"]
    assert json.loads((run_folder(cluster) / "slurm_train.lock").read_text())["job_id"] == "42"
    assert not (run_folder(cluster, "geonorm") / "slurm_train.lock").exists()
    assert not (run_folder(cluster, "geonorm") / "slurm_jobs.json").exists()


@pytest.mark.parametrize("damaged", ['{"jobs": [{"job_id": "7", "stage": "tr', '[{"job_id": "7"}]', b'\xff{"jobs": []}'], ids=["cut-short", "a-list", "not-utf8"])
def test_a_damaged_job_record_is_kept_aside(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, damaged: str | bytes) -> None:
    folder = run_folder(cluster)
    folder.mkdir(parents=True)
    data = damaged.encode() if isinstance(damaged, str) else damaged
    (folder / "slurm_jobs.json").write_bytes(data)
    result = run_launcher(cluster, monkeypatch, capsys, argv(cluster, ONE), {})
    assert result["status"] == 0 and not result["trace"], result
    assert (folder / "slurm_jobs.json.damaged").read_bytes() == data  # the earlier job ids are not lost
    assert [j["job_id"] for j in json.loads((folder / "slurm_jobs.json").read_text())["jobs"]] == ["42"]
    assert "slurm_jobs.json was damaged" in result["out"] and "kept as" in result["out"] and "slurm_jobs.json.damaged" in result["out"]


@pytest.mark.parametrize("name", ["slurm_train.lock", "slurm_jobs.json"])
def test_a_lock_or_record_that_is_a_folder_is_refused_before_submitting(
    cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, name: str
) -> None:
    (run_folder(cluster) / name).mkdir(parents=True)
    result = run_launcher(cluster, monkeypatch, capsys, argv(cluster, TWO), {})
    assert refusal_class(result) is None, result
    assert f"{name} is a folder" in result["err"]
    assert sorted(p.name for p in run_folder(cluster).iterdir()) == [name]  # nothing written
    assert not run_folder(cluster, "geonorm").exists()


def test_a_hand_edited_lock_is_stale_not_a_traceback(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    folder = run_folder(cluster)
    folder.mkdir(parents=True)
    (folder / "slurm_train.lock").write_text(json.dumps({"job_id": None, "claimed_at": "soon", "pid": "me", "host": "here"}))
    result = run_launcher(cluster, monkeypatch, capsys, argv(cluster, ONE), {})
    assert result["status"] == 0 and not result["trace"], result
    assert len(submitted(cluster)) == 1


def test_a_full_disk_after_submission_names_the_job(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    def full(path: Path, value: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(slurm, "write_json_atomic", full)
    result = run_launcher(cluster, monkeypatch, capsys, argv(cluster, ONE), {})
    assert result["status"] == 1 and not result["trace"], result
    assert "submitted job 42, but it could not be recorded in" in result["out"] and "No space left on device" in result["out"]
    assert "1 not recorded: openwebtext_s/pre_ln (train) job 42" in result["out"]


def test_a_full_disk_before_submission_submits_nothing_for_that_run(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    def full(*args: object) -> bool:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(slurm, "claim_lock", full)
    result = run_launcher(cluster, monkeypatch, capsys, argv(cluster, ONE), {})
    assert result["status"] == 1 and not result["trace"], result
    assert submitted(cluster) == [] and "not submitted" in result["out"] and "No space left on device" in result["out"]


# -----------------------------------------------------------------------------
# The run folder exists before sbatch's --output points into it; XL through the launcher

# A stand-in sbatch that records whether the folder of its --output exists when it is called.
OUTPUT_CHECKING_SBATCH = '''import json, os
output = next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--output="))
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "folder_there": os.path.isdir(os.path.dirname(output))}) + "\\n")
job_id = 41 + len(open(os.environ["FAKE_LOG"]).read().splitlines())
print(f"{job_id};cluster" if "--parsable" in sys.argv else f"Submitted batch job {job_id}")'''


def test_the_printed_grid_makes_each_run_folder_before_its_sbatch(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    stand_in(cluster, "sbatch", OUTPUT_CHECKING_SBATCH)
    result = run_launcher(cluster, monkeypatch, capsys, [*argv(cluster, TWO), "--dry_run", "--chain_zero_shot"], {})
    assert result["status"] == 0 and not cluster["root"].exists(), result  # a dry run writes nothing
    script = cluster["root"].parent / "grid.sh"
    script.write_text(result["out"])
    subprocess.run(["bash", str(script)], cwd=slurm.REPO_ROOT, env=cluster["env"], check=True, capture_output=True, timeout=60)
    calls = submitted(cluster)
    assert len(calls) == 4 and all(call["folder_there"] for call in calls), calls


def test_the_live_launch_makes_each_run_folder_before_its_sbatch(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    stand_in(cluster, "sbatch", OUTPUT_CHECKING_SBATCH)
    result = run_launcher(cluster, monkeypatch, capsys, [*argv(cluster, TWO), "--chain_zero_shot"], {})
    assert result["status"] == 0 and not result["trace"], result
    calls = submitted(cluster)
    assert len(calls) == 4 and all(call["folder_there"] for call in calls), calls


def test_xl_is_a_scale_of_the_launcher(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    grid = ["--mode", "slurm", "--scales", "XL", "--datasets", "openwebtext", "--methods", "pre_ln", "--dry_run"]
    result = run_launcher(cluster, monkeypatch, capsys, argv(cluster, grid), {})
    assert result["status"] == 0 and not result["trace"], result
    (line,) = [ln for ln in result["out"].splitlines() if ln.startswith("sbatch ")]
    assert "scripts/slurm_train.sh config/openwebtext_xl.py" in line and "openwebtext_xl/pre_ln" in line
    result = run_launcher(cluster, monkeypatch, capsys, argv(cluster, [*grid[:3], "XXL", *grid[4:]]), {})
    assert refusal_class(result) is None and "choose from: S, M, L, XL" in result["err"], result
