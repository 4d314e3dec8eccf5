"""The paper's grid, run, printed or submitted to SLURM: python scripts/launch.py --dry_run ... (--help for all options).

The code lives in `spheretnorm.experiments.launcher`; this file is the command.
"""

import sys

from spheretnorm.experiments.launcher import main

if __name__ == "__main__":
    sys.exit(main())
