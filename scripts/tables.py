"""The paper's Tables 2-5 from your runs beside the paper's numbers: python scripts/tables.py --runs_root out ...

The code lives in `spheretnorm.experiments.tabulate`; this file is the command.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import
from spheretnorm.experiments.tabulate import main

if __name__ == "__main__":
    sys.exit(main())
