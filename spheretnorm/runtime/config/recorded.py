"""What a run folder records, read back as settings: its config.json as a config file
(read_run_config), the rule that a resume of a folder named by --out_dir alone starts from the
run's own settings (resumed_run_config), and the modules a run's settings need imported before any
key is checked (import_first: the imports key, and with consent the modules a continued run records).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spheretnorm.model import CONNECTIONS
from spheretnorm.optim import OPTIMIZERS
from spheretnorm.runtime.config.train_config import HF_PREFIX, KEY_HOLDERS, ConfigError, _is_key
from spheretnorm.runtime.config.values import check_value, parse_value
from spheretnorm.runtime.imports import KEY as IMPORTS_KEY, TRUST_KEY, consent_to_recorded_imports, import_modules, import_recorded
from spheretnorm.runtime.token_files import read_json_object

# What a run folder's config.json records besides the config keys (train.py's run_config): read
# back as a config file, these are skipped, not refused as unknown keys.
DEBUG_PREFIX = "debug_"  # the fault-injection switches (debug_nan_at_iter, debug_crash_at_iter)
RUN_RECORD_KEYS = ("method", "world_size", "grad_accum_steps", "tokens_per_step", "num_params", "resolved_dtype", "sphere_kernels", "kernel_path",
                   "cpu_threads", "data_source", "settings_history")


def read_run_config(path: str) -> dict[str, Any]:
    """The config keys of a run folder's config.json, the parameters as keys of their own and what it
    records besides (RUN_RECORD_KEYS) left out, so that `train.py out/RUN/config.json --eval_only=true`
    evaluates the run as it was trained. Its out_dir is the folder holding it: a run folder moved is
    still the run evaluated, never another that took its old place."""
    values = read_json_object(path, ConfigError, "give the config.json that train.py wrote into a run folder.")
    nested = {}
    for holder in KEY_HOLDERS:
        params = values.pop(holder, None) or {}
        if not isinstance(params, dict):
            raise ConfigError(f"{path!r} has {holder}={params!r:.60}, where an object of keys belongs.")
        nested.update(params)
    if "out_dir" in values:  # the run is the folder this config.json is in, wherever that folder has moved
        values["out_dir"] = str(Path(path).parent)
    # Consent to its recorded imports is the user's to give on the command line, never the file's;
    # a fault injected once (debug_nan_at_iter, ...) is not injected again by reading the run back.
    return {**{k: v for k, v in values.items() if k not in (*RUN_RECORD_KEYS, TRUST_KEY) and not k.startswith(DEBUG_PREFIX)}, **nested}


def resume_record(pairs: list[tuple[str, str]]) -> Path | None:
    """out_dir/config.json, whether there or not, for a resume of a run folder named by --out_dir
    alone (the command line's pairs; no config file given); None for any other command. An
    evaluation keeps the command's keys: it computes no loss term, so needs no consent to import a
    module of one."""
    def last(key: str) -> str:
        return next((raw for k, raw in reversed(pairs) if k == key), "")

    evaluating = bool(last("eval_only") and parse_value("eval_only", last("eval_only")))
    if last("init_from") != "resume" or evaluating or not last("out_dir"):
        return None
    return Path(last("out_dir"), "config.json")  # run_folder.CONFIG_NAME (which imports this module)


def resumed_run_config(pairs: list[tuple[str, str]]) -> list[str]:
    """[resume_record] where that file is there, so that a resume by --out_dir alone starts from
    the run's own settings as `train.py RUN/config.json --init_from=resume` does (not the defaults:
    another data set, rates and batch); [] otherwise. A folder that holds a checkpoint but lost its
    config.json has it written back from the checkpoint first (checkpoint.restore_run_config)."""
    record = resume_record(pairs)
    return [str(record)] if record is not None and record.is_file() else []


def import_first(file_values: list[tuple[str, dict[str, Any]]], pairs: list[tuple[str, str]]) -> None:
    """Import the modules of the imports key (the last one given wins) before any other key is
    checked: they register what those keys may name. A run folder's config.json records its modules
    rather than gives them: imported only with consent (imports.import_recorded), and asked for only
    where its connection or optimizer is no registered one."""
    trust = [check_value(TRUST_KEY, read[TRUST_KEY], f"in {path}") for path, read in file_values if TRUST_KEY in read]
    trust += [parse_value(TRUST_KEY, raw) for key, raw in pairs if key == TRUST_KEY]
    consent_to_recorded_imports(bool(trust and trust[-1]))
    given: list[tuple[str, Any]] = [(path, read) for path, read in file_values if IMPORTS_KEY in read]
    given += [("", {IMPORTS_KEY: parse_value(IMPORTS_KEY, raw)}) for key, raw in pairs if key == IMPORTS_KEY]
    path, read = given[-1] if given else ("", {})
    if path.endswith(".json"):
        import_recorded(read, repr(path), ConfigError, _names_unregistered(read))
    else:
        import_modules(check_value(IMPORTS_KEY, read[IMPORTS_KEY], f"in {path}") if path else read.get(IMPORTS_KEY, []), error=ConfigError)
    _import_resumed_run(file_values, pairs)


def _import_resumed_run(file_values: list[tuple[str, dict[str, Any]]], pairs: list[tuple[str, str]]) -> None:
    """A run that continues a model (a resume or evaluation of a run folder, --init_from=hf:DIR)
    whose command line names a connection, optimizer or key that no imported module registered:
    import the modules the config.json it continues records, with the user's consent (without it,
    one sentence naming them). Before any key is checked, which would refuse the name as unknown."""
    def last(key: str) -> Any:  # the value the full parse will give key: the command line's, else the files' last
        given = [parse_value(key, raw) for k, raw in pairs if k == key] or [read[key] for _, read in file_values if key in read]
        return given[-1] if given else None

    named = {**dict.fromkeys(k for k, _ in pairs), "connection": last("connection"), "optimizer": last("optimizer")}
    record = _continued_record(last("init_from"), last("out_dir"), bool(last("eval_only")))
    if record is not None and _names_unregistered(named) and record.is_file():
        values = read_json_object(record, ConfigError, "give --imports=MODULE for the modules the run needs.")
        import_recorded(values, repr(str(record)), ConfigError)


def _continued_record(init_from: Any, out_dir: Any, eval_only: bool) -> Path | None:
    """The config.json that records the modules of the model a run continues: its run folder's
    on a resume or evaluation, the folder's of --init_from=hf:DIR; None for a new model."""
    if isinstance(init_from, str) and init_from.startswith(HF_PREFIX) and init_from.removeprefix(HF_PREFIX):
        return Path(init_from.removeprefix(HF_PREFIX), "config.json")  # the export's config.json (spheretnorm.hf.folder)
    if (init_from in ("resume", "auto") or eval_only) and out_dir:
        return Path(out_dir, "config.json")  # run_folder.CONFIG_NAME (which imports this module)
    return None


def _names_unregistered(values: dict[str, Any]) -> bool:
    """Whether a run's config names a connection or an optimizer that no imported module registered,
    or a key that none declares (a loss term's)."""
    named = [(values.get("connection"), CONNECTIONS), (values.get("optimizer"), OPTIMIZERS)]
    return any(isinstance(name, str) and name not in registry for name, registry in named) or not all(map(_is_key, values))
