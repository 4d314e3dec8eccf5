"""Stability sweep, final val loss against peak LR at two warm-ups: python scripts/lr_sweep.py [--methods ...] [--lrs ...].

The code lives in `spheretnorm.experiments.stability_sweep`; this file is the command.
"""

import sys

from spheretnorm.experiments.stability_sweep import main

if __name__ == "__main__":
    sys.exit(main())
