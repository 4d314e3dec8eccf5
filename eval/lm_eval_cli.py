"""lm-eval's command line with this project's `nanogpt` model: python -m eval.lm_eval_cli run --model nanogpt ...

The code lives in `spheretnorm.zeroshot.lm_eval_entry`; this file is the command.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import
from spheretnorm.zeroshot.lm_eval_entry import main

if __name__ == "__main__":
    sys.exit(main())
