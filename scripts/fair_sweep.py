"""Each method at its own best learning rate in both blocks: python scripts/fair_sweep.py [--table_only].

The code lives in `spheretnorm.experiments.fair_comparison`; this file is the command.
"""

import sys

from spheretnorm.experiments.fair_comparison import main

if __name__ == "__main__":
    sys.exit(main())
