"""The one exception type of the evaluation tools.

Every input problem a user can fix (a missing checkpoint, a foreign file, an unknown task,
an unreachable dataset) is raised as EvalError with a one-sentence message; the command-line
tools print it without a traceback and exit with status 2.
"""

from __future__ import annotations


class EvalError(Exception):
    """A bad input to the evaluation tools, with a message that says how to fix it."""
