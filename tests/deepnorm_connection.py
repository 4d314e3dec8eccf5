"""A DeepNorm-like deep connection in a file of its own, as a user would write one.

h = LN(alpha * h + gain * F(h)) (DeepNet, Wang et al. 2022, without its init scaling), with
alpha = (2L) ** DEEPNORM_EXPONENT: a module-level constant read through a module-level function,
the kind of name an export that copied only the class would leave behind. It imports only
torch, math and spheretnorm.model (in two of the forms an export rewrites). Importing it
registers nothing: tests/test_export_own_module.py registers the class and removes it again,
so the registry-driven tests of other files never see it.
"""

from __future__ import annotations

import math

import torch

import spheretnorm.model as core
from spheretnorm.model import Connection, MethodParam

DEEPNORM_EXPONENT = 0.25  # DeepNet's alpha = (2N)^(1/4) for a decoder of N layers


def deepnorm_alpha(n_layer: int) -> float:
    """DeepNet's residual scale: (2 n_layer) ** DEEPNORM_EXPONENT."""
    return math.pow(2 * n_layer, DEEPNORM_EXPONENT)


class DeepNorm(Connection):
    """h = LN(alpha * h + gain * F(h)), alpha = deepnorm_alpha(n_layer), gain a method parameter."""

    title = "DeepNorm x{branch_gain:g}"
    params = (MethodParam("branch_gain", 1.0, "the fixed gain of the sublayer's output"),)

    def __init__(self, config, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.alpha = deepnorm_alpha(config.n_layer)
        self.gain = config.branch_gain
        self.ln = core.block_norm(config)

    def forward(self, h: torch.Tensor, sublayer) -> torch.Tensor:
        return self.ln(self.alpha * h + self.gain * sublayer(h))
