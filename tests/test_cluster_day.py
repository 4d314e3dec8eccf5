"""A cluster user's day with scripts/launch.py: sbatch options as clusters want them, grids
refused before submission when their jobs would fail at start, nothing submitted twice, the
zero-shot stage chained after training, and only runs with a checkpoint counted as finished.

Stand-ins first on PATH play a small SLURM queue (a JSON file of jobs):
  sbatch   records each call's arguments and the SBATCH_* variables it sees (SLURM itself reads
           those and lets them win over the script's #SBATCH lines), gives job ids 42, 43, ...,
           and queues the job as PENDING under FAKE_USER.
  squeue   records its arguments and prints the queued jobs of --user whose name is in --name,
           in the fields of --format, with the noise real output may carry (padding, a blank line).
"""

from __future__ import annotations

import getpass
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
queue_path = os.environ["FAKE_QUEUE"]
queue = json.load(open(queue_path)) if os.path.exists(queue_path) else []
job_id = 42 + len(json.load(open(queue_path + ".all"))) if os.path.exists(queue_path + ".all") else 42
name = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--job-name=")), "sbatch")
waits = any(a.startswith("--dependency=") for a in sys.argv[1:])
job = {{"id": str(job_id), "name": name, "user": os.environ["FAKE_USER"], "state": "PENDING", "reason": "Dependency" if waits else "Priority"}}
for path, jobs in ((queue_path, queue), (queue_path + ".all", json.load(open(queue_path + ".all")) if os.path.exists(queue_path + ".all") else [])):
    json.dump([*jobs, job], open(path, "w"))
