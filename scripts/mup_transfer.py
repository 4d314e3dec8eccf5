"""μP learning-rate transfer, standard vs μP at two widths: python scripts/mup_transfer.py [--widths ...] [--lrs ...].

The code lives in `spheretnorm.experiments.lr_transfer`; this file is the command.
"""

import sys

from spheretnorm.experiments.lr_transfer import main

if __name__ == "__main__":
    sys.exit(main())
