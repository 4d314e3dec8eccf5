"""Sharded checkpoints (ckpt.dcp) as every reader, resume and consolidation sees them, in-process:
folders written by save_sharded in this one process (no process group, one rank's files), so no
torchrun is launched. Which checkpoint of a run folder is read (one function for all of them), the
leftovers of an interrupted save, shards of another save, and where consolidation may write.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

import sample
import train
from spheretnorm.model import GPT, GPTConfig
from spheretnorm.optim import build_optimizer
from spheretnorm.runtime.checkpoint import (
    CheckpointError,
    checkpoint_state,
    read_torch_file,
    resume_checkpoint,
)
from spheretnorm.runtime.config import ConfigError, TrainConfig, optimizer_settings, parse_config
from spheretnorm.runtime.distributed import DistInfo
from spheretnorm.runtime.checkpoint import load_checkpoint, save_sharded
from spheretnorm.runtime.checkpoint.consolidation import main as consolidate
from test_train import data_dir, tiny_args  # noqa: F401 (data_dir: a fixture)

CONFIG = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=50304, connection="pre_ln")
GPT2_META = {"dataset": "openwebtext", "tokenizer": "gpt2", "vocab_size": 50257, "eot_token": 50256}


def save(folder: Path, iter_num: int, seed: int = 0) -> Path:
    """A sharded checkpoint at `folder` as train.py --parallel=fsdp writes it (one rank), after one
    optimizer step from weights drawn with `seed`: weights and state differ between seeds."""
    torch.manual_seed(seed)
    model = GPT(CONFIG)
    train_config = asdict(TrainConfig())
    optimizer = build_optimizer(model, optimizer_settings(train_config))
    x = torch.randint(0, 50257, (2, 8))
    model(x, x)[1].backward()
    optimizer.step()
    extra = {**checkpoint_state(model, weights=False), "train_config": train_config, "iter_num": iter_num, "data_meta": GPT2_META}
    folder.parent.mkdir(parents=True, exist_ok=True)
    save_sharded(folder, model, optimizer, extra, DistInfo(), "cpu")
    return folder


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder holding a ckpt.dcp at iter 4."""
    out = tmp_path_factory.mktemp("sharded_run")
    save(out / "ckpt.dcp", 4)
    return out


def greedy(path: Path) -> list[str]:
    return sample.main([str(path), "--start=Hello", "--temperature=0", "--max_new_tokens=4", "--num_samples=1", "--device=cpu"])


# -----------------------------------------------------------------------------
# Every reader takes a run folder, a ckpt.pt and a ckpt.dcp alike


def test_sample_zero_shot_and_export_read_a_folder_its_ckpt_dcp_and_its_consolidated_file(run: Path, tmp_path: Path) -> None:
    from spheretnorm.hf.export_cli import main as export
    from spheretnorm.zeroshot.harness import load_eval_model

    whole = tmp_path / "ckpt.pt"
    consolidate([str(run / "ckpt.dcp"), "--out", str(whole)])
    expected = greedy(whole)
    assert len(load_checkpoint(whole)["optimizer"]["state"]) == len(list(GPT(CONFIG).parameters()))  # the optimizer, whole
    assert greedy(run) == greedy(run / "ckpt.dcp") == expected
    for given in (run, run / "ckpt.dcp"):
        model, ckpt = load_eval_model(given)  # was: "does not match this version of model.py"
        assert ckpt["iter_num"] == 4 and model.get_num_params() > 0
    export(["--ckpt", str(run), "--out", str(tmp_path / "hf")])  # the default format: was refused
    assert (tmp_path / "hf" / "model.safetensors").is_file()


# -----------------------------------------------------------------------------
# The newer of ckpt.pt and ckpt.dcp


def test_every_reader_and_resume_takes_the_newer_of_ckpt_pt_and_ckpt_dcp(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from spheretnorm.experiments.grid import checkpoint_path
    from spheretnorm.runtime.checkpoint import resolve_checkpoint
    from spheretnorm.zeroshot.harness import resolve_checkpoint_path

    out = tmp_path / "run"
    save(out / "ckpt.dcp", 9, seed=1)  # consolidated at 4, then resumed under fsdp up to 9
    consolidate([str(save(tmp_path / "first" / "ckpt.dcp", 4)), "--out", str(out / "ckpt.pt")])
    assert resolve_checkpoint(out) == (out / "ckpt.dcp", "holds ckpt.pt (iter 4) and ckpt.dcp (iter 9); ckpt.dcp is the newer")
    assert checkpoint_path(out) == out / "ckpt.dcp"  # the launcher's finished check and zero-shot stage
    capsys.readouterr()
    assert greedy(out) == greedy(out / "ckpt.dcp")
    assert f"sampling from {out / 'ckpt.dcp'}" in capsys.readouterr().err
    assert resolve_checkpoint_path(out) == out / "ckpt.dcp"
    assert "ckpt.dcp is the newer; evaluating" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"ckpt\.dcp \(iter 9\); ckpt\.dcp is the newer, the checkpoint of --parallel=fsdp; resume it with --parallel=fsdp"):
        train.resolve_init_from(parse_config(tiny_args(data_dir, out, "--init_from=auto")).train)
    resumed = train.resolve_init_from(parse_config(tiny_args(data_dir, out, "--init_from=auto", "--parallel=fsdp")).train)
    assert resumed.init_from == "resume" and f"ckpt.dcp is the newer; resuming from {out / 'ckpt.dcp'}." in resume_checkpoint(resumed)[1]


