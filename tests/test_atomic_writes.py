"""runtime.atomic.replace_file, the one writer of a file that is whole or not there: what a
failure leaves, the temporary names, the permissions and the fsync of a durable write."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from spheretnorm.runtime import atomic
from spheretnorm.runtime.atomic import WriteError, replace_file, write_atomically


def fail_after_writing(tmp: Path) -> None:
    tmp.write_text("half", encoding="utf-8")
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("temp", [None, "out.txt.tmp"])
def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path: Path, temp: str | None) -> None:
    path = tmp_path / "out.txt"
    path.write_text("old", encoding="utf-8")
    with pytest.raises(OSError, match="No space left"):
        replace_file(path, fail_after_writing, temp=None if temp is None else tmp_path / temp)
    assert path.read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_a_fixed_temporary_name_is_the_one_written(tmp_path: Path) -> None:
    seen: list[Path] = []
    replace_file(tmp_path / "ckpt.pt", lambda tmp: (seen.append(tmp), tmp.write_bytes(b"x")), temp=tmp_path / "ckpt.pt.tmp")
    assert seen == [tmp_path / "ckpt.pt.tmp"] and (tmp_path / "ckpt.pt").read_bytes() == b"x"


def test_the_file_gets_the_mode_the_umask_gives(tmp_path: Path) -> None:
    """mkstemp's temporary files are private (0600); the output must not be."""
    old = os.umask(0o027)
    try:
        path = replace_file(tmp_path / "table.md", lambda tmp: tmp.write_text("| a |", encoding="utf-8"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_a_durable_write_syncs_the_temporary_file_before_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    monkeypatch.setattr(atomic, "_fsync", lambda p: events.append(f"fsync {p.name}"))
    real_replace = os.replace
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b)))
    replace_file(tmp_path / "ckpt.pt", lambda tmp: tmp.write_bytes(b"x"), temp=tmp_path / "ckpt.pt.tmp", durable=True)
    assert events == ["fsync ckpt.pt.tmp", "replace"]
    events.clear()
    replace_file(tmp_path / "ckpt.pt", lambda tmp: tmp.write_bytes(b"y"), temp=tmp_path / "ckpt.pt.tmp")
    assert events == ["replace"]


def test_an_output_on_a_full_disk_is_one_sentence_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "tables.md"
    with pytest.raises(WriteError) as error:
        write_atomically(path, fail_after_writing)
    assert str(error.value) == (
        f"Cannot write {str(path)!r} (No space left on device; the disk (or the file size limit) is full, "
        "free space and run again); no partial file was left."
    )
    assert list((tmp_path / "sub").iterdir()) == []
