"""A sharded checkpoint (train.py --parallel=fsdp) as one ckpt.pt: python scripts/consolidate.py out/RUN/ckpt.dcp [--out out/RUN/ckpt.pt].

The code lives in `spheretnorm.runtime.checkpoint.consolidation`; this file is the command.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import
from spheretnorm.runtime.checkpoint.consolidation import main

if __name__ == "__main__":
    main()
