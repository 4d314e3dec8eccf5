"""Conditioning of the map h_1 -> h_L (embedding output to last block output), per token position.

    python scripts/jacobian.py --ckpt out/depth_study/seed1337/pre_ln/ckpt.pt
    python scripts/jacobian.py --ckpt A/ckpt.pt B/ckpt.pt --tokens 8 --scope prefix --json cond.json

For each checkpoint and each of --tokens positions t (evenly spaced over one val sequence),
the largest and smallest singular values of the Jacobian of h_L[t] and their ratio, from
Jacobian-vector and vector-Jacobian products only: Lanczos with full reorthogonalisation on
J J^T (the output side, d x d). With --steps at its default (the output dimension) the Krylov
space is the whole space and the values are exact up to rounding; a smaller --steps gives an
accurate sigma_max and an upper bound on sigma_min (the "exact" column says which). A
sigma_min within float64 rounding of zero (the map loses a direction) is shown as "< rounding
level", and the ratio as a lower bound.

What is differentiated (h_L is the last block's output, before ln_f):
  --scope self (default): dh_L[t] / dh_1[t], the token's own path through the depth, with
    every other position's input held fixed; a square d x d matrix.
  --scope prefix: dh_L[t] / dh_1[0..t], the token's output against every input it can see
    (causal attention: later inputs do not reach it); d x (t+1)d, of rank at most d, and its
    d singular values are those reported.
Sphere connections (geonorm, proj_spheret, cay_spheret, p_spheret, and ngpt) keep every token on its
sphere, so the radial direction is no degree of freedom: input perturbations are restricted
to the tangent space at each h_1[s] (the radial component of a direction is removed) and the
output is projected onto the tangent space at h_L[t]. The singular values are those of that
(d-1) x (d-1) (self) map, of the model in float64 with the reference sphere update.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from spheretnorm.runtime.token_files import load_meta, open_split
from spheretnorm.model import CONNECTIONS, GPT
from spheretnorm.runtime.checkpoint import clean_state_dict, load_checkpoint
from spheretnorm.runtime.config import config_from_dict
from spheretnorm.runtime.cli import HelpFormatter, UsageError
from spheretnorm.runtime.imports import add_import_options, use_import_options
from spheretnorm.runtime.methods import method_key

SCOPES = ("self", "prefix")
# An eigenvalue of J J^T below this times (largest eigenvalue x dimension) is float64 rounding:
# the smallest singular value is then reported as an upper bound (the map loses a direction).
RESOLUTION = 100 * np.finfo(np.float64).eps
# Lanczos stops a run of its recurrence when the next residual is this small (relative to the
# operator's scale): the Krylov space is invariant, and a fresh direction continues it.
BREAKDOWN = 1e-10

Vector = torch.Tensor


# -----------------------------------------------------------------------------
# The linear map of one position


def tangent(v: Vector, points: Vector) -> Vector:
    """v with its component along each row of points removed (the tangent space of the sphere there)."""
    u = points / points.norm(dim=-1, keepdim=True)
    return v - (v * u).sum(dim=-1, keepdim=True) * u


@dataclass
class PositionMap:
    """The Jacobian J of h_L[t] with respect to h_1 (T, d), restricted as --scope and the sphere say.

    jvp(w) = P_out J M P_in w and vjp(u) = M P_in J^T P_out u, where M keeps the input positions
    of the scope and P_in, P_out are the tangent projections (the identity for Euclidean models).
    """

    model: GPT
    h1: Vector  # (T, d) embedding output of one sequence
    position: int
    scope: str

    def __post_init__(self) -> None:
        self.sphere = CONNECTIONS[self.model.config.connection].on_sphere
        self.mask = torch.zeros(self.h1.size(0), 1, dtype=self.h1.dtype)
        self.mask[self.position if self.scope == "self" else slice(self.position + 1)] = 1.0
        with torch.no_grad():
            self.h_last = self.output(self.h1)
        # The point of linearisation is fixed: one forward pass serves every VJP of Lanczos.
        with sdpa_kernel(SDPBackend.MATH):
            _, self._pullback = torch.func.vjp(self.output, self.h1)

    def output(self, h1: Vector) -> Vector:
        x = h1[None]
        for block in self.model.transformer.h:
            x = block(x)
        return x[0, self.position]

    def restrict_in(self, w: Vector) -> Vector:
        w = w * self.mask
        return tangent(w, self.h1) if self.sphere else w

    def restrict_out(self, u: Vector) -> Vector:
        return tangent(u, self.h_last) if self.sphere else u

    def jvp(self, w: Vector) -> Vector:
        # Forward-mode AD has no rule for the fused CPU attention kernels; the math one has.
        with sdpa_kernel(SDPBackend.MATH):
            _, out = torch.func.jvp(self.output, (self.h1,), (self.restrict_in(w),))
        return self.restrict_out(out).detach()

    def vjp(self, u: Vector) -> Vector:
        (grad,) = self._pullback(self.restrict_out(u))
        return self.restrict_in(grad).detach()

    def output_dim(self) -> int:
        """Dimension of the output space J acts into: d, or d - 1 on the sphere."""
        return self.h1.size(1) - (1 if self.sphere else 0)

    def random_output(self, generator: torch.Generator) -> Vector:
        return self.restrict_out(torch.randn(self.h1.size(1), generator=generator, dtype=self.h1.dtype))


# -----------------------------------------------------------------------------
# Lanczos on J J^T


def lanczos_eigenvalues(matvec: Callable[[Vector], Vector], fresh: Callable[[], Vector], dim: int, steps: int,
                       project: Callable[[Vector], Vector] = lambda v: v) -> np.ndarray:
    """Ritz values of a symmetric PSD operator on a dim-dimensional space after `steps` steps.

    Full reorthogonalisation against every earlier Lanczos vector keeps them orthogonal in
    floating point; a breakdown (an invariant subspace) continues from a fresh direction, so
    steps = dim returns every eigenvalue. `fresh` draws a random vector of the space.

    When the space is a subspace of the vectors' ambient space (a sphere's tangent space),
    `project` is its orthogonal projector, applied to every new vector. Without it, the
    rounding-level part of a vector outside the subspace, where the operator is zero, is
    not removed by the reorthogonalisation (no Lanczos vector spans it) and the recurrence
    multiplies it by the Lanczos polynomial at 0, which grows exponentially when 0 lies far
    from the spectrum: by step 50 of a sphere model's tangent Jacobian (d = 128) it had become
    a whole Lanczos vector, and a spurious eigenvalue 0 took the place of the true smallest one.
    """
    steps = min(steps, dim)
    basis: list[Vector] = []
    alphas, betas = [], []
    q = project(fresh())
    q = q / q.norm()
    beta = 0.0
    for k in range(steps):
        basis.append(q)
        w = matvec(q)
        alpha = float(w @ q)
        alphas.append(alpha)
        w = project(w - alpha * q - (beta * basis[-2] if k > 0 and beta else 0.0))
        Q = torch.stack(basis)
        for _ in range(2):  # twice is enough (Kahan's "twice is enough" for Gram-Schmidt)
            w = w - Q.T @ (Q @ w)
        beta = float(w.norm())
        scale = max(abs(a) for a in alphas) or 1.0
        if k == steps - 1:
            break
        if beta <= BREAKDOWN * scale:
            w = project(fresh())
            for _ in range(2):
                w = w - Q.T @ (Q @ w)
            beta = 0.0  # the tridiagonal splits: no coupling to the new block
            q = w / w.norm()
        else:
            q = w / beta
        betas.append(beta)
    T = np.diag(alphas) + np.diag(betas, 1) + np.diag(betas, -1)
    return np.linalg.eigvalsh(T)


@dataclass
class Conditioning:
    checkpoint: str
    method: str
    iter: int | None
    position: int
    sigma_max: float
    sigma_min: float  # an upper bound when not resolved
    ratio: float
    steps: int
    exact: bool  # the Krylov space was the whole output space
    resolved: bool  # sigma_min is above float64 rounding (else the map is singular to precision)


def position_conditioning(pmap: PositionMap, steps: int | None, generator: torch.Generator) -> tuple[float, float, int, bool, bool]:
    """(sigma_max, sigma_min, Lanczos steps, exact, resolved) of one position's restricted Jacobian.

    Unresolved: the smallest eigenvalue of J J^T is within rounding of zero, and sigma_min is
    returned as the rounding level, an upper bound.
    """
    dim = pmap.output_dim()
    steps = dim if steps is None else min(steps, dim)
    eig = lanczos_eigenvalues(lambda u: pmap.jvp(pmap.vjp(u)), lambda: pmap.random_output(generator), dim, steps, project=pmap.restrict_out)
    floor = RESOLUTION * max(eig.max(), 0.0) * dim
    resolved = bool(eig.min() > floor)
    smin = float(np.sqrt(eig.min() if resolved else floor))
    return float(np.sqrt(max(eig.max(), 0.0))), smin, steps, steps == dim, resolved


# -----------------------------------------------------------------------------
# Checkpoints and data


def load_model(path: Path) -> tuple[GPT, dict]:
    """The checkpoint's model in float64 with the reference sphere update (exact JVPs and VJPs)."""
    ckpt = load_checkpoint(path)
    model = GPT(config_from_dict({**ckpt["model_config"], "sphere_impl": "reference"}))
    model.load_state_dict(clean_state_dict(ckpt["model"]))
    return model.double().eval(), ckpt


