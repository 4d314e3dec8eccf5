"""Prepare a dataset: python data/prepare.py NAME [--input FILES] (see data/README.md).

The code lives in `spheretnorm.data.preparation`; this file is the command.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import
from spheretnorm.data.preparation import main

if __name__ == "__main__":
    sys.exit(main())
