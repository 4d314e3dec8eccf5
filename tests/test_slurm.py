"""scripts/slurm_train.sh against stand-in SLURM and torchrun executables.

Nothing here needs SLURM or a GPU. A tmp dir put first on PATH holds:
  torchrun   two kinds. "old" (torch 2.4-2.9): its argparse knows no --signals_to_handle /
             --shutdown_timeout and exits 2 on them, and it leaves SIGUSR1 at its default
             action, so a USR1 kills it. "new" (torch >= 2.10): accepts both flags and forwards
             the signals they name to its workers. Both start --nproc_per_node fake workers as
             their own children, in new sessions, as the real torchrun does.
  srun       runs its command once per node (SLURM_JOB_NUM_NODES) and forwards USR1/TERM to
             those task processes only (not to their descendants): the least that real srun does.
             It records its options, and passes the environment on as srun does: all of it with
             --export=ALL, else only SLURM's own variables when SLURM_EXPORT_ENV is NONE (what
             sbatch --export=NONE leaves in a job).
  scontrol   `show hostnames` prints node names; `requeue` is recorded.
The fake worker records its arguments, the variables of WORKER_ENV and the signal that stopped
it, then exits 0, as train.py does after checkpointing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm_train.sh"
NEW_FLAGS = ("--signals_to_handle", "--shutdown_timeout")
TIMEOUT_S = 15
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
WORKER_ENV = ("OMP_NUM_THREADS", *OFFLINE)  # what the fake worker records of its environment

FAKE_TORCHRUN = r'''#!{python}
"""Stand-in torchrun of the {kind!r} kind."""
import argparse, json, os, signal, subprocess, sys

KIND = {kind!r}
parser = argparse.ArgumentParser(prog="torchrun")
parser.add_argument("--nnodes", default="1")
parser.add_argument("--nproc_per_node", type=int, default=1)
parser.add_argument("--node_rank", type=int, default=0)
parser.add_argument("--rdzv_id")
parser.add_argument("--rdzv_backend")
parser.add_argument("--rdzv_endpoint")
parser.add_argument("--standalone", action="store_true")
if KIND == "new":
    parser.add_argument("--signals_to_handle", default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
                        help="signals to forward to the workers")
    parser.add_argument("--shutdown_timeout", type=int, default=None,
                        help="seconds the workers get after a signal")
parser.add_argument("training_script")
parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
args = parser.parse_args()

log_dir = os.environ["FAKE_LOG_DIR"]
with open(os.path.join(log_dir, "torchrun.jsonl"), "a") as f:
    f.write(json.dumps({{"kind": KIND, "argv": sys.argv[1:], "pid": os.getpid()}}) + "\n")

workers = [
    subprocess.Popen(
        [sys.executable, os.environ["FAKE_WORKER"], args.training_script, *args.training_script_args],
        env={{**os.environ, "LOCAL_RANK": str(rank), "FAKE_NODE": os.environ.get("SLURM_NODEID", "0")}},
        start_new_session=True,
    )
    for rank in range(args.nproc_per_node)
]

def forward(signum, frame):
    for w in workers:
        if w.poll() is None:
            w.send_signal(signum)

handled = getattr(args, "signals_to_handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT")
for name in handled.split(","):
    signal.signal(getattr(signal, name.strip()), forward)
sys.exit(max(w.wait() for w in workers))
'''

FAKE_WORKER = r'''#!{python}
"""Stand-in train.py worker: records its argv and the stop signal, exits 0 like train.py."""
import json, os, signal, sys, time

log_dir = os.environ["FAKE_LOG_DIR"]
name = os.path.join(log_dir, "worker-%s-%s.json" % (os.environ["FAKE_NODE"], os.environ["LOCAL_RANK"]))
record = {{"argv": sys.argv[1:], "signal": None, "env": {{k: os.environ.get(k) for k in {worker_env!r}}}}}

def save():
    with open(name + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(name + ".tmp", name)

def stop(signum, frame):
    record["signal"] = signal.Signals(signum).name
    save()
    sys.exit(0)

signal.signal(signal.SIGUSR1, stop)
signal.signal(signal.SIGTERM, stop)
save()  # "started": only written once the handlers are in place
if os.environ.get("FAKE_WORKER_MODE") == "finish":
    sys.exit(0)
deadline = time.time() + {timeout}
while time.time() < deadline:
    time.sleep(0.02)
sys.exit(3)  # never signalled
'''

FAKE_SRUN = r'''#!/bin/bash
# Stand-in srun: options are recorded; the command runs once per node. Without --export=ALL, a
# job whose SLURM_EXPORT_ENV is NONE gives its tasks SLURM's variables only (and the tests' own).
export_all=0
while [[ $# -gt 0 && $1 == -* ]]; do
  echo "$1" >> "$FAKE_LOG_DIR/srun_options"
  [[ $1 == --export=ALL* ]] && export_all=1
  shift
done
task_env=(env)  # env execs the task: its pid is the task's
if [[ $export_all == 0 && ${SLURM_EXPORT_ENV:-} == NONE* ]]; then
  task_env=(env -i)
  while IFS= read -r name; do task_env+=("$name=${!name}"); done < <(compgen -e | grep -E '^(SLURM_|FAKE_|PATH$|HOME$)')
fi
pids=()
for ((node = 0; node < ${SLURM_JOB_NUM_NODES:-1}; node++)); do
  "${task_env[@]}" SLURM_NODEID=$node "$@" &
  pids+=($!)
done
echo "${pids[*]}" > "$FAKE_LOG_DIR/srun_tasks"
trap 'kill -USR1 "${pids[@]}" 2>/dev/null' USR1
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM
status=0
for pid in "${pids[@]}"; do
  while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done
  wait "$pid"; s=$?
  (( s > status )) && status=$s
done
exit $status
'''

FAKE_SCONTROL = r'''#!/bin/bash
# Stand-in scontrol: `show hostnames LIST` and `requeue ID`.
echo "$*" >> "$FAKE_LOG_DIR/scontrol"
if [[ $1 == show && $2 == hostnames ]]; then
  for ((i = 0; i < ${SLURM_JOB_NUM_NODES:-1}; i++)); do echo "node$i"; done
fi
'''


def write_executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def fake_cluster(tmp_path: Path, kind: str) -> dict[str, str]:
    """A bin dir of stand-ins, a log dir, and the environment of a 2-node SLURM batch job."""
    bin_dir, log_dir = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log_dir.mkdir()
    write_executable(bin_dir / "torchrun", FAKE_TORCHRUN.format(python=sys.executable, kind=kind))
    write_executable(tmp_path / "worker.py", FAKE_WORKER.format(python=sys.executable, timeout=TIMEOUT_S, worker_env=WORKER_ENV))
    write_executable(bin_dir / "srun", FAKE_SRUN)
    write_executable(bin_dir / "scontrol", FAKE_SCONTROL)
    # No thread count or offline setting from the machine running the tests, nor a SLURM job of its own.
    outside = {k: v for k, v in os.environ.items() if k not in WORKER_ENV and not k.startswith("SLURM_")}
    return {
        **outside,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_LOG_DIR": str(log_dir),
        "FAKE_WORKER": str(tmp_path / "worker.py"),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "node[0-1]",
        "SLURM_RESTART_COUNT": "0",
        "GPUS_PER_NODE": "2",
    }


def start_job(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", str(SCRIPT), "config/shakespeare_char.py", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def worker_records(env: dict[str, str]) -> list[dict]:
    records = []
    for path in sorted(Path(env["FAKE_LOG_DIR"]).glob("worker-*.json")):
        records.append(json.loads(path.read_text()))
    return records


def wait_for_workers(job: subprocess.Popen, env: dict[str, str], count: int) -> None:
    deadline = time.time() + TIMEOUT_S
    while len(worker_records(env)) < count:
        if job.poll() is not None:
            pytest.fail(f"the job ended (exit {job.returncode}) before its workers started:\n{job.stdout.read()}")
        if time.time() > deadline:
            job.kill()
            pytest.fail("the workers did not start in time")
        time.sleep(0.02)


def finish(job: subprocess.Popen) -> str:
    try:
        out, _ = job.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        job.kill()
        out, _ = job.communicate()
        pytest.fail(f"the job did not end:\n{out}")
    return out


def torchrun_calls(env: dict[str, str]) -> list[dict]:
    path = Path(env["FAKE_LOG_DIR"]) / "torchrun.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def requeued(env: dict[str, str]) -> bool:
    path = Path(env["FAKE_LOG_DIR"]) / "scontrol"
    return path.exists() and "requeue 4242" in path.read_text().splitlines()


# -----------------------------------------------------------------------------


def test_old_stand_in_refuses_the_new_flags(tmp_path: Path) -> None:
    """The old stand-in behaves like torch 2.4-2.9's torchrun, so the other tests mean something."""
    env = fake_cluster(tmp_path, "old")
    help_text = subprocess.run(["torchrun", "--help"], env=env, capture_output=True, text=True).stdout
    assert "--nproc_per_node" in help_text and not any(flag in help_text for flag in NEW_FLAGS)
    result = subprocess.run(["torchrun", "--signals_to_handle=SIGUSR1", "x.py"], env=env, capture_output=True, text=True)
    assert result.returncode == 2 and "unrecognized arguments" in result.stderr