# -----------------------------------------------------------------------------
# Consolidation writes no file it was not asked to replace


def test_consolidation_refuses_an_existing_output_and_the_folder_it_reads(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    (out / "ckpt.pt").write_bytes(b"another checkpoint of the run")
    for argv in ([str(out / "ckpt.dcp")], [str(out / "ckpt.dcp"), "--out", str(out / "ckpt.pt")]):
        with pytest.raises(SystemExit) as e:
            consolidate(argv)
        assert e.value.code == 2
        assert capsys.readouterr().err == f"error: {str(out / 'ckpt.pt')!r} already exists; pass --overwrite to replace it, or give another --out.\n"
    assert (out / "ckpt.pt").read_bytes() == b"another checkpoint of the run"
    monkeypatch.chdir(out / "ckpt.dcp")
    with pytest.raises(SystemExit):
        consolidate([".", "--out", "whole.pt"])
    assert "is inside the sharded folder '.' being read" in capsys.readouterr().err
    consolidate([".", "--overwrite"])  # `consolidate.py .`: beside the folder, not in it
    assert sorted(p.name for p in (out / "ckpt.dcp").iterdir()) == [".metadata", "__0_0.distcp", "meta.pt"]
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 4


# -----------------------------------------------------------------------------
# Leftovers of an interrupted save


def test_a_leftover_old_folder_is_settled_at_the_start_and_blocks_no_later_save(run: Path, tmp_path: Path) -> None:
    from spheretnorm.runtime.checkpoint import settle_interrupted_save

    out = tmp_path / "run"
    shutil.copytree(run, out)
    shutil.copytree(out / "ckpt.dcp", out / "ckpt.dcp.old")  # a kill during the save's last cleanup
    (out / "ckpt.dcp.old" / "__0_0.distcp").unlink()  # or a cleanup that stopped half-way
    save(out / "ckpt.dcp", 6)  # was: "Directory not empty", and the new checkpoint left as ckpt.dcp.tmp
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.dcp"]
    assert load_checkpoint(out / "ckpt.dcp")["iter_num"] == 6
    shutil.copytree(out / "ckpt.dcp", out / "ckpt.dcp.old")
    assert settle_interrupted_save(out / "ckpt.dcp").startswith("NOTE: an interrupted save left ckpt.dcp.old")
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.dcp"]


@pytest.mark.parametrize("left", [(".tmp",), (".old",), (".tmp", ".old")])
def test_every_leftover_of_an_interrupted_save_is_settled_by_what_it_holds(run: Path, tmp_path: Path, left: tuple[str, ...]) -> None:
    """The newest whole checkpoint wins, wherever it is; a .tmp whose writing never finished (no
    meta.pt) is removed."""
    from spheretnorm.runtime.checkpoint import settle_interrupted_save

    out = tmp_path / "run"
    newer = save(tmp_path / "newer" / "ckpt.dcp", 8, seed=1)
    shutil.copytree(run / "ckpt.dcp", out / ("ckpt.dcp" + left[-1]))  # iter 4
    if left == (".tmp",):  # killed after writing the new folder, before its renames: ckpt.dcp is the older
        shutil.copytree(run / "ckpt.dcp", out / "ckpt.dcp")
        shutil.rmtree(out / "ckpt.dcp.tmp")
        shutil.copytree(newer, out / "ckpt.dcp.tmp")
    if len(left) == 2:  # killed between the renames: the new one in .tmp, the previous in .old
        shutil.copytree(newer, out / "ckpt.dcp.tmp")
    settle_interrupted_save(out / "ckpt.dcp")
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.dcp"]
    assert load_checkpoint(out / "ckpt.dcp")["iter_num"] == (4 if left == (".old",) else 8)
    unfinished = out / "ckpt.dcp.tmp"
    shutil.copytree(newer, unfinished)
    (unfinished / "meta.pt").unlink()
    settle_interrupted_save(out / "ckpt.dcp")
    assert not unfinished.exists() and load_checkpoint(out / "ckpt.dcp")["iter_num"] == (4 if left == (".old",) else 8)


@pytest.mark.parametrize("left", [".tmp", ".old"])
def test_a_leftover_that_is_a_file_is_removed_and_blocks_neither_resume_nor_save(run: Path, tmp_path: Path, left: str) -> None:
    """A ckpt.dcp.tmp that is a file (issue 67, item 8c) was "could not remove ... remove it by hand":
    a good checkpoint beside it could not be resumed."""
    from spheretnorm.runtime.checkpoint import settle_interrupted_save

    out = tmp_path / "run"
    shutil.copytree(run / "ckpt.dcp", out / "ckpt.dcp")
    (out / ("ckpt.dcp" + left)).write_text("not a checkpoint")
    assert settle_interrupted_save(out / "ckpt.dcp").endswith("kept iter 4 as ckpt.dcp, and removed the rest.")
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.dcp"]
    (out / ("ckpt.dcp" + left)).write_text("not a checkpoint")
    save(out / "ckpt.dcp", 6)  # a save past such a file, too
    assert load_checkpoint(out / "ckpt.dcp")["iter_num"] == 6 and sorted(p.name for p in out.iterdir()) == ["ckpt.dcp"]


def test_a_damaged_folder_beside_a_whole_leftover_is_refused_naming_what_to_remove(run: Path, tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(run / "ckpt.dcp", out / "ckpt.dcp.old")
    (out / "ckpt.dcp").mkdir()
    with pytest.raises(ConfigError) as e:
        train.resolve_init_from(parse_config(tiny_args(data_dir, out, "--init_from=auto", "--parallel=fsdp")).train)
    assert str(e.value) == (
        f"{out / 'ckpt.dcp'} cannot be read, and ckpt.dcp.old, left by an interrupted save, holds iter 4; "
        f"remove {out / 'ckpt.dcp'} to resume from that one, or remove {out / 'ckpt.dcp.old'} to keep ckpt.dcp."
    )


# -----------------------------------------------------------------------------
# The files of one save


def test_a_shard_of_another_save_is_refused_and_a_folder_from_before_save_records_loads(run: Path, tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    shutil.copytree(run / "ckpt.dcp", mixed)
    other = save(tmp_path / "other" / "ckpt.dcp", 4, seed=1)  # the same shape: the same file sizes
    assert (other / "__0_0.distcp").stat().st_size == (mixed / "__0_0.distcp").stat().st_size
    shutil.copy(other / "__0_0.distcp", mixed / "__0_0.distcp")
    save_id = read_torch_file(mixed / "meta.pt")["save_id"]
    with pytest.raises(CheckpointError, match=rf"holds a __0_0.distcp that its save '{save_id}' did not write \(its digest differs\)"):
        load_checkpoint(mixed)
    with pytest.raises(SystemExit):
        consolidate([str(mixed), "--out", str(tmp_path / "whole.pt")])
    stray = tmp_path / "stray"
    shutil.copytree(run / "ckpt.dcp", stray)
    shutil.copy(other / "__0_0.distcp", stray / "__1_0.distcp")
    with pytest.raises(CheckpointError, match=r"holds __1_0.distcp, which its save .* did not write"):
        load_checkpoint(stray)
    older = tmp_path / "older"  # written before saves recorded their files
    shutil.copytree(run / "ckpt.dcp", older)
    meta = read_torch_file(older / "meta.pt")
    torch.save({k: v for k, v in meta.items() if k not in ("save_id", "files")}, older / "meta.pt")
    assert load_checkpoint(older)["iter_num"] == 4


# -----------------------------------------------------------------------------
# A run folder's config.json


def test_a_config_json_names_the_run_beside_it(tmp_path: Path) -> None:
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "config.json").write_text(json.dumps({"method": "pre_ln", "out_dir": str(tmp_path / "where_it_was")}))
    assert parse_config([str(moved / "config.json")], world_size=1).train.out_dir == str(moved)
    assert parse_config([str(moved / "config.json"), "--out_dir=elsewhere"], world_size=1).train.out_dir == "elsewhere"


def test_a_save_that_cannot_put_its_folder_in_place_is_one_oserror_and_keeps_the_previous(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Said by every rank alike (any_rank), not by rank 0 alone while the others die in a barrier."""
    import spheretnorm.runtime.checkpoint.sharded as sharded

    out = tmp_path / "run"
    shutil.copytree(run, out)

    replace = sharded.os.replace

    def refuse(src: Path, dst: Path) -> None:  # the folder's renames only, not meta.pt's
        if Path(src).is_dir():
            raise OSError(13, "Permission denied")
        replace(src, dst)

    monkeypatch.setattr(sharded.os, "replace", refuse)
    with pytest.raises(OSError, match=rf"could not put the new {out / 'ckpt.dcp'} in place \(Permission denied\)"):
        save(out / "ckpt.dcp", 6)
    monkeypatch.undo()
    assert load_checkpoint(out / "ckpt.dcp")["iter_num"] == 4
    assert sharded.settle_interrupted_save(out / "ckpt.dcp").endswith("kept iter 6 as ckpt.dcp, and removed the rest.")
