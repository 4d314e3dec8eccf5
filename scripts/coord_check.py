"""Coordinate check of μP: python scripts/coord_check.py [--widths ...] [--connections ...].

The code lives in `spheretnorm.experiments.coordinates`; this file is the command.
"""

import sys

from spheretnorm.experiments.coordinates import main

if __name__ == "__main__":
    sys.exit(main())
