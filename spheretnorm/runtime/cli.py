"""What every command shares: the checkout's root, the --help formatter, the usage error and the
one line a command prints when a package it needs is missing.

It imports the standard library only: a command imports it before torch, so that a missing torch
can be reported by it (docs/ARCHITECTURE.md, "The commands")."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from types import TracebackType

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout: config/, data/, reference/


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The scripts' --help: the docstring as written, and every option's default unless its help
    states it already or there is none to state (a flag, an optional value left unset)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default in ("", [], argparse.SUPPRESS)
        if "default" in text or unset or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)".strip()


class UsageError(ValueError):
    """A bad command-line value; scripts print it as one line and exit with status 2."""


MISSING_PACKAGE_EXIT = 2  # as a usage error: the command did not start


def missing_package_line(command_file: str, module: str) -> str:
    """What a command says when `module` cannot be imported: which command, what it needs, how to install it."""
    command = Path(command_file).resolve()
    shown = command.relative_to(REPO_ROOT) if command.is_relative_to(REPO_ROOT) else command
    return (
        f"{shown.as_posix()} needs {module}; install the project from {REPO_ROOT}: "
        'pip install -e ".[dev]" (README.md, "Which torch gets installed", says which torch to choose first)'
    )


def explain_missing_packages(command_file: str) -> None:
    """Make an uncaught ModuleNotFoundError of another package one line and exit status 2 (a command
    calls this before its first third-party import); a module of this package that cannot be found
    is a bug, and keeps its traceback as every other error."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        name = getattr(error, "name", None) if issubclass(kind, ModuleNotFoundError) else None
        if not name or name.split(".")[0] == __package__.split(".")[0]:
            previous(kind, error, tb)
            return
        print(missing_package_line(command_file, name), file=sys.stderr)
        raise SystemExit(MISSING_PACKAGE_EXIT)  # from an excepthook, Python exits with this status

    sys.excepthook = hook


class SurvivingStream:
    """A console stream that outlives its reader: `train.py | tee log`, and Ctrl-C to the whole
    group ends tee first, so every later print would fail (EPIPE) and turn a stop that is writing
    its checkpoint into a crash. A failed write silences the stream instead: its descriptor is
    pointed at /dev/null, so the rest of the buffer and Python's own flush at exit go nowhere."""

    def __init__(self, stream: object) -> None:
        self._stream = stream
        self.dead = False

    def write(self, text: str) -> int:
        if not self.dead:
            try:
                return self._stream.write(text)
            except (OSError, ValueError):  # ValueError: the stream was closed
                self._silence()
        return len(text)

    def flush(self) -> None:
        if not self.dead:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self._silence()

    def _silence(self) -> None:
        self.dead = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no descriptor (a test's stream): writes are dropped above
            pass

    def __getattr__(self, name: str) -> object:  # encoding, fileno, isatty, ...: the stream's own
        return getattr(self._stream, name)


def survive_closed_console() -> None:
    """Make sys.stdout and sys.stderr SurvivingStreams (once): a reader that goes away costs the
    console lines, never the run."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, SurvivingStream):
            setattr(sys, name, SurvivingStream(stream))
