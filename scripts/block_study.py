"""nGPT and LLaMA's block in the depth study's CPU setting: python scripts/block_study.py [--seeds ...] [--table_only].

The code lives in `spheretnorm.experiments.block_variants`; this file is the command.
"""

import sys

from spheretnorm.experiments.block_variants import main

if __name__ == "__main__":
    sys.exit(main())
