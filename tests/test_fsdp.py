"""--parallel=fsdp on CPU with gloo, two ranks unless said: the same losses as DDP, nGPT's unit
norms across shards, the meta-device start, activation checkpointing, and sharded checkpoints that
survive SIGTERM, reshard onto 1 and 4 ranks, refuse damage, survive a full disk and consolidate.

Processes are few (each costs seconds on two cores): one torchrun of tests/fsdp_worker.py runs every
in-process check through train.py's Trainer; one stopped train.py run feeds the checkpoint tests.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from fsdp_worker import BLOCKS, CONNECTIONS, RUN_ARGS
from spheretnorm.model import GPT, GPTConfig
from spheretnorm.runtime.checkpoint import CheckpointError
from spheretnorm.runtime.checkpoint import load_checkpoint, load_model
from spheretnorm.runtime.config import ConfigError, parse_config
from spheretnorm.runtime.distributed import DistInfo
from spheretnorm.runtime.parallel import checkpoint_activations, choose_start
from spheretnorm.runtime.run_folder import OutDirError
from test_preemption import STOP_WITHIN_S, children, start, wait_all_gone, wait_for_line
from test_train import REPO, SUBPROCESS_ENV, data_dir, read_metrics, tiny_args, train_losses  # noqa: F401 (data_dir: a fixture)

ENV = {**SUBPROCESS_ENV, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def run_cmd(nproc: int, data_dir: Path, out: Path, *extra: str) -> list[str]:
    args = tiny_args(data_dir, out, *RUN_ARGS, *extra)
    launcher = [*TORCHRUN, f"--nproc_per_node={nproc}"] if nproc > 1 else [sys.executable]
    return [*launcher, "train.py", *args]


def check(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def worker(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("fsdp_worker")
    cmd = [*TORCHRUN, "--nproc_per_node=2", str(REPO / "tests" / "fsdp_worker.py"), str(data_dir), str(out)]
    result = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=400)
    check(result)
    return {**json.loads((out / "results.json").read_text()), "output": result.stdout + result.stderr}


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


# -----------------------------------------------------------------------------
# The loop, sharded


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("connection", CONNECTIONS)
def test_fsdp_losses_equal_ddp_losses_with_grad_accumulation(worker: dict, connection: str, block: str) -> None:
    runs = worker["losses"][f"{connection}/{block}"]
    assert len(runs["ddp"]) == 10 and all(math.isfinite(x) for x in runs["fsdp"])
    assert max_diff(runs["ddp"], runs["fsdp"]) < 1e-5, runs
    # The small-model start builds the whole model, as DDP does, and shards it: the same weights.
    assert worker["init_diff"][f"{connection}/{block}"] == 0.0


@pytest.mark.parametrize("key", ["pre_ln/gpt2--optimizer=muon", "p_spheret/llama--optimizer=muon", "pre_ln/gpt2--optimizer=toy_sgd",
                                 "p_spheret/llama--optimizer=muonh", "p_spheret/llama--optimizer=adamh--hyperball_radius=0.5"])
def test_muon_hyperball_and_a_registered_optimizer_step_as_one_process_does(worker: dict, key: str) -> None:
    """Muon's Newton-Schulz runs on the whole matrix of each sharded weight (every rank gathers it),
    and the Hyperball's norms are of whole matrices (reduced over the shards): the steps equal
    DDP's, weights and losses, 10 steps at full rate after a 2-step warm-up."""
    runs = worker["losses"][key]
    assert max_diff(runs["ddp"], runs["fsdp"]) < 1e-5, runs
    assert worker["weight_diff"][key] < 1e-5


