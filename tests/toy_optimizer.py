"""A third optimizer, registered from outside the package: SGD with heavy-ball momentum, with one
key of its own (toy_momentum). tests/test_optimizers.py and tests/fsdp_worker.py import it and
train, resume, shard and tabulate it with no other edit anywhere."""

from __future__ import annotations

import torch

from spheretnorm.model import MethodParam
from spheretnorm.optim import OptimizerRecipe, Optimizers, adamw_groups, register_optimizer, trainable

NAME = "toy_sgd"


@register_optimizer(NAME)
class ToySGD(OptimizerRecipe):
    title = "SGD"
    params = (MethodParam("toy_momentum", 0.9, "the toy SGD's momentum", check=lambda m: 0 <= m < 1, must="in [0, 1)"),)

    @classmethod
    def build(cls, model: torch.nn.Module, settings, device_type: str) -> Optimizers:
        # The paper's groups (decay on matrices, μP's factors), SGD's step.
        groups = adamw_groups(model, trainable(model), settings.weight_decay, settings.learning_rate)
        return Optimizers([torch.optim.SGD(groups, lr=settings.learning_rate, momentum=settings.toy_momentum)])
