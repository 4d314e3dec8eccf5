"""A logit z-loss in a module of its own, as a user would add a loss idea (PaLM, Chowdhery et al. 2022):
coefficient * mean(logsumexp(logits)^2), on with --imports=zloss_term --fixture_z_loss=1e-4. Named
fixture_z_loss so that a researcher's own z-loss, imported into the same test session (pytest
--imports=my_module), takes the natural name "z_loss" (issue 65, item 5)."""

import torch

from spheretnorm.model import MethodParam
from spheretnorm.runtime.loss_terms import register_loss_term


@register_loss_term("fixture_z_loss", MethodParam("fixture_z_loss", 0.0, "weight of the logit z-loss (0: off)", check=lambda v: v >= 0, must=">= 0"))
def fixture_z_loss(logits: torch.Tensor, targets: torch.Tensor, train) -> torch.Tensor:
    return train.fixture_z_loss * torch.logsumexp(logits.float(), dim=-1).pow(2).mean()
