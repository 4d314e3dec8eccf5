"""--help, generated from the dataclasses.

A key's one-line help is the trailing comment of its field (model.py for GPTConfig,
train_config.py for TrainConfig), so the help cannot drift from the code. The fields of GPTConfig
that carry no comment in model.py get theirs here.
"""

from __future__ import annotations

import inspect
import io
import re
import textwrap
import tokenize
from dataclasses import fields
from typing import Any

from spheretnorm.model import CONNECTIONS, GPTConfig, declared_params
from spheretnorm.optim import OPTIMIZERS
from spheretnorm.runtime.config.parsing import split_argv
from spheretnorm.runtime.config.train_config import _MODEL_CHOICES, KEY_HOLDERS, ConfigError, TrainConfig, key_default, param_keys
from spheretnorm.runtime.config.values import parse_value
from spheretnorm.runtime.imports import KEY as IMPORTS_KEY, import_modules
from spheretnorm.runtime.loss_terms import LOSS_TERMS

_MODEL_HELP_GAPS = {
    "block_size": "context length in tokens",
    "n_layer": "transformer blocks",
    "n_head": "attention heads per block",
    "n_embd": "width of the hidden states (a multiple of n_head)",
    "dropout": "dropout probability (the paper trains without dropout)",
}
TRAIN_USAGE = "usage: python train.py [config/NAME.py ...] [--key=value ...]"
TRAIN_DESCRIPTION = (
    "Train a GPT with a chosen deep connection. Config files are read first, in order, then the\n"
    "--key=value options; later ones win. Every key below can be set either way; the defaults are\n"
    "the paper's shared hyperparameters at the S scale. A config file is Python that runs, as in\n"
    "nanoGPT (its public names become keys): only trusted files belong there."
)
_FIELD_LINE = re.compile(r"^    (\w+)\s*:")
_SECTION_LINE = re.compile(r"^    #\s*--\s*(.+)$")
_HELP_COLUMN = 32


def field_comments(cls: type) -> tuple[dict[str, str], dict[str, str]]:
    """({field: its trailing comment}, {field: the '# -- section' above it}) from the source; empty
    without the source (a frozen install): --help then lists the keys and defaults alone."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}, {}
    # Comments come from the tokenizer, so a '#' inside a string default is never one.
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    comment_at = {t.start[0]: t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT}
    names = {f.name for f in fields(cls)}
    comments, sections, section, above = {}, {}, "", []
    for line_no, line in enumerate(source.splitlines(), start=1):
        header = _SECTION_LINE.match(line)
        match = _FIELD_LINE.match(line)
        if header:
            section, above = header.group(1).strip(), []
        elif match and match.group(1) in names:
            name = match.group(1)
            sections[name] = section
            # A trailing comment, else the comment lines right above the field.
            text = comment_at.get(line_no) or " ".join(above)
            if text:
                comments[name] = text
            above = []
        elif line.strip().startswith("#") and line_no in comment_at:
            above.append(comment_at[line_no])
        else:
            above = []
    return comments, sections


def key_help() -> dict[str, str]:
    """The one-line help of every config key, with its choices where it has any."""
    model_comments, _ = field_comments(GPTConfig)
    train_comments, _ = field_comments(TrainConfig)
    helps = {**_MODEL_HELP_GAPS, **model_comments, **{k: p.help for k, p in declared_params().items()}, **train_comments}
    choices = {**_MODEL_CHOICES, **{f.name: (*f.metadata["choices"], *f.metadata["forms"]) for f in fields(TrainConfig) if "choices" in f.metadata}}
    for key, allowed in choices.items():
        helps[key] = f"{helps.get(key, '')} [one of: {', '.join(allowed)}]".strip()
    return helps


def _default_text(value: Any) -> str:
    if isinstance(value, list):  # as the command line writes it
        value = ",".join(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if value == "":
        return '""'
    return str(value)


def _help_entry(option: str, text: str) -> str:
    if len(option) + 2 >= _HELP_COLUMN:
        return f"  {option}\n{' ' * _HELP_COLUMN}{text}"
    return f"  {option.ljust(_HELP_COLUMN - 2)}{text}"


def _key_entries(cls: type, helps: dict[str, str]) -> list[str]:
    lines, section = [], None
    _, sections = field_comments(cls)
    for f in fields(cls):
        if f.name in KEY_HOLDERS:
            continue  # their keys are listed one by one (_param_entries, _optimizer_entries)
        if sections.get(f.name) and sections[f.name] != section:
            section = sections[f.name]
            lines.append(f" {section}:")
        lines.append(_help_entry(f"--{f.name}={_default_text(key_default(f.name))}", helps.get(f.name, "")))
    return lines


def _param_entries() -> list[str]:
    """The parameters that connection classes declare, with the connections that use them; one
    in the method key (in_key) says so, as a launcher's --methods sets it."""
    params = declared_params()
    owners = {k: [c for c, cls in CONNECTIONS.items() if any(p.key == k for p in cls.params)] for k in param_keys()}
    return [
        _help_entry(
            f"--{k}={_default_text(params[k].default)}",
            f"{params[k].help} (connection {', '.join(owners[k])}{'; in the method key' if params[k].in_key else ''})",
        )
        for k in param_keys()
    ]


def _optimizer_entries() -> list[str]:
    """The keys that optimizers and loss terms declare (spheretnorm/optim.py, runtime/loss_terms.py), each with its owner."""
    owners = [("optimizer", OPTIMIZERS), ("loss term", LOSS_TERMS)]
    return [
        _help_entry(f"--{p.key}={_default_text(p.default)}", f"{p.help} ({kind} {name})")
        for kind, registry in owners
        for name, entry in registry.items()
        for p in entry.params
    ]


def config_help(
    extra_options: dict[str, str] | None = None,
    *,
    usage: str = TRAIN_USAGE,
    description: str = TRAIN_DESCRIPTION,
    train_keys: bool = True,
) -> str:
    """The --help text of a program configured by GPTConfig (and TrainConfig) keys: extra_options
    ('--name=DEFAULT' -> its help) first; train_keys=False leaves out the training keys."""
    helps = key_help()
    parts = [usage, "", description]
    if extra_options:
        parts += ["", "Options of this program:", *(_help_entry(k, v) for k, v in extra_options.items())]
    parts += ["", "Model keys (model.GPTConfig), as --key=DEFAULT:", *_key_entries(GPTConfig, helps), *_param_entries()]
    if train_keys:
        parts += ["", "Training keys (spheretnorm.runtime.config.TrainConfig), as --key=DEFAULT:", *_key_entries(TrainConfig, helps), *_optimizer_entries()]
    return "\n".join(parts) + "\n"


def train_help(argv: list[str]) -> str:
    """train.py's --help, with the keys of the modules --imports names (their connections',
    optimizers' and loss terms' keys): imported first, as a run would (issue 65, item 5)."""
    named = [raw for key, raw in split_argv([a for a in argv if a not in ("-h", "--help")])[1] if key == IMPORTS_KEY]
    if named:
        import_modules(parse_value(IMPORTS_KEY, named[-1]), error=ConfigError)
    return config_help()


def wants_help(argv: list[str]) -> bool:
    """True when the command line asks for --help (or -h) anywhere."""
    return any(arg in ("-h", "--help") for arg in argv)
