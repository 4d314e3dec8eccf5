"""A sharded folder written before saves recorded their files (issue 48, point 6a): it still loads,
and one line says that its shards cannot be verified as one save's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spheretnorm.runtime.checkpoint import load_checkpoint, read_torch_file
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
    save(tmp_path / "recorded" / "ckpt.dcp", 4)
    capsys.readouterr()
    load_checkpoint(tmp_path / "recorded" / "ckpt.dcp")
    assert capsys.readouterr().err == ""
