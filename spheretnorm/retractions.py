"""
The retractions of the sphere connections, each defined once.

Every sphere update of the paper has one form (docs/CONNECTIONS.md):

    r = ||h||,  z = F(h) - (<h, F(h)> / r^2) h,  s = ||z||,  beta = alpha s / r
    h_out = cos(theta) h + (r sin(theta) / s) z,   theta = phi(beta)

so a retraction is nothing but its angle map phi, its derivative phi' (0 wherever the
angle cap is active) and the cap rule. RETRACTIONS below is the one table of them. The
readable reference update (model.py's SphereConnection), the fused autograd function
(kernels.py) and the Triton kernels (triton_kernels.py) all take phi from here, or, for
Triton, which cannot call Python, are checked against it by tests generated from this
table (tests/test_retractions.py): a new entry without its Triton line fails those tests.

The functions take beta (rows, 1) and p, angle_max as 0-dim tensors, so that one compiled
kernel serves every value. At the cap itself phi' is taken from the uncapped side, as
torch.clamp's gradient does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

Tensor = torch.Tensor
EPS = 1e-12  # the clamp on r^2 and s^2 of every path
AngleFn = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


@dataclass(frozen=True)
class Retraction:
    """One retraction: name, the paper's name, phi and phi' in words, the cap rule, and
    `angle(beta, p, angle_max) -> (cos theta, sin theta, phi'(beta))`."""

    name: str
    title: str
    phi: str
    cap: str
    angle: AngleFn


def _geo(beta: Tensor, p: Tensor, angle_max: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    theta = torch.minimum(beta, angle_max)
    return torch.cos(theta), torch.sin(theta), (beta <= angle_max).to(beta.dtype)


def _proj(beta: Tensor, p: Tensor, angle_max: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    q = torch.rsqrt(1.0 + beta * beta)  # theta = arctan(beta): cos = q, sin = beta q, no trig
    return q, beta * q, q * q


def _cay(beta: Tensor, p: Tensor, angle_max: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    beta_max = 2.0 * torch.tan(angle_max / 2.0)  # 2 arctan(beta_max / 2) = angle_max
    b = torch.minimum(beta, beta_max)
    den = 4.0 + b * b
    dphi = torch.where(beta <= beta_max, 4.0 / (4.0 + beta * beta), torch.zeros_like(beta))
    return (4.0 - b * b) / den, 4.0 * b / den, dphi


def _p(beta: Tensor, p: Tensor, angle_max: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    u = beta / p
    theta = p * torch.atan(u)
    capped = (p > 1.0) & (theta > angle_max)  # for p <= 1, theta < p pi / 2 <= pi / 2 needs no cap
    theta = torch.where(capped, angle_max, theta)
    dphi = torch.where(capped, torch.zeros_like(u), 1.0 / (1.0 + u * u))
    return torch.cos(theta), torch.sin(theta), dphi


RETRACTIONS: dict[str, Retraction] = {
    r.name: r
    for r in (
        Retraction("geo", "exponential map (GeoNorm, Eq. 6)", "min(beta, angle_max)", "always at angle_max", _geo),
        Retraction("proj", "metric projection (1-SpheretNorm, Eq. 9)", "arctan(beta)", "none: theta < pi/2", _proj),
        Retraction(
            "cay", "Cayley map (2-SpheretNorm, Eq. 10)", "2 arctan(beta / 2)",
            "beta at 2 tan(angle_max / 2), so theta <= angle_max", _cay,
        ),
        Retraction("p", "p-SpheretNorm", "p arctan(beta / p)", "theta at angle_max when p > 1", _p),
    )
}


def get_retraction(name: str) -> Retraction:
    """The table's entry, or one sentence naming the valid ones."""
    try:
        return RETRACTIONS[name]
    except KeyError:
        raise ValueError(f"Unknown retraction {name!r}; valid retractions are: {', '.join(RETRACTIONS)}.") from None


def retraction_angle(name: str, beta: Tensor, p: Tensor, angle_max: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """cos(theta), sin(theta) and phi'(beta) of the retraction `name`, per row."""
    return get_retraction(name).angle(beta, p, angle_max)


# How a step-size parameter above its cap learns (GPTConfig.alpha_cap_grad): "stop", the paper's
# clamp, passes it no gradient, so a sublayer whose softplus(a) crosses the cap never comes back;
# "straight_through" keeps the clamp's value and passes the gradient of softplus(a) as if uncapped.
ALPHA_CAP_GRADS = ("stop", "straight_through")


def step_size(a: Tensor, decay: float, cap: float | None = 1.0, cap_grad: str = "stop") -> Tensor:
    """alpha = min(softplus(a), cap) * lambda_l: the sphere step size from its parameter a (the
    paper's cap is 1; cap None leaves softplus(a) uncapped). Above the cap no gradient reaches a
    (cap_grad "stop"), or, with "straight_through", d alpha / d a = sigmoid(a) * lambda_l there too."""
    softplus = torch.nn.functional.softplus(a)
    if cap is None:
        return softplus * decay
    capped = softplus.clamp(max=cap)
    if cap_grad == "straight_through":
        # The value is the clamp's exactly (x - x.detach() is an exact 0); the gradient is softplus's.
        capped = capped.detach() + (softplus - softplus.detach())
    return capped * decay
