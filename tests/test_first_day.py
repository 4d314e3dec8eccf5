"""A new user's first day, second pass (issue 46): offline data, CPU threads, the collapse alarm's
warm-up and its one line under torchrun, MuonH's radius, zero-shot results in the run folder,
plot variants, and the small things."""

from __future__ import annotations

import dataclasses
import gzip
import os
import re
import sys
import urllib.error
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from spheretnorm.data import pipeline
from spheretnorm.data.pipeline import DATASETS, TINY_SHAKESPEARE
from spheretnorm.data.preparation import main as prepare_main
from spheretnorm.data.preparation import prepare
from spheretnorm.model import GPTConfig
from spheretnorm.runtime import distributed
from spheretnorm.runtime.cli import REPO_ROOT
from spheretnorm.runtime.config import TrainConfig
from spheretnorm.runtime.distributed import DistInfo, leave_process_group, report_stop
from spheretnorm.runtime.run_folder import CollapseError, NonFiniteLossError, WriteFailed
from spheretnorm.runtime.start_notes import hyperball_note, warmup_note
from spheretnorm.runtime.device import cpu_threads_note, default_cpu_threads, set_cpu_threads
from spheretnorm.runtime.token_files import PrepareError
from spheretnorm.runtime.tracking import Progress
from spheretnorm.runtime.validation import Evaluator

# -----------------------------------------------------------------------------
# 1. Tiny Shakespeare ships in the repository


def no_network(*args, **kwargs):
    raise urllib.error.URLError("no network in this test")


def test_shakespeare_char_prepares_offline_from_the_embedded_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr("urllib.request.urlopen", no_network)
    meta = prepare("shakespeare_char", out_dir=str(tmp_path), progress=False)
    assert (meta["train_tokens"], meta["val_tokens"], meta["vocab_size"]) == (1_003_854, 111_540, 65)
    assert meta["source"]["kind"] == "embedded" and meta["source"]["sha256"] == TINY_SHAKESPEARE.sha256
    assert "using the embedded copy data/tinyshakespeare.txt.gz" in capsys.readouterr().out
    assert not (tmp_path / "input.txt").exists()  # nothing pretends to be a download


def test_the_embedded_copy_is_the_recorded_text_in_a_tracked_place() -> None:
    # data/*/ is ignored by git (prepared datasets), so the copy sits in data/ itself.
    assert TINY_SHAKESPEARE.path.parent == REPO_ROOT / "data"
    assert pipeline.hashlib.sha256(gzip.decompress(TINY_SHAKESPEARE.path.read_bytes())).hexdigest() == TINY_SHAKESPEARE.sha256
    assert TINY_SHAKESPEARE.url.startswith("https://raw.githubusercontent.com/karpathy/char-rnn/")


def test_an_altered_embedded_copy_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    altered = tmp_path / "tinyshakespeare.txt.gz"
    altered.write_bytes(gzip.compress(b"First Citizen:\nBefore we proceed any further, hear me speak.\n"))
    spec = DATASETS["shakespeare_char"]
    monkeypatch.setitem(DATASETS, "shakespeare_char", dataclasses.replace(spec, embedded=dataclasses.replace(TINY_SHAKESPEARE, path=altered)))
    with pytest.raises(PrepareError, match=rf"The embedded copy .* holds text of sha256 [0-9a-f]{{64}}, not the recorded {TINY_SHAKESPEARE.sha256}"):
        prepare("shakespeare_char", out_dir=str(tmp_path / "out"), progress=False)


def test_an_earlier_download_is_still_the_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("urllib.request.urlopen", no_network)
    (tmp_path / "input.txt").write_bytes(gzip.decompress(TINY_SHAKESPEARE.path.read_bytes()))
    meta = prepare("shakespeare_char", out_dir=str(tmp_path), progress=False)
    assert meta["source"]["kind"] == "url" and meta["vocab_size"] == 65