def test_a_muonh_sharded_checkpoint_reshards_and_resumes_on_its_radii(worker: dict, data_dir: Path, tmp_path: Path) -> None:
    from spheretnorm.runtime.checkpoint.consolidation import main as consolidate

    out = tmp_path / "run"
    shutil.copytree(worker["muon"]["out_dir"], out)
    reference, k = worker["muon"]["reference"], 6
    assert load_checkpoint(out / "ckpt.dcp")["iter_num"] == k
    consolidate([str(out / "ckpt.dcp"), "--out", str(tmp_path / "whole.pt")])  # both MuonH's and AdamW's state, whole
    whole = load_checkpoint(tmp_path / "whole.pt")
    assert len(whole["optimizer"]["optimizers"]) == 2
    # Every hidden matrix written by two ranks lies on its sphere: ||W||_F = the radius in the state.
    matrices = [n for n, w in whole["model"].items() if w.dim() == 2 and ".h." in n]
    state = whole["optimizer"]["optimizers"][0]
    radii = [s["radius"].item() for s in state["state"].values()]
    assert len(radii) == len(matrices) == 8
    norms = sorted(whole["model"][n].double().norm().item() for n in matrices)
    assert max(abs(a - b) / b for a, b in zip(norms, sorted(radii))) < 1e-5
    # One process reads the two ranks' shards and continues the run.
    check(subprocess.run(run_cmd(1, data_dir, out, "--optimizer=muonh", f"--max_iters={k + 3}", "--init_from=resume"),
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300))
    resumed = train_losses(out)
    for it in range(k + 1, k + 4):
        assert resumed[it] == pytest.approx(reference[it - 1], abs=1e-5), it


def test_fsdp_starts_without_the_view_warning(worker: dict) -> None:
    """The sphere connections' blocks return a view (no copy), which FSDP2 warns about at every
    start; no activation is changed in place (test_layout), so parallel.py silences that warning."""
    assert "returned a view tensor" not in worker["output"]


def test_mup_learning_rate_groups_are_the_same_sharded(worker: dict) -> None:
    runs = worker["losses"]["pre_ln/gpt2--mup_base_width=16"]
    assert max_diff(runs["ddp"], runs["fsdp"]) < 1e-5, runs


@pytest.mark.parametrize("block", BLOCKS)
def test_ngpt_matrices_stay_unit_norm_across_shards(worker: dict, block: str) -> None:
    # c_proj's embedding axis is 0, the axis FSDP shards: its norms need the other rank's rows.
    assert worker["unit_norm"][f"ngpt/{block}"] < 1e-5


@pytest.mark.parametrize("connection", CONNECTIONS)
def test_the_evaluation_row_is_the_same_sharded(worker: dict, connection: str) -> None:
    ddp, fsdp = worker["eval"][f"{connection}/gpt2"]
    assert set(ddp) == set(fsdp)
    assert fsdp["val_loss"] == pytest.approx(ddp["val_loss"], abs=1e-5)  # eval_iters=3: one rank runs an extra forward
    for key, value in ddp.items():
        if isinstance(value, list) and value and isinstance(value[0], float):
            assert fsdp[key] == pytest.approx(value, abs=1e-4), key
    assert fsdp["final_cosine"] == pytest.approx(ddp["final_cosine"], abs=1e-4)


def test_activation_checkpointing_gives_the_same_losses(worker: dict) -> None:
    runs = worker["checkpointing"]
    for parallel in ("ddp", "fsdp"):
        assert max_diff(runs[f"{parallel}/false"], runs[f"{parallel}/true"]) < 1e-6, parallel


def test_activation_checkpointing_saves_less_for_backward() -> None:
    """Bytes that autograd keeps for backward during a forward, with and without checkpointing."""
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=48, connection="p_spheret")
    x = torch.randint(0, 48, (4, 16))
    saved, losses = {}, {}
    for ac in (False, True):
        torch.manual_seed(0)
        model = GPT(config)
        if ac:
            checkpoint_activations(model)
        total = [0]

        def pack(t: torch.Tensor) -> torch.Tensor:
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _, loss = model(x, x)
        loss.backward()
        saved[ac], losses[ac] = total[0], loss.item()
    assert saved[True] < 0.5 * saved[False], saved
    assert losses[True] == losses[False]


# -----------------------------------------------------------------------------
# The meta-device start


def test_meta_start_follows_every_init_rule(worker: dict) -> None:
    meta = worker["meta"]
    torch.manual_seed(1337)
    whole = dict(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=48, connection="ngpt")).named_parameters())
    assert set(meta["weights"]) == set(whole)
    for name, p in whole.items():
        got = torch.tensor(meta["weights"][name]).view(p.shape)
        want = p.detach()
        if (want == want.flatten()[0]).all():  # a constant init: the same value exactly
            assert torch.equal(got, want), name
        else:
            assert got.mean().item() == pytest.approx(want.mean().item(), abs=4 * want.std().item() / want.numel() ** 0.5), name
            assert got.std().item() == pytest.approx(want.std().item(), rel=0.15), name
            assert not torch.equal(got, want), name  # drawn on the shards, not copied from a whole build
    assert meta["unit_norm"] < 1e-5  # nGPT's after_init, on sharded matrices
    assert not [n for n in meta["same_shards"] if whole[n].dim() == 2]  # each rank draws its own rows
    assert all(math.isfinite(x) for x in meta["losses"])


