"""scripts/consolidate.py (issue 48, point 7): a stop's state keeps a stop's name, and --overwrite
alone never puts an older state over a newer checkpoint. In-process, one rank's folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from spheretnorm.runtime.checkpoint import atomic_torch_save, read_torch_file
from spheretnorm.runtime.checkpoint.consolidation import main as consolidate
from test_sharded_readers import save


def test_a_stop_state_is_consolidated_under_a_stop_name(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    save(tmp_path / "ckpt.stop.dcp", 5)
    atomic_torch_save({"iter_num": 4}, tmp_path / "ckpt.pt")  # the healthy one beside it stays as it is
    consolidate([str(tmp_path / "ckpt.stop.dcp")])
    assert capsys.readouterr().out == f"wrote {tmp_path / 'ckpt.stop.pt'}\n"
    assert read_torch_file(tmp_path / "ckpt.stop.pt")["iter_num"] == 5 and read_torch_file(tmp_path / "ckpt.pt") == {"iter_num": 4}


def test_overwriting_a_newer_checkpoint_is_refused_unless_meant_and_then_said(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = save(tmp_path / "ckpt.dcp", 10)
    atomic_torch_save({"iter_num": 14}, tmp_path / "ckpt.pt")
    with pytest.raises(SystemExit) as info:
        consolidate([str(folder), "--overwrite"])
    assert info.value.code == 2 and read_torch_file(tmp_path / "ckpt.pt") == {"iter_num": 14}
    assert capsys.readouterr().err == (
        f"error: {str(tmp_path / 'ckpt.pt')!r} holds iter 14, newer than the iter 10 of {str(folder)!r}; "
        "pass --replace_newer to replace it all the same, or give another --out.\n"
    )
    consolidate([str(folder), "--overwrite", "--replace_newer"])
    assert capsys.readouterr().out.startswith(f"NOTE: replacing {tmp_path / 'ckpt.pt'} (iter 14) by the older iter 10 of {folder}, as --replace_newer asks.\n")
    assert read_torch_file(tmp_path / "ckpt.pt")["iter_num"] == 10
    consolidate([str(folder), "--overwrite"])  # the same iteration, or an older file: --overwrite as before
    assert "NOTE" not in capsys.readouterr().out
