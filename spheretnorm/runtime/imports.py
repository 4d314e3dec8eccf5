"""The `imports` key: a user's own modules (a connection of their own), imported before any other key is read.

So that a connection of one's own means the same in every process, each command imports the
modules a run was given (`--imports=my_ideas.deepnorm`) before it reads a key, a model config or a
method name that may need them; the modules a file records are imported only with the user's
consent (import_recorded): a file from elsewhere must not choose code to run. A module is looked up
on sys.path, then in the current folder, whose folder then goes on PYTHONPATH for the processes
this one starts; sys.path itself is never edited. docs/ARCHITECTURE.md ("Adding a deep
connection") says the rest.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, TypeVar

from spheretnorm.runtime.cli import UsageError
from spheretnorm.runtime.stopping import StartupStopped

KEY = "imports"
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_FORMS = 'give dotted module names such as my_ideas.deepnorm (imports = ["a.b", "c"] in a config file, --imports=a.b,c on the command line)'
_HOW_TO_FIX = "check the name and that its folder is on PYTHONPATH or the current folder"

def own_module_hint(kind: str) -> str:
    """Said where a connection's or an optimizer's (`kind`) name is unknown: it may be one of a module not imported."""
    article = "an" if kind[0] in "aeiou" else "a"
    return f"{article} {kind} of your own module needs --imports=MODULE (imports = [...] in a config file)"


OWN_CONNECTION_HINT = own_module_hint("connection")

T = TypeVar("T")


class ImportsError(UsageError):
    """A value of the imports key that is no list of module names, or a module that cannot be imported."""


def comma_list(text: str) -> list[str]:
    """'a.b, c' -> ['a.b', 'c']: a list key as the command line writes it."""
    return [item.strip() for item in text.split(",") if item.strip()]


def check_names(names: Any, source: str = KEY) -> list[str]:
    """names as a list, or an ImportsError when it is not a list of dotted module names."""
    if not isinstance(names, (list, tuple)) or not all(isinstance(name, str) for name in names):
        raise ImportsError(f"{source}: {names!r:.80} is not a list of module names; {_FORMS}.")
    bad = [name for name in names if not _MODULE_NAME.fullmatch(name)]
    if bad:
        raise ImportsError(f"{source}: {bad[0]!r} is not a module name; {_FORMS}.")
    return list(names)


def import_modules(names: Any, source: str = KEY, error: type[Exception] = ImportsError) -> None:
    """Import each module of `names` (sys.path, then the current folder); the first that is absent or
    fails as it runs is one `error` naming it. `source` says where the names come from ('imports', or
    a file that records them)."""
    try:
        names = check_names(names, source)
    except ImportsError as exc:
        raise error(str(exc)) from None
    for name in names:
        if name in sys.modules:
            continue
        try:
            _import_top_level_from_current_folder(name.partition(".")[0])
            importlib.import_module(name)
        except StartupStopped:
            raise  # a stop signal during the import (train.py's start-up): the signal's, not the module's
        # Any failure of the user's code is the same to them: this module. A module that calls
        # sys.exit or raises KeyboardInterrupt as it runs too: its status (3, say) would read as
        # one of the command's own (train.py's collapse).
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001
            raise error(f"{source}: module {name!r} could not be imported ({_first_line(exc)}); {_HOW_TO_FIX}.") from None
        for folder in folders_off_sys_path([name]):  # the processes this one starts find it too
            _share_with_child_processes(folder)


# The user's consent to import what a file records (--trust_recorded_imports=true): a file read
# from elsewhere must not choose code to run, as transformers' trust_remote_code. One switch per
# process, set where a command reads its command line (consent_to_recorded_imports).
TRUST_KEY = "trust_recorded_imports"
_consent = {"given": False}


def consent_to_recorded_imports(given: bool) -> None:
    """Whether this process imports the modules that files record (its command line's --trust_recorded_imports)."""
    _consent["given"] = bool(given)


def recorded_imports_trusted() -> bool:
    return _consent["given"]


def import_recorded(record: Any, source: str, error: type[Exception] = ImportsError, needed: bool = True) -> None:
    """Import the modules a saved config records under the key (a checkpoint's train_config, a
    config.json), with the user's consent only. Without consent, a reader that `needed` them (the
    model names a connection no imported module registered) is one `error` naming them and both
    ways to consent; one that does not imports nothing."""
    names = record.get(KEY) if isinstance(record, dict) else None
    if not names or not (needed or recorded_imports_trusted()):
        return
    try:
        names = check_names(names, f"{source} records {KEY}")
    except ImportsError as exc:
        raise error(str(exc)) from None
    if recorded_imports_trusted():
        import_modules(names, f"{source} records {KEY}={names!r:.80}", error)
    elif any(name not in sys.modules for name in names):
        raise error(
            f"{source} records {KEY}={list(names)!r:.200}, code that is imported only with your consent; pass "
            f"--{KEY}={','.join(str(name) for name in names)[:200]} to import the modules you name, or --{TRUST_KEY}=true "
            "to import what the file records (only for files you trust: importing a module runs it)."
        )


def add_import_options(parser: Any) -> None:
    """--imports and --trust_recorded_imports for a command that reads checkpoints or run folders (argparse)."""
    parser.add_argument(f"--{KEY}", default="", help="comma-separated modules of your own to import first (a connection they register)")
    parser.add_argument(
        f"--{TRUST_KEY}", nargs="?", const="true", default="false", choices=("true", "false"),
        help="import the modules a checkpoint or config.json records under imports: this runs their code, so only for files you trust",
    )


def use_import_options(args: Any, error: type[Exception]) -> None:
    """Import what --imports names and record --trust_recorded_imports's consent (add_import_options' values)."""
    import_modules(comma_list(getattr(args, KEY)), f"--{KEY}", error)
    consent_to_recorded_imports(getattr(args, TRUST_KEY) == "true")


def recorded_imports(ckpt: dict[str, Any]) -> list[str]:
    """The modules a checkpoint's train_config records (unchecked; [] when none)."""
    train_config = ckpt.get("train_config")
    return list((train_config.get(KEY) or []) if isinstance(train_config, dict) else [])


def imports_of_overrides(overrides: Sequence[str]) -> list[str]:
    """The module names of the last --imports=... among train.py overrides ([] when none)."""
    given = [arg.partition("=")[2] for arg in overrides if arg.startswith(f"--{KEY}=")]
    return comma_list(given[-1]) if given else []


def keep_recorded_imports(train: T, record: dict[str, Any] | None) -> T:
    """The training config of a run that continues a model, with the modules `record` (its
    checkpoint's train_config, a folder's config.json) holds added to its own, so that a run
    given no --imports keeps recording what its model needs."""
    recorded = record.get(KEY) if isinstance(record, dict) else None
    names = list(dict.fromkeys([*getattr(train, KEY), *(recorded or [])]))
    return dataclasses.replace(train, **{KEY: names}) if names != getattr(train, KEY) else train


def folders_off_sys_path(names: Sequence[str]) -> list[str]:
    """The folders that the imported modules `names` came from and sys.path lacks: a command run
    elsewhere needs them on PYTHONPATH. A relative entry of sys.path ('' under python -m) does not
    count: elsewhere it means another folder."""
    on_path = {p for p in sys.path if os.path.isabs(p)}
    folders: list[str] = []
    for top in dict.fromkeys(name.partition(".")[0] for name in names):
        module = sys.modules.get(top)
        # A package's folder (a namespace package has no __file__), else the module's file.
        where = [*getattr(module, "__path__", []), getattr(module, "__file__", None)]
        folder = os.path.dirname(os.path.abspath(where[0])) if where[0] else None
        if folder and folder not in on_path and folder not in folders:
            folders.append(folder)
    return folders


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _import_top_level_from_current_folder(top: str) -> None:
    """Import the top-level module or package `top` from the current folder when sys.path has
    none of that name."""
    if top in sys.modules or importlib.util.find_spec(top) is not None:
        return
    folder = os.getcwd()
    spec = importlib.machinery.PathFinder.find_spec(top, [folder])
    if spec is None:
        return  # importlib.import_module then says "No module named ..."
    module = importlib.util.module_from_spec(spec)
    sys.modules[top] = module  # as the import system does, before the code runs (for its own imports)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[top]
        raise


def _share_with_child_processes(folder: str) -> None:
    """folder first on PYTHONPATH, which the processes this one starts inherit (sys.path stays as it is)."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([folder, *paths])
