"""μP learning-rate transfer, standard vs μP at two widths: python scripts/mup_transfer.py [--widths ...] [--lrs ...].

The code lives in `spheretnorm.experiments.lr_transfer`; this file is the command.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import
from spheretnorm.experiments.lr_transfer import main

if __name__ == "__main__":
    sys.exit(main())
