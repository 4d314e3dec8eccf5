"""nGPT and LLaMA's block in the depth study's CPU setting: python scripts/block_study.py [--seeds ...] [--table_only].

The code lives in `spheretnorm.experiments.block_variants`; this file is the command.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import
from spheretnorm.experiments.block_variants import main

if __name__ == "__main__":
    sys.exit(main())
