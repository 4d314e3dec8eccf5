"""Bad input on the newer surfaces: one sentence, nothing submitted that was refused, no history lost.

A. scripts/launch.py --mode slurm with --sbatch_args the launcher owns or refuses (in every form
   sbatch reads: -N2, -N 2, --nodes=2, --nodes 2), a bare word, an option without its value, an
   option given twice, and SBATCH_* variables that are not counts: every case is refused before
   the first sbatch call, in one line, with exit status 2. A stand-in sbatch (test_cluster_day's)
   records every call.
B. The launcher's other pre-flight refusals: a --runs_root that is a file or cannot be created,
   WANDB_MODE that is not a W&B mode.
C. train.py started (scratch, or init_from=auto without a checkpoint) in a folder that holds
   another run's metrics.jsonl, config.json or zero-shot results: refused, the files untouched,
   unless --overwrite=true; the same run starting again after a crash before its first
   checkpoint is not another run, and starts.
D. A resume whose metrics.jsonl rewrite fails (a full disk): one line, no metrics.jsonl.tmp left,
   the old metrics.jsonl whole.

The launcher runs in-process (its main returns the exit status), so an uncaught exception is a
traceback; one case of each kind also runs as a real process.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

import train
from spheretnorm.cluster import launcher
from spheretnorm.runtime import run_folder
from spheretnorm.runtime.config import ConfigError
from spheretnorm.runtime.run_folder import OutDirError
from test_cluster_day import cluster, submitted  # noqa: F401 (cluster: a fixture)
from test_train import REPO, SUBPROCESS_ENV, data_dir, tiny_args  # noqa: F401 (data_dir: a fixture)

GRID = ["--mode", "slurm", "--scales", "S", "--datasets", "openwebtext", "--methods", "pre_ln,geonorm"]

# (id, --sbatch_args, {environment}): every one refused with nothing submitted.
REFUSED_SBATCH = [
    ("J", "-J mine", {}),
    ("J-attached", "-Jmine", {}),
    ("job-name", "--job-name=mine", {}),
    ("job-name-separate", "--job-name mine", {}),
    ("o", "-o log.txt", {}),
    ("output", "--output=log.txt", {}),
    ("e", "-e err.txt", {}),
    ("error", "--error err.txt", {}),
    ("N-attached", "-N2", {}),
    ("N-separate", "-N 2", {}),
    ("nodes", "--nodes=2", {}),
    ("nodes-separate", "--nodes 2", {}),
    ("N-in-a-cluster", "-HN2", {}),
    ("G-separate", "-G 2", {}),
    ("G-attached", "-G2", {}),
    ("gpus", "--gpus=2", {}),
    ("gpus-per-node", "--partition=gpu --gpus-per-node=2", {}),
    ("gres", "--gres=gpu:2", {}),
    ("gres-separate", "--gres gpu:a100:2", {}),
    ("n", "-n 4", {}),
    ("ntasks", "--ntasks=4", {}),
    ("ntasks-per-node", "--ntasks-per-node=8", {}),
    ("export", "--export=NONE", {}),
    ("wrap", "--wrap=hostname", {}),
    ("bare-word", "other_job.sh", {}),
    ("bare-word-after-options", "--partition=gpu other_job.sh --time=1:00:00", {}),
    ("double-dash", "-- --partition=gpu", {}),
    ("twice-short-and-long", "-c 8 --cpus-per-task=16", {}),
    ("twice-long", "--partition=gpu --partition=debug", {}),
    ("no-value-last", "--time=1:00:00 --partition", {}),
    ("no-value-before-option", "--partition --account=lab", {}),
    ("short-no-value", "-p", {}),
    ("unknown-short", "-Z", {}),
    ("unsplittable", "--comment='unclosed", {}),
    ("SBATCH_NODES-negative", "", {"SBATCH_NODES": "-3"}),
    ("SBATCH_NODES-zero", "", {"SBATCH_NODES": "0"}),
    ("SBATCH_NODES-range", "", {"SBATCH_NODES": "2-4"}),
    ("SBATCH_GPUS_PER_NODE-word", "", {"SBATCH_GPUS_PER_NODE": "abc"}),
    ("SBATCH_GPUS_PER_NODE-zero", "", {"SBATCH_GPUS_PER_NODE": "a100:0"}),
    ("SBATCH_NODES-bad-with-nnodes", "--nodes=1", {"SBATCH_NODES": "x"}),
]
# What clusters want: still accepted, every option passed on.
ACCEPTED_SBATCH = [
    ("long-forms", "--partition=gpu --account=lab --qos=high --time=12:00:00 --cpus-per-task=16", {}),
    ("short-forms", "-p gpu -A lab -q high -t 12:00:00 -c 16", {}),
    ("flags", "--requeue --exclusive -v -v --mem=0", {}),
    ("separate-values", "--partition gpu --constraint a100", {}),
    ("non-gpu-gres", "--gres=nvme:1", {}),
    ("typed-gpus-variable", "", {"SBATCH_GPUS_PER_NODE": "a100:4", "SBATCH_NODES": "2"}),
]


def run_launcher(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, argv: list[str], env: dict[str, str]) -> dict:
    """launcher.main in-process under the stand-in SLURM: exit status (None: it raised), stderr,
    the traceback if one escaped, the sbatch calls made."""
    for key in [k for k in os.environ if k.startswith(("SBATCH_", "WANDB_"))]:
        monkeypatch.delenv(key)
    for key, value in {**cluster["env"], **env}.items():
        monkeypatch.setenv(key, value)
    status, trace = None, ""
    try:
        status = launcher.main(argv)
    except SystemExit as e:
        status = e.code
    except Exception:
        trace = traceback.format_exc()
    captured = capsys.readouterr()
    return {"status": status, "err": captured.err, "out": captured.out, "trace": trace, "calls": len(submitted(cluster))}


def refusal_class(result: dict) -> str | None:
    """What went wrong with a case that must be refused: None when it was refused as it should be."""
    if result["trace"] or "Traceback" in result["err"]:
        return "traceback"
    refused = result["status"] not in (0, None) or "error:" in result["err"]
    if refused and result["calls"]:
        return "refused-but-submitted"
    if not refused:
        return "silent acceptance"
    lines = [line for line in result["err"].strip().splitlines() if line.strip()]
    if result["status"] != 2 or len(lines) != 1 or not lines[0].startswith("error: "):
        return "not one sentence with exit 2"
    return None


def sbatch_argv(cluster: dict, case: str, env: dict[str, str]) -> list[str]:
    return [*GRID, "--runs_root", str(cluster["root"]), f"--data_dir={cluster['data']}", f"--sbatch_args={case}"]


@pytest.mark.parametrize("case,env", [pytest.param(a, e, id=i) for i, a, e in REFUSED_SBATCH])
def test_a_refused_sbatch_option_submits_nothing(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, case: str, env: dict) -> None:
    result = run_launcher(cluster, monkeypatch, capsys, sbatch_argv(cluster, case, env), env)
    assert refusal_class(result) is None, result
    assert result["calls"] == 0
    word = next(iter(env), "--sbatch_args")
    assert word in result["err"]  # it names what is wrong


@pytest.mark.parametrize("case,env", [pytest.param(a, e, id=i) for i, a, e in ACCEPTED_SBATCH])
def test_sbatch_options_clusters_want_are_passed_on(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, case: str, env: dict) -> None:
    result = run_launcher(cluster, monkeypatch, capsys, sbatch_argv(cluster, case, env), env)
    assert result["status"] == 0 and not result["trace"], result
    jobs = submitted(cluster)
    assert len(jobs) == 2
    for job in jobs:
        argv = job["argv"]
        given = launcher.shlex.split(case)
        assert argv[2:2 + len(given)] == given  # after --job-name and --output, as written


def test_a_refused_sbatch_option_is_one_line_from_a_real_process(cluster: dict) -> None:
    result = subprocess.run(
        [sys.executable, "scripts/launch.py", *sbatch_argv(cluster, "-N 2", {})],
        cwd=REPO, env=cluster["env"], capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and submitted(cluster) == []
    assert result.stderr == "error: --sbatch_args sets -N (--nodes), which the launcher sets from --nnodes; use that instead.\n"


# -----------------------------------------------------------------------------
# B: the launcher's other pre-flight refusals


def runs_root_cases(tmp_path: Path) -> dict[str, Path]:
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder\n")
    return {"file": a_file, "under-a-file": a_file / "runs", "proc": Path("/proc/spheretnorm-test/runs")}


@pytest.mark.parametrize("mode", ["slurm", "local"])
@pytest.mark.parametrize("kind", ["file", "under-a-file", "proc"])
def test_a_runs_root_that_cannot_hold_runs_is_one_line(
    cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path, kind: str, mode: str
) -> None:
    root = runs_root_cases(tmp_path)[kind]
    argv = [*GRID, "--mode", mode, "--runs_root", str(root), f"--data_dir={cluster['data']}", "--nproc_per_node=1"]
    result = run_launcher(cluster, monkeypatch, capsys, argv, {})
    assert refusal_class(result) is None, result
    assert "--runs_root" in result["err"] and str(root) in result["err"]


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_bogus_wandb_mode_is_one_line(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, dry_run: bool) -> None:
    argv = [*GRID, "--runs_root", str(cluster["root"]), f"--data_dir={cluster['data']}", "--wandb_log=true", *(["--dry_run"] if dry_run else [])]
    result = run_launcher(cluster, monkeypatch, capsys, argv, {"WANDB_MODE": "bogus"})
    assert refusal_class(result) is None, result
    assert "WANDB_MODE='bogus'" in result["err"] and "online, offline, disabled" in result["err"]


# -----------------------------------------------------------------------------
# C: a new run never replaces another run's files without --overwrite

RUN = ("--max_iters=4", "--eval_interval=2")


@pytest.fixture(scope="module")
def finished(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run evaluated up to iter 4, with a zero-shot result beside it."""
    out = tmp_path_factory.mktemp("finished")
    train.main(tiny_args(data_dir, out, *RUN))
    (out / "ckpt_zero_shot.json").write_text(json.dumps({"results": {"hellaswag": {"acc": 0.3}}}) + "\n")
    return out


