"""Conditioning of h_1 -> h_L per token position: python scripts/jacobian.py --ckpt CKPT [CKPT ...] [--json FILE].

The code lives in `spheretnorm.experiments.conditioning`; this file is the command.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import
import torch

from spheretnorm.experiments.conditioning import main

if __name__ == "__main__":
    torch.set_grad_enabled(True)
    sys.exit(main())
