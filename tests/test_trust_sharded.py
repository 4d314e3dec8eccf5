"""A sharded folder written before saves recorded their files (issue 48, point 6a): it still loads,
one line says that its shards cannot be verified as one save's, and what torch's own index shows
to be of another save is refused."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

import sample
from spheretnorm.runtime.checkpoint import CheckpointError, read_torch_file
from spheretnorm.runtime.checkpoint import load_checkpoint
from spheretnorm.runtime.checkpoint.consolidation import main as consolidate
from test_sharded_readers import save


def test_a_folder_without_its_files_record_loads_and_says_its_shards_cannot_be_verified(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    older = save(tmp_path / "ckpt.dcp", 4)
    meta = read_torch_file(older / "meta.pt")
    torch.save({k: v for k, v in meta.items() if k not in ("save_id", "files")}, older / "meta.pt")
    capsys.readouterr()
    assert load_checkpoint(older)["iter_num"] == 4
    assert load_checkpoint(older)["iter_num"] == 4  # said once
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"NOTE: Sharded checkpoint {str(older)!r} has a meta.pt without the record of its files")
    assert "its shards cannot be verified as one save's" in err
    assert "resume the run once with this version" in err and "scripts/consolidate.py" in err  # what it takes to go on (issue 67, item 5)
    save(tmp_path / "recorded" / "ckpt.dcp", 4)
    capsys.readouterr()
    load_checkpoint(tmp_path / "recorded" / "ckpt.dcp")
    assert capsys.readouterr().err == ""


def older(folder: Path) -> Path:
    """`folder` as saves wrote it before they recorded their files: a meta.pt without save_id and
    files, its train_config naming the run folder the save wrote into (as train.py's does)."""
    meta = read_torch_file(folder / "meta.pt")
    meta = {k: v for k, v in meta.items() if k not in ("save_id", "files")}
    torch.save({**meta, "train_config": {**meta["train_config"], "out_dir": str(folder.parent)}}, folder / "meta.pt")
    return folder


def test_an_older_folder_refuses_files_shown_to_be_of_another_save_and_still_loads_one_save(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Without the record of its files, what torch's own index shows is checked: the index and
    meta.pt of one run folder, and each shard as long as the index's entries in it, no other shard."""
    ours, other = older(save(tmp_path / "ours" / "ckpt.dcp", 4)), older(save(tmp_path / "other" / "ckpt.dcp", 4, seed=1))
    folders = {}
    for case in ("copied_in", "stray", "longer", "alike"):
        folders[case] = tmp_path / case / "ckpt.dcp"
        shutil.copytree(ours, folders[case])  # a copied run folder: its own files, still one save
    for name in ("meta.pt", "__0_0.distcp"):  # `cp other/ckpt.dcp/* ckpt.dcp/`: the index, a dot file, stays ours
        shutil.copy(other / name, folders["copied_in"] / name)
    shutil.copy(other / "__0_0.distcp", folders["stray"] / "__1_0.distcp")
    with open(folders["longer"] / "__0_0.distcp", "ab") as f:
        f.write(b"\0" * 8)
    size = (ours / "__0_0.distcp").stat().st_size
    refusals = {
        "copied_in": f"has a .metadata written by a save into {str(ours.parent)!r} and a meta.pt of the run in {str(other.parent)!r}: "
                     "its files are of different saves",
        "stray": "holds __1_0.distcp, which its index (.metadata) names no entry in: the file is from another save",
        "longer": f"holds a __0_0.distcp of {size + 8} bytes where its index places its entries in the first {size}: "
                  "the file is from another save or damaged",
    }
    for case, words in refusals.items():
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(folders[case])
        assert str(e.value).startswith(f"Sharded checkpoint {str(folders[case])!r} {words}") and "\n" not in str(e.value), str(e.value)
        with pytest.raises(sample.SampleError, match=re.escape(words)):
            sample.read_checkpoint(folders[case])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        consolidate([str(folders["copied_in"]), "--out", str(tmp_path / "whole.pt")])
    assert e.value.code == 2 and capsys.readouterr().err.startswith("error: Sharded checkpoint") and not (tmp_path / "whole.pt").exists()
    # What cannot be shown: a shard of another save laid out alike holds nothing of the save that wrote it.
    shutil.copy(other / "__0_0.distcp", folders["alike"] / "__0_0.distcp")
    for folder in (ours, folders["alike"]):
        assert load_checkpoint(folder)["iter_num"] == 4
        assert capsys.readouterr().err.count("its shards cannot be verified as one save's") == 1