def folder_of(kind: str, finished: Path, data_dir: Path, out: Path) -> Path:
    """A folder without ckpt.pt that holds an earlier run's files."""
    if kind == "started-with-other-settings":  # crashed before its first checkpoint, another learning rate
        with pytest.raises(RuntimeError, match="deliberate crash"):
            train.main(tiny_args(data_dir, out, *RUN, "--learning_rate=1e-3", "--debug_crash_at_iter=1"))
        return out
    shutil.copytree(finished, out)
    (out / "ckpt.pt").unlink()
    if kind == "metrics-and-config":
        (out / "ckpt_zero_shot.json").unlink()
    elif kind == "zero-shot-only":
        (out / "metrics.jsonl").unlink()
        (out / "config.json").unlink()
    elif kind == "metrics-only":
        (out / "config.json").unlink()
        (out / "ckpt_zero_shot.json").unlink()
    return out


def snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and not p.name.startswith(".")}


HISTORY = ["with-zero-shot", "metrics-and-config", "zero-shot-only", "metrics-only", "started-with-other-settings"]


def start_over(data_dir: Path, out: Path, init_from: str, *extra: str) -> str | None:
    """train.main as a new run in out: None when it started, else what stopped it (its class)."""
    try:
        train.main(tiny_args(data_dir, out, *RUN, f"--init_from={init_from}", *extra))
    except (ConfigError, OutDirError) as e:
        assert "\n" not in str(e)
        return str(e)
    return None


