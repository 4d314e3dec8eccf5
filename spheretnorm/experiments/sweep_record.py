"""A sweep's record, OUT_DIR/<name>.json, and what it vouches for (issue 67, item 2).

The declaration's digest, written with it before any run (declare); each run's config.json and
metrics.jsonl digests and the declaration it ran under, kept in the record's rows from the first
time the run was recorded ended; the code's commit. A re-run, --table_only and --compare check
them: a run whose files no longer match is one line and left out of every headline (status
UNVERIFIED: not ended, so no cell, gap, rule or plan reads its loss; sweep_runner.check_row).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from spheretnorm.runtime.token_files import read_json_object
from spheretnorm.data.pipeline import sha256_file
from spheretnorm.experiments.grid import CONFIG_NAME
from spheretnorm.experiments.stats import Rule, parse_rule
from spheretnorm.experiments.sweep_plan import UNSTABLE, Place, Seeds, Sweep
from spheretnorm.runtime.cli import REPO_ROOT, UsageError
from spheretnorm.runtime.run_folder import METRICS_NAME

UNVERIFIED = "unverified"
DIGEST_KEYS = ("config_sha256", "metrics_sha256")


def file_digest(path: Path) -> str | None:
    """The sha256 of a file's bytes; None where there is no file."""
    with contextlib.suppress(FileNotFoundError):
        return sha256_file(path)
    return None


def declaration_digest(declared: dict[str, Any]) -> str:
    """The sha256 of a declaration's keys, its own digest left out, in a canonical JSON form."""
    return hashlib.sha256(json.dumps({k: v for k, v in declared.items() if k not in ("digest", "edited")}, sort_keys=True).encode()).hexdigest()


def code_version() -> dict[str, Any]:
    """The repository's commit and whether files differed from it (None where git or a repository is missing)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def edited_declaration_line(declared: dict[str, Any], path: Path) -> str | None:
    """One line where a declaration's keys no longer give the digest written with them; None where
    they do, or where the declaration predates digests (nothing to check it against)."""
    digest = declared.get("digest")
    if not isinstance(digest, str) or declaration_digest(declared) == digest:
        return None
    return (f"warning: the declaration in {path} was changed after it was written (digest {digest[:12]} recorded, "
            f"{declaration_digest(declared)[:12]} now): its rules ({', '.join(map(str, declared.get('rules', []))) or 'none'}) judge nothing here; "
            f"restore the record from its run record (docs/run_records/) to read them.")


def recorded_rows(path: Path) -> dict[str, dict[str, Any]]:
    """The record's rows by run folder (their "folder"), those that hold digests: what check_row compares."""
    runs = read_record(path).get("runs")
    return {row["folder"]: row for row in runs if isinstance(row, dict) and isinstance(row.get("folder"), str) and "metrics_sha256" in row} \
        if isinstance(runs, list) else {}


def last_iteration(out_dir: Path) -> int | None:
    """The iteration of a running job's newest metrics row (None before its first)."""
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError):  # none yet, or not a metrics row
        lines = (out_dir / METRICS_NAME).read_text(encoding="utf-8").strip().splitlines()
        return int(json.loads(lines[-1])["iter"]) if lines else None
    return None


