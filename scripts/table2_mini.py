"""The paper's Table 2 in miniature (issue 64): python scripts/table2_mini.py [--dry_run] [--table_only --tables_dir docs].

The code lives in `spheretnorm.experiments.table2_miniature`; this file is the command.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import
from spheretnorm.experiments.table2_miniature import main

if __name__ == "__main__":
    sys.exit(main())
