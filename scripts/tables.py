"""The paper's Tables 2-5 from your runs beside the paper's numbers: python scripts/tables.py --runs_root out ...

The code lives in `spheretnorm.experiments.tabulate`; this file is the command.
"""

import sys

from spheretnorm.experiments.tabulate import main

if __name__ == "__main__":
    sys.exit(main())