def val_sequence(ckpt: dict, data_dir: str | None, length: int) -> torch.Tensor:
    """The first `length` tokens of the val split the checkpoint was trained on (1, length)."""
    directory = data_dir or ckpt.get("train_config", {}).get("data_dir")
    if not directory or not (Path(directory) / "meta.json").is_file():
        raise UsageError(f"--data_dir {directory!r} holds no prepared dataset; pass the folder with meta.json and val.bin the run trained on.")
    tokens = np.asarray(open_split(directory, "val", load_meta(directory))[:length], dtype=np.int64)
    return torch.from_numpy(tokens)[None]


def positions(seq_len: int, count: int) -> list[int]:
    """count positions evenly spaced over 0..seq_len-1, the first and the last included."""
    if count < 1:
        raise UsageError(f"--tokens {count} is not valid; give a positive number of positions.")
    return sorted({round(x) for x in np.linspace(0, seq_len - 1, min(count, seq_len))})


def measure(path: Path, args: argparse.Namespace) -> list[Conditioning]:
    model, ckpt = load_model(path)
    length = args.seq_len or model.config.block_size
    if length > model.config.block_size:
        raise UsageError(f"--seq_len {length} exceeds the model's block_size {model.config.block_size}; choose at most that.")
    idx = val_sequence(ckpt, args.data_dir, length)
    with torch.no_grad():
        h1 = model.embed(idx)[0]
    generator = torch.Generator().manual_seed(args.seed)
    rows = []
    for t in positions(idx.size(1), args.tokens):
        pmap = PositionMap(model, h1, t, args.scope)
        smax, smin, steps, exact, resolved = position_conditioning(pmap, args.steps, generator)
        ratio = smax / smin if smin > 0 else float("inf")
        rows.append(Conditioning(str(path), method_key(model.config), ckpt.get("iter_num"), t, smax, smin, ratio, steps, exact, resolved))
    return rows


