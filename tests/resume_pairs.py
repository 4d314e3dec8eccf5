"""A contract test's pair of run folders, made once per registered name: one trained 2 steps, and a
copy of it resumed for a 3rd step unchanged (the optimizer and the loss-term contracts use it)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import pytest


def resumed_pairs(run: Callable[..., Any], data_dir: Path, factory: pytest.TempPathFactory,
                  args_of: Callable[[str], tuple[str, ...]]) -> Callable[[str], tuple[Path, Path]]:
    """name -> (the 2-step folder, its copy resumed to 3 steps), each made at its first call;
    run(data_dir, out, *args) trains, args_of(name) are the name's train.py arguments."""
    made: dict[str, tuple[Path, Path]] = {}

    def folders(name: str) -> tuple[Path, Path]:
        if name not in made:
            root = factory.mktemp(f"two_steps_{name}")
            run(data_dir, root / "2", *args_of(name), "--max_iters=2")
            shutil.copytree(root / "2", root / "3")
            run(data_dir, root / "3", *args_of(name), "--max_iters=3", "--init_from=resume")
            made[name] = (root / "2", root / "3")
        return made[name]

    return folders
