"""What a training run leaves in its out_dir, and the ways a run can end.

train.py writes a run folder; the experiment scripts (spheretnorm/runs.py, tables, export)
read it. Both sides take the file names, the exit statuses and the stop reasons from here, so
this module imports nothing of the project's heavy parts (no torch, no model).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spheretnorm.config import TrainConfig

CKPT_NAME = "ckpt.pt"
METRICS_NAME = "metrics.jsonl"
CONFIG_NAME = "config.json"
AVG_WINDOW = 200  # the paper reports the train loss averaged over the last 200 iterations
SPLITS = ("train", "val")


# Exit statuses of train.py, one per way a run can end (README, "Training"). A stopped or
# crashed run also writes a {"kind": "stop", "reason": ...} row to metrics.jsonl.
EXIT_OK = 0  # finished, or stopped by SIGTERM/SIGUSR1 with a checkpoint to resume from
EXIT_CRASH = 1  # an unexpected exception (a bug, out of memory, a lost file): traceback on stderr
EXIT_CONFIG = 2  # a bad config or device, refused before any training
EXIT_COLLAPSE = 3  # representation collapse: final_cosine above collapse_cosine for collapse_evals evaluations
EXIT_NON_FINITE = 4  # the loss or gradient norm became nan/inf


class RunStopped(RuntimeError):
    """The run stopped itself for a reason its stop row and exit status name."""

    reason = ""
    exit_code = EXIT_CRASH


class NonFiniteLossError(RunStopped):
    """The loss (or gradient norm) became nan/inf; the run stops without saving."""

    reason = "non_finite"
    exit_code = EXIT_NON_FINITE

    @classmethod
    def at(cls, what: str, value: float, iteration: int, kept: str) -> NonFiniteLossError:
        """`what` (a loss, a gradient norm) became `value` at `iteration`; `kept` names the checkpoint
        a resume would start from (tracking.Progress.kept_checkpoint_text)."""
        return cls(f"{what} became {value} at iter {iteration}; stopping without saving: {kept}.")


class CollapseError(RunStopped):
    """Every token's final state has become one point; the run stops without saving."""

    reason = "collapse"
    exit_code = EXIT_COLLAPSE


def checkpoint_path(train: TrainConfig) -> Path:
    return Path(train.out_dir) / CKPT_NAME


class MetricsLog:
    """metrics.jsonl: one JSON object per line, flushed at once so a crash loses nothing.

    A resumed run first drops the rows past the checkpoint's iteration (they belong to the
    abandoned tail of the previous attempt), so every iteration appears once, and every stop row
    (the previous attempt's ending, which the resume abandons).
    """

    def __init__(self, path: Path, resume_iter: int | None):
        self.path = path
        kept = self._rows_up_to(resume_iter) if resume_iter is not None else []
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
        os.replace(tmp, path)
        self._file = open(path, "a", encoding="utf-8")

    def _rows_up_to(self, last_iter: int) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        rows = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a crash
                continue
            if row.get("iter", 0) <= last_iter and row.get("kind") != "stop":
                rows.append(row)
        return rows

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