@pytest.mark.parametrize("init_from", ["auto", "scratch"])
@pytest.mark.parametrize("kind", HISTORY)
def test_a_new_run_never_replaces_another_runs_files(finished: Path, data_dir: Path, tmp_path: Path, kind: str, init_from: str) -> None:
    out = folder_of(kind, finished, data_dir, tmp_path / "run")
    before = snapshot(out)
    refusal = start_over(data_dir, out, init_from)
    assert snapshot(out) == before  # nothing replaced, nothing added
    assert refusal is not None and str(out) in refusal and "--overwrite=true" in refusal and "--out_dir" in refusal


@pytest.mark.parametrize("kind", ["with-zero-shot", "started-with-other-settings"])
def test_overwrite_replaces_another_runs_files(finished: Path, data_dir: Path, tmp_path: Path, kind: str) -> None:
    out = folder_of(kind, finished, data_dir, tmp_path / "run")
    assert start_over(data_dir, out, "auto", "--overwrite=true") is None
    assert (out / "ckpt.pt").is_file()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4]  # this run's rows only


def test_the_same_run_started_again_after_an_early_crash_starts(data_dir: Path, tmp_path: Path) -> None:
    """A job that crashed before its first checkpoint, restarted with the same command (init_from=auto,
    as the launcher's and the SLURM script's), is no other run: it starts, without --overwrite."""
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="deliberate crash"):
        train.main(tiny_args(data_dir, out, *RUN, "--init_from=auto", "--debug_crash_at_iter=1"))
    assert not (out / "ckpt.pt").exists() and (out / "metrics.jsonl").is_file()
    assert start_over(data_dir, out, "auto") is None
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4]