@pytest.mark.parametrize("kind", ["old", "new"])
def test_job_runs_to_the_end_with_either_torchrun(tmp_path: Path, kind: str) -> None:
    env = {**fake_cluster(tmp_path, kind), "FAKE_WORKER_MODE": "finish"}
    out = finish(start_job(env, "--connection=geonorm"))
    calls = torchrun_calls(env)
    assert len(calls) == 2, out  # one torchrun per node
    for call in calls:
        assert call["kind"] == kind
        passed = [flag for flag in NEW_FLAGS if any(a.startswith(flag) for a in call["argv"])]
        assert passed == (list(NEW_FLAGS) if kind == "new" else []), call["argv"]
        assert "--rdzv_endpoint=node0:29500" in call["argv"] and "--nproc_per_node=2" in call["argv"]
    records = worker_records(env)
    assert len(records) == 4  # 2 nodes x 2 workers
    for record in records:
        assert record["argv"] == ["train.py", "config/shakespeare_char.py", "--init_from=auto", "--connection=geonorm"]
        assert record["signal"] is None
    assert not requeued(env)


def test_user_init_from_replaces_auto(tmp_path: Path) -> None:
    """An explicit --init_from is the only one train.py gets, as is launch.py's --init_from=auto."""
    env = {**fake_cluster(tmp_path, "new"), "FAKE_WORKER_MODE": "finish", "SLURM_RESTART_COUNT": "3"}
    finish(start_job(env, "--init_from=resume"))
    argv = worker_records(env)[0]["argv"]
    assert argv[2:] == ["--init_from=resume"]
    for path in Path(env["FAKE_LOG_DIR"]).glob("worker-*.json"):
        path.unlink()
    finish(start_job(env, "--connection=geonorm", "--init_from=auto"))  # as launch.py submits it
    argv = worker_records(env)[0]["argv"]
    assert argv[2:] == ["--connection=geonorm", "--init_from=auto"]


