"""Depth study on a CPU, with the diagnostics: python scripts/depth_study.py [--seeds ...] [--table_only].

The code lives in `spheretnorm.experiments.depth`; this file is the command.
"""

import sys

from spheretnorm.experiments.depth import main

if __name__ == "__main__":
    sys.exit(main())
