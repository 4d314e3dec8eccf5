"""Is this the same run? The single home of that answer, and of the names it gives a run.

A run is what it computes: every key of its configs but those that change nothing it computes
(where it runs, writes and logs: config.RUN_NEUTRAL_KEYS) and the method's own keys, which its
folder name holds already. train.py, the launcher, the studies and the tables all ask here, so
a folder one of them takes for a run is the run the others take: the settings of a run, flat
(``run_settings``, ``saved_settings``), its folder suffix (``run_suffix``), the conflicts between
a folder and a command (``run_conflicts``), the keys a resume changes or may not change
(``resume_changes``, ``check_resume_keys``) and the row labels of tables (``settings_labels``).

It imports config.py and nothing that names methods or folders: methods.py and run_folder.py
import it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Hashable, Mapping, Sequence

from spheretnorm.model import OPENED_DEFAULTS, GPTConfig, declared_params
from spheretnorm.optim import OPTIMIZERS
from spheretnorm.runtime.config import (
    RESTART_FREE_KEYS, RESUME_FIXED_KEYS, RUN_NEUTRAL_KEYS, RUN_RECORD_KEYS, TRAIN_KEYS, ConfigError, ParsedConfig, TrainConfig,
    key_default, model_values
)
from spheretnorm.runtime.imports import TRUST_KEY
from spheretnorm.runtime.loss_terms import loss_term_params

_SUFFIX_SAFE = re.compile(r"[A-Za-z0-9_.=+-]+")
_SUFFIX_MAX_CHARS = 60


# -----------------------------------------------------------------------------
# The settings of a run


def param_text(value: Any) -> str:
    """A value as method keys, folder names and the command line write it: '0.5' (not 0.50),
    'true', 'none', '256'. Here because suffixes and row labels write values so too."""
    if value is None or isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def method_keys_neutral() -> frozenset[str]:
    """The method's own keys: the folder name holds them already (see RUN_NEUTRAL_KEYS). A
    parameter without in_key (dyt_alpha) is a setting: a changed value is a folder suffix."""
    return frozenset({"connection", *OPENED_DEFAULTS, *(k for k, p in declared_params().items() if p.in_key)})


def run_neutral_keys() -> frozenset[str]:
    """RUN_NEUTRAL_KEYS and every connection's method keys: the keys no suffix names."""
    return RUN_NEUTRAL_KEYS | method_keys_neutral()


def train_values(train: TrainConfig | dict[str, Any]) -> dict[str, Any]:
    """A training config (or a saved one) as flat keys: its fields, the optimizer's keys at the top
    level (not inside optimizer_params or loss_params)."""
    values = dict(asdict(train) if isinstance(train, TrainConfig) else train)
    nested = [values.pop(holder, None) for holder in ("optimizer_params", "loss_params")]
    return {**values, **{k: v for held in nested if isinstance(held, dict) for k, v in held.items()}}


def run_settings(parsed: ParsedConfig) -> dict[str, Any]:
    """What identifies the run a command asks for (run_conflicts compares it with a config.json):
    every key that computes, flat, but a key left to follow another (parsed.derived:
    lr_decay_iters), whose recorded value a folder's run keeps (keep_recorded_keys)."""
    values = {**train_values(parsed.train), **model_values(asdict(parsed.model_config()))}
    return {k: v for k, v in values.items() if k not in RUN_NEUTRAL_KEYS and k not in parsed.derived}


def saved_settings(saved: dict[str, Any]) -> dict[str, Any]:
    """A run folder's config.json (or a checkpoint's configs) in run_settings' form. A key the
    file predates has its default: code that did not know the key ran as its default does
    (a block-less config is GPT-2's, an optimizer-less one AdamW's with its defaults)."""
    train = train_values(saved)
    optimizer = train.get("optimizer", TrainConfig.optimizer)
    # Training keys only: a model key's default may resolve per model (bias), so one the file
    # lacks is not compared (block aside, whose default is GPT-2's fixed block).
    defaults = {**{k: key_default(k) for k in TRAIN_KEYS}, **{k: p.default for k, p in loss_term_params().items()},
                **{p.key: p.default for p in getattr(OPTIMIZERS.get(optimizer), "params", ())}}
    model = model_values({"block": GPTConfig.block, **saved}, connection=GPTConfig.connection)
    return {**defaults, **train, **model}


# -----------------------------------------------------------------------------
# The folder suffix