@pytest.mark.parametrize("download", [False, True])
def test_a_foreign_input_txt_in_the_data_folder_is_refused_in_one_line(
    download: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Before, any input.txt there was prepared, and recorded, as Tiny Shakespeare (issue 67, item 8b)."""
    monkeypatch.setattr("urllib.request.urlopen", no_network)
    (tmp_path / "input.txt").write_text("abcdefghij" * 50, encoding="utf-8")
    argv = ["shakespeare_char", "--out_dir", str(tmp_path), "--no_progress"] + (["--download"] if download else [])
    assert prepare_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {tmp_path / 'input.txt'} is not the text of 'shakespeare_char' (sha256 ")
    assert f"--input {tmp_path / 'input.txt'} --out_dir FOLDER" in err[0] and not (tmp_path / "meta.json").exists()


def test_download_with_input_is_one_line(tmp_path: Path, capsys) -> None:
    assert prepare_main(["shakespeare_char", "--download", "--input", str(tmp_path / "x.txt"), "--out_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --download") and "shakespeare, shakespeare_char" in err[0]


# -----------------------------------------------------------------------------
# 2. CPU threads


@pytest.mark.parametrize(
    "cores, load, expected",
    [(2, 0.1, 2), (2, 2.3, 1), (2, 9.0, 1), (4, 1.2, 3), (8, None, 8), (1, 0.0, 1)],
)
def test_the_default_threads_leave_the_busy_cores_alone(cores: int, load: float | None, expected: int) -> None:
    assert default_cpu_threads(cores, load) == expected


def test_the_thread_line_says_how_many_and_how_to_change_it() -> None:
    threads, line = cpu_threads_note({}, 2, 2.3)
    assert threads == 1 and line.startswith("CPU: 1 torch thread(s) on 2 core(s)") and "load average, 2.3" in line and "OMP_NUM_THREADS=N" in line
    threads, line = cpu_threads_note({"OMP_NUM_THREADS": "3"}, 2, 2.3)
    assert threads is None and "OMP_NUM_THREADS=3" in line  # the user's choice is kept
    assert set_cpu_threads("cuda:0") is None


@pytest.mark.parametrize("given", ["0", "-1", "many", "1.5"])
def test_an_omp_num_threads_that_is_no_count_is_said_to_be_ignored(given: str) -> None:
    # It was reported as obeyed ("2 threads, as OMP_NUM_THREADS=many says") and defeated the
    # loaded-machine default (issue 67, item 8).
    threads, line = cpu_threads_note({"OMP_NUM_THREADS": given}, 2, 2.3)
    assert threads == 1
    assert f"OMP_NUM_THREADS={given!r} is not a positive integer and is ignored" in line


# -----------------------------------------------------------------------------
# 3. The collapse alarm: not during the warm-up, said once, one line under torchrun


def evaluator(warmup_iters: int, iter_num: int, max_iters: int = 100) -> Evaluator:
    """An Evaluator with just what the collapse alarm reads (no model, no data)."""
    ev = Evaluator.__new__(Evaluator)
    ev.cfg = TrainConfig(warmup_iters=warmup_iters, max_iters=max_iters, lr_decay_iters=max_iters, collapse_evals=1)
    ev.progress = Progress(checkpoint=Path("ckpt.pt"), tokens_per_step=1, iter_num=iter_num)
    ev.dist, ev.device, ev.pinned = DistInfo(), "cpu", ""
    ev.raw_model = SimpleNamespace(config=SimpleNamespace(alpha_cap_grad="stop"))
    ev.collapsed_at_end, ev.final_suspect = None, False
    return ev


COLLAPSED_ROW = {"final_cosine": 0.999}


@pytest.mark.parametrize("iter_num", [1, 50, 100])
def test_no_evaluation_during_the_warm_up_counts(iter_num: int) -> None:
    ev = evaluator(warmup_iters=100, iter_num=iter_num, max_iters=200)
    assert ev.collapse_suspect(COLLAPSED_ROW) is False and ev.progress.collapse_streak == 0


def test_the_alarm_counts_after_the_warm_up() -> None:
    with pytest.raises(CollapseError, match="for 1 evaluations in a row \\(iter 101\\)"):
        evaluator(warmup_iters=100, iter_num=101, max_iters=200).collapse_suspect(COLLAPSED_ROW)


def test_a_stop_at_the_final_evaluation_is_said_once(capsys) -> None:
    ev = evaluator(warmup_iters=10, iter_num=100, max_iters=100)
    assert ev.collapse_suspect(COLLAPSED_ROW) is True
    assert capsys.readouterr().out == ""  # no WARNING line ahead of the stop's own
    with pytest.raises(CollapseError, match="the final state is saved all the same"):
        ev.stop_if_collapsed()


@pytest.mark.parametrize("error, rank, said", [
    (CollapseError("collapsed"), 0, True), (CollapseError("collapsed"), 1, False),
    (NonFiniteLossError("nan"), 3, False), (WriteFailed("disk full"), 1, True),
])  # fmt: skip
def test_a_shared_stop_is_said_by_rank_0_alone(error, rank: int, said: bool, capsys) -> None:
    assert report_stop(error, rank) == error.exit_code
    err = capsys.readouterr().err
    assert err == (f"error: {error}\n" if said else "")


class FakeGroup:
    """torch.distributed as leave_process_group sees it: a group of two, recording the calls."""

    def __init__(self, barrier_fails: bool = False):
        self.calls: list[str] = []
        self.barrier_fails = barrier_fails

    def is_initialized(self) -> bool:
        return True

    def get_world_size(self) -> int:
        return 2

    def barrier(self) -> None:
        self.calls.append("barrier")
        if self.barrier_fails:
            raise RuntimeError("peer gone")

    def destroy_process_group(self) -> None:
        self.calls.append("destroy")


@pytest.mark.parametrize("error, calls", [
    (CollapseError("c"), ["barrier", "destroy"]), (NonFiniteLossError("n"), ["barrier", "destroy"]),
    (WriteFailed("w"), ["destroy"]), (None, ["barrier", "destroy"]), (ValueError("bug"), ["destroy"]),
])  # fmt: skip
def test_after_a_shared_stop_or_the_runs_end_the_ranks_leave_together(monkeypatch: pytest.MonkeyPatch, error, calls: list[str]) -> None:
    group = FakeGroup()
    monkeypatch.setattr(distributed, "torch_dist", group)
    leave_process_group(error)
    assert group.calls == calls


def test_a_peer_gone_before_the_barrier_still_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    group = FakeGroup(barrier_fails=True)
    monkeypatch.setattr(distributed, "torch_dist", group)
    leave_process_group(CollapseError("c"))
    assert group.calls == ["barrier", "destroy"]


def test_a_warm_up_as_long_as_the_run_is_warned_of() -> None:
    line = warmup_note(TrainConfig(warmup_iters=100, max_iters=50, lr_decay_iters=50))
    assert line is not None and line.startswith("warning: warmup_iters=100 >= max_iters=50")
    assert warmup_note(TrainConfig(warmup_iters=10, max_iters=50, lr_decay_iters=50)) is None


# -----------------------------------------------------------------------------
# 4. MuonH with a sphere connection


def test_a_sphere_connection_at_muonhs_initial_radius_gets_a_note() -> None:
    sphere = GPTConfig(connection="p_spheret")
    note = hyperball_note(TrainConfig(optimizer="muonh"), sphere)
    assert note is not None and "--hyperball_radius=1" in note and "p_spheret" in note
    assert hyperball_note(TrainConfig(optimizer="adamh"), sphere) is not None
    assert hyperball_note(TrainConfig(optimizer="muonh", hyperball_radius=1.0), sphere) is None
    assert hyperball_note(TrainConfig(optimizer="muonh"), GPTConfig(connection="pre_ln")) is None
    assert hyperball_note(TrainConfig(optimizer="muon"), sphere) is None


def test_every_documented_hyperball_command_of_a_sphere_model_sets_the_radius() -> None:
    sphere = re.compile(r"--connection=(geonorm|proj_spheret|cay_spheret|p_spheret)\b")
    for doc in ("README.md", "docs/OPTIMIZERS.md"):
        for line in (REPO_ROOT / doc).read_text(encoding="utf-8").splitlines():
            if "train.py" in line and re.search(r"--optimizer=(muonh|adamh)\b", line) and sphere.search(line):
                assert "--hyperball_radius=" in line, f"{doc}: {line}"


# -----------------------------------------------------------------------------
# 5. Zero-shot: results inside the run folder, the char refusal before lm-eval


def test_a_run_folder_gets_its_results_under_the_name_the_tables_read(tmp_path: Path) -> None:
    from spheretnorm.experiments.grid import ZERO_SHOT_NAME
    from spheretnorm.zeroshot.driver import results_path

    run = tmp_path / "RUN"
    run.mkdir()
    assert results_path(run, None, None) == run / ZERO_SHOT_NAME
    assert results_path(str(run), None, 10) == run / "ckpt_zero_shot_limit10.json"
    assert results_path(run / "ckpt.pt", None, None) == run / ZERO_SHOT_NAME
    sharded = run / "ckpt.dcp"
    sharded.mkdir()
    (sharded / "meta.pt").write_bytes(b"")
    assert results_path(sharded, None, None) == run / ZERO_SHOT_NAME  # beside a sharded checkpoint


def test_a_char_checkpoint_is_refused_before_lm_eval_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from spheretnorm.runtime.checkpoint import CHECKPOINT_FORMAT
    from spheretnorm.zeroshot import driver

    run = tmp_path / "RUN"
    run.mkdir()
    config = dataclasses.asdict(GPTConfig(vocab_size=65, n_layer=1, n_head=1, n_embd=8, block_size=8))
    torch.save({"format": CHECKPOINT_FORMAT, "model_config": config, "data_meta": {"tokenizer": "char"}, "model": {}, "iter_num": 1}, run / "ckpt.pt")
    monkeypatch.setitem(sys.modules, "spheretnorm.zeroshot.harness", None)  # importing it (and lm-eval) would fail the test
    monkeypatch.setattr(driver, "make_task_manager", lambda *a: pytest.fail("the task index was loaded"))
    assert driver.main(["--ckpt", str(run), "--tasks", "piqa"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was trained with the 'char' tokenizer" in err[0], err


# -----------------------------------------------------------------------------
# 6. Plot variants


def test_each_variant_of_a_method_has_its_own_style_and_name() -> None:
    from spheretnorm.experiments.figures import row_styles
    from spheretnorm.experiments.grid import row_label

    rows = ["p_spheret:0.5, optimizer=adamw", "p_spheret:0.5, optimizer=muon", "p_spheret:0.5, optimizer=muonh", "pre_ln"]
    styles = row_styles(rows)
    looks = {(str(styles[r]["linestyle"]), styles[r].get("marker")) for r in rows[:3]}
    assert len(looks) == 3  # three lines that can be told apart
    assert len({str(styles[r]["color"]) for r in rows[:3]}) == 1  # in the method's colour
    assert [row_label(r) for r in rows[:3]] == [f"0.5-SpheretNorm, optimizer={o}" for o in ("adamw", "muon", "muonh")]


def test_plot_runs_draws_the_variants_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spheretnorm.experiments import figures
    from spheretnorm.experiments.grid import Run, index_runs

    def run(optimizer: str, shift: float) -> Run:
        config = {"method": "p_spheret:0.5", "dataset": "shakespeare_char", "n_layer": 4, "n_head": 4, "n_embd": 128, "max_iters": 20, "optimizer": optimizer}
        rows = [{"kind": "train", "iter": i, "train_loss": 3.0 - 0.01 * i + shift} for i in range(1, 21)]
        rows += [{"kind": "eval", "iter": i, "val_loss": 3.0 - 0.01 * i + shift} for i in (10, 20)]
        return Run(tmp_path / optimizer, config, rows, None)

    runs = list(index_runs([run("adamw", 0.0), run("muon", 0.1), run("muonh", 0.2)]).values())
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, out: drawn.append(fig) or [])
    figures.plot_runs(runs, "title", tmp_path / "fig", smooth=0.0)
    (fig,) = drawn
    val = fig.axes[1]
    assert len({(str(line.get_linestyle()), line.get_marker()) for line in val.lines}) == 3
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == [f"0.5-SpheretNorm, optimizer={o}" for o in ("adamw", "muon", "muonh")]


# -----------------------------------------------------------------------------
# 8. Small things


def test_a_char_model_exports_without_token_ids_outside_its_vocabulary() -> None:
    pytest.importorskip("transformers")
    from spheretnorm.hf.gpt2 import to_hf_gpt2
    from spheretnorm.model import GPT

    hf = to_hf_gpt2(GPT(GPTConfig(vocab_size=65, n_layer=1, n_head=1, n_embd=8, block_size=8)))
    assert hf.config.bos_token_id is None and hf.config.eos_token_id is None
    hf = to_hf_gpt2(GPT(GPTConfig(vocab_size=50304, n_layer=1, n_head=1, n_embd=8, block_size=8)))
    assert hf.config.bos_token_id == hf.config.eos_token_id == 50256


def test_a_skip_for_a_job_of_another_runs_root_names_that_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spheretnorm.cluster import slurm

    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho 'JobId=44 JobName=spheretnorm-openwebtext_s-pre_ln StdOut={tmp_path}/out_other/openwebtext_s/pre_ln/slurm-x-44.out'\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    run = SimpleNamespace(path=tmp_path / "out" / "openwebtext_s" / "pre_ln", out_dir=Path("out/openwebtext_s/pre_ln"))
    text = slurm.other_folder_text("44", run)
    assert f"writing to {tmp_path}/out_other/openwebtext_s/pre_ln (--runs_root {tmp_path}/out_other), not to out/openwebtext_s/pre_ln" in text
    run.path = tmp_path / "out_other" / "openwebtext_s" / "pre_ln"  # its own folder: nothing to add
    assert slurm.other_folder_text("44", run) == ""


def test_the_docs_run_roots_are_ignored_and_the_hf_package_is_not() -> None:
    lines = (REPO_ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "out_*/" in lines  # --runs_root out_llama (docs/EXPERIMENTS.md)
    assert "hf/" not in lines and "/hf/" in lines  # a bare hf/ would also ignore new files in spheretnorm/hf/
    experiments = (REPO_ROOT / "docs/EXPERIMENTS.md").read_text(encoding="utf-8")
    assert "not by block" not in experiments and "pre_ln+block=llama" in experiments
