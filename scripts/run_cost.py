"""What a study's run costs here, path by path (eager, compiled; fp32, bf16): python scripts/run_cost.py --help.

The code lives in `spheretnorm.experiments.study_cost`; this file is the command.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import
from spheretnorm.experiments.study_cost import main

if __name__ == "__main__":
    sys.exit(main())
