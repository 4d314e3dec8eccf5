"""
Triton kernels of the sphere update (sphere_impl='triton'), for CUDA.

The same maths as sphere_kernels.sphere_forward / sphere_backward, one program per row:
a row of h and F(h) is loaded once, reduced in fp32 registers, and written once. The
kernels are registered as torch.library triton_ops, so torch.compile traces through
them without a graph break, and their backward is registered with the op.

Needs triton (optional dependency) and torch >= 2.6 (torch.library.triton_op). On a CPU
the kernels run under the Triton interpreter (TRITON_INTERPRET=1), which is how the
tests check them on machines without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sphere_kernels import EPS, KIND_CODES
MAX_WIDTH = 65536  # one row must fit one program's registers / shared memory


@triton.jit
def _row_geometry(h, f, ALPHA, P, AMAX, EPS_: tl.constexpr, KIND: tl.constexpr):
    """One row's <h,h>, r^2, c, z, <z,z>, r, s, beta and cos(theta), sin(theta), phi'(beta).

    The same as sphere_kernels._row_geometry and retraction_angle, in one function.
    """
    hh = tl.sum(h * h, axis=0)
    r2 = tl.maximum(hh, EPS_)
    c = tl.sum(h * f, axis=0) / r2
    z = f - c * h  # Gram-Schmidt (Eq. 5)
    ss = tl.sum(z * z, axis=0)
    r = tl.sqrt(r2)
    s = tl.sqrt(tl.maximum(ss, EPS_))
    beta = tl.load(ALPHA).to(tl.float32) * s / r
    p = tl.load(P).to(tl.float32)
    angle_max = tl.load(AMAX).to(tl.float32)
    if KIND == 0:  # geo: theta = min(beta, angle_max)
        theta = tl.minimum(beta, angle_max)
        cos, sin = tl.cos(theta), tl.sin(theta)
        dphi = tl.where(beta <= angle_max, 1.0, 0.0)
    elif KIND == 1:  # proj: theta = arctan(beta)
        q = 1.0 / tl.sqrt(1.0 + beta * beta)
        cos, sin, dphi = q, beta * q, q * q
    elif KIND == 2:  # cay: theta = 2 arctan(b / 2), b = min(beta, 2 tan(angle_max / 2))
        beta_max = 2.0 * tl.sin(angle_max) / (1.0 + tl.cos(angle_max))  # 2 tan(angle_max / 2)
        b = tl.minimum(beta, beta_max)
        den = 4.0 + b * b
        cos, sin = (4.0 - b * b) / den, 4.0 * b / den
        dphi = tl.where(beta <= beta_max, 4.0 / (4.0 + beta * beta), 0.0)
    else:  # p: theta = p arctan(beta / p), capped at angle_max for p > 1
        u = beta / p
        # arctan(u), u >= 0, in plain arithmetic (libdevice's atan does not run under the
        # interpreter). Cephes' reduction: u > tan(3pi/8) -> pi/2 - atan(1/u); u > tan(pi/8)
        # -> pi/4 + atan((u-1)/(u+1)); then an odd polynomial on |t| <= tan(pi/8).
        big = u > 2.414213562373095
        mid = (u > 0.4142135623730950) & (~big)
        t = tl.where(big, -1.0 / tl.maximum(u, 1e-30), tl.where(mid, (u - 1.0) / (u + 1.0), u))
        base = tl.where(big, 1.5707963267948966, tl.where(mid, 0.7853981633974483, 0.0))
        t2 = t * t
        poly = (((8.05374449538e-2 * t2 - 1.38776856032e-1) * t2 + 1.99777106478e-1) * t2 - 3.33329491539e-1) * t2
        theta = p * (base + t + t * poly)
        capped = (p > 1.0) & (theta > angle_max)
        theta = tl.where(capped, angle_max, theta)
        cos, sin = tl.cos(theta), tl.sin(theta)
        dphi = tl.where(capped, 0.0, 1.0 / (1.0 + u * u))
    return hh, r2, c, z, ss, r, s, beta, cos, sin, dphi


@triton.jit
def _sphere_fwd_kernel(
    H, F, OUT, ALPHA, P, AMAX, d, stride_h, stride_f, stride_o,
    EPS_: tl.constexpr, KIND: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    h = tl.load(H + row * stride_h + cols, mask=mask, other=0.0).to(tl.float32)
    f = tl.load(F + row * stride_f + cols, mask=mask, other=0.0).to(tl.float32)
    _, _, _, z, _, r, s, _, cos, sin, _ = _row_geometry(h, f, ALPHA, P, AMAX, EPS_, KIND)
    out = cos * h + (r * sin / s) * z
    tl.store(OUT + row * stride_o + cols, out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _sphere_bwd_kernel(
    G, H, F, DH, DF, DALPHA, ALPHA, P, AMAX, d,
    stride_g, stride_h, stride_f, stride_dh, stride_df,
    EPS_: tl.constexpr, KIND: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    g = tl.load(G + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    h = tl.load(H + row * stride_h + cols, mask=mask, other=0.0).to(tl.float32)
    f = tl.load(F + row * stride_f + cols, mask=mask, other=0.0).to(tl.float32)
    # The forward's per-row geometry, recomputed from the row in registers.
    hh, r2, c, z, ss, r, s, beta, cos, sin, dphi = _row_geometry(h, f, ALPHA, P, AMAX, EPS_, KIND)
    alpha = tl.load(ALPHA).to(tl.float32)
    B = r * sin / s
    gh = tl.sum(g * h, axis=0)
    gz = tl.sum(g * z, axis=0)
    zh = tl.sum(z * h, axis=0)
    # The derivation is in sphere_kernels.sphere_backward's docstring.
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
    tl.store(DALPHA + row, dbeta * s / r)


def _launch_settings(d: int) -> tuple[int, int]:
    if d > MAX_WIDTH:
        raise ValueError(f"sphere_impl='triton' supports widths up to {MAX_WIDTH}, got n_embd={d}; use sphere_impl='fused'.")
    block = triton.next_power_of_2(d)
    return block, min(max(block // 256, 1), 16)  # BLOCK, num_warps


@torch.library.triton_op("spheretnorm::sphere_fwd", mutates_args=())
def sphere_fwd(
    h: torch.Tensor, f: torch.Tensor, alpha: torch.Tensor, p: torch.Tensor, angle_max: torch.Tensor, kind: int
) -> torch.Tensor:
    """The updated h of (rows, d) inputs with unit stride in d."""
    n, d = h.shape
    out = torch.empty_like(h)
    block, warps = _launch_settings(d)
    torch.library.wrap_triton(_sphere_fwd_kernel)[(n,)](
        h, f, out, alpha, p, angle_max, d, h.stride(0), f.stride(0), out.stride(0),
        EPS_=EPS, KIND=kind, BLOCK=block, num_warps=warps,
    )
    return out


@torch.library.triton_op("spheretnorm::sphere_bwd", mutates_args=())
def sphere_bwd(
    grad: torch.Tensor,
    h: torch.Tensor,
    f: torch.Tensor,
    alpha: torch.Tensor,
    p: torch.Tensor,
    angle_max: torch.Tensor,
    kind: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of h, F(h) and alpha (summed over rows)."""
    n, d = h.shape
    dh, df = torch.empty_like(h), torch.empty_like(f)
    dalpha_rows = torch.empty((n,), dtype=torch.float32, device=h.device)
    block, warps = _launch_settings(d)
    torch.library.wrap_triton(_sphere_bwd_kernel)[(n,)](
        grad, h, f, dh, df, dalpha_rows, alpha, p, angle_max, d,
        grad.stride(0), h.stride(0), f.stride(0), dh.stride(0), df.stride(0),
        EPS_=EPS, KIND=kind, BLOCK=block, num_warps=warps,
    )
    return dh, df, dalpha_rows.sum().to(alpha.dtype)


def _setup_context(ctx, inputs, output) -> None:
    h, f, alpha, p, angle_max, kind = inputs
    ctx.save_for_backward(h, f, alpha, p, angle_max)  # only h and F(h): backward recomputes
    ctx.kind = kind


def _backward(ctx, grad_out):
    h, f, alpha, p, angle_max = ctx.saved_tensors
    dh, df, dalpha = sphere_bwd(grad_out.contiguous(), h, f, alpha, p, angle_max, ctx.kind)
    return dh, df, dalpha, None, None, None


sphere_fwd.register_autograd(_backward, setup_context=_setup_context)


def sphere_update_triton(
    h: torch.Tensor, f: torch.Tensor, alpha: torch.Tensor, kind: str, p: torch.Tensor, angle_max: torch.Tensor
) -> torch.Tensor:
    """sphere_kernels.sphere_update through the Triton kernels."""
    shape = h.shape
    h2 = h.reshape(-1, shape[-1]).contiguous()
    f2 = f.reshape(-1, shape[-1]).contiguous()
    out = sphere_fwd(h2, f2, alpha, p, angle_max, KIND_CODES[kind])
    return out.view(shape)
