"""Writing a file whole or not at all: a temporary name beside it, then a rename.

`replace_file` is the one mechanism behind every writer of a single file that a crash or a full
disk must not leave half-written (checkpoints, metrics.jsonl, config.json, the tables, figures and
zero-shot results, a downloaded dataset); each caller says in its own sentence which file it could
not write; folders renamed whole (a sharded checkpoint, an export) have their own two-step commits.
Standard library only, so that tables and plots can write without importing torch.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def current_umask() -> int:
    """The process's umask; reading it means setting it, so it is set back at once."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def apply_umask(path: str | Path) -> None:
    """Give `path` the permissions open() gives a new file, 0666 less the umask: mkstemp and
    safetensors write private temporary files (0600), unreadable to the group and to others."""
    os.chmod(path, 0o666 & ~current_umask())


def folder_mode() -> int:
    """The permissions mkdir() gives a new folder: 0777 less the umask."""
    return 0o777 & ~current_umask()


def replace_file(path: str | Path, write: Callable[[Path], None], *, temp: Path | None = None, durable: bool = False) -> Path:
    """Call write(tmp) on a temporary name in path's folder, then rename it onto path. On any failure
    the temporary file is removed and the error raised as it came (an OSError names no file).

    temp: a fixed temporary name (one a run folder's cleanup knows, RUN_FILES). durable: fsync
    before the rename, so that a node that crashes just after leaves no empty file under path's name.
    """
    path = Path(path)
    if temp is None:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + path.suffix, dir=path.parent)
        os.close(fd)
        temp = Path(name)
    try:
        write(temp)
        if durable:
            _fsync(temp)
        apply_umask(temp)  # mkstemp makes its file private (0600); outputs get the usual mode
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return path


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDWR)  # writable: some systems refuse to sync a read-only handle
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -----------------------------------------------------------------------------
# The outputs of the commands (tables, figures, zero-shot results, exports): one sentence


class WriteError(Exception):
    """An output that could not be written; the message is one sentence naming the file."""


def write_failure(path: str | Path, exc: OSError) -> WriteError:
    """The sentence for an OSError while writing `path` (a full disk said as such)."""
    full = exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
    why = f"{exc.strerror or exc}" + ("; the disk (or the file size limit) is full, free space and run again" if full else "")
    return WriteError(f"Cannot write {str(path)!r} ({why}); no partial file was left.")


def write_atomically(path: str | Path, write: Callable[[Path], None]) -> Path:
    """replace_file into path's folder (made if missing), with an OSError as one WriteError sentence naming path."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return replace_file(path, write)
    except OSError as exc:
        raise write_failure(path, exc) from None


def write_text_atomically(path: str | Path, text: str) -> Path:
    """write_atomically of a UTF-8 text."""
    return write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def remove_written(path: Path) -> None:
    """Remove a file or folder an interrupted write left (best effort, never raising)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