print(f"{{job_id}}" if "--parsable" in sys.argv else f"Submitted batch job {{job_id}}")
'''

FAKE_SQUEUE = r'''#!{python}
import json, os, sys
with open(os.environ["FAKE_LOG"] + ".squeue", "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
options = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
names = options["--name"].split(",") if "--name" in options else None
queue = json.load(open(os.environ["FAKE_QUEUE"])) if os.path.exists(os.environ["FAKE_QUEUE"]) else []
if "--noheader" not in sys.argv:
    print("JOBID|STATE|REASON|NAME")
for job in queue:
    if job["user"] == options.get("--user") and (names is None or job["name"] in names):
        line = options["--format"]
        for field, key in (("%i", "id"), ("%T", "state"), ("%r", "reason"), ("%j", "name")):
            line = line.replace(field, job[key])
        print("  " + line + "  ")
print()
'''


@pytest.fixture
def cluster(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("squeue", FAKE_SQUEUE)):
        (bin_dir / name).write_text(text.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    log, queue = tmp_path / "sbatch.jsonl", tmp_path / "queue.json"
    offline = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SBATCH_", "WANDB_")) and k not in offline}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", FAKE_LOG=str(log), FAKE_QUEUE=str(queue), FAKE_USER=getpass.getuser(),
        NETRC=str(tmp_path / "no_netrc"), OMP_NUM_THREADS="1",
    )
    return {"env": env, "log": log, "queue": queue, "data": write_markov_data(tmp_path / "data"), "root": tmp_path / "runs"}


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


# -----------------------------------------------------------------------------
# Nothing submitted twice; zero-shot jobs chained after training; only runs with ckpt.pt finished


PAIR = ("--methods", "pre_ln,geonorm", "--datasets", "openwebtext")


def run_dir(cluster: dict, method: str) -> Path:
    return cluster["root"] / "openwebtext_s" / method


def queued(cluster: dict) -> list[dict]:
    return json.loads(cluster["queue"].read_text()) if cluster["queue"].is_file() else []


def set_queue(cluster: dict, jobs: list[dict]) -> None:
    cluster["queue"].write_text(json.dumps(jobs))


def option(argv: list[str], name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in argv if a.startswith(name + "=")), None)


def test_a_second_slurm_launch_submits_nothing_and_job_ids_are_recorded(cluster: dict) -> None:
    first = launch(cluster, *PAIR, f"--data_dir={cluster['data']}")
    assert first.returncode == 0, first.stderr
    assert [option(j["argv"], "--job-name") for j in submitted(cluster)] == ["spheretnorm-openwebtext_s-pre_ln", "spheretnorm-openwebtext_s-geonorm"]
    for method, job_id in (("pre_ln", "42"), ("geonorm", "43")):
        lock = json.loads((run_dir(cluster, method) / "slurm_train.lock").read_text())
        assert lock["job_id"] == job_id and lock["stage"] == "train"
        (record,) = json.loads((run_dir(cluster, method) / "slurm_jobs.json").read_text())["jobs"]
        assert record["job_id"] == job_id and record["job_name"] == f"spheretnorm-openwebtext_s-{method}"
        assert f"submitted job {job_id}" in first.stdout

    second = launch(cluster, *PAIR, f"--data_dir={cluster['data']}")
    assert second.returncode == 0, second.stderr
    assert len(submitted(cluster)) == 2  # nothing more
    skips = [line for line in second.stdout.splitlines() if line.startswith("skip ")]
    assert skips == [
        f"skip openwebtext_s/pre_ln: train job 42 is already pending (Priority) ({run_dir(cluster, 'pre_ln') / 'slurm_train.lock'})",
        f"skip openwebtext_s/geonorm: train job 43 is already pending (Priority) ({run_dir(cluster, 'geonorm') / 'slurm_train.lock'})",
    ]
    assert "0 submitted, 2 skipped" in second.stdout
    # squeue was asked for this user's jobs of the grid, by name.
    (call, *_) = [json.loads(line) for line in Path(str(cluster["log"]) + ".squeue").read_text().splitlines()]
    assert f"--user={getpass.getuser()}" in call and "spheretnorm-openwebtext_s-pre_ln" in option(call, "--name").split(",")


def test_a_stale_lock_does_not_block_and_a_queued_job_without_a_lock_does(cluster: dict) -> None:
    assert launch(cluster, *PAIR, f"--data_dir={cluster['data']}").returncode == 0
    # Job 42 ended (squeue no longer lists it); job 43 is running; someone else's job has pre_ln's name.
    set_queue(cluster, [
        {"id": "43", "name": "spheretnorm-openwebtext_s-geonorm", "user": getpass.getuser(), "state": "RUNNING", "reason": "None"},
        {"id": "7", "name": "spheretnorm-openwebtext_s-pre_ln", "user": "somebody_else", "state": "RUNNING", "reason": "None"},
    ])  # fmt: skip
    result = launch(cluster, *PAIR, f"--data_dir={cluster['data']}")
    assert result.returncode == 0, result.stderr
    jobs = submitted(cluster)
    assert len(jobs) == 3 and option(jobs[2]["argv"], "--job-name") == "spheretnorm-openwebtext_s-pre_ln"
    assert "note: openwebtext_s/pre_ln: the lock" in result.stdout and "of job 42 is stale" in result.stdout
    assert "skip openwebtext_s/geonorm: train job 43 is already running" in result.stdout
    assert json.loads((run_dir(cluster, "pre_ln") / "slurm_train.lock").read_text())["job_id"] == "44"
    assert [j["job_id"] for j in json.loads((run_dir(cluster, "pre_ln") / "slurm_jobs.json").read_text())["jobs"]] == ["42", "44"]

    # A job of this user with the run's name blocks even without a lock (submitted by hand, or elsewhere).
    (run_dir(cluster, "pre_ln") / "slurm_train.lock").unlink()
    result = launch(cluster, *PAIR, f"--data_dir={cluster['data']}")
    assert result.returncode == 0 and len(submitted(cluster)) == 3
    assert "skip openwebtext_s/pre_ln: train job 44 named spheretnorm-openwebtext_s-pre_ln is already pending" in result.stdout


def test_chain_zero_shot_submits_each_evaluation_after_its_training(cluster: dict) -> None:
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
    result = launch(cluster, *PAIR, f"--data_dir={cluster['data']}", "--chain_zero_shot", **env)
    assert result.returncode == 0, result.stderr
    jobs = [j["argv"] for j in submitted(cluster)]
    assert [option(a, "--job-name") for a in jobs] == [
        "spheretnorm-openwebtext_s-pre_ln", "spheretnorm-zero_shot-openwebtext_s-pre_ln",
        "spheretnorm-openwebtext_s-geonorm", "spheretnorm-zero_shot-openwebtext_s-geonorm",
    ]  # fmt: skip
    assert [option(a, "--dependency") for a in jobs] == [None, "afterok:42", None, "afterok:44"]
    offline = ",".join(f"{k}={v}" for k, v in env.items())
    assert option(jobs[0], "--export") == f"ALL,GPUS_PER_NODE=8,{offline}"  # training
    assert option(jobs[1], "--export") == f"ALL,{offline}"  # zero-shot
    assert "eval/zero_shot.py" in option(jobs[1], "--wrap") and jobs[1].index("--dependency=afterok:42") < jobs[1].index("--wrap=" + option(jobs[1], "--wrap"))
    lock = json.loads((run_dir(cluster, "pre_ln") / "slurm_zero_shot.lock").read_text())
    assert lock["job_id"] == "43" and lock["after"] == "42"

    # Again: every job is queued, nothing is submitted.
    again = launch(cluster, *PAIR, f"--data_dir={cluster['data']}", "--chain_zero_shot")
    assert again.returncode == 0 and len(submitted(cluster)) == 4
    assert "skip openwebtext_s/pre_ln: zero_shot job 43 is already pending (Dependency)" in again.stdout
    # A training job still queued whose evaluation is not: the evaluation waits for that job.
    set_queue(cluster, [job for job in queued(cluster) if job["id"] != "45"])
    third = launch(cluster, *PAIR, f"--data_dir={cluster['data']}", "--chain_zero_shot")
    assert third.returncode == 0, third.stderr
    (last,) = [j["argv"] for j in submitted(cluster)[4:]]
    assert option(last, "--job-name") == "spheretnorm-zero_shot-openwebtext_s-geonorm" and option(last, "--dependency") == "afterok:44"


def test_a_printed_chain_is_a_working_shell_script(cluster: dict, tmp_path: Path) -> None:
    result = launch(cluster, "--methods", "pre_ln", "--datasets", "openwebtext", f"--data_dir={cluster['data']}", "--chain_zero_shot", "--dry_run")
    assert result.returncode == 0, result.stderr
    assert submitted(cluster) == []
    script = tmp_path / "grid.sh"
    script.write_text(result.stdout)
    ran = subprocess.run(["bash", "-e", str(script)], cwd=REPO, env=cluster["env"], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    first, second = (j["argv"] for j in submitted(cluster))
    assert "--parsable" in first and option(second, "--dependency") == "afterok:42"


def test_chain_zero_shot_needs_slurm_and_the_train_stage(cluster: dict) -> None:
    result = launch(cluster, *PAIR, "--chain_zero_shot", "--stage", "zero_shot")
    assert result.returncode == 2 and submitted(cluster) == []
    assert result.stderr.strip().splitlines() == [
        "error: --chain_zero_shot does not work with --stage zero_shot; it needs --mode slurm and --stage train (it queues each run's zero-shot job after its training job)."
    ]


def write_trained(cluster: dict, method: str, with_checkpoint: bool) -> Path:
    """A run folder whose training reached max_iters, with or without its ckpt.pt."""
    out = run_dir(cluster, method)
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "iter": 10**9, "val_loss": 3.0}) + "\n")
    if with_checkpoint:
        (out / "ckpt.pt").write_bytes(b"stand-in")
    return out


def test_a_run_without_its_checkpoint_is_not_finished(cluster: dict) -> None:
    write_trained(cluster, "pre_ln", with_checkpoint=False)
    write_trained(cluster, "geonorm", with_checkpoint=True)
    result = launch(cluster, *PAIR, "--stage", "zero_shot")
    assert result.returncode == 0, result.stderr
    (job,) = [j["argv"] for j in submitted(cluster)]  # only the run with a checkpoint is evaluated
    assert option(job, "--job-name") == "spheretnorm-zero_shot-openwebtext_s-geonorm"
    assert "skip openwebtext_s/pre_ln: reached max_iters" in result.stdout and "has no ckpt.pt to evaluate" in result.stdout
    # Training: the run without a checkpoint trains again; the finished one is skipped.
    result = launch(cluster, *PAIR, f"--data_dir={cluster['data']}")
    assert result.returncode == 0, result.stderr
    assert [option(j["argv"], "--job-name") for j in submitted(cluster)[1:]] == ["spheretnorm-openwebtext_s-pre_ln"]
    assert "left no ckpt.pt, so it trains again" in result.stdout
    assert "skip openwebtext_s/geonorm: finished" in result.stdout


def test_squeue_output_is_parsed_robustly() -> None:
    from spheretnorm.cluster.slurm import QueuedJob, parse_squeue

    text = "\n".join([
        "JOBID|STATE|REASON|NAME",  # a header, when --noheader is not understood
        "",
        "   101|RUNNING|None|spheretnorm-a  ",
        "102_3|PENDING|Priority|spheretnorm-b|with-a-bar",  # an array task; a name holding the separator
        "103+0|PENDING|Resources|spheretnorm-c",  # a heterogeneous job's component
        "104|COMPLETED|None|spheretnorm-d",  # ended: shown for a while, but no longer queued
        "105|CANCELLED by 0|None|spheretnorm-e",
        "squeue: warning: something",
        "106|COMPLETING|None|spheretnorm-f",
    ])  # fmt: skip
    assert parse_squeue(text) == [
        QueuedJob("101", "RUNNING", "None", "spheretnorm-a"),
        QueuedJob("102", "PENDING", "Priority", "spheretnorm-b|with-a-bar"),
        QueuedJob("103", "PENDING", "Resources", "spheretnorm-c"),
        QueuedJob("106", "COMPLETING", "None", "spheretnorm-f"),
    ]


def test_gpu_check_help_runs_nothing(tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--help"], cwd=tmp_path, env={**os.environ, "OUT": str(tmp_path / "out")},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "One GPU check of the fused sphere update" in result.stdout
    assert "nvidia-smi" not in result.stdout + result.stderr and not (tmp_path / "out").exists()