def test_meta_start_holds_about_a_shard(worker: dict) -> None:
    memory = worker["memory"]
    assert memory["local_shard"] <= 0.55 * memory["whole"]
    # The peak of the start is about the rank's shard, far from the whole model's weights.
    assert memory["meta_peak"] < 0.75 * memory["whole"], memory


def test_the_start_rule_builds_small_models_whole(monkeypatch: pytest.MonkeyPatch, data_dir: Path, tmp_path: Path) -> None:
    import spheretnorm.runtime.parallel as parallel

    cfg = parse_config(tiny_args(data_dir, tmp_path, "--parallel=fsdp")).train
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=48)
    assert choose_start(cfg, config, "cpu", DistInfo())[0] == "full"
    monkeypatch.setattr(parallel, "memory_per_rank", lambda device, dist: 1000)
    start, why = choose_start(cfg, config, "cpu", DistInfo())
    assert start == "meta" and "fsdp_init=auto" in why
    forced = parse_config(tiny_args(data_dir, tmp_path, "--parallel=fsdp", "--fsdp_init=full")).train
    assert choose_start(forced, config, "cpu", DistInfo()) == ("full", "fsdp_init=full")
    with pytest.raises(ConfigError, match=r"parallel=fsdp does not run dtype=float16.*bfloat16 or float32"):
        parallel.mixed_precision("float16")
    with pytest.raises(ConfigError, match=r"parallel='zero' is not valid; choose one of: ddp, fsdp"):
        parse_config(tiny_args(data_dir, tmp_path, "--parallel=zero"))


# -----------------------------------------------------------------------------
# Sharded checkpoints