def srun_options(env: dict[str, str]) -> list[str]:
    path = Path(env["FAKE_LOG_DIR"]) / "srun_options"
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize("cpus, threads", [("16", "8"), ("3", "1"), ("1", "1")])
def test_threads_follow_cpus_per_task_and_srun_gets_it(tmp_path: Path, cpus: str, threads: str) -> None:
    """--cpus-per-task=16 with 2 workers per node: 8 threads each (at least 1); newer srun does
    not inherit --cpus-per-task from sbatch, so the script passes it."""
    env = {**fake_cluster(tmp_path, "new"), "FAKE_WORKER_MODE": "finish", "SLURM_CPUS_PER_TASK": cpus, "SLURM_CPUS_ON_NODE": "64"}
    out = finish(start_job(env))
    records = worker_records(env)
    assert len(records) == 4, out
    assert {r["env"]["OMP_NUM_THREADS"] for r in records} == {threads}
    assert f"--cpus-per-task={cpus}" in srun_options(env)
    assert f"OMP_NUM_THREADS={threads} per worker" in out


def test_threads_without_cpus_per_task_share_the_nodes_cpus(tmp_path: Path) -> None:
    env = {**fake_cluster(tmp_path, "new"), "FAKE_WORKER_MODE": "finish", "SLURM_CPUS_ON_NODE": "12"}
    finish(start_job(env))
    assert {r["env"]["OMP_NUM_THREADS"] for r in worker_records(env)} == {"6"}
    assert not any(o.startswith("--cpus-per-task") for o in srun_options(env))  # srun's own default


