"""The paper's grid, run, printed or submitted to SLURM: python scripts/launch.py --dry_run ... (--help for all options).

The code lives in `spheretnorm.cluster` (`launcher.py`, the command line); this file is the command.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import
from spheretnorm.cluster.launcher import main

if __name__ == "__main__":
    sys.exit(main())
