"""The retraction table (spheretnorm/retractions.py) against independent formulas and every backend.

Generated from the table: a new entry is checked here without edits, and fails until it has
(1) an independent closed form of its update below, (2) a connection class that uses it, and
(3) its line in the Triton kernel (triton_kernels._angle). The closed forms are the paper's
own equations (6, 9, 10 and the p-family), written with explicit trigonometry or geometry,
not the table's cos/sin/phi' expressions.
"""

from __future__ import annotations

import math

import pytest
import torch

from spheretnorm import kernels
from spheretnorm.model import CONNECTIONS, GPTConfig, SphereConnection
from spheretnorm.retractions import RETRACTIONS, get_retraction, retraction_angle

# Tiny tensors: one thread each is many times faster on a shared two-core machine (conftest.one_thread),
# which keeps README's install check quick where other work holds the cores.
pytestmark = pytest.mark.usefixtures("one_thread")

ANGLE_MAX = math.pi / 4


def _tangent(h: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return f - (h * f).sum(-1, keepdim=True) / (h * h).sum(-1, keepdim=True) * h


def exp_map(h, f, alpha, p, angle_max):
    """Eq. 6: rotate by theta = min(alpha ||z|| / ||h||, angle_max) along the great circle."""
    z = _tangent(h, f)
    r, s = h.norm(dim=-1, keepdim=True), z.norm(dim=-1, keepdim=True)
    theta = (alpha * s / r).clamp(max=angle_max)
    return torch.cos(theta) * h + torch.sin(theta) * r * z / s


def metric_projection(h, f, alpha, p, angle_max):
    """Eq. 9: step in the tangent space, then project back onto the sphere of radius ||h||."""
    v = h + alpha * _tangent(h, f)
    return h.norm(dim=-1, keepdim=True) * v / v.norm(dim=-1, keepdim=True)


def cayley(h, f, alpha, p, angle_max):
    """Eq. 10 with the step shrunk so that the Cayley angle 2 arctan(b / 2) stays <= angle_max."""
    z = _tangent(h, f)
    r, s = h.norm(dim=-1, keepdim=True), z.norm(dim=-1, keepdim=True)
    g = torch.minimum(torch.full_like(s, alpha), 2 * math.tan(angle_max / 2) * r / s)
    b2 = (g * s / r) ** 2
    return ((4 - b2) * h + 4 * g * z) / (4 + b2)


def p_family(h, f, alpha, p, angle_max):
    """theta = p arctan(beta / p), capped at angle_max for p > 1, by explicit trigonometry."""
    z = _tangent(h, f)
    r, s = h.norm(dim=-1, keepdim=True), z.norm(dim=-1, keepdim=True)
    theta = p * torch.atan(alpha * s / r / p)
    if p > 1:
        theta = theta.clamp(max=angle_max)
    return torch.cos(theta) * h + torch.sin(theta) * r * z / s


CLOSED_FORMS = {"geo": exp_map, "proj": metric_projection, "cay": cayley, "p": p_family}
P_VALUES = {"p": (0.3, 1.0, 3.0)}  # the p-family on both sides of 1; other entries ignore p


def cases() -> list[tuple[str, float]]:
    return [(name, p) for name in RETRACTIONS for p in P_VALUES.get(name, (1.0,))]


def connection_for(name: str) -> str:
    """A registered connection whose update is this retraction (the p-family's for 'p')."""
    users = [k for k, cls in CONNECTIONS.items() if issubclass(cls, SphereConnection) and cls.retraction == name]
    assert users, f"no registered connection uses retraction {name!r}"
    return users[0]


def inputs(seed: int = 0, n: int = 16, d: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=torch.float64) * 2
    f = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.logspace(-2, 1, n, dtype=torch.float64)[:, None]
    return h, f


def reference(name: str, p: float, h: torch.Tensor, f: torch.Tensor, alpha: float, impl: str = "reference"):
    cfg = GPTConfig(n_layer=1, n_head=1, n_embd=h.shape[-1], connection=connection_for(name), spheret_p=p, sphere_impl=impl)
    conn = CONNECTIONS[cfg.connection](cfg, 1, 0).to(h.dtype)
    with torch.no_grad():
        conn.a.fill_(math.log(math.expm1(alpha)))  # softplus(a) = alpha, lambda_1 = 1
    return conn(h, lambda _: f)


def test_every_retraction_has_a_closed_form_here() -> None:
    missing = sorted(set(RETRACTIONS) - set(CLOSED_FORMS))
    assert not missing, f"write the independent formula of {missing} in CLOSED_FORMS"


@pytest.mark.parametrize("name,p", cases())
def test_reference_update_is_the_papers_retraction(name: str, p: float) -> None:
    """model.py's reference update (phi from the table) equals the paper's equation, in float64."""
    h, f = inputs()
    for alpha in (0.3, 0.9):  # the cap inactive for most rows, then active for many
        expected = CLOSED_FORMS[name](h, f, alpha, p, ANGLE_MAX)
        torch.testing.assert_close(reference(name, p, h, f, alpha), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name,p", cases())
def test_phi_prime_is_the_derivative_of_phi(name: str, p: float) -> None:
    """phi' of the table against central differences of theta = atan2(sin, cos), off the cap's kink."""
    beta = torch.linspace(0.01, 3.0, 300, dtype=torch.float64)[:, None]
    p_t, am = torch.tensor(p, dtype=torch.float64), torch.tensor(ANGLE_MAX, dtype=torch.float64)
    eps = 1e-6

    def theta(b: torch.Tensor) -> torch.Tensor:
        cos, sin, _ = retraction_angle(name, b, p_t, am)
        return torch.atan2(sin, cos)

    _, _, dphi = retraction_angle(name, beta, p_t, am)
    numeric = (theta(beta + eps) - theta(beta - eps)) / (2 * eps)
    away_from_kink = (numeric - dphi).abs() < 1e-3  # the one point where the cap switches on
    assert away_from_kink.float().mean() > 0.99
    torch.testing.assert_close(dphi[away_from_kink], numeric[away_from_kink], rtol=1e-6, atol=1e-8)
    # The cap rule: theta never exceeds angle_max where the entry caps at all.
    if name != "proj" and not (name == "p" and p <= 1):
        assert theta(beta).max() <= ANGLE_MAX + 1e-12


def backends() -> list:
    found = ["fused_eager", pytest.param("fused", marks=pytest.mark.compiled_kernels)]
    found.append(pytest.param("triton", marks=pytest.mark.skipif(not kernels.triton_available(), reason="triton is not installed")))
    return found


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("name,p", cases())
def test_every_backend_computes_the_table(name: str, p: float, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward and the gradients of h, F(h) and a, each backend against the reference (fp32)."""
    monkeypatch.setenv("SPHERETNORM_EAGER_KERNELS", "1" if backend == "fused_eager" else "0")
    impl = "fused" if backend.startswith("fused") else backend
    h64, f64 = inputs(seed=1)
    grad = torch.randn(h64.shape, generator=torch.Generator().manual_seed(2))
    results = []
    for which in ("reference", impl):
        h, f = h64.float().requires_grad_(True), f64.float().requires_grad_(True)
        cfg = GPTConfig(n_layer=1, n_head=1, n_embd=h.shape[-1], connection=connection_for(name), spheret_p=p, sphere_impl=which)
        conn = CONNECTIONS[cfg.connection](cfg, 1, 0)
        with torch.no_grad():
            conn.a.fill_(math.log(math.expm1(0.9)))
        out = conn(h, lambda _: f)
        out.backward(grad)
        results.append((out.detach(), h.grad, f.grad, conn.a.grad))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


def test_unknown_retraction_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="Unknown retraction 'slerp'; valid retractions are: geo, proj, cay, p"):
        get_retraction("slerp")
    h, f = inputs()
    with pytest.raises(ValueError, match="Unknown retraction"):
        kernels.sphere_update(h, f, torch.tensor(0.0), 1.0, "slerp")


@pytest.mark.skipif(not kernels.triton_available(), reason="triton is not installed")
def test_triton_refuses_a_retraction_it_has_no_line_for() -> None:
    """No fall-through: a name the kernel does not know stops it, it never computes another map."""
    from spheretnorm import triton_kernels

    h, f = (t.float() for t in inputs())
    p, am = torch.tensor(1.0), torch.tensor(ANGLE_MAX)
    with pytest.raises(Exception, match="no Triton line"):
        triton_kernels.sphere_update_triton(h, f, torch.tensor(0.0), 1.0, "slerp", p, am)