def test_a_refused_start_is_one_line_with_exit_2(finished: Path, data_dir: Path, tmp_path: Path) -> None:
    out = folder_of("metrics-and-config", finished, data_dir, tmp_path / "run")
    result = subprocess.run([sys.executable, "train.py", *tiny_args(data_dir, out, *RUN, "--init_from=auto")],
                            cwd=REPO, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: out_dir ") and "metrics.jsonl, config.json (evaluated up to iter 4)" in last


def test_the_launcher_skips_a_folder_train_py_would_refuse(cluster: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A run folder with an earlier run's history but no checkpoint is skipped with the reason, not
    submitted to fail at start; one that reached max_iters without ckpt.pt trains again with
    --overwrite=true (its settings are the grid's: a folder with other settings is skipped before)."""
    root = cluster["root"]
    argv = [*GRID, "--mode", "print", "--runs_root", str(root), f"--data_dir={cluster['data']}", "--max_iters=4"]
    runs = {run.method: run for run in launcher.build_grid(["pre_ln", "geonorm"], ["S"], ["openwebtext"], root, argv[-2:], 8)}
    for method, last_eval in (("pre_ln", 2), ("geonorm", 4)):
        out = runs[method].path
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({**runs[method].settings, "max_iters": 4}, default=str))
        (out / "metrics.jsonl").write_text("".join(json.dumps({"kind": "eval", "iter": i}) + "\n" for i in range(0, last_eval + 1, 2)))
    result = run_launcher(cluster, monkeypatch, capsys, argv, {})
    assert result["status"] == 0 and not result["trace"], result
    plan = result["out"]
    commands = [line for line in plan.splitlines() if line.startswith("torchrun ")]
    assert len(commands) == 1 and "--connection=geonorm" in commands[0] and "--overwrite=true" in commands[0]
    skip = next(line for line in plan.splitlines() if line.startswith("# skip openwebtext_s/pre_ln"))
    assert "holds an earlier run's metrics.jsonl, config.json (evaluated up to iter 2) but no ckpt.pt" in skip


# -----------------------------------------------------------------------------
# D: a failed metrics.jsonl rewrite on resume


def test_a_failed_metrics_rewrite_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"kind": "train", "iter": i}) + "\n" for i in range(1, 6)))
    before = path.read_bytes()

    def full(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr(run_folder.os, "replace", full)
    with pytest.raises(OSError, match=r"could not rewrite .*metrics.jsonl \(No space left on device\); it is as it was"):
        run_folder.MetricsLog(path, resume_iter=3)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))


def test_a_resume_on_a_full_disk_is_one_line_and_leaves_no_temp_file(data_dir: Path, tmp_path: Path) -> None:
    args = tiny_args(data_dir, tmp_path, "--eval_interval=2")
    train.main([*args, "--max_iters=2"])
    with (tmp_path / "metrics.jsonl").open("a") as f:  # rows a resume keeps, more than the limit
        f.write(json.dumps({"kind": "note", "iter": 0, "pad": "x" * 70_000}) + "\n")
    before = (tmp_path / "metrics.jsonl").read_bytes()
    result = subprocess.run([sys.executable, "train.py", *args, "--max_iters=4", "--init_from=auto"], cwd=REPO, env=SUBPROCESS_ENV,
                            capture_output=True, text=True, timeout=300, preexec_fn=_limit_file_size)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: could not rewrite {tmp_path / 'metrics.jsonl'} (File too large); it is as it was; ") and "(iter 2) is untouched" in last
    assert not (tmp_path / "metrics.jsonl.tmp").exists()
    assert (tmp_path / "metrics.jsonl").read_bytes() == before
