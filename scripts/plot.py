"""Loss curves and diagnostic heatmaps from run folders: python scripts/plot.py --runs_root out ...

The code lives in `spheretnorm.experiments.figures`; this file is the command.
"""

import sys

from spheretnorm.experiments.figures import main

if __name__ == "__main__":
    sys.exit(main())
