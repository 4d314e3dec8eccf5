"""Stability sweep, final val loss against peak LR at two warm-ups: python scripts/lr_sweep.py [--methods ...] [--lrs ...].

The code lives in `spheretnorm.experiments.stability_sweep`; this file is the command.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import
from spheretnorm.experiments.stability_sweep import main

if __name__ == "__main__":
    sys.exit(main())