def run_inconsistency(out_dir: Path) -> str | None:
    """A run folder whose two files disagree: metrics.jsonl past the max_iters config.json gives (a
    restored run's config.json swapped for another's)."""
    try:
        config = json.loads((out_dir / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    last, most = last_iteration(out_dir), config.get("max_iters") if isinstance(config, dict) else None
    if isinstance(last, int) and isinstance(most, int) and last > most:
        return f"its metrics.jsonl reaches iter {last}, past the max_iters={most} of its config.json"
    return None


def digest_mismatches(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What of a run's files differs from the digests its record row holds, a phrase each."""
    return [f"its {name} is not the file the record holds (sha256 {recorded[key][:12]} recorded, {(now.get(key) or 'none')[:12]} now)"
            for key, name in zip(DIGEST_KEYS, (CONFIG_NAME, METRICS_NAME)) if recorded.get(key) and recorded[key] != now.get(key)]


def record_mismatch_lines(record: dict[str, Any], folder: Path) -> dict[int, str]:
    """A finished sweep's record read back (--compare): {row index: one line} for each ended run
    whose files in `folder` differ from its row's digests, and {-1: line} where the declaration was
    edited; {} for a record that holds no digests (written before them: nothing to check)."""
    lines = {}
    declared = record.get("declared")
    edited = edited_declaration_line(declared, folder) if isinstance(declared, dict) else None
    if edited:
        lines[-1] = edited
    for i, row in enumerate(record.get("runs") or []):
        if not (isinstance(row, dict) and isinstance(row.get("folder"), str) and row.get("status") in ("ok", *UNSTABLE)):
            continue
        run = folder / row["folder"]
        now = {key: file_digest(run / name) for key, name in zip(DIGEST_KEYS, (CONFIG_NAME, METRICS_NAME))}
        wrong = digest_mismatches(row, now) + [w for w in [run_inconsistency(run)] if w]
        if wrong:
            lines[i] = f"warning: {folder}: {row['folder']}: {'; '.join(wrong)}; left out (restore it from its run record to count it)."
    return lines


RECORD_FIX = ("restore it from its run record (docs/run_records/), or move it aside to start the record anew; a record "
              "that cannot be read is never rewritten")


def read_record(path: Path) -> dict[str, Any]:
    """A sweep's record (OUT_DIR/<name>.json), {} when there is none; one that is not a JSON object
    is a UsageError naming it (it held the declaration: rewriting it would drop the rules)."""
    if not path.is_file():
        return {}
    try:
        return read_json_object(path, UsageError, RECORD_FIX)
    except OSError as e:
        raise UsageError(f"{str(path)!r} cannot be read ({e.strerror or e}); {RECORD_FIX}.") from None


def check_declaration(declared: Any, path: Path) -> None:
    """A record's "declared" is an object whose rules are rule texts; anything else is one line."""
    rules = declared.get("rules", []) if isinstance(declared, dict) else None
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        raise UsageError(f"{str(path)!r} holds a declaration that is not an object with a list of rule texts "
                         f"(\"declared\": {json.dumps(declared)[:80]}); {RECORD_FIX}.")
    try:
        for text in rules:
            parse_rule(text)
    except (ValueError, UsageError) as e:
        raise UsageError(f"{str(path)!r} declares a rule that cannot be read ({e}); {RECORD_FIX}.") from None


# -----------------------------------------------------------------------------
# The declaration: the rules and seeds, written before any run


def declare(sweep: Sweep, place: Place) -> dict[str, Any]:
    """The sweep's declaration: its rules and seeds, written into OUT_DIR/<name>.json before any run
    starts (write_outputs keeps it there), so that a rule cannot be chosen after the results. A
    sweep that declared rules keeps them: no rules given means the declared ones, other rules are a
    UsageError. A dry run writes nothing."""
    path = place.out_dir / f"{sweep.name}.json"
    record = read_record(path)
    given = [r.text for r in sweep.rules]
    old = record.get("declared")
    if old is not None:
        check_declaration(old, path)
        edited = edited_declaration_line(old, path)
        if edited:  # its rules judge nothing: the table is printed, no verdict
            print(edited, flush=True)
            return {**old, "rules": [], "edited": edited}
        if given and given != old.get("rules", []):
            raise UsageError(f"--rule {' '.join(given)} differs from the rule(s) declared in {path} before its runs "
                             f"({' '.join(old.get('rules', [])) or 'none'}); give those, or use another --out_dir.")
        return old
    seeds = Seeds.of(sweep.values("seed")) if any(a.key == "seed" for a in sweep.axes) else None
    declared = {"rules": given, "selection_seed": seeds.selection if seeds else None, "held_out_seeds": list(seeds.held_out) if seeds else [],
                "declared_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs_in_folder": sum(1 for _ in place.out_dir.glob(f"**/{CONFIG_NAME}")),
                "code": code_version()}
    declared["digest"] = declaration_digest(declared)
    if not place.dry_run:
        place.out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**record, "declared": declared}, indent=2) + "\n", encoding="utf-8")
    return declared


def declared_rules(place: Place) -> tuple[Rule, ...]:
    return tuple(parse_rule(text) for text in place.declared.get("rules", []))