def table(rows: list[Conditioning]) -> str:
    lines = ["| checkpoint | method | iter | position | sigma_max | sigma_min | sigma_max / sigma_min | exact |", "|:--|:--|--:|--:|--:|--:|--:|:--|"]
    for r in rows:
        bound = "<" if not r.resolved or not r.exact else ""  # sigma_min is then an upper bound
        lines.append(f"| {r.checkpoint} | {r.method} | {r.iter} | {r.position} | {r.sigma_max:.4g} | {bound}{r.sigma_min:.4g} | "
                     f"{'>' if bound else ''}{r.ratio:.4g} | {'yes' if r.exact else f'no ({r.steps} steps)'} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--ckpt", nargs="+", required=True, help="one or more ckpt.pt files (a table row per checkpoint and position)")
    p.add_argument("--tokens", type=int, default=4, help="positions measured, evenly spaced over the sequence (default 4)")
    p.add_argument("--scope", choices=SCOPES, default="self", help="self: dh_L[t]/dh_1[t]; prefix: dh_L[t]/dh_1[0..t] (default self)")
    p.add_argument("--steps", type=int, default=None, help="Lanczos steps (default: the output dimension, exact)")
    p.add_argument("--seq_len", type=int, default=None, help="tokens of the val sequence (default: the model's block_size)")
    p.add_argument("--data_dir", default=None, help="the prepared dataset (default: the checkpoint's data_dir)")
    p.add_argument("--seed", type=int, default=0, help="seed of the Lanczos start vectors")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    add_import_options(p)  # a checkpoint of the user's own connection, as every reader of checkpoints
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        use_import_options(args, UsageError)  # before a checkpoint names a connection of the user's
        if args.steps is not None and args.steps < 1:
            raise UsageError(f"--steps {args.steps} is not valid; give a positive number, or leave it out for exact values.")
        rows = [row for path in args.ckpt for row in measure(Path(path), args)]
    except (UsageError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n", encoding="utf-8")
    return 0
