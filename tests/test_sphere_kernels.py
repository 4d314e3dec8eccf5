"""The fused sphere updates (kernels.py, triton_kernels.py) against model.py's reference.

Every implementation must give the reference's outputs and gradients (of h, F(h) and the
step parameter a) for every sphere connection, in fp32 and under bf16 autocast, in the
corner cases of the maths: the angle cap active and inactive, p < 1, p = 1, p = 2, p > 2,
F(h) parallel to h (z = 0), F(h) = 0 and a tiny tangent part. The hand-derived backward
is also checked by finite differences (gradcheck, float64).
"""

import math

import pytest
import torch

from spheretnorm.optim import build_optimizer
from spheretnorm.runtime.config import TrainConfig
from spheretnorm.runtime.checkpoint import checkpoint_state
from spheretnorm.runtime.checkpoint import load_model
from spheretnorm import kernels  # conftest.py sets TRITON_INTERPRET=1 where there is no CUDA
from spheretnorm.model import CONNECTIONS, GPT, GPTConfig
from spheretnorm.retractions import RETRACTIONS, retraction_angle

# (connection, spheret_p): all four retractions, and the p-family on both sides of 1 and 2.
SPHERE_CASES = [
    ("geonorm", 0.5),
    ("proj_spheret", 0.5),
    ("cay_spheret", 0.5),
    ("p_spheret", 0.3),
    ("p_spheret", 1.0),
    ("p_spheret", 2.0),
    ("p_spheret", 3.5),
]
INPUT_CASES = ["mixed", "small", "capped", "parallel", "zero", "tiny_z"]
# Where CUDA is present (scripts/gpu_check.sh), the updates and models run on the GPU: the
# Triton kernels compiled for real, the fused update compiled by inductor for CUDA.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

needs_triton = pytest.mark.skipif(
    not kernels.triton_available(), reason="triton (and torch >= 2.6) is not installed"
)
# fused: the kernels that torch.compile (inductor) makes of the maths, C++ on a CPU and
# Triton on a GPU; fused_eager: the same autograd.Function with its maths in eager ops.
IMPLS = [
    pytest.param("fused", marks=pytest.mark.compiled_kernels),
    "fused_eager",
    pytest.param("triton", marks=needs_triton),
]