@pytest.fixture(scope="module")
def stopped(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A two-rank fsdp run stopped by SIGTERM to torchrun: its out_dir and what the stop showed."""
    out = tmp_path_factory.mktemp("fsdp_stopped")
    proc = start(run_cmd(2, data_dir, out, "--max_iters=400"))
    wait_for_line(proc, "iter 10/")
    workers = children(proc.pid)
    os.kill(proc.pid, signal.SIGTERM)
    output = proc.communicate(timeout=STOP_WITHIN_S + 10)[0]
    return out, {"workers": workers, "returncode": proc.returncode, "output": output}


def test_sigterm_leaves_a_loadable_sharded_checkpoint(stopped: tuple[Path, dict]) -> None:
    out, info = stopped
    wait_all_gone(info["workers"], STOP_WITHIN_S)
    assert len(info["workers"]) == 2, info
    ckpt = load_checkpoint(out / "ckpt.dcp")  # whole, in this process without a process group
    stop = read_metrics(out, "stop")[-1]
    assert stop["reason"] == "signal" and stop["exit_code"] == 0 and stop["checkpoint_iter"] == ckpt["iter_num"] >= 10
    assert ckpt["world_size"] == 2 and len(ckpt["rng"]) == 2
    assert not (out / "ckpt.dcp.tmp").exists()
    model = load_model(out / "ckpt.dcp")  # what sample.py, the zero-shot evaluation and the exports call
    assert model.get_num_params() > 0


@pytest.mark.parametrize("nproc", [1, 4])
def test_a_resume_on_another_number_of_ranks_continues_the_run(stopped: tuple[Path, dict], worker: dict, data_dir: Path, tmp_path: Path, nproc: int) -> None:
    out = tmp_path / "run"
    shutil.copytree(stopped[0], out)
    k = load_checkpoint(out / "ckpt.dcp")["iter_num"]
    end = min(k + 5, len(worker["reference"]))
    check(subprocess.run(run_cmd(nproc, data_dir, out, f"--max_iters={end}", "--init_from=auto"), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300))
    resumed = train_losses(out)
    for it in range(k + 1, end + 1):  # the reference: the same run uninterrupted, on two ranks
        assert resumed[it] == pytest.approx(worker["reference"][it - 1], abs=1e-5), (it, nproc)
    assert load_checkpoint(out / "ckpt.dcp")["world_size"] == nproc


def test_a_full_disk_mid_checkpoint_leaves_the_previous_one(stopped: tuple[Path, dict], data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(stopped[0], out)
    k = load_checkpoint(out / "ckpt.dcp")["iter_num"]
    shard = max(f.stat().st_size for f in (out / "ckpt.dcp").glob("*.distcp"))

    def small_files() -> None:  # a file may grow to half a shard; the metrics rows still fit
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (shard // 2, shard // 2))

    result = subprocess.run(run_cmd(1, data_dir, out, f"--max_iters={k + 2}", "--init_from=auto"), cwd=REPO, env=ENV,
                            capture_output=True, text=True, timeout=300, preexec_fn=small_files)
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(error) == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "could not write" in error[0] and "full disk" in error[0] and "untouched" in error[0], error
    assert read_metrics(out, "stop")[-1]["reason"] == "write_failed"
    assert load_checkpoint(out / "ckpt.dcp")["iter_num"] == k
    assert not (out / "ckpt.dcp.tmp").exists()


def test_damaged_and_foreign_folders_are_refused_in_one_sentence(stopped: tuple[Path, dict], tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "weights.bin").write_bytes(b"\0" * 16)
    cut = tmp_path / "cut"
    shutil.copytree(stopped[0] / "ckpt.dcp", cut)
    shard = sorted(cut.glob("*.distcp"))[-1]
    shard.write_bytes(shard.read_bytes()[:100])
    no_index = tmp_path / "no_index"
    shutil.copytree(stopped[0] / "ckpt.dcp", no_index)
    (no_index / ".metadata").unlink()
    wrong_tag = tmp_path / "wrong_tag"
    shutil.copytree(stopped[0] / "ckpt.dcp", wrong_tag)
    torch.save({"format": "someone-else"}, wrong_tag / "meta.pt")
    hostile = tmp_path / "hostile"  # an index whose unpickling would run a command
    shutil.copytree(stopped[0] / "ckpt.dcp", hostile)
    marker = tmp_path / "ran"

    class Command:
        def __reduce__(self) -> tuple:
            return subprocess.call, (["touch", str(marker)],)

    (hostile / ".metadata").write_bytes(pickle.dumps(Command()))
    cases = ((foreign, "no meta.pt"), (cut, "is damaged"), (no_index, "no .metadata"), (wrong_tag, "someone-else"),
             (hostile, "disallowed objects (subprocess.call)"))
    for folder, words in cases:
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(folder)
        message = str(e.value)
        assert words in message and str(folder) in message and "\n" not in message, message
    assert not marker.exists()


def test_a_damaged_shard_stops_a_two_rank_resume_on_every_rank_in_one_line(stopped: tuple[Path, dict], data_dir: Path, tmp_path: Path) -> None:
    """Rank 0 reads every byte of the folder (its digests), the others check sizes only: the ranks
    decide together, before any tensor is read, so a shard of its save's size whose bytes differ
    is refused by every rank: rank 0's one line and status 2 (EXIT_CONFIG: refused before any
    training), no rank's traceback (each rank's output in its own file: torchrun's own report of
    a failed worker is a traceback of its own)."""
    out, logs = tmp_path / "run", tmp_path / "logs"
    shutil.copytree(stopped[0], out)
    shard = out / "ckpt.dcp" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    cmd = [*TORCHRUN, "--nproc_per_node=2", f"--log-dir={logs}", "--redirects=3", "train.py",
           *tiny_args(data_dir, out, *RUN_ARGS, "--max_iters=400", "--init_from=resume")]
    result = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    ranks = {int(p.parent.name): p.read_text() + (p.parent / "stdout.log").read_text() for p in logs.rglob("stderr.log")}
    errors = {rank: [line for line in text.splitlines() if line.startswith("error:")] for rank, text in ranks.items()}
    assert sorted(ranks) == [0, 1] and errors[1] == [] and len(errors[0]) == 1, (ranks, result.stderr[-3000:])
    assert errors[0][0].startswith(f"error: Sharded checkpoint {str(out / 'ckpt.dcp')!r} holds a __1_0.distcp that its save ")
    assert "(its digest differs)" in errors[0][0]
    assert not any("Traceback" in text for text in ranks.values()), ranks
    # torchrun's own status is 1; the first rank to end (rank 0, once it has said it) ends with 2, and torchrun ends the others
    assert result.returncode != 0 and re.search(r"Root Cause.*?exitcode\s*: 2 ", result.stderr, re.S), result.stderr[-3000:]


def test_one_command_consolidates_a_folder_into_a_ckpt_pt_that_ddp_resumes(stopped: tuple[Path, dict], worker: dict, data_dir: Path, tmp_path: Path) -> None:
    from spheretnorm.runtime.checkpoint.consolidation import main

    out = tmp_path / "run"
    shutil.copytree(stopped[0], out)
    main([str(out / "ckpt.dcp")])  # ckpt.pt beside it
    whole, folder = load_checkpoint(out / "ckpt.pt", require=train.RESUME_KEYS), load_checkpoint(out / "ckpt.dcp")
    assert whole["iter_num"] == folder["iter_num"] and whole["model_config"] == folder["model_config"]
    for name, tensor in folder["model"].items():
        assert torch.equal(whole["model"][name], tensor), name
    assert len(whole["optimizer"]["state"]) == len(list(load_model(out / "ckpt.pt").parameters()))
    # One process under DDP (4 micro-steps) continues the two-rank FSDP run.
    shutil.rmtree(out / "ckpt.dcp")
    k = whole["iter_num"]
    train.main(tiny_args(data_dir, out, *(a for a in RUN_ARGS if a != "--parallel=fsdp"), f"--max_iters={k + 2}", "--init_from=auto"))
    resumed = train_losses(out)
    for it in (k + 1, k + 2):
        assert resumed[it] == pytest.approx(worker["reference"][it - 1], abs=1e-5), it


def test_a_ddp_resume_of_a_sharded_run_says_how(stopped: tuple[Path, dict], data_dir: Path) -> None:
    # --parallel=ddp named: a resume by --out_dir otherwise takes the run's own parallel=fsdp (issue 65's one resume rule)
    args = tiny_args(data_dir, stopped[0], "--init_from=resume", "--parallel=ddp")
    with pytest.raises(OutDirError, match=r"holds ckpt\.dcp, the checkpoint of --parallel=fsdp.*consolidate\.py"):
        train.main(args)


def test_sampling_and_zero_shot_take_the_sharded_folder(stopped: tuple[Path, dict]) -> None:
    import sample
    from spheretnorm.zeroshot.harness import resolve_checkpoint_path

    out = stopped[0]
    assert sample.checkpoint_file(out) == out / "ckpt.dcp"  # an out_dir with no ckpt.pt
    assert sample.checkpoint_file(out / "ckpt.dcp") == out / "ckpt.dcp"
    assert resolve_checkpoint_path(out / "ckpt.dcp") == out / "ckpt.dcp"
    assert sample.read_checkpoint(out / "ckpt.dcp")["iter_num"] >= 10


def test_a_replacement_cut_between_its_renames_is_taken_back(stopped: tuple[Path, dict], data_dir: Path, tmp_path: Path) -> None:
    shutil.copytree(stopped[0] / "ckpt.dcp", tmp_path / "ckpt.dcp.old")  # the old one moved aside, the new not yet in
    train.resolve_init_from(parse_config(tiny_args(data_dir, tmp_path, "--parallel=fsdp", "--init_from=auto")).train)
    assert (tmp_path / "ckpt.dcp").is_dir() and not (tmp_path / "ckpt.dcp.old").exists()
    assert load_checkpoint(tmp_path / "ckpt.dcp")["iter_num"] >= 10


def test_a_sharded_run_that_lost_its_config_json_gets_its_settings_back(stopped: tuple[Path, dict], tmp_path: Path) -> None:
    """The resume rule's write-back (checkpoint.restore_run_config) from a sharded folder's meta.pt:
    the settings train.py wrote at the start, parallel=fsdp among them, so the resume takes ckpt.dcp."""
    from spheretnorm.runtime.checkpoint import restore_run_config

    out = tmp_path / "run"
    shutil.copytree(stopped[0], out)
    original = json.loads((out / "config.json").read_text())
    (out / "config.json").unlink()
    note = restore_run_config([f"--out_dir={out}", "--init_from=resume"])
    assert note is not None and "ckpt.dcp records" in note
    restored = json.loads((out / "config.json").read_text())
    assert restored["parallel"] == "fsdp" and restored["max_iters"] == 400
    assert {k: original[k] for k in restored} == restored  # the same settings: only the run's records (method, world_size, ...) not there