def test_offline_variables_and_threads_reach_the_workers_of_an_export_none_job(tmp_path: Path) -> None:
    """A job submitted with --export=NONE (SLURM_EXPORT_ENV=NONE) would give srun's tasks nothing
    of the batch shell's environment; srun --export=ALL hands it on."""
    env = {**fake_cluster(tmp_path, "old"), "FAKE_WORKER_MODE": "finish", "SLURM_EXPORT_ENV": "NONE", "SLURM_CPUS_PER_TASK": "4", **OFFLINE}
    out = finish(start_job(env))
    records = worker_records(env)
    assert len(records) == 4, out
    for record in records:
        assert record["env"] == {"OMP_NUM_THREADS": "2", **OFFLINE}, out
    assert "--export=ALL" in srun_options(env)
    assert "offline settings for every worker: HF_HUB_OFFLINE=1" in out


@pytest.mark.parametrize("args", [["config/shakespeare_char.py", "--connection=geonorm"], []])
def test_outside_slurm_the_script_prints_its_usage(tmp_path: Path, args: list[str]) -> None:
    env = fake_cluster(tmp_path, "new")
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST", "SLURM_RESTART_COUNT"):
        del env[name]
    result = subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("usage: sbatch [sbatch options] scripts/slurm_train.sh config/NAME.py")
    assert "unbound variable" not in result.stderr
    assert len(result.stderr.splitlines()) == (2 if args else 1)
    assert torchrun_calls(env) == [] and result.stdout == ""
    help_text = subprocess.run(["bash", str(SCRIPT), "--help"], cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert help_text.returncode == 0 and help_text.stdout.startswith("usage: ")


@pytest.mark.parametrize("kind", ["old", "new"])
def test_time_limit_signal_reaches_every_worker_and_requeues(tmp_path: Path, kind: str) -> None:
    """SLURM's `--signal=B:USR1` goes to the batch shell only; every worker must see USR1."""
    env = fake_cluster(tmp_path, kind)
    job = start_job(env)
    wait_for_workers(job, env, 4)
    job.send_signal(signal.SIGUSR1)
    out = finish(job)
    records = worker_records(env)
    assert [r["signal"] for r in records] == ["SIGUSR1"] * 4, out
    assert requeued(env), out
    assert job.returncode == 0, out  # the workers exit 0 after saving; srun passes that on


def test_old_torchrun_survives_usr1_from_the_step(tmp_path: Path) -> None:
    """A USR1 that SLURM delivers to the whole step (torchrun included) must not kill old torchrun."""
    env = fake_cluster(tmp_path, "old")
    job = start_job(env)
    wait_for_workers(job, env, 4)
    for call in torchrun_calls(env):
        os.kill(call["pid"], signal.SIGUSR1)
    time.sleep(0.3)
    assert all(r["signal"] is None for r in worker_records(env))  # torchrun ignored it and lives
    job.send_signal(signal.SIGUSR1)
    finish(job)
    assert job.returncode == 0
    assert [r["signal"] for r in worker_records(env)] == ["SIGUSR1"] * 4


def test_preemption_term_reaches_the_workers_of_old_torchrun(tmp_path: Path) -> None:
    """SIGTERM to the step's tasks (pre-emption) reaches the workers; no requeue by the script."""
    env = fake_cluster(tmp_path, "old")
    job = start_job(env)
    wait_for_workers(job, env, 4)
    srun_pid = int(subprocess.run(["pgrep", "-P", str(job.pid), "-f", "srun"], capture_output=True, text=True).stdout.split()[0])
    os.kill(srun_pid, signal.SIGTERM)
    finish(job)
    assert [r["signal"] for r in worker_records(env)] == ["SIGTERM"] * 4
    assert job.returncode == 0 and not requeued(env)


def test_missing_torchrun_is_one_clear_error(tmp_path: Path) -> None:
    env = fake_cluster(tmp_path, "new")
    (tmp_path / "bin" / "torchrun").unlink()
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin"
    result = subprocess.run(["bash", str(SCRIPT), "config/shakespeare_char.py"], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: torchrun is not on PATH; activate the environment that has torch before running sbatch."
    ]
