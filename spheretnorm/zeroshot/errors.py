"""The one exception type of the evaluation tools, and the checks that turn damaged files into it.

Every input problem a user can fix (a missing checkpoint, a foreign file, an unknown task,
an unreachable dataset, a damaged benchmark file) is raised as EvalError with a one-sentence
message; the command-line tools print it without a traceback and exit with status 2.

The file checks below (read_text_file, schema_problem) say *what* is wrong in a phrase; each
tool wraps the phrase into its own error type and sentence. scripts/tables.py and
scripts/plot.py use them too, for run folders (config.json, metrics.jsonl, ckpt_zero_shot.json).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from spheretnorm.runtime.config import TYPE_WORDS, type_text


class EvalError(Exception):
    """A bad input to the evaluation tools, with a message that says how to fix it."""


class UnreadableFile(ValueError):
    """A file that is not text; the message is a phrase to follow the file's name ('is not UTF-8 text ...')."""


def read_text_file(path: str | Path) -> str:
    """The UTF-8 text of a file; binary content (not UTF-8, or NUL bytes) or an unreadable file raises UnreadableFile."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(f"is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})") from None
    except OSError as exc:
        raise UnreadableFile(f"cannot be read ({exc.strerror})") from None
    if "\x00" in text:  # valid UTF-8 but no text: e.g. a UTF-16 file or an archive
        raise UnreadableFile("holds NUL bytes, so it is not a text file")
    return text


def parse_json(text: str) -> Any:
    """json.loads, with a value nested too deeply for Python's parser a ValueError (phrase) rather than a RecursionError."""
    import json

    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"is nested too deeply to read (lists or objects inside each other beyond Python's recursion limit of {sys.getrecursionlimit()})") from None


def non_finite(value: Any) -> bool:
    """Whether a number is nan or +-inf (JSON's NaN / Infinity, which Python's json reads)."""
    return isinstance(value, float) and (value != value or value in (float("inf"), float("-inf")))


# -----------------------------------------------------------------------------
# The shape of a JSON value
#
# A schema is a type (or tuple of types) for a value, a dict for an object with those fields
# (each required), or a one-item list for a list of such items.

Schema = Any
NUMBER = (int, float)  # a JSON number: 3 and 3.0 alike (JSON's true/false are not numbers here)

def kind_of(value: Any) -> str:
    """What a JSON value is, as an error says it: 'null', 'a string', 'a list', ..."""
    return "null" if value is None else TYPE_WORDS.get(type(value), type(value).__name__)


def schema_text(schema: Schema) -> str:
    """The fields of a schema as eval/README.md writes them: 'id, question{stem, choices[{text, label}]}'."""
    if isinstance(schema, dict):
        return ", ".join(k + _nested_text(v) for k, v in schema.items())
    return ""


def _nested_text(schema: Schema) -> str:
    if isinstance(schema, dict):
        return "{" + schema_text(schema) + "}"
    if isinstance(schema, list) and isinstance(schema[0], dict):
        return "[{" + schema_text(schema[0]) + "}]"
    return ""


def schema_problem(value: Any, schema: Schema, where: str = "") -> str | None:
    """What is wrong with value against schema, e.g. "question.choices[1].text is null, not a string"; None if nothing.

    A missing field reads "has no field 'x' (fields there: ...)", to follow the name of the record.
    """
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return f"{where or 'it'} is {kind_of(value)}, not an object"
        for key, sub in schema.items():
            path = f"{where}.{key}" if where else key
            if key not in value:
                return f"has no field {path!r} (fields there: {', '.join(map(str, value)) or 'none'})"
            problem = schema_problem(value[key], sub, path)
            if problem:
                return problem
        return None
    if isinstance(schema, list):
        if not isinstance(value, list):
            return f"{where} is {kind_of(value)}, not a list"
        return next((p for i, item in enumerate(value) if (p := schema_problem(item, schema[0], f"{where}[{i}]"))), None)
    types = schema if isinstance(schema, tuple) else (schema,)
    # JSON's true and false are Python ints too; only a field meant to be a bool may hold one.
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        return f"{where} is {kind_of(value)}, not {type_text(types)}"
    return None


def empty_field(value: Any, schema: Schema, may_be_empty: frozenset[str] = frozenset(), where: str = "") -> str | None:
    """The path of the first string field of a schema-checked value that is empty or blank ('question.stem',
    'endings[2]'); fields named in may_be_empty (last key) may be. None when there is none."""
    if isinstance(schema, dict) and isinstance(value, dict):
        for key, sub in schema.items():
            if key in may_be_empty:
                continue
            found = empty_field(value.get(key), sub, may_be_empty, f"{where}.{key}" if where else key)
            if found:
                return found
        return None
    if isinstance(schema, list) and isinstance(value, list):
        return next((f for i, item in enumerate(value) if (f := empty_field(item, schema[0], may_be_empty, f"{where}[{i}]"))), None)
    if isinstance(value, str) and not value.strip() and str in (schema if isinstance(schema, tuple) else (schema,)):
        return where
    return None


def problem_sentence(subject: str, problem: str) -> str:
    """'Record 3 of F has no field ...' or 'Record 3 of F: x is null, not a string' (no final full stop)."""
    return f"{subject} {problem}" if problem.startswith("has ") else f"{subject}: {problem}"
