"""Zero-shot evaluation of a checkpoint: python eval/zero_shot.py --ckpt PATH --tasks paper (see eval/README.md).

The code lives in `spheretnorm.zeroshot.driver`; this file is the command.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import
from spheretnorm.zeroshot.driver import main

if __name__ == "__main__":
    sys.exit(main())
