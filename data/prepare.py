"""Prepare a dataset: python data/prepare.py NAME [--input FILES] (see data/README.md).

The code lives in `spheretnorm.data.prepare`; this file is the command.
"""

import sys

from spheretnorm.data.preparation import main

if __name__ == "__main__":
    sys.exit(main())
