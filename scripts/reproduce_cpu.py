"""The whole pipeline on a CPU, runs then tables and figure: python scripts/reproduce_cpu.py [--methods ...].

The code lives in `spheretnorm.experiments.cpu_pipeline`; this file is the command.
"""

import sys

from spheretnorm.experiments.cpu_pipeline import main

if __name__ == "__main__":
    sys.exit(main())
