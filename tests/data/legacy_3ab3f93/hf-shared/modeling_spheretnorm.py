"""Hugging Face model of a spheretnorm GPT (custom code, loaded with trust_remote_code=True).

The connections, norms and MLP are spheretnorm's model.py classes, written into the exported
copy of this file by spheretnorm/hf/folder.py (in the repository's template an import stands in their
place), so that a fix in model.py reaches every later export and the folder needs only torch
and transformers. What is added
here is what transformers needs: attention with a key/value cache, padding masks, and the
PreTrainedModel / GenerationMixin interface. Parameter names are model.py's, so the
safetensors file holds GPT.state_dict() as it is.
"""

from __future__ import annotations

import math  # noqa: F401 - model.py's classes, written in below, use it
from dataclasses import dataclass  # noqa: F401 - so does the retraction table
from typing import Any, Callable  # noqa: F401

import torch
import torch.nn as nn
from torch.nn import functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_spheretnorm import SpheretNormConfig

# transformers 5.2x renamed the model outputs' past_key_values to cache: use this version's name.
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"

# ---- written from spheretnorm's retractions.py, kernels.py and hf/remote/standalone_kernels.py

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


def step_size(a: Tensor, decay: float) -> Tensor:
    """alpha = min(softplus(a), 1) * lambda_l: the sphere step size from its parameter a."""
    return torch.nn.functional.softplus(a).clamp(max=1.0) * decay


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """fp32 for bf16/fp16/fp32 inputs (the geometry needs it), fp64 for fp64 inputs."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


class ScaleToRadius(torch.autograd.Function):
    """out = rho x / ||x|| per row, keeping only out and one number per row for backward.

    Autograd would also keep x, a (B, T, d) tensor that nothing else needs: out is kept by
    the first sublayer anyway, and x = out / k with k = rho / ||x||. With g the gradient of
    out: dx = k (g - <g, out> out / rho^2) (dx = k g where ||x||^2 is clamped at 1e-12),
    drho = sum over rows of <g, out> / rho.
    """

    @staticmethod
    def forward(ctx, x, rho):  # type: ignore[override]
        r2 = (x * x).sum(dim=-1, keepdim=True)
        k = rho * torch.rsqrt(r2.clamp_min(EPS))
        out = x * k
        ctx.save_for_backward(out, k, r2 >= EPS, rho)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        out, k, unclamped, rho = ctx.saved_tensors
        g_out = (grad * out).sum(dim=-1, keepdim=True)
        dx = k * (grad - unclamped * (g_out / (rho * rho)) * out)
        drho = (g_out / rho).sum()
        return dx, drho.reshape(rho.shape)


def scale_to_radius(x: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """rho x / ||x|| per row (||x||^2 clamped at 1e-12), rho a 0-dim tensor."""
    return ScaleToRadius.apply(x, rho)


def resolve_impl(impl: str, device_type: str) -> str:
    """Every sphere update of the exported model takes the reference path."""
    return "reference"


def sphere_update(*args: object, **kwargs: object) -> torch.Tensor:
    # Unreachable: resolve_impl above never selects a fused kernel.
    raise RuntimeError("The exported spheretnorm model has no fused sphere kernels; it runs the reference update.")


def ngpt_update(*args: object, **kwargs: object) -> torch.Tensor:
    # Unreachable too: nGPT's connection asks resolve_impl as the sphere connections do.
    raise RuntimeError("The exported spheretnorm model has no fused nGPT update; it runs the reference update.")


# ---- written from spheretnorm's model.py

ROPE_BASE = 10000.0
RMS_NORM_EPS = 1e-06
NGPT_ALPHA_INIT = 0.05


def inverse_softplus(y: float) -> float:
    """x with softplus(x) = y; for large y softplus is the identity to fp32 precision."""
    return y if y >= 20.0 else math.log(math.expm1(y))


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class DyT(nn.Module):
    """Dynamic Tanh: DyT(x) = g * tanh(a x) + b, a learnable scalar a."""

    def __init__(self, ndim: int, alpha_init: float):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * torch.tanh(self.alpha * x) + self.bias


class ScaleNorm(nn.Module):
    """Modified ScaleNorm of the embedding output (Eq. 11): puts h on a sphere.

    h1 = clamp(softplus(gamma), 1, sqrt(d)) * x / ||x||, with softplus(gamma) = sqrt(d)
    at init, so every token starts on the sphere of radius sqrt(d) (RMS 1).
    """

    def __init__(self, ndim: int):
        super().__init__()
        self.max_radius = math.sqrt(ndim)
        self.gamma = nn.Parameter(torch.tensor(inverse_softplus(self.max_radius)))

    def radius(self) -> torch.Tensor:
        return F.softplus(self.gamma).clamp(1.0, self.max_radius)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # = radius * x / ||x||, with a backward that keeps the output, not x as well.
        return scale_to_radius(x, self.radius())


class RMSNorm(nn.Module):
    """RMSNorm (LLaMA's): g * x / sqrt(mean(x^2) + eps); the normalisation runs in fp32 and is cast
    back to x's dtype before the gain, as in the Hugging Face LLaMA (so an fp32 gain gives fp32)."""

    def __init__(self, ndim: int, eps: float = RMS_NORM_EPS):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def block_norm(config: GPTConfig) -> nn.Module:
    """The normalisation layer of the block: LayerNorm in GPT-2's, RMSNorm in LLaMA's."""
    if config.block == "llama":
        return RMSNorm(config.n_embd)
    return LayerNorm(config.n_embd, bias=config.bias)


def unit(x: torch.Tensor) -> torch.Tensor:
    """x / ||x|| along the last dimension (nGPT's Norm), the norm clamped at EPS."""
    return F.normalize(x, dim=-1, eps=EPS)


def rotary_cos_sin(pos: torch.Tensor, hs: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles pos * ROPE_BASE^(-2i/hs) at positions pos (T,) or (B, T),
    each repeated for the two halves of a head and shaped to broadcast against (B, nh, T, hs).

    Computed in fp32 whatever the activations' dtype (in bf16 a position of a few hundred would
    lose its last digits), once per attention call for both q and k.
    """
    inv_freq = ROPE_BASE ** (-torch.arange(0, hs, 2, device=device, dtype=torch.float32) / hs)
    angles = pos.to(device=device, dtype=torch.float32)[..., None] * inv_freq  # (T, hs/2) or (B, T, hs/2)
    if angles.dim() == 3:
        angles = angles[:, None]  # one set of angles for all heads
    return torch.cat((angles.cos(),) * 2, dim=-1), torch.cat((angles.sin(),) * 2, dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, nh, T, hs) turned by the angles of rotary_cos_sin, in the half-split layout of LLaMA's
    Hugging Face port: dimension i and i + hs/2 form one plane."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


def rotate(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (RoPE) of x (B, nh, T, hs) at positions pos (T,) or (B, T)."""
    return apply_rotary(x, *rotary_cos_sin(pos, x.size(-1), x.device))


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.rotary = config.block == "llama"  # LLaMA's block has no position table: RoPE on q, k
        # A connection may normalise q and k (nGPT); it then says the softmax scale.
        self.qk_norm = CONNECTIONS[config.connection].qk_norm(config)
        self.softmax_scale = getattr(self.qk_norm, "softmax_scale", None)  # None: SDPA's 1 / sqrt(hs)

    def heads(
        self, x: torch.Tensor, pos: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of x (B, T, C), each (B, nh, T, hs), with positions and the connection's q/k norm applied."""
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.rotary:
            pos = torch.arange(T, device=x.device) if pos is None else pos
            cos, sin = rotary_cos_sin(pos, q.size(-1), x.device)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.qk_norm is not None:
            q, k = self.qk_norm(q, k)
        return q, k, v

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, pos: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Causal self-attention; attn_mask (B, T, T), True where a query may attend, replaces
        the causal mask and pos (B, T) the positions 0..T-1 (packed zero-shot rows, see
        GPT.final_hidden)."""
        B, T, C = x.size()
        q, k, v = self.heads(x, pos)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=None if attn_mask is None else attn_mask[:, None],  # one mask for all heads
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=attn_mask is None,
            scale=self.softmax_scale,
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble heads
        return self.resid_dropout(self.c_proj(y))

    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """The softmax matrix (B, nh, T, T) that forward's fused attention never materialises.

        For diagnostics only (an attention sink is read off it): the same scores as forward's
        (scale, positions, causal mask), in fp32.
        """
        q, k, _ = self.heads(x)
        T = x.size(1)
        scale = self.softmax_scale or 1.0 / math.sqrt(q.size(-1))
        scores = (q.float() @ k.float().transpose(-2, -1)) * scale
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        return scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)


class MLP(nn.Module):
    """GPT-2's MLP: c_proj(GELU(c_fc(x))), 4d wide."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.scale = CONNECTIONS[config.connection].mlp_scale(config, config.mlp_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.scale(self.c_fc(x)))))


class SwiGLU(nn.Module):
    """LLaMA's MLP: c_proj(SiLU(gate) * up), [gate; up] = c_fc(x), each mlp_hidden wide."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 2 * config.mlp_hidden, bias=config.bias)  # gate, then up
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.scale = CONNECTIONS[config.connection].mlp_scale(config, 2 * config.mlp_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.scale(self.c_fc(x)).chunk(2, dim=-1)
        return self.dropout(self.c_proj(F.silu(gate) * up))


BLOCK_MLPS = {
    'gpt2': MLP,
    'llama': SwiGLU,
}


def depth_decay(config: GPTConfig, layer_idx: int, slot: int) -> float:
    """lambda_l of the sphere step size, with l a block or sublayer index."""
    if config.alpha_index == "block":
        l, L = layer_idx, config.n_layer
    else:
        l, L = 2 * (layer_idx - 1) + slot + 1, 2 * config.n_layer
    return {
        "sqrt": 1.0 / math.sqrt(l),
        "harmonic": 1.0 / l,
        "linear": (L - l) / L,
        "none": 1.0,
    }[config.alpha_decay]


@dataclass(frozen=True)
class MethodParam:
    """A model key that makes variants of one connection, such as p of p-SpheretNorm.

    Its value is part of the method's name ('p_spheret:0.5'), run folder ('p_spheret-0.5'),
    W&B name and table row, and a launcher grid sets it ('--methods p_spheret:0.25'). key may
    be a GPTConfig field (spheret_p) or a new key, kept in GPTConfig.connection_params.
    """

    key: str
    default: float | int | str | bool
    help: str


@dataclass(frozen=True)
class OptimRule:
    """How AdamW treats one parameter: weight-decayed or not, and a factor on its LR."""

    decay: bool
    lr_factor: float = 1.0


def ngpt_scaling(config: GPTConfig) -> float:
    """The paper's s_scale of alpha, s_qk and s_z: 1 / sqrt(d) (NVIDIA/ngpt's base_scale)."""
    return 1.0 / math.sqrt(config.n_embd)


def scaled_vector(size: int, scaling: float) -> nn.Parameter:
    """A learnable vector stored at s_scale (nGPT's parametrisation, see above)."""
    return nn.Parameter(torch.full((size,), float(scaling)))


class NormalizedQK(nn.Module):
    """nGPT's attention scores: q and k unit per head, then times s_qk (init 1); the softmax
    scale sqrt(hs) restores the spread that 1 / sqrt(hs) assumes of unnormalised q, k."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        scaling = ngpt_scaling(config)
        self.n_head = config.n_head
        self.s_qk = scaled_vector(config.n_embd, scaling)  # one entry per head dimension, all heads
        self.factor = 1.0 / scaling  # s_init = 1
        self.softmax_scale = math.sqrt(config.n_embd // config.n_head)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = (self.s_qk * self.factor).view(self.n_head, 1, -1)  # (nh, 1, hs) against (B, nh, T, hs)
        return (s * unit(q)).to(q.dtype), (s * unit(k)).to(k.dtype)


class ScaledHidden(nn.Module):
    """nGPT's s_u, s_v: the MLP's pre-activations times s * sqrt(d) (s stored at 1, init 1).

    The paper puts sqrt(d) on v (the gate) only; here it is on u as well, as in NVIDIA/ngpt. The
    two agree exactly: u enters the output linearly, and Norm(F(h)) removes a positive factor.
    """

    def __init__(self, config: GPTConfig, width: int):
        super().__init__()
        self.s_uv = scaled_vector(width, 1.0)
        self.factor = math.sqrt(config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (self.s_uv * self.factor).to(x.dtype)


class ScaledHead(nn.Linear):
    """nGPT's LM head: logits = s_z * (E_out h), s_z per vocabulary entry (init 1)."""

    def __init__(self, config: GPTConfig):
        super().__init__(config.n_embd, config.vocab_size, bias=False)
        scaling = ngpt_scaling(config)
        self.s_z = scaled_vector(config.vocab_size, scaling)
        self.factor = 1.0 / scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # s_z scales the rows of E_out (vocab x d) rather than the logits: the same product,
        # without keeping a second logits-sized tensor for backward.
        return F.linear(x, self.weight * (self.s_z * self.factor)[:, None])


class UnitNorm(nn.Module):
    """x / ||x||: nGPT's Norm as a layer (on the embedding output)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return unit(x)


def embedding_axis(name: str) -> int:
    """The axis of a weight matrix that lies along the embedding dimension: 0 for the output
    projections into the residual stream (c_proj: d x hidden), 1 for every other matrix
    (embeddings, LM head, c_attn, c_fc: one row of length d per output)."""
    return 0 if name.endswith("c_proj.weight") else 1


class Connection(nn.Module):
    """Base of every deep connection: built as cls(config, layer_idx, slot), called as
    conn(h, sublayer) -> new h. What a connection needs beyond that, it declares here."""

    title = ""  # the paper's name of the method, a format string over params ('{spheret_p:g}-SpheretNorm')
    params: tuple[MethodParam, ...] = ()  # model keys that make variants of this connection
    biases = True  # whether the model's Linear layers may have biases (bias=None: the block decides)
    tie_embeddings = True  # the LM head shares the token embedding's matrix (GPT-2)
    on_sphere = False  # every hidden state keeps its norm: its radial direction is no degree of freedom

    @classmethod
    def optimizer_rule(cls, name: str, p: nn.Parameter) -> OptimRule:
        """The optimizer's treatment of model parameter `name` when the model uses this
        connection. The paper's rule: decay on matrices and embeddings (dim >= 2) only."""
        return OptimRule(decay=p.dim() >= 2)

    @classmethod
    def after_optimizer_step(cls, model: nn.Module) -> None:
        """Runs once after every optimizer step (e.g. to renormalise weights); nothing by default."""

    @classmethod
    def after_init(cls, model: nn.Module) -> None:
        """Runs once at the end of GPT.__init__, after the weights' init; nothing by default."""

    @classmethod
    def check_config(cls, config: GPTConfig) -> None:
        """Raise a ValueError naming the key if this connection cannot run `config`; any is fine by default."""

    # What a connection may change inside the sublayers and the head. The defaults are the
    # plain GPT-2 / LLaMA model; nGPT overrides all three.

    @staticmethod
    def qk_norm(config: GPTConfig) -> nn.Module | None:
        """A module (q, k) -> (q, k) applied per head before the scores, with an attribute
        softmax_scale; None for plain attention."""
        return None

    @staticmethod
    def mlp_scale(config: GPTConfig, width: int) -> nn.Module:
        """A module applied to the MLP's pre-activations (width of them) before the nonlinearity."""
        return nn.Identity()

    @staticmethod
    def lm_head(config: GPTConfig) -> nn.Linear:
        """The LM head: logits = lm_head(final hidden state)."""
        return nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__()
        if not 1 <= layer_idx <= config.n_layer:
            raise ValueError(f"layer_idx must lie in 1..{config.n_layer}, got {layer_idx}.")
        if slot not in (0, 1):
            raise ValueError(f"slot must be 0 (attention) or 1 (MLP), got {slot}.")
        self.layer_idx = layer_idx
        self.slot = slot

    @staticmethod
    def embed_norm(config: GPTConfig) -> nn.Module:
        return nn.Identity()

    @staticmethod
    def final_norm(config: GPTConfig) -> nn.Module:
        return block_norm(config)


class PreLN(Connection):
    """Pre-LN (GPT-2): h = h + F(LN(h))."""

    title = "Pre-LN"

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.ln = block_norm(config)

    def forward(self, h: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        return h + sublayer(self.ln(h))


class PostLN(Connection):
    """Post-LN (original Transformer): h = LN(h + F(h))."""

    title = "Post-LN"

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.ln = block_norm(config)

    def forward(self, h: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        return self.ln(h + sublayer(h))


class PreDyT(Connection):
    """Pre-DyT: h = h + F(DyT(h)); the final norm is DyT too."""

    title = "Pre-DyT"

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.dyt = DyT(config.n_embd, config.dyt_alpha)

    @staticmethod
    def final_norm(config: GPTConfig) -> nn.Module:
        return DyT(config.n_embd, config.dyt_alpha)

    def forward(self, h: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        return h + sublayer(self.dyt(h))


class PeriLN(Connection):
    """Peri-LN: h = h + LN_out(F(LN_in(h))), optional LN on the embedding."""

    title = "Peri-LN"

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.ln_in = block_norm(config)
        self.ln_out = block_norm(config)

    @staticmethod
    def embed_norm(config: GPTConfig) -> nn.Module:
        return block_norm(config) if config.peri_embed_ln else nn.Identity()

    def forward(self, h: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        return h + self.ln_out(sublayer(self.ln_in(h)))


class Keel(Connection):
    """Keel: h = LN_post(alpha * h + F(LN_in(h))), alpha fixed (default 2L sublayers)."""

    title = "Keel"

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.alpha = config.keel_scale
        self.ln_in = block_norm(config)
        self.ln_post = block_norm(config)

    def forward(self, h: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        return self.ln_post(self.alpha * h + sublayer(self.ln_in(h)))


class LNS(Connection):
    """LayerNorm Scaling (curse-of-depth paper): h = h + F(LN(h) / sqrt(l))."""

    title = "LNS"

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.ln = block_norm(config)
        self.scale = 1.0 / math.sqrt(layer_idx)

    def forward(self, h: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        return h + sublayer(self.ln(h) * self.scale)


class SphereConnection(Connection):
    """Shared part of GeoNorm and SpheretNorm: tangent projection, step size, retraction.

    A subclass names its retraction: an entry of retractions.RETRACTIONS, whose angle map
    theta = phi(beta) is all that tells the four updates apart. reference_update below is the
    update as the paper writes it, the spec in code; the fused paths (kernels.py,
    triton_kernels.py) compute the same with a hand-derived backward.
    """

    retraction = ""  # a key of retractions.RETRACTIONS
    on_sphere = True

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        get_retraction(self.retraction)  # a subclass naming no known retraction fails here
        self.angle_max = config.angle_max
        self.p = 1.0  # only p-SpheretNorm's phi reads it
        self.impl = config.sphere_impl
        self.decay = depth_decay(config, layer_idx, slot)
        # softplus(a) = 1 at init: the full (decayed) step.
        self.a = nn.Parameter(torch.tensor(math.log(math.e - 1.0)))

    @staticmethod
    def embed_norm(config: GPTConfig) -> nn.Module:
        return ScaleNorm(config.n_embd)

    def step_size(self) -> torch.Tensor:
        """alpha = min(softplus(a), 1) * lambda_l."""
        return step_size(self.a, self.decay)

    def forward(self, h: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        f = sublayer(h)
        if resolve_impl(self.impl, h.device.type) == "reference":
            return self.reference_update(h, f, self.step_size())
        # The fused paths take a and lambda_l, not alpha: the Triton kernels compute the step
        # size inside, saving step_size()'s small launches at every sublayer.
        return sphere_update(h, f, self.a, self.decay, self.retraction, self.p, self.angle_max, self.impl)

    def reference_update(self, h: torch.Tensor, f: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        # The retraction keeps ||h|| only as well as <h, z> = 0 holds, so the
        # geometry is computed in fp32 even when the sublayer runs in bf16.
        dtype = h.dtype
        h, f = h.to(compute_dtype(h)), f.to(compute_dtype(h))
        r2 = (h * h).sum(dim=-1, keepdim=True).clamp_min(EPS)
        r = r2.sqrt()
        z = f - ((h * f).sum(dim=-1, keepdim=True) / r2) * h  # Gram-Schmidt (Eq. 5)
        s = (z * z).sum(dim=-1, keepdim=True).clamp_min(EPS).sqrt()
        beta = alpha * s / r
        p, angle_max = (torch.tensor(v, dtype=h.dtype, device=h.device) for v in (self.p, self.angle_max))
        cos, sin, _ = get_retraction(self.retraction).angle(beta, p, angle_max)  # theta = phi(beta)
        return (cos * h + (r * sin / s) * z).to(dtype)  # rotate h by theta towards z


class GeoNorm(SphereConnection):
    """GeoNorm: the exponential map, theta = min(beta, angle_max) (Eq. 6)."""

    title = "GeoNorm"
    retraction = "geo"


class ProjSpheretNorm(SphereConnection):
    """1-SpheretNorm, the metric projection h = r (h + alpha z) / ||h + alpha z|| (Eq. 9):
    a rotation by theta = arctan(beta)."""

    title = "Proj-SpheretNorm (1-SpheretNorm)"
    retraction = "proj"


class CaySpheretNorm(SphereConnection):
    """2-SpheretNorm, the Cayley map h = ((4 - b^2) h + 4 g z) / (4 + b^2) (Eq. 10): a
    rotation by theta = 2 arctan(beta / 2), capped at angle_max (b = g s / r, g = alpha
    until the cap)."""

    title = "Cay-SpheretNorm (2-SpheretNorm)"
    retraction = "cay"


class PSpheretNorm(SphereConnection):
    """p-SpheretNorm: theta = p arctan(beta / p), capped at angle_max when p > 1."""

    title = "{spheret_p:g}-SpheretNorm"
    params = (MethodParam("spheret_p", 0.5, "p of p-SpheretNorm: angle = p * arctan(beta / p)"),)
    retraction = "p"

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.p = config.spheret_p


class NGPT(Connection):
    """nGPT: h = Norm(h + alpha * (Norm(F(h)) - h)), every hidden state on the unit sphere.

    alpha is a learnable eigen learning rate per dimension (|alpha| is used, as NVIDIA/ngpt
    does); no normalisation layers, no biases, no weight decay; every matrix is renormalised
    along the embedding dimension after each optimizer step, queries and keys are normalised
    per head (NormalizedQK), the MLP's pre-activations scaled (ScaledHidden), and the logits
    too (ScaledHead); the LM head has its own matrix.
    """

    title = "nGPT"
    biases = False
    tie_embeddings = False
    on_sphere = True

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        scaling = ngpt_scaling(config)
        self.alpha = scaled_vector(config.n_embd, scaling)
        self.factor = NGPT_ALPHA_INIT / scaling
        self.impl = config.sphere_impl  # 'reference': reference_update's autograd graph; else kernels.NGPTUpdate

    @classmethod
    def check_config(cls, config: GPTConfig) -> None:
        if config.mup_base_width:
            raise ValueError(
                f"nGPT has its own scale parametrisation and no μP; set mup_base_width=0 (got {config.mup_base_width})."
            )

    @classmethod
    def optimizer_rule(cls, name: str, p: nn.Parameter) -> OptimRule:
        return OptimRule(decay=False)  # the unit norm constrains every matrix; nGPT trains without decay

    @classmethod
    def after_optimizer_step(cls, model: nn.Module) -> None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    p.copy_(F.normalize(p, dim=embedding_axis(name)))

    @classmethod
    def after_init(cls, model: nn.Module) -> None:
        cls.after_optimizer_step(model)  # training starts from unit-norm matrices too

    @staticmethod
    def embed_norm(config: GPTConfig) -> nn.Module:
        # Token rows are unit already (a no-op then); with GPT-2's position table the sum is not.
        return UnitNorm()

    @staticmethod
    def final_norm(config: GPTConfig) -> nn.Module:
        return nn.Identity()

    @staticmethod
    def qk_norm(config: GPTConfig) -> nn.Module | None:
        return NormalizedQK(config)

    @staticmethod
    def mlp_scale(config: GPTConfig, width: int) -> nn.Module:
        return ScaledHidden(config, width)

    @staticmethod
    def lm_head(config: GPTConfig) -> nn.Linear:
        return ScaledHead(config)

    def eigen_lr(self) -> torch.Tensor:
        """|alpha|, the per-dimension step towards Norm(F(h)); 0.05 everywhere at init."""
        return (self.alpha * self.factor).abs()

    def forward(self, h: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        f = sublayer(h)
        if resolve_impl(self.impl, h.device.type) == "reference":
            return self.reference_update(h, f, self.eigen_lr())
        return ngpt_update(h, f, self.eigen_lr())  # the same, keeping only h and f for backward

    def reference_update(self, h: torch.Tensor, f: torch.Tensor, lr: torch.Tensor) -> torch.Tensor:
        dtype, geometry = h.dtype, compute_dtype(h, f)  # the sphere in fp32, as SphereConnection
        h = unit(h.to(geometry))
        return unit(h + lr * (unit(f.to(geometry)) - h)).to(dtype)


CONNECTIONS = {
    'pre_ln': PreLN,
    'post_ln': PostLN,
    'pre_dyt': PreDyT,
    'peri_ln': PeriLN,
    'keel': Keel,
    'lns': LNS,
    'geonorm': GeoNorm,
    'proj_spheret': ProjSpheretNorm,
    'cay_spheret': CaySpheretNorm,
    'p_spheret': PSpheretNorm,
    'ngpt': NGPT,
}


def transformer_modules(config: GPTConfig, block: Callable[[GPTConfig, int], nn.Module]) -> nn.ModuleDict:
    """Embeddings, the blocks block(config, l) for l = 1..L, and the final norm, by GPT-2's names.

    LLaMA's block has no position table (wpe): its positions enter the attention by RoPE.

    The exported Hugging Face model (spheretnorm/hf/folder.py) builds its body here too, with its cached block.
    """
    connection = CONNECTIONS[config.connection]
    modules = dict(wte=nn.Embedding(config.vocab_size, config.n_embd))
    if config.block == "gpt2":
        modules["wpe"] = nn.Embedding(config.block_size, config.n_embd)
    modules.update(
        drop=nn.Dropout(config.dropout),
        embed_norm=connection.embed_norm(config),
        h=nn.ModuleList([block(config, l) for l in range(1, config.n_layer + 1)]),
        ln_f=connection.final_norm(config),
    )
    return nn.ModuleDict(modules)


# ---- end of model.py's code


def causal_padding_mask(
    attention_mask: torch.Tensor | None, past_len: int, n_new: int, device: torch.device
) -> torch.Tensor | None:
    """(B or 1, 1, n_new, past_len + n_new) boolean mask of the keys each new token may see.

    None when there is neither a past nor padding: attention is then plain causal SDPA, as in
    model.py. A token always sees itself, so that a padding row is never fully masked (NaN).
    """
    if past_len == 0 and (attention_mask is None or bool(attention_mask.all())):
        return None
    total = past_len + n_new
    query_pos = torch.arange(past_len, total, device=device)[:, None]
    key_pos = torch.arange(total, device=device)[None, :]
    mask = (key_pos <= query_pos)[None, None]
    if attention_mask is not None:
        mask = mask & attention_mask[:, None, None, :total].bool()
    return mask | (key_pos == query_pos)[None, None]


class SpheretNormAttention(CausalSelfAttention):
    """model.py's CausalSelfAttention, reading and extending a key/value cache.

    Its heads() gives q, k, v with the rotary positions (LLaMA's block) and the connection's
    q/k norm (nGPT) applied, so the cache holds keys as the attention reads them.
    """

    def __init__(self, config: SpheretNormConfig, cache_index: int):
        super().__init__(config)
        self.cache_index = cache_index  # 0-based, as transformers' caches count layers

    def forward(
        self, x: torch.Tensor, cache: Cache | None, mask: torch.Tensor | None, positions: torch.Tensor
    ) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.heads(x, positions)  # each (B, nh, T, hs)
        if cache is not None:
            k, v = cache.update(k, v, self.cache_index)  # (B, nh, past + T, hs)
        dropout_p = self.dropout if self.training else 0.0
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=self.softmax_scale)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.softmax_scale)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class SpheretNormBlock(nn.Module):
    """model.py's Block: two connection calls, the first around the cached attention."""

    def __init__(self, config: SpheretNormConfig, layer_idx: int):
        super().__init__()
        connection = CONNECTIONS[config.connection]
        self.attn = SpheretNormAttention(config, layer_idx - 1)
        self.mlp = BLOCK_MLPS[config.block](config)
        self.conn_attn = connection(config, layer_idx, slot=0)
        self.conn_mlp = connection(config, layer_idx, slot=1)

    def forward(
        self, x: torch.Tensor, cache: Cache | None, mask: torch.Tensor | None, positions: torch.Tensor
    ) -> torch.Tensor:
        x = self.conn_attn(x, lambda h: self.attn(h, cache, mask, positions))
        return self.conn_mlp(x, self.mlp)


class SpheretNormPreTrainedModel(PreTrainedModel):
    config_class = SpheretNormConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["SpheretNormBlock"]

    def _init_weights(self, module: nn.Module) -> None:
        # For models built from a config; from_pretrained loads every weight from the file.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


class SpheretNormForCausalLM(SpheretNormPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config: SpheretNormConfig):
        super().__init__(config)
        connection = CONNECTIONS[config.connection]
        self.transformer = transformer_modules(config, SpheretNormBlock)
        self.lm_head = connection.lm_head(config)  # nGPT's scales its logits
        if not connection.tie_embeddings:
            self._tied_weights_keys = {}  # nGPT's head has its own matrix, in the weights file
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.transformer.wte

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.transformer.wte = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def positions(self, position_ids: torch.Tensor | None, past_len: int, n_new: int, device: torch.device) -> torch.Tensor:
        """Absolute positions of the new tokens, checked against the learned position table
        where there is one (RoPE, LLaMA's block, computes any position)."""
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + n_new, device=device)[None]
        if "wpe" in self.transformer and int(position_ids.max()) >= self.config.block_size:
            raise ValueError(
                f"Cannot run position {int(position_ids.max())}; the model has learned positions 0..{self.config.block_size - 1} only (block_size {self.config.block_size})."
            )
        return position_ids

    def forward(
        self,
        input_ids: torch.LongTensor,
        cache: Cache | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        past_key_values: Cache | None = None,  # the name of `cache` before transformers 5.2x
        **kwargs,
    ) -> CausalLMOutputWithPast:
        cache = cache if cache is not None else past_key_values
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        past_len = cache.get_seq_length() if cache is not None else 0
        n_new = input_ids.size(1)
        positions = self.positions(position_ids, past_len, n_new, input_ids.device)
        mask = causal_padding_mask(attention_mask, past_len, n_new, input_ids.device)

        x = self.transformer.wte(input_ids)
        if "wpe" in self.transformer:  # GPT-2's block; LLaMA's places tokens by RoPE, in the attention
            x = x + self.transformer.wpe(positions)
        x = self.transformer.embed_norm(self.transformer.drop(x))
        for block in self.transformer.h:
            x = block(x, cache, mask, positions)
        x = self.transformer.ln_f(x) * getattr(self.config, "logit_multiplier", 1.0)  # μP (model.py's final_hidden)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        logits = self.lm_head(x)

        loss = None
        if labels is not None:  # labels are the inputs; the shift happens here, as in transformers
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)).float(), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache if use_cache else None})
