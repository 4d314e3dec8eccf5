"""A logit z-loss in a module of its own, as a user would add a loss idea (PaLM, Chowdhery et al. 2022):
coefficient * mean(logsumexp(logits)^2), on with --imports=zloss_term --z_loss=1e-4."""

import torch

from spheretnorm.model import MethodParam
from spheretnorm.runtime.loss_terms import register_loss_term


@register_loss_term("z_loss", MethodParam("z_loss", 0.0, "weight of the logit z-loss (0: off)", check=lambda v: v >= 0, must=">= 0"))
def z_loss(logits: torch.Tensor, targets: torch.Tensor, train) -> torch.Tensor:
    return train.z_loss * torch.logsumexp(logits.float(), dim=-1).pow(2).mean()
