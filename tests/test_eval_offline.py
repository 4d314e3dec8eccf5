"""Offline evaluation never touches the network (spheretnorm/zeroshot/offline.py).

eval/zero_shot.py runs in a subprocess whose every network attempt (DNS look-up, connect) is
recorded and refused, as on a compute node without internet, and without the offline variables
in its environment unless a test sets them. --local_data, HF_DATASETS_OFFLINE=1 and
HF_HUB_OFFLINE=1 each turn the hub off: a task whose local files are absent, or whose hub
dataset is not in the (empty) HF cache, is refused in one line before any network attempt,
instead of lm-eval retrying the hub for minutes; and a whole evaluation from --local_data
makes no network attempt at all (tokenizer included).
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from spheretnorm.zeroshot import offline
from test_eval_faults import ckpt  # noqa: F401  (a fixture: a real tiny GPT-2-vocabulary checkpoint)

REPO = Path(__file__).resolve().parents[1]

# Runs eval/zero_shot.py's main with the network refused; NETGUARD_LOG collects every attempt.
# FAST_BUILTIN indexes only those built-in task folders ('-': none) and the include paths
# (lm-eval's full index takes long).
GUARD = r'''
import os, socket, sys, traceback

def refuse(*args, **kwargs):
    with open(os.environ["NETGUARD_LOG"], "a") as log:
        log.write(f"network attempt {args[:2]!r}\n" + "".join(traceback.format_stack(limit=12)) + "\n")
    raise OSError("network refused by the test")

if os.environ.get("NETGUARD_LOG"):  # unset: the network as it is (a closed port stands for the hub)
    socket.getaddrinfo = refuse
    socket.create_connection = refuse
    socket.socket.connect = lambda self, *args: refuse(*args)

from spheretnorm.zeroshot import driver

if os.environ.get("FAST_BUILTIN"):
    def make_task_manager(paths):
        import pathlib
        import lm_eval.tasks
        base = pathlib.Path(lm_eval.tasks.__file__).parent
        builtin = [str(base / b) for b in os.environ["FAST_BUILTIN"].split(",") if b != "-"]
        return lm_eval.tasks.TaskManager(include_path=[*builtin, *paths], include_defaults=False)
    driver.make_task_manager = make_task_manager

sys.exit(driver.main(sys.argv[1:]))
'''

CLOSED_PORT = "http://127.0.0.1:9"  # the discard port, closed: a hub that refuses every connection

SCIQ = [{"question": "What do plants take in?", "distractor3": "salt", "distractor1": "sand", "distractor2": "oil", "correct_answer": "carbon dioxide", "support": ""}]


@pytest.fixture
def sciq_only(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "sciq").mkdir(parents=True)
    (data / "sciq" / "test.json").write_text(json.dumps(SCIQ))
    return data


def run_guarded(
    tmp_path: Path, argv: list[str], offline_vars: dict[str, str] | None = None, fast_builtin: str = "", refuse_network: bool = True
) -> tuple[subprocess.CompletedProcess, str]:
    """eval/zero_shot.py's main with the network refused (unless not refuse_network); (the process, the network attempts it made)."""
    guard = tmp_path / "guard.py"
    guard.write_text(GUARD)
    log = tmp_path / "network.log"
    env = {k: v for k, v in os.environ.items() if k not in offline.OFFLINE_VARS and k != "TRANSFORMERS_OFFLINE"}
    env.update(offline_vars or {})
    # An empty HF cache and tiktoken cache of its own: nothing on this machine may stand in for the hub.
    env.update(HF_HOME=str(tmp_path / "hf"), TIKTOKEN_CACHE_DIR=str(tmp_path / "tiktoken"), NETGUARD_LOG=str(log) if refuse_network else "", FAST_BUILTIN=fast_builtin)
    env.pop("HF_DATASETS_CACHE", None)
    env.pop("HF_HUB_CACHE", None)
    proc = subprocess.run([sys.executable, str(guard), *map(str, argv)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    return proc, log.read_text() if log.is_file() else ""


def last_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return proc.stderr.strip().splitlines()[-1]


def test_absent_local_files_are_refused_before_any_network_attempt(ckpt: Path, sciq_only: Path, tmp_path: Path) -> None:
    argv = ["--ckpt", ckpt, "--tasks", "sciq,boolq", "--local_data", sciq_only, "--bootstrap_iters", "0"]
    proc, attempts = run_guarded(tmp_path, argv, fast_builtin="super_glue/boolq")
    assert attempts == ""
    assert proc.returncode == 2
    assert last_line(proc) == (
        f"error: --local_data {str(sciq_only)!r} lacks the files of boolq ({sciq_only / 'boolq' / 'dev.jsonl'}), and nothing "
        "is fetched from the hub with --local_data; add them (layout in eval/README.md), or pass --skip_missing to leave "
        "this task out (marked skipped in the printed table and the results JSON)."
    )


@pytest.mark.parametrize("variable", offline.OFFLINE_VARS)
def test_one_offline_variable_keeps_everything_off_the_network(ckpt: Path, tmp_path: Path, variable: str) -> None:
    proc, attempts = run_guarded(tmp_path, ["--ckpt", ckpt, "--tasks", "boolq", "--bootstrap_iters", "0"], {variable: "1"}, "super_glue/boolq")
    assert attempts == ""
    assert proc.returncode == 2
    hf = tmp_path / "hf"
    assert last_line(proc) == (
        f"error: Task boolq needs the Hugging Face hub dataset aps/super_glue (boolq), but the hub is off here ({variable}=1) "
        f"and the HF cache ({hf / 'datasets'}, {hf / 'hub'}) does not hold it; fill the cache on a machine with network "
        "(python -m eval.prefetch --tasks boolq) and copy it here, or run without the offline variables on a machine with network."
    )


def test_an_unreachable_hub_is_refused_in_one_line_within_seconds(ckpt: Path, tmp_path: Path) -> None:
    """Without the offline variables the libraries retried an unreachable hub for about 45 s and ended in
    lm-eval's ConnectionError; the probe (3 s at most) turns the hub off, so the command ends in the
    offline one-line error. The time is not asserted (a timed test fails on a loaded machine, where the
    task index alone takes 15 s): measured 44 s before and 20 s after at load 5 (2026-12-07)."""
    proc, _ = run_guarded(tmp_path, ["--ckpt", ckpt, "--tasks", "boolq", "--bootstrap_iters", "0"], {"HF_ENDPOINT": CLOSED_PORT}, "super_glue/boolq", refuse_network=False)
    assert proc.returncode == 2
    hf = tmp_path / "hf"
    assert last_line(proc).startswith(
        f"error: Task boolq needs the Hugging Face hub dataset aps/super_glue (boolq), but the hub is off here ({CLOSED_PORT} did not answer: "
    )
    assert last_line(proc).endswith(
        f") and the HF cache ({hf / 'datasets'}, {hf / 'hub'}) does not hold it; fill the cache on a machine with network "
        "(python -m eval.prefetch --tasks boolq) and copy it here, or run on a machine that reaches the hub (HF_ENDPOINT names another address)."
    )


def test_the_hub_probe_tells_an_answer_from_none(monkeypatch: pytest.MonkeyPatch) -> None:
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:  # any status is an answer
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}/")
        assert offline.hub_unreachable() is None
    finally:
        server.shutdown()
    monkeypatch.setenv("HF_ENDPOINT", CLOSED_PORT)
    assert offline.hub_unreachable().startswith(f"{CLOSED_PORT} did not answer: ")
    for var in (*offline.OFFLINE_VARS, "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    with offline.offline_mode(None, probe_hub=True) as reason:
        assert reason.startswith(f"{CLOSED_PORT} did not answer") and offline.offline_flags() == list(offline.OFFLINE_VARS)
    assert offline.offline_flags() == []


def test_an_evaluation_from_local_data_makes_no_network_attempt(ckpt: Path, sciq_only: Path, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    argv = ["--ckpt", ckpt, "--tasks", "sciq,boolq", "--local_data", sciq_only, "--skip_missing", "--bootstrap_iters", "0", "--device", "cpu", "--out", out]
    proc, attempts = run_guarded(tmp_path, argv, fast_builtin="-")
    assert attempts == ""
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    assert set(results["results"]) == {"sciq"} and set(results["skipped"]) == {"boolq"}


def test_offline_mode_sets_both_variables_for_imported_modules_and_restores_them(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets.config
    from huggingface_hub import constants

    for var in (*offline.OFFLINE_VARS, "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with offline.offline_mode(None) as reason:  # the hub is on: nothing changes
        assert reason is None and offline.offline_flags() == []
    with offline.offline_mode("data") as reason:
        assert reason == "--local_data"
        assert offline.offline_flags() == list(offline.OFFLINE_VARS)
        assert datasets.config.HF_HUB_OFFLINE and constants.HF_HUB_OFFLINE
    assert offline.offline_flags() == [] and not datasets.config.HF_HUB_OFFLINE and not constants.HF_HUB_OFFLINE
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with offline.offline_mode(None) as reason:  # one variable means both
        assert reason == "HF_DATASETS_OFFLINE=1" and os.environ["HF_HUB_OFFLINE"] == "1" and constants.HF_HUB_OFFLINE
    assert "HF_HUB_OFFLINE" not in os.environ


def test_the_cache_check_finds_the_folders_datasets_and_the_hub_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets.config
    from huggingface_hub import constants

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    config = {"task": "arc_easy", "dataset_path": "allenai/ai2_arc", "dataset_name": "ARC-Easy"}
    assert offline.uncached_hub_dataset(config) == "allenai/ai2_arc (ARC-Easy)"
    (tmp_path / "hub" / "datasets--allenai--ai2_arc").mkdir(parents=True)
    assert offline.uncached_hub_dataset(config) is None
    lambada = {"task": "lambada_openai", "dataset_path": "EleutherAI/lambada_openai"}
    assert offline.uncached_hub_dataset(lambada) == "EleutherAI/lambada_openai"
    (tmp_path / "datasets" / "EleutherAI___lambada_openai").mkdir(parents=True)  # datasets' own folder name
    assert offline.uncached_hub_dataset(lambada) is None
    assert offline.uncached_hub_dataset({"task": "mine", "dataset_path": "json", "dataset_kwargs": {"data_files": "x.json"}}) is None
