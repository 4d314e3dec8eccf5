"""Conditioning of h_1 -> h_L per token position: python scripts/jacobian.py --ckpt CKPT [CKPT ...] [--json FILE].

The code lives in `spheretnorm.experiments.conditioning`; this file is the command.
"""

import sys

import torch

from spheretnorm.experiments.conditioning import main

if __name__ == "__main__":
    torch.set_grad_enabled(True)
    sys.exit(main())