def run_suffix(overrides: dict[str, Any]) -> str:
    """'+max_iters=20+n_layer=2' for the setting-changing overrides, '' when there are none.

    A suffix longer than 60 characters or with a path-unsafe character keeps its safe pairs, in
    order, up to 60 characters, then '+overrides-<8 hex digits>', a hash of all the settings, so
    that the same command always finds the same folder again (for a resume).
    """
    changed = _changed_settings(overrides)
    if not changed:
        return ""
    # None as 'None', as folder suffixes have always written it, so an earlier run's folder is found again.
    pairs = [f"+{k}={'None' if v is None else param_text(v)}" for k, v in changed.items()]
    text = "".join(pairs)
    if len(text) <= _SUFFIX_MAX_CHARS and _SUFFIX_SAFE.fullmatch(text):
        return text
    readable = ""
    for pair in (p for p in pairs if _SUFFIX_SAFE.fullmatch(p)):
        if len(readable) + len(pair) > _SUFFIX_MAX_CHARS:
            break
        readable += pair
    return readable + _hashed_suffix(changed)


def earlier_run_suffixes(overrides: dict[str, Any]) -> list[str]:
    """The suffixes earlier code gave these overrides, where they differ from run_suffix's: a hashed
    suffix was '+overrides-<8 hex digits>' alone before issue 66. A folder of that name is the same
    run (methods.found_run_folder looks for it)."""
    changed, current = _changed_settings(overrides), run_suffix(overrides)
    hashed = _hashed_suffix(changed) if changed else ""
    return [hashed] if hashed and current.endswith(hashed) and current != hashed else []  # a suffix short enough never had a hash


def _changed_settings(overrides: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sorted(overrides.items()) if k not in run_neutral_keys()}


