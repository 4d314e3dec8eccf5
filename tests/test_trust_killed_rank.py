"""After a rank died during a checkpoint write (issue 48, point 8), the line of the rank that
survives says what is on disk: the iteration the checkpoint holds, read back (not the one this
rank believes it saved), and the temporary file the cut write left."""

from __future__ import annotations

from pathlib import Path

from spheretnorm.runtime.checkpoint import atomic_torch_save
from spheretnorm.runtime.tracking import Progress


def test_the_kept_checkpoint_is_named_as_it_is_on_disk_with_the_cut_write(tmp_path: Path) -> None:
    progress = Progress(tmp_path / "ckpt.pt", tokens_per_step=8, iter_num=14, saved_iter=14)  # rank 1: "saved" 14
    atomic_torch_save({"iter_num": 13}, tmp_path / "ckpt.pt")  # rank 0 died writing 14: 13 is what is there
    assert progress.kept_checkpoint_text() == f"the last good checkpoint {tmp_path / 'ckpt.pt'} (iter 13) is untouched"
    (tmp_path / "ckpt.pt.tmp").write_bytes(b"PK\x03\x04 cut short")
    assert progress.kept_checkpoint_text() == (
        f"the last good checkpoint {tmp_path / 'ckpt.pt'} (iter 13) is untouched; ckpt.pt.tmp is left by a write cut short"
    )
    (tmp_path / "ckpt.pt").unlink()
    assert progress.kept_checkpoint_text() == "no checkpoint had been written; ckpt.pt.tmp is left by a write cut short"