def make_inputs(case: str, n: int = 24, d: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """h on the sphere of radius sqrt(d) and a sublayer output F(h) of the given kind."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g)
    h = h / h.norm(dim=-1, keepdim=True) * math.sqrt(d)
    noise = torch.randn(n, d, generator=g)
    row_scale = torch.rand(n, 1, generator=g) + 0.5
    if case == "mixed":  # tangent sizes from far below to far above the cap, row by row
        f = noise * torch.logspace(-2, 1.5, n).unsqueeze(-1)
    elif case == "small":  # beta << angle_max: the cap never acts
        f = 0.05 * noise
    elif case == "capped":  # beta >> angle_max: the cap acts on every row
        f = 30.0 * noise
    elif case == "parallel":  # F(h) = c h: z = 0, the update must be the identity
        f = row_scale * h
    elif case == "zero":
        f = torch.zeros(n, d)
    elif case == "tiny_z":  # F(h) nearly parallel to h: ||z|| ~ 1e-3 ||F(h)||
        f = 3.0 * h + 1e-2 * noise
    else:
        raise ValueError(case)
    return h, f


def build_connection(name: str, p: float, impl: str, softplus_a: float = 0.8, layer: int = 1, alpha_cap: float | None = 1.0,
                     alpha_cap_grad: str = "stop") -> torch.nn.Module:
    cfg = GPTConfig(n_layer=max(2, layer), n_head=2, n_embd=32, block_size=8, vocab_size=64, connection=name, spheret_p=p,
                    sphere_impl=impl, alpha_cap=alpha_cap, alpha_cap_grad=alpha_cap_grad)
    conn = CONNECTIONS[name](cfg, layer, slot=0)  # layer 1: lambda = 1, the largest step
    with torch.no_grad():
        conn.a.fill_(math.log(math.expm1(softplus_a)))  # default 0.8: off the clamp at 1
    return conn


def run_update(conn, h, f, grad, autocast: bool):
    """out, dh, dF, da of one update with F(h) fixed to f."""
    device = "cpu" if h.dtype == torch.float64 else DEVICE  # float64 truth stays on the CPU
    conn = conn.to(device)
    h = h.detach().to(device, copy=True).requires_grad_(True)
    f = f.detach().to(device, copy=True).requires_grad_(True)
    grad = grad.to(device)
    conn.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        out = conn(h, lambda _: f)
    out.backward(grad)
    return out.detach().cpu(), h.grad.cpu(), f.grad.cpu(), conn.a.grad.cpu()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest elementwise difference relative to the largest entry of b (0 when both are 0)."""
    scale = b.abs().max().item()
    diff = (a.float() - b.float()).abs().max().item()
    return diff / scale if scale > 0 else diff


def condition_of_s(h: torch.Tensor, f: torch.Tensor) -> float:
    """max over rows of ||F(h)|| / ||z||, over rows whose z is not zero to rounding."""
    h, f = h.double(), f.double()
    z = f - (h * f).sum(-1, keepdim=True) / (h * h).sum(-1, keepdim=True) * h
    ratio = f.norm(dim=-1) / z.norm(dim=-1).clamp_min(1e-300)
    ratio = ratio[z.norm(dim=-1) > 1e-6 * f.norm(dim=-1)]
    return max(ratio.max().item(), 1.0) if ratio.numel() else 1.0


def compare_to_reference(name, p, impl, case, autocast, monkeypatch, **conn_kw):
    if impl == "fused_eager":
        monkeypatch.setenv("SPHERETNORM_EAGER_KERNELS", "1")
        impl = "fused"
    h, f = make_inputs(case)
    if autocast:  # a Linear under bf16 autocast hands the connection a bf16 F(h)
        f = f.bfloat16()
    grad = torch.randn(h.shape, generator=torch.Generator().manual_seed(7))
    ref = run_update(build_connection(name, p, "reference", **conn_kw), h, f, grad, autocast)
    got = run_update(build_connection(name, p, impl, **conn_kw), h, f, grad, autocast)
    out, dh, df, da = got
    assert out.dtype == ref[0].dtype and df.dtype == ref[2].dtype
    assert torch.isfinite(out).all() and torch.isfinite(dh).all() and torch.isfinite(df).all()
    assert rel_err(out, ref[0]) < 1e-6, "output"
    assert rel_err(dh, ref[1]) < 1e-5, "grad of h"
    if df.dtype == torch.bfloat16:
        # Both round the same fp32 gradient to bf16; an fp32 difference of 1e-7 may flip the
        # last bit of a few entries, so allow one bf16 unit in the last place.
        torch.testing.assert_close(df.float(), ref[2].float(), rtol=2**-7, atol=1e-6)
    else:
        assert rel_err(df, ref[2]) < 1e-5, "grad of F(h)"
    if case in ("parallel", "zero") and not autocast:  # (a bf16 F(h) is not parallel to h)
        # z = 0 up to rounding: da is a sum of rounding noise; it only has to stay tiny.
        assert abs(da.item()) < 1e-5 and abs(ref[3].item()) < 1e-5
        return ref, got
    # da sums one term per row, each through s = ||F(h) - c h||: when z is tiny, fp32 rounding
    # of s is amplified by kappa = ||F(h)|| / ||z|| (~300 in 'tiny_z'), in the reference as
    # much as here. So da is compared with the float64 reference, within 1e-5 plus that
    # amplified rounding.
    truth = run_update(build_connection(name, p, "reference", **conn_kw).double(), h.double(), f.double(), grad.double(), False)[3]
    tol = (1e-5 + 4 * condition_of_s(h, f) * 2**-23) * abs(truth.item()) + 1e-12
    assert abs(da.item() - truth.item()) <= tol, "grad of a"
    return ref, got


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name,p", SPHERE_CASES)
@pytest.mark.parametrize("case", INPUT_CASES)
def test_impl_matches_reference_fp32(impl, name, p, case, monkeypatch):
    ref, _ = compare_to_reference(name, p, impl, case, False, monkeypatch)
    if case in ("parallel", "zero"):  # z = 0: the output is h itself
        h, _ = make_inputs(case)
        torch.testing.assert_close(ref[0], h, rtol=0, atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name,p", SPHERE_CASES)
@pytest.mark.parametrize("case", ["mixed", "parallel", "tiny_z"])
def test_impl_matches_reference_bf16_autocast(impl, name, p, case, monkeypatch):
    compare_to_reference(name, p, impl, case, True, monkeypatch)


@needs_triton
@pytest.mark.parametrize("kind", RETRACTIONS)
@pytest.mark.parametrize("softplus_a", [0.6, 1.3])  # step size off and on its clamp at 1
def test_triton_op_and_eager_function_agree(kind, softplus_a):
    """torch.compile's path (triton_ops given alpha = step_size(a)) and the eager path (an
    autograd.Function that computes alpha from a inside the kernels) give the same update."""
    from spheretnorm import triton_kernels

    h, f = make_inputs("mixed")
    grad = torch.randn(h.shape, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    p, am = torch.tensor(0.7, device=DEVICE), torch.tensor(math.pi / 4, device=DEVICE)
    code, decay = kind, 0.5
    paths = {
        "triton_op": lambda hh, ff, a: triton_kernels.sphere_fwd(hh, ff, kernels.step_size(a, decay), p, am, code),
        "eager": lambda hh, ff, a: triton_kernels._EagerSphereUpdate.apply(hh, ff, a, decay, p, am, code),
    }
    results = []
    for path in paths.values():
        hh, ff = h.to(DEVICE).requires_grad_(True), f.to(DEVICE).requires_grad_(True)
        a = torch.tensor(math.log(math.expm1(softplus_a)), device=DEVICE, requires_grad=True)
        out = path(hh, ff, a)
        out.backward(grad)
        results.append([out.detach(), hh.grad, ff.grad, a.grad])
    for x, y in zip(*results):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
    assert (results[1][3].item() == 0) is (softplus_a > 1)  # the clamp stops the gradient of a


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("softplus_a,layer", [(1.5, 1), (1.0, 2), (0.004, 3), (0.8, 5)])
def test_step_parameter_regimes_match_reference(impl, softplus_a, layer, monkeypatch):
    """The step size from a: clamped (softplus(a) > 1: no gradient to a), at the clamp's edge
    (torch passes the gradient there), far below it (a about -5.5), and deeper layers' decay."""
    ref, got = compare_to_reference("p_spheret", 0.5, impl, "mixed", False, monkeypatch, softplus_a=softplus_a, layer=layer)
    if softplus_a > 1:
        assert ref[3].item() == 0 and got[3].item() == 0
    else:
        assert ref[3].item() != 0


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("alpha_cap,softplus_a", [(None, 1.5), (None, 0.3), (2.0, 1.5), (0.5, 0.8)])
def test_other_caps_match_reference_on_every_path(impl, alpha_cap, softplus_a, monkeypatch):
    """alpha_cap other than the paper's 1 (the Triton kernels then take alpha itself): the same
    update and gradients as the reference, and a gradient of a exactly where softplus(a) < cap."""
    ref, got = compare_to_reference("p_spheret", 0.5, impl, "mixed", False, monkeypatch, softplus_a=softplus_a, alpha_cap=alpha_cap)
    capped = alpha_cap is not None and softplus_a > alpha_cap
    assert (ref[3].item() == 0) is capped and (got[3].item() == 0) is capped


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("softplus_a", [1.5, 0.8])
def test_a_straight_through_cap_matches_reference_on_every_path(impl, softplus_a, monkeypatch):
    """alpha_cap_grad=straight_through (the Triton kernels then take alpha itself): the reference's
    update and gradients, and a gradient of a above the cap as below it."""
    ref, got = compare_to_reference("p_spheret", 0.5, impl, "mixed", False, monkeypatch, softplus_a=softplus_a, alpha_cap_grad="straight_through")
    assert ref[3].item() != 0 and got[3].item() != 0


def test_cases_exercise_the_cap():
    """The inputs do what their names say: 'capped' rows all hit angle_max, 'small' none."""
    for case, expect in (("capped", True), ("small", False)):
        h, f = make_inputs(case)
        z = f - (h * f).sum(-1, keepdim=True) / (h * h).sum(-1, keepdim=True) * h
        beta = 0.8 * z.norm(dim=-1) / h.norm(dim=-1)
        assert bool((beta > math.pi / 4).all()) is expect
    h, f = make_inputs("mixed")
    z = f - (h * f).sum(-1, keepdim=True) / (h * h).sum(-1, keepdim=True) * h
    beta = 0.8 * z.norm(dim=-1) / h.norm(dim=-1)
    assert (beta > math.pi / 4).any() and (beta < math.pi / 4).any()


# -----------------------------------------------------------------------------
# The hand-derived backward against finite differences


@pytest.mark.parametrize("kind", RETRACTIONS)
@pytest.mark.parametrize("p", [0.4, 1.0, 2.0, 3.0])
@pytest.mark.parametrize("f_scale", [0.1, 3.0])  # cap inactive / active (for capped kinds)
def test_gradcheck_float64(kind, p, f_scale):
    g = torch.Generator().manual_seed(3)
    h = torch.randn(5, 7, generator=g, dtype=torch.float64).requires_grad_(True)
    f = (f_scale * torch.randn(5, 7, generator=g, dtype=torch.float64)).requires_grad_(True)
    alpha = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    p_t = torch.tensor(p, dtype=torch.float64)
    am_t = torch.tensor(math.pi / 4, dtype=torch.float64)

    def update(h, f, alpha):
        return kernels.SphereUpdate.apply(h, f, alpha, p_t, am_t, kind)

    assert torch.autograd.gradcheck(update, (h, f, alpha), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_scale_to_radius_value_and_gradcheck():
    """The embedding ScaleNorm's hand backward: value rho x / ||x||, and finite differences."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 5, 6, generator=g, dtype=torch.float64).requires_grad_(True)
    rho = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    out = kernels.scale_to_radius(x, rho)
    torch.testing.assert_close(out, rho * x / x.norm(dim=-1, keepdim=True))
    assert torch.autograd.gradcheck(kernels.scale_to_radius, (x, rho))


def test_retraction_angle_matches_each_phi():
    """cos, sin and phi' of every retraction against the formulas with explicit trig."""
    beta = torch.linspace(0.0, 4.0, 41, dtype=torch.float64)
    am = torch.tensor(math.pi / 4, dtype=torch.float64)
    bmax = 2 * math.tan(math.pi / 8)
    expected = {
        ("geo", 1.0): (beta.clamp(max=math.pi / 4), (beta <= math.pi / 4).double()),
        ("proj", 1.0): (torch.atan(beta), 1 / (1 + beta**2)),
        ("cay", 1.0): (2 * torch.atan(beta.clamp(max=bmax) / 2), torch.where(beta <= bmax, 1 / (1 + beta**2 / 4), 0.0)),
        ("p", 0.5): (0.5 * torch.atan(beta / 0.5), 1 / (1 + (beta / 0.5) ** 2)),
    }
    theta3 = 3 * torch.atan(beta / 3)
    expected[("p", 3.0)] = (theta3.clamp(max=math.pi / 4), torch.where(theta3 <= math.pi / 4, 1 / (1 + (beta / 3) ** 2), 0.0))
    for (kind, p), (theta, dphi) in expected.items():
        cos, sin, d = retraction_angle(kind, beta, torch.tensor(p, dtype=torch.float64), am)
        torch.testing.assert_close(cos, torch.cos(theta))
        torch.testing.assert_close(sin, torch.sin(theta))
        torch.testing.assert_close(d, dphi)


# -----------------------------------------------------------------------------
# Whole models


def tiny_model(name: str, impl: str, **kw) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, connection=name, sphere_impl=impl, **kw)
    return GPT(cfg).to(DEVICE)


# Under TRITON_INTERPRET=1 a kernel is a Python function that torch.compile cannot trace.
triton_compiled = pytest.param(
    "triton",
    marks=[needs_triton, pytest.mark.skipif(not torch.cuda.is_available(), reason="compiling Triton kernels needs CUDA")],
)


@pytest.mark.parametrize("impl", ["reference", "fused", triton_compiled])
@pytest.mark.parametrize("name", ["geonorm", "p_spheret"])
def test_compiled_model_has_no_graph_break_and_same_loss(impl, name):
    """fullgraph=True fails on any graph break; aot_eager traces forward and backward."""
    torch._dynamo.reset()
    x = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    eager = tiny_model(name, impl)
    _, loss_eager = eager(x, x)
    loss_eager.backward()
    compiled_model = tiny_model(name, impl)
    compiled = torch.compile(compiled_model, backend="aot_eager", fullgraph=True)
    _, loss_compiled = compiled(x, x)
    loss_compiled.backward()
    assert abs(loss_compiled.item() - loss_eager.item()) < 1e-5
    a_eager = eager.transformer.h[1].conn_mlp.a.grad
    a_compiled = compiled_model.transformer.h[1].conn_mlp.a.grad
    assert abs(a_eager.item() - a_compiled.item()) <= 1e-5 * abs(a_eager.item()) + 1e-9


@pytest.mark.compiled_kernels
def test_inductor_compiled_model_same_loss():
    """The whole model compiled by inductor with the fused update traced inline."""
    torch._dynamo.reset()
    x = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    _, ref = tiny_model("p_spheret", "reference")(x, x)
    _, got = torch.compile(tiny_model("p_spheret", "fused"), fullgraph=True)(x, x)
    assert abs(got.item() - ref.item()) < 1e-5


def train_losses(name: str, impl: str, steps: int = 20) -> list[float]:
    model = tiny_model(name, impl)
    opt = build_optimizer(model, TrainConfig(weight_decay=0.1, learning_rate=3e-3, min_lr=0.0, beta1=0.9, beta2=0.95), DEVICE)
    g = torch.Generator().manual_seed(5)
    losses = []
    for _ in range(steps):
        # Counting sequences (each token + 1 mod 64): learnable, so the loss falls.
        x = ((torch.randint(64, (4, 1), generator=g) + torch.arange(17)) % 64).to(DEVICE)
        _, loss = model(x[:, :-1].contiguous(), x[:, 1:].contiguous())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.compiled_kernels
@pytest.mark.parametrize("name", ["proj_spheret", "cay_spheret", "p_spheret"])
def test_training_reference_and_fused_give_same_losses(name):
    ref, fused = train_losses(name, "reference"), train_losses(name, "fused")
    assert ref[-1] < ref[0]  # the run trains, so the comparison means something
    assert max(abs(a - b) for a, b in zip(ref, fused)) < 1e-4


def test_fused_saves_what_pre_ln_saves():
    """Autograd keeps h and F(h) per update, not the ~20 intermediates of the reference.

    In fp32 a Pre-LN sublayer keeps h and LN(h) (and two numbers per row), a fused sphere
    update h and F(h): the sphere model keeps no more than Pre-LN.
    """
    from bench import saved_activation_bytes

    x = torch.randint(64, (4, 16), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    ref = saved_activation_bytes(tiny_model("p_spheret", "reference"), x)
    fused = saved_activation_bytes(tiny_model("p_spheret", "fused"), x)
    pre_ln = saved_activation_bytes(tiny_model("pre_ln", "auto"), x)
    one_stream_tensor = x.numel() * 32 * 4  # (B, T, d) in fp32
    assert fused < ref - 4 * one_stream_tensor  # the reference keeps more than one more per update (4 updates)
    assert fused <= pre_ln


def test_fused_update_trains_after_an_inference_mode_pass():
    """Constants cached during an evaluation under inference_mode must not break training."""
    model = tiny_model("p_spheret", "fused", spheret_p=0.4321)  # a p no other test has cached
    x = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(6)).to(DEVICE)
    with torch.inference_mode():
        model(x, x)
    _, loss = model(x, x)
    loss.backward()
    assert model.transformer.h[0].conn_attn.a.grad is not None


def test_impl_choice_and_errors():
    assert kernels.resolve_impl("auto", "cpu") == "fused"
    assert kernels.resolve_impl("reference", "cuda") == "reference"
    with pytest.raises(ValueError, match="Unknown sphere_impl 'fast'; valid values are: auto, reference, fused, triton"):
        GPTConfig(sphere_impl="fast")
    with pytest.raises(ValueError, match="Unknown retraction 'exp'"):
        kernels.sphere_update(torch.ones(2, 4), torch.ones(2, 4), torch.tensor(1.0), 1.0, "exp")


def test_the_recorded_kernel_path_follows_the_impl_the_device_and_the_variable(monkeypatch):
    """config.json's sphere_kernels: which of the paths (equal up to rounding) computed a run."""
    monkeypatch.delenv("SPHERETNORM_EAGER_KERNELS", raising=False)
    assert kernels.sphere_kernel_path("auto", "cpu") == "fused_compiled"
    assert kernels.sphere_kernel_path("fused", "cpu", model_compiled=True) == "fused_in_model_compile"
    assert kernels.sphere_kernel_path("reference", "cuda", model_compiled=True) == "reference"
    assert kernels.sphere_kernel_path("triton", "cpu") == "triton_interpreted"
    assert kernels.sphere_kernel_path("triton", "cuda") == "triton"
    monkeypatch.setenv("SPHERETNORM_EAGER_KERNELS", "1")
    assert kernels.sphere_kernel_path("fused", "cpu") == "fused_eager"
    monkeypatch.setenv("SPHERETNORM_EAGER_KERNELS", "0")  # the variable's "off" spelling
    assert kernels.sphere_kernel_path("fused", "cpu") == "fused_compiled"


def test_impl_is_not_saved_as_part_of_the_maths(tmp_path):
    """A checkpoint trained with one impl loads with another and gives the same logits."""
    model = tiny_model("cay_spheret", "reference").eval()
    state = checkpoint_state(model)
    state["model_config"]["sphere_impl"] = "fused"
    other = load_model(state).to(DEVICE).eval()
    x = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(4)).to(DEVICE)
    torch.testing.assert_close(other(x)[0], model(x)[0], rtol=1e-5, atol=1e-5)


# -----------------------------------------------------------------------------
# What compiles, and how often


def spy_on_compiles(monkeypatch) -> list[str]:
    """Record which kernels kernels.py asks torch.compile for (they run eagerly instead, at no cost)."""
    asked: list[str] = []

    def fake_compiled(fn):
        asked.append(fn.__name__)
        return fn

    monkeypatch.delenv("SPHERETNORM_EAGER_KERNELS", raising=False)
    monkeypatch.setattr(kernels, "_compiled", fake_compiled)
    monkeypatch.setattr(kernels, "_built", set(), raising=False)  # nothing built yet in this process
    monkeypatch.setattr(kernels, "_announced", set())
    return asked


@pytest.mark.compiled_kernels
def test_auto_on_a_cpu_compiles_for_training_only(monkeypatch, capsys):
    """sphere_impl='auto' on a CPU: a forward-only pass (sampling, the evaluation at iter 0)
    runs the eager maths and compiles nothing; a training step compiles both kernels, which
    later forward-only passes then use. An explicit 'fused' compiles at once."""
    asked = spy_on_compiles(monkeypatch)
    x = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(9))
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, connection="p_spheret", sphere_impl="auto"))
    with torch.no_grad():
        model.generate(x[:, :3], 4)
        model(x, x)
    assert asked == []
    assert capsys.readouterr().err == ""  # no "compiling ..." line either
    _, loss = model(x, x)
    loss.backward()
    assert sorted(set(asked)) == ["sphere_backward", "sphere_forward"]
    asked.clear()
    with torch.no_grad():
        model(x, x)
    assert set(asked) == {"sphere_forward"}  # the kernel training built
    monkeypatch.setattr(kernels, "_built", set())
    fused = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, connection="p_spheret", sphere_impl="fused"))
    asked.clear()
    with torch.no_grad():
        fused(x, x)
    assert set(asked) == {"sphere_forward"}


@pytest.mark.compiled_kernels
def test_sampling_compiles_the_fused_forward_once(monkeypatch):
    """The inputs of the sublayers' updates are views of differently shaped tensors (the
    embedding's (B, T, d), an earlier update's (B*T, d)); growing prompts change B*T. One
    kernel serves them all: no recompile per sublayer or per token."""
    monkeypatch.delenv("SPHERETNORM_EAGER_KERNELS", raising=False)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = tiny_model("geonorm", "fused").eval()
    with torch.no_grad():
        model.generate(torch.zeros((3, 1), dtype=torch.long, device=DEVICE), 5)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
