"""A checkpoint as a Hugging Face folder or safetensors: python scripts/export_hf.py --ckpt CKPT --out DIR [--format hf|safetensors].

The code lives in `spheretnorm.hf.export_cli`; this file is the command.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import
from spheretnorm.hf.export_cli import main

if __name__ == "__main__":
    main()
