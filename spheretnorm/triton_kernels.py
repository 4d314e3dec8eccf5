"""
Triton kernels of the sphere update (sphere_impl='triton'), for CUDA.

The same maths as kernels.sphere_forward / sphere_backward, one program per row:
a row of h and F(h) is loaded once, reduced in fp32 registers, and written once. The
kernels are registered as torch.library triton_ops, so torch.compile traces through
them without a graph break, and their backward is registered with the op; eager calls
launch them through a plain autograd.Function, which costs less host time per call.

Needs triton (optional dependency) and torch >= 2.6 (torch.library.triton_op). On a CPU
the kernels run under the Triton interpreter (TRITON_INTERPRET=1), which is how the
tests check them on machines without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from spheretnorm.retractions import EPS, step_size

MAX_WIDTH = 65536  # one row must fit one program's registers / shared memory


@triton.jit
def _step_size(A, DECAY, FROM_A: tl.constexpr):
    """alpha = min(softplus(a), 1) * decay (model.py's SphereConnection.step_size) and d alpha / d a.

    With FROM_A false, A holds alpha itself (d alpha / d A = 1): the path under torch.compile,
    where inductor fuses step_size() into its own kernels.

    Computed in every program from the raw parameter a: the step size then costs no kernel
    launches of its own (the eager step_size() is three ops forward and three backward at
    every sublayer). softplus(a) = max(a, 0) + log1p(exp(-|a|)), with log1p(x) = x log(u) / (u - 1),
    u = 1 + x: exact to rounding where log(1 + x) would lose x's digits.
    """
    a = tl.load(A).to(tl.float32)
    if FROM_A:
        x = tl.exp(-tl.abs(a))
        u = 1.0 + x
        log1p_x = tl.where(u == 1.0, x, tl.log(u) * x / (u - 1.0))
        softplus = tl.maximum(a, 0.0) + log1p_x
        alpha = tl.minimum(softplus, 1.0) * DECAY
        dalpha_da = tl.where(softplus <= 1.0, DECAY / (1.0 + tl.exp(-a)), 0.0)  # clamp passes softplus = 1
    else:
        alpha = a
        dalpha_da = a * 0.0 + 1.0
    return alpha, dalpha_da


@triton.jit
def _angle(beta, p, angle_max, KIND: tl.constexpr):
    """cos(theta), sin(theta), phi'(beta) of the retraction named KIND: retractions.py's table,
    line by line (tests/test_retractions.py holds each line to its entry there). A name with no
    line here stops the kernel's compilation with an error, never falls through to another map.
    """
    if KIND == "geo":  # theta = min(beta, angle_max)
        theta = tl.minimum(beta, angle_max)
        cos, sin = tl.cos(theta), tl.sin(theta)
        dphi = tl.where(beta <= angle_max, 1.0, 0.0)
    elif KIND == "proj":  # theta = arctan(beta)
        q = 1.0 / tl.sqrt(1.0 + beta * beta)
        cos, sin, dphi = q, beta * q, q * q
    elif KIND == "cay":  # theta = 2 arctan(b / 2), b = min(beta, 2 tan(angle_max / 2))
        beta_max = 2.0 * tl.sin(angle_max) / (1.0 + tl.cos(angle_max))  # 2 tan(angle_max / 2)
        b = tl.minimum(beta, beta_max)
        den = 4.0 + b * b
        cos, sin = (4.0 - b * b) / den, 4.0 * b / den
        dphi = tl.where(beta <= beta_max, 4.0 / (4.0 + beta * beta), 0.0)
    elif KIND == "p":  # theta = p arctan(beta / p), capped at angle_max for p > 1
        u = beta / p
        theta = p * _atan_nonneg(u)
        capped = (p > 1.0) & (theta > angle_max)
        theta = tl.where(capped, angle_max, theta)
        cos, sin = tl.cos(theta), tl.sin(theta)
        dphi = tl.where(capped, 0.0, 1.0 / (1.0 + u * u))
    else:
        tl.static_assert(False, "this retraction has no Triton line in triton_kernels._angle")
    return cos, sin, dphi


@triton.jit
def _atan_nonneg(u):
    """arctan(u) for u >= 0 in plain arithmetic (libdevice's atan does not run under the
    interpreter). Cephes' reduction: u > tan(3pi/8) -> pi/2 - atan(1/u); u > tan(pi/8) ->
    pi/4 + atan((u-1)/(u+1)); then an odd polynomial on |t| <= tan(pi/8)."""
    big = u > 2.414213562373095
    mid = (u > 0.4142135623730950) & (~big)
    t = tl.where(big, -1.0 / tl.maximum(u, 1e-30), tl.where(mid, (u - 1.0) / (u + 1.0), u))
    base = tl.where(big, 1.5707963267948966, tl.where(mid, 0.7853981633974483, 0.0))
    t2 = t * t
    poly = (((8.05374449538e-2 * t2 - 1.38776856032e-1) * t2 + 1.99777106478e-1) * t2 - 3.33329491539e-1) * t2
    return base + t + t * poly


@triton.jit
def _row_geometry(h, f, alpha, P, AMAX, EPS_: tl.constexpr, KIND: tl.constexpr):
    """One row's <h,h>, r^2, c, z, <z,z>, r, s, beta and cos(theta), sin(theta), phi'(beta).

    The same as kernels._row_geometry, with the angle map of _angle.
    """
    hh = tl.sum(h * h, axis=0)
    r2 = tl.maximum(hh, EPS_)
    c = tl.sum(h * f, axis=0) / r2
    z = f - c * h  # Gram-Schmidt (Eq. 5)
    ss = tl.sum(z * z, axis=0)
    r = tl.sqrt(r2)
    s = tl.sqrt(tl.maximum(ss, EPS_))
    beta = alpha * s / r
    cos, sin, dphi = _angle(beta, tl.load(P).to(tl.float32), tl.load(AMAX).to(tl.float32), KIND)
    return hh, r2, c, z, ss, r, s, beta, cos, sin, dphi


@triton.jit
def _sphere_fwd_kernel(
    H, F, OUT, A, DECAY, P, AMAX, d, stride_h, stride_f, stride_o,
    EPS_: tl.constexpr, KIND: tl.constexpr, FROM_A: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    h = tl.load(H + row * stride_h + cols, mask=mask, other=0.0).to(tl.float32)
    f = tl.load(F + row * stride_f + cols, mask=mask, other=0.0).to(tl.float32)
    alpha, _ = _step_size(A, DECAY, FROM_A)
    _, _, _, z, _, r, s, _, cos, sin, _ = _row_geometry(h, f, alpha, P, AMAX, EPS_, KIND)
    out = cos * h + (r * sin / s) * z
    tl.store(OUT + row * stride_o + cols, out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _sphere_bwd_kernel(
    G, H, F, DH, DF, DA, A, DECAY, P, AMAX, d,
    stride_g, stride_h, stride_f, stride_dh, stride_df,
    EPS_: tl.constexpr, KIND: tl.constexpr, FROM_A: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    g = tl.load(G + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    h = tl.load(H + row * stride_h + cols, mask=mask, other=0.0).to(tl.float32)
    f = tl.load(F + row * stride_f + cols, mask=mask, other=0.0).to(tl.float32)
    # The forward's per-row geometry, recomputed from the row in registers.
    alpha, dalpha_da = _step_size(A, DECAY, FROM_A)
    hh, r2, c, z, ss, r, s, beta, cos, sin, dphi = _row_geometry(h, f, alpha, P, AMAX, EPS_, KIND)
    B = r * sin / s
    gh = tl.sum(g * h, axis=0)
    gz = tl.sum(g * z, axis=0)
    zh = tl.sum(z * h, axis=0)
    # The derivation is in kernels.sphere_backward's docstring.
    dbeta = dphi * (-sin * gh + (r * cos / s) * gz)
    dr = gz * sin / s - dbeta * beta / r
    ds = -gz * B / s + dbeta * alpha / r
    k = tl.where(ss >= EPS_, ds / s, 0.0)
    dc = -(B * gh + k * zh)
    dhf = dc / r2
    dhh = tl.where(hh >= EPS_, dr / (2.0 * r) - dc * c / r2, 0.0)
    df = B * g + k * z + dhf * h
    dh = (cos - c * B) * g - (c * k) * z + dhf * f + (2.0 * dhh) * h
    tl.store(DH + row * stride_dh + cols, dh.to(DH.dtype.element_ty), mask=mask)
    tl.store(DF + row * stride_df + cols, df.to(DF.dtype.element_ty), mask=mask)
    tl.store(DA + row, dbeta * (s / r) * dalpha_da)  # this row's part of d loss / d a


def _launch_settings(d: int) -> tuple[int, int]:
    if d > MAX_WIDTH:
        raise ValueError(f"sphere_impl='triton' supports widths up to {MAX_WIDTH}, got n_embd={d}; use sphere_impl='fused'.")
    block = triton.next_power_of_2(d)
    return block, min(max(block // 256, 1), 16)  # BLOCK, num_warps


def _launch_fwd(h, f, a, decay: float, p, angle_max, kind: str, from_a: bool, wrap=lambda kernel: kernel) -> torch.Tensor:
    """The updated h of (rows, d) inputs with unit stride in d.

    a is the raw step parameter (from_a) or the step size alpha itself (decay unused).

    wrap is torch.library.wrap_triton inside the triton_op (so that torch.compile sees the
    kernel), the identity on the eager path.
    """
    n, d = h.shape
    out = torch.empty_like(h)
    block, warps = _launch_settings(d)
    wrap(_sphere_fwd_kernel)[(n,)](
        h, f, out, a, decay, p, angle_max, d, h.stride(0), f.stride(0), out.stride(0),
        EPS_=EPS, KIND=kind, FROM_A=from_a, BLOCK=block, num_warps=warps,
    )
    return out


def _launch_bwd(grad, h, f, a, decay: float, p, angle_max, kind: str, from_a: bool, wrap=lambda kernel: kernel):
    """Gradients of h, F(h) and a (summed over rows)."""
    n, d = h.shape
    dh, df = torch.empty_like(h), torch.empty_like(f)
    da_rows = torch.empty((n,), dtype=torch.float32, device=h.device)
    block, warps = _launch_settings(d)
    wrap(_sphere_bwd_kernel)[(n,)](
        grad, h, f, dh, df, da_rows, a, decay, p, angle_max, d,
        grad.stride(0), h.stride(0), f.stride(0), dh.stride(0), df.stride(0),
        EPS_=EPS, KIND=kind, FROM_A=from_a, BLOCK=block, num_warps=warps,
    )
    return dh, df, da_rows.sum().to(a.dtype)


# Two ways into the same kernels.
# - Under torch.compile, triton_ops, which the compiler traces through with no graph break.
#   They take the step size alpha, computed by step_size()'s ops, which inductor fuses into
#   its own kernels (FROM_A false).
# - In eager mode, a plain autograd.Function that takes the raw parameter a and lambda_l and
#   computes alpha in the kernels (FROM_A true). A triton_op call passes the dispatcher and
#   two Python re-entries (the op, its registered autograd), and step_size() is six small
#   launches forward and backward. On an H200 host (16 rows, where launches decide), one
#   update's forward + backward took 709 us of host time through the triton_ops plus 277 us
#   for step_size(), against 267 us for Pre-LN's LayerNorm + add; bench.py --profile showed
#   the eager sphere steps of the S model 60% GPU-busy against Pre-LN's 77-82%.


@torch.library.triton_op("spheretnorm::sphere_fwd", mutates_args=())
def sphere_fwd(
    h: torch.Tensor, f: torch.Tensor, alpha: torch.Tensor, p: torch.Tensor, angle_max: torch.Tensor, kind: str
) -> torch.Tensor:
    return _launch_fwd(h, f, alpha, 1.0, p, angle_max, kind, False, torch.library.wrap_triton)


@torch.library.triton_op("spheretnorm::sphere_bwd", mutates_args=())
def sphere_bwd(
    grad: torch.Tensor,
    h: torch.Tensor,
    f: torch.Tensor,
    alpha: torch.Tensor,
    p: torch.Tensor,
    angle_max: torch.Tensor,
    kind: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of h, F(h) and alpha (summed over rows)."""
    return _launch_bwd(grad, h, f, alpha, 1.0, p, angle_max, kind, False, torch.library.wrap_triton)


def _setup_context(ctx, inputs, output) -> None:
    h, f, alpha, p, angle_max, kind = inputs
    ctx.save_for_backward(h, f, alpha, p, angle_max)  # only h and F(h): backward recomputes
    ctx.kind = kind


def _backward(ctx, grad_out):
    h, f, alpha, p, angle_max = ctx.saved_tensors
    dh, df, dalpha = sphere_bwd(grad_out.contiguous(), h, f, alpha, p, angle_max, ctx.kind)
    return dh, df, dalpha, None, None, None


sphere_fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerSphereUpdate(torch.autograd.Function):
    """The eager path: the same kernels, launched directly, with alpha computed from a inside."""

    @staticmethod
    def forward(ctx, h, f, a, decay, p, angle_max, kind):  # type: ignore[override]
        ctx.save_for_backward(h, f, a, p, angle_max)  # only h and F(h): backward recomputes
        ctx.decay, ctx.kind = decay, kind
        return _launch_fwd(h, f, a, decay, p, angle_max, kind, True)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        h, f, a, p, angle_max = ctx.saved_tensors
        dh, df, da = _launch_bwd(grad_out.contiguous(), h, f, a, ctx.decay, p, angle_max, ctx.kind, True)
        return dh, df, da, None, None, None, None


def sphere_update_triton(
    h: torch.Tensor,
    f: torch.Tensor,
    a: torch.Tensor,
    decay: float,
    kind: str,
    p: torch.Tensor,
    angle_max: torch.Tensor,
    cap: float | None = 1.0,
    cap_grad: str = "stop",
) -> torch.Tensor:
    """kernels.sphere_update through the Triton kernels; a is the raw step parameter. The kernels
    compute the step size at the paper's cap 1 and gradient only; another cap or cap_grad passes
    alpha itself."""
    shape = h.shape
    h2 = h.reshape(-1, shape[-1]).contiguous()
    f2 = f.reshape(-1, shape[-1]).contiguous()
    if torch.compiler.is_compiling() or cap != 1.0 or cap_grad != "stop":
        out = sphere_fwd(h2, f2, step_size(a, decay, cap, cap_grad), p, angle_max, kind)
    else:
        out = _EagerSphereUpdate.apply(h2, f2, a, float(decay), p, angle_max, kind)
    return out.view(shape)
