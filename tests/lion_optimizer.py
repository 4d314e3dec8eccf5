"""Lion (Chen et al., 2023), registered from outside the package with a rate key of its own
(fixture_lion_lr): the optimizer a user adds from their own module, as docs/OPTIMIZERS.md shows.
tests/test_optimizer_contract.py trains and resumes it with no other edit anywhere. Registered as
fixture_lion (key fixture_lion_lr), names a user will not pick: a researcher's own Lion, imported into
the same test session (pytest --imports=my_module), registers "lion" beside it (issue 65, item 5)."""

from __future__ import annotations

from typing import Any

import torch

from spheretnorm.model import MethodParam
from spheretnorm.optim import OptimizerRecipe, Optimizers, adamw_groups, register_optimizer, trainable


class Lion(torch.optim.Optimizer):
    """W <- (1 - lr wd) W - lr sign(b1 m + (1 - b1) G);  m <- b2 m + (1 - b2) G."""

    def __init__(self, params: Any, lr: float, betas: tuple[float, float]):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=0.0))

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                m = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(m.lerp(p.grad, 1 - beta1).sign_(), alpha=-group["lr"])
                m.lerp_(p.grad, 1 - beta2)


@register_optimizer("fixture_lion")
class LionRecipe(OptimizerRecipe):
    title = "Lion"
    rate_key = "fixture_lion_lr"
    params = (MethodParam("fixture_lion_lr", 1e-4, "Lion's peak learning rate", check=lambda x: x > 0, must="> 0"),)

    @classmethod
    def build(cls, model: torch.nn.Module, settings: Any, device_type: str) -> Optimizers:
        groups = adamw_groups(model, trainable(model), settings.weight_decay, settings.fixture_lion_lr)  # at the rate it means
        return Optimizers([Lion(groups, lr=settings.fixture_lion_lr, betas=(settings.beta1, settings.beta2))])