def _hashed_suffix(changed: dict[str, Any]) -> str:
    digest = hashlib.sha1(json.dumps(changed, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"+overrides-{digest}"


# -----------------------------------------------------------------------------
# Conflicts: a folder against a command, a checkpoint against a resume


def run_conflicts(saved: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """'key: the run has X, asked for Y' for every key where a run folder's config.json (saved)
    is another run than the one wanted (run_settings), but keys a restart may change (RESTART_FREE_KEYS)."""
    have = saved_settings(saved)
    wanted = json.loads(json.dumps(wanted, default=str))  # as config.json holds them (tuples as lists)
    return [
        f"{k}: the run has {have[k]!r}, asked for {v!r}"
        for k, v in wanted.items()
        if k in have and not same_setting(k, have[k], v) and k not in RESTART_FREE_KEYS
    ]


def same_setting(key: str, have: Any, wanted: Any) -> bool:
    """Whether a recorded value is the one asked for. A rate (learning_rate, muon_lr, ...) is the same
    to 6 significant digits, the precision of the folder names: a study's grid extension was written
    unrounded before 2026-12-07 (0.0010000091042, folder lr0.00100001) and is now written as given."""
    if (key == "learning_rate" or key.endswith("_lr")) and all(isinstance(x, float) and not isinstance(x, bool) for x in (have, wanted)):
        return f"{have:.6g}" == f"{wanted:.6g}"
    return have == wanted


def config_conflicts(out_dir: Path, parsed: ParsedConfig) -> list[str]:
    """'key: the run has X, asked for Y' for each setting where out_dir's config.json is another
    run than the one `parsed` asks for (run_conflicts, the question train.py asks too)."""
    path = Path(out_dir) / "config.json"  # run_folder.CONFIG_NAME (which imports this module)
    if not path.is_file():
        return []
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{path} is not JSON ({e}); move that run folder away (or repair the file) to run there.") from None
    return run_conflicts(saved, run_settings(parsed)) if isinstance(saved, dict) else []


def check_resume_keys(train: TrainConfig, saved_train: dict[str, Any]) -> None:
    """A resume keeps the keys whose state would not carry over (RESUME_FIXED_KEYS: the optimizer);
    saved_train is the checkpoint's train_config."""
    have, values = saved_settings(saved_train), train_values(train)
    fixed = [k for k in sorted(RESUME_FIXED_KEYS) if have.get(k) != values.get(k)]
    if fixed and not train.fresh_optimizer:
        raise ConfigError(
            f"Refusing to resume with {', '.join(f'{k}={values[k]!r}' for k in fixed)}: the checkpoint was trained with "
            f"{', '.join(f'{k}={have.get(k)!r}' for k in fixed)}, whose state does not carry over; pass "
            f"{' '.join(f'--{k}={have.get(k)}' for k in fixed)} to resume it, --fresh_optimizer=true to resume the weights "
            "with a new optimizer state, or start another out_dir."
        )


def keep_recorded_keys(train: TrainConfig, derived: Sequence[str], saved_train: dict[str, Any] | None) -> TrainConfig:
    """train with each derived key (ParsedConfig.derived) at the value a resumed checkpoint's
    train_config records, so a resumed or extended run keeps its schedule; saved_train None: train."""
    recorded = {k: saved_train[k] for k in derived if saved_train and saved_train.get(k) is not None}
    return replace(train, **recorded) if recorded else train


# Keys that say how a command runs, not what the run trains with: never a change of its settings.
RESUME_COMMAND_KEYS = ("init_from", "eval_only", "overwrite", "fresh_optimizer", TRUST_KEY)


def resume_changes(train: TrainConfig, ckpt: Mapping[str, Any], cpu_threads: int | None) -> dict[str, list[Any]]:
    """What a resume changes, key -> [the checkpoint's value, this run's]: each training key the
    command line changes, and cpu_threads where the checkpoint records another count (one and two
    threads give other losses from the next step on). tracking.Progress keeps it in the history."""
    have, values = saved_settings(ckpt["train_config"]), train_values(train)
    changes = {k: [have[k], v] for k, v in values.items() if k in have and have[k] != v and k not in RESUME_COMMAND_KEYS}
    recorded = ckpt.get("cpu_threads")
    if recorded is not None and cpu_threads is not None and recorded != cpu_threads:
        changes["cpu_threads"] = [recorded, cpu_threads]
    return changes


def changes_text(changes: Mapping[str, Sequence[Any]]) -> str:
    """'key: old -> new; ...' for a resume's changes (resume_changes)."""
    return "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items())


# What a row label leaves out of a run's history: keys that change how often it logs, where it
# writes, or its length; the history itself keeps every change. The kernel path's keys and the
# micro-batch and the loss's chunking stay in the label: they change the losses to rounding (as cpu_threads does).
UNLABELLED_CHANGES = (RUN_NEUTRAL_KEYS | RESTART_FREE_KEYS) - {"compile", "compile_scope", "sphere_impl", "batch_size", "loss_chunk_tokens"}


def history_label(config: Mapping[str, Any]) -> str:
    """A run folder's settings history in a row label: 'z_loss 0.0001 -> 0.01 at iter 10' per
    change of a key that computes, '' for a run trained on one set of settings."""
    history = config.get("settings_history")
    if not isinstance(history, list):
        return ""
    return "; ".join(f"{k} {param_text(pair[0])} -> {param_text(pair[1])} at iter {entry.get('iter')}"
                     for entry in history if isinstance(entry, dict) and isinstance(entry.get("changed"), dict)
                     for k, pair in entry["changed"].items()
                     if k not in UNLABELLED_CHANGES and isinstance(pair, list) and len(pair) == 2)


# -----------------------------------------------------------------------------
# Row labels: what tells runs of one method apart in tables and figures


def run_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a run's config.json that make it another run than its method's others:
    every computing key (saved_settings: a key the file predates has its default), less the
    method's own keys and the block, which the row names already."""
    ignored = RUN_NEUTRAL_KEYS | method_keys_neutral() | {"block", *RUN_RECORD_KEYS}
    return {k: v for k, v in saved_settings(dict(config)).items() if k not in ignored}


def keys_differing_within(cells: Sequence[Hashable], identities: Sequence[Mapping[str, Any]]) -> set[str]:
    """The keys in which two runs of one cell differ, among the runs that have the key:
    identities[i] is run i's run_identity, cells[i] the group it belongs to (a table's cell, its column)."""
    by_cell: dict[Hashable, list[Mapping[str, Any]]] = {}
    for cell, identity in zip(cells, identities, strict=True):
        by_cell.setdefault(cell, []).append(identity)
    differing: set[str] = set()
    for cell_identities in by_cell.values():
        for key in {k for identity in cell_identities for k in identity}:
            values = {json.dumps(identity[key], sort_keys=True, default=str) for identity in cell_identities if key in identity}
            if len(values) > 1:
                differing.add(key)
    return differing


def settings_labels(cells: Sequence[Hashable], configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The settings that tell runs of one method apart, one label per run ('optimizer=muon'; ''
    where nothing does): configs[i] is run i's config.json, cells[i] the (dataset, scale, row) it
    belongs to. A key names rows when two runs of a cell that both have it differ in it (a key only
    some runs have, muon_lr beside an AdamW run, still tells those apart); each label lists its
    run's naming keys, sorted. Runs that share every setting get the same label (grid.index_runs refuses them)."""
    identities = [run_identity(config) for config in configs]
    naming = keys_differing_within(cells, identities)
    labels = [", ".join(f"{k}={param_text(identity[k])}" for k in sorted(naming) if k in identity) for identity in identities]
    # A run whose keys changed part-way is not a run of its last settings: its label says so.
    return [", ".join(filter(None, (label, history and f"changed part-way: {history}")))
            for label, history in zip(labels, map(history_label, configs))]
