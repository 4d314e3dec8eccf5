"""What every command shares: the checkout's root, the --help formatter and the usage error."""

from __future__ import annotations

import argparse
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout: config/, data/, reference/


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The scripts' --help: the docstring as written, and every option's default.

    The default is appended unless the option's help already states it or there is none to
    state (a flag, an optional value left unset).
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default in ("", [], argparse.SUPPRESS)
        if "default" in text or unset or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)".strip()


class UsageError(ValueError):
    """A bad command-line value; scripts print it as one line and exit with status 2."""
