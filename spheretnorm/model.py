"""
A GPT language model with a switchable deep connection, in one file.

The model is GPT-2 as in nanoGPT (learned token and position embeddings, causal
self-attention, GELU MLP, weight-tied head), or LLaMA's block. What changes between
experiments is the *deep connection*: the rule that combines a hidden state h with the
output of a sublayer F (attention or MLP). Each rule is one small class below, registered
in CONNECTIONS, that declares its own keys (`params`); a Block is two connection calls.

The maths follows the paper "Sphere Retraction Normalizations" (arXiv 2608.02668) and
docs/CONNECTIONS.md, which records the choices made where the paper is silent; equation
numbers are the paper's. docs/ARCHITECTURE.md shows how to add a connection.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import torch
import torch.nn as nn
from torch.nn import functional as F

# Relative imports of the model core only (kernels, retractions, mup, keys): a Hugging Face export
# copies these files, unchanged, into its folder (spheretnorm/hf/folder.py), where the same
# lines import the copies beside them.
from .chunked_loss import head_loss, head_weight_bias
from .kernels import compute_dtype, ngpt_update, resolve_impl, scale_to_radius, sphere_update
# The key machinery lives in keys.py: declared keys (MethodParam), the registries and their checks,
# GPTConfig's checks, a key's role in a run. optim.py, runtime/ and users' modules import some of
# these names from here (`from spheretnorm.model import MethodParam`), so this line names them too.
from .keys import (
    ALPHA_DECAYS, ALPHA_INDICES, BLOCKS, CONNECTIONS, KEYED_REGISTRIES, MODEL_KEYS, NEUTRAL, OPENED_KEYS,
    RESTART_FREE, RESUME_FIXED, MethodParam, check_model_config, check_registration, declared_keys_as_keywords,
    declared_params,
)
from .mup import init_scale, output_multiplier, param_kind, width_ratio
from .retractions import EPS, get_retraction, step_size

ROPE_BASE = 10000.0  # theta of the rotary embedding (RoPE paper, LLaMA 1-2)
RMS_NORM_EPS = 1e-6  # LLaMA's


# -----------------------------------------------------------------------------
# Configuration

# Each key says what it is to a run's identity (field metadata NEUTRAL, RESTART_FREE, RESUME_FIXED;
# keys.py); a key without it changes what a run computes.


@dataclass
class GPTConfig:
    block_size: int = 1024
    # GPT-2's 50257 padded up to a multiple of 64 for speed (train.py derives it from the dataset)
    vocab_size: int = field(default=50304, metadata=RESTART_FREE)
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    # Bias in Linear and LayerNorm layers; None means the block's own choice: on in GPT-2's
    # (paper Table 6), off in LLaMA's and for connections without biases (nGPT).
    bias: bool | None = None
    connection: str = "pre_ln"  # a key of CONNECTIONS
    block: str = "gpt2"  # a key of BLOCKS: GPT-2's block (the paper's) or LLaMA's
    angle_max: float = math.pi / 4  # largest rotation of one sphere update (paper 4.2)
    alpha_decay: str = "sqrt"  # depth decay lambda_l of the sphere step size
    alpha_index: str = "block"  # l counts blocks (1..L) or sublayers (1..2L)
    # The choices the paper fixes, opened up (docs/CONNECTIONS.md, "Not in the paper"); the
    # defaults are the paper's model. The sphere connections read them, the others refuse them.
    alpha_cap: float | None = 1.0  # the cap on softplus(a) in the sphere step size; None: uncapped
    alpha_cap_grad: str = "stop"  # a's gradient above the cap: stop (none, the paper's) or straight_through
    radius_cap: float | None = 1.0  # ScaleNorm's largest radius in units of sqrt(d); None: uncapped
    sphere_input_gain: bool = False  # a learnable per-channel gain g on what each sphere sublayer reads
    mlp_width: int = 0  # the MLP's hidden width; 0: the block's own (mlp_hidden)
    mup_base_width: int = 0  # μP base width n0: LRs and init transfer from width n0 (0: off; mup.py)
    # How the sphere update runs (same maths): auto | reference | fused | triton
    sphere_impl: str = field(default="auto", metadata=NEUTRAL)
    # Training's LM head and loss this many tokens at a time (chunked_loss.py), never the whole logits: memory
    # on GPUs with a large vocabulary; 0: all at once. Same results up to rounding, so a resume may change it.
    loss_chunk_tokens: int = field(default=0, metadata=NEUTRAL)
    # The values of the parameters the connection's class declares (Connection.params: spheret_p,
    # dyt_alpha, keel_alpha, ...), read as attributes like the keys above (config.spheret_p).
    connection_params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Every check, with the error naming the key, is keys.check_model_config, which also settles
        # connection_params and bias; which connections read the sphere keys is this file's to say.
        check_model_config(self, sphere_connections)

    @property
    def mlp_hidden(self) -> int:
        """Width of the MLP's hidden layer: mlp_width where set; else 4d in GPT-2, and in LLaMA 2/3 of 4d
        (so that SwiGLU's three matrices cost what GELU's two do) rounded up to a multiple of 64, as
        Meta's code rounds it."""
        if self.mlp_width:
            return self.mlp_width
        if self.block == "gpt2":
            return 4 * self.n_embd
        return 64 * ((8 * self.n_embd // 3 + 63) // 64)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not fields: a connection's declared parameters.
        params = self.__dict__.get("connection_params") or {}
        if name in params:
            return params[name]
        raise AttributeError(f"GPTConfig has no key {name!r} (its connection's keys: {', '.join(params) or 'none'})")

    @property
    def keel_scale(self) -> float:
        """Keel's alpha: keel_alpha, or 2 * n_layer where it is None."""
        return float(self.keel_alpha) if self.keel_alpha is not None else 2.0 * self.n_layer

    @property
    def mup_ratio(self) -> float:
        """n0 / n of mup.py's rules; 1.0 when μP is off."""
        return width_ratio(self.n_embd, self.mup_base_width)


MODEL_FIELDS = tuple(f.name for f in fields(GPTConfig))
# GPTConfig keys that choose how the model runs, not what it computes: a resume or an
# evaluation may change them, and they are not part of a run's identity.
EXECUTION_KEYS = tuple(f.name for f in fields(GPTConfig) if f.metadata == NEUTRAL)
# The keys that open a choice the paper fixed, at their defaults (the paper's): a run that sets
# one otherwise names it in its method key ('p_spheret:0.5+alpha_cap=none', runtime/config/).
OPENED_DEFAULTS = {f.name: f.default for f in fields(GPTConfig) if f.name in OPENED_KEYS}
MODEL_KEYS.extend(MODEL_FIELDS)  # keys no registered connection, optimizer or loss term may declare (keys.check_registration)


# GPTConfig(connection="p_spheret", spheret_p=0.25): a declared key as a keyword joins connection_params.
GPTConfig.__init__ = declared_keys_as_keywords("connection_params", declared_params)(GPTConfig.__init__)


# -----------------------------------------------------------------------------
# Normalisations


def constant_parameter(module: nn.Module, name: str, shape: tuple[int, ...], value: float) -> None:
    """Give `module` a learnable parameter `name` filled with `value`, and remember the value so
    that GPT.init_weights can fill it again (a model built on the meta device has no values yet)."""
    module.register_parameter(name, nn.Parameter(torch.full(shape, float(value))))
    module.__dict__.setdefault("constant_inits", {})[name] = float(value)


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        constant_parameter(self, "weight", (ndim,), 1.0)
        if bias:
            constant_parameter(self, "bias", (ndim,), 0.0)
        else:
            self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class DyT(nn.Module):
    """Dynamic Tanh: DyT(x) = g * tanh(a x) + b, a learnable scalar a."""

    def __init__(self, ndim: int, alpha_init: float):
        super().__init__()
        constant_parameter(self, "alpha", (), alpha_init)
        constant_parameter(self, "weight", (ndim,), 1.0)
        constant_parameter(self, "bias", (ndim,), 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * torch.tanh(self.alpha * x) + self.bias


def inverse_softplus(y: float) -> float:
    """x with softplus(x) = y; for large y softplus is the identity to fp32 precision."""
    return y if y >= 20.0 else math.log(math.expm1(y))


class ScaleNorm(nn.Module):
    """Modified ScaleNorm of the embedding output (Eq. 11): h1 = clamp(softplus(gamma), 1, sqrt(d)) * x / ||x||,
    softplus(gamma) = sqrt(d) at init, so every token starts on the sphere of radius sqrt(d) (RMS 1).
    radius_cap moves the upper end to radius_cap * sqrt(d) (None: no upper end; not in the paper)."""

    def __init__(self, ndim: int, radius_cap: float | None = 1.0):
        super().__init__()
        self.max_radius = None if radius_cap is None else radius_cap * math.sqrt(ndim)
        constant_parameter(self, "gamma", (), inverse_softplus(math.sqrt(ndim)))

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
        constant_parameter(self, "weight", (ndim,), 1.0)
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


# -----------------------------------------------------------------------------
# Sublayers: nanoGPT's attention and MLP, and LLaMA's rotary positions and SwiGLU


def rotary_cos_sin(pos: torch.Tensor, hs: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles pos * ROPE_BASE^(-2i/hs) at positions pos (T,) or (B, T),
    repeated for the two halves of a head, shaped to broadcast against (B, nh, T, hs); in fp32
    (in bf16 a position of a few hundred would lose its last digits), once for both q and k."""
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

    def heads(self, x: torch.Tensor, pos: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, pos: torch.Tensor | None = None) -> torch.Tensor:
        """Causal self-attention; attn_mask (B, T, T), True where a query may attend, replaces the
        causal mask and pos (B, T) the positions 0..T-1 (packed zero-shot rows, see GPT.final_hidden)."""
        B, T, C = x.size()
        q, k, v = self.heads(x, pos)
        mask = None if attn_mask is None else attn_mask[:, None]  # one mask for all heads
        dropout_p = self.dropout if self.training else 0.0
        causal = attn_mask is None
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal, scale=self.softmax_scale)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble heads
        return self.resid_dropout(self.c_proj(y))

    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """The softmax matrix (B, nh, T, T) that forward's fused attention never materialises, for
        diagnostics (an attention sink): the same scores as forward's (scale, positions, mask), in fp32."""
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


BLOCK_MLPS: dict[str, Callable[[GPTConfig], nn.Module]] = {"gpt2": MLP, "llama": SwiGLU}


# -----------------------------------------------------------------------------
# Deep connections. Each is built as cls(config, layer_idx, slot) with layer_idx the
# 1-based block index and slot 0 (attention) or 1 (MLP), and called as
# conn(h, sublayer) -> new h. The class also says which norm sits on the embedding
# output and which before the LM head.

Sublayer = Callable[[torch.Tensor], torch.Tensor]


# CONNECTIONS (name -> class, in registration order) is keys.py's dict, which its checks read;
# @register_connection fills it.


def register_connection(name: str) -> Callable[[type], type]:
    """Class decorator: make a Connection subclass available as --connection=name."""

    def register(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, Connection)):
            raise TypeError(f"@register_connection({name!r}) needs a Connection subclass, got {cls!r}.")
        check_registration("connection", name, cls, __name__)
        CONNECTIONS[name] = cls
        return cls

    return register


@dataclass(frozen=True)
class OptimRule:
    """How AdamW treats one parameter: weight-decayed or not, and a factor on its LR."""

    decay: bool
    lr_factor: float = 1.0


class Connection(nn.Module):
    """Base of every deep connection: built as cls(config, layer_idx, slot), called as
    conn(h, sublayer) -> new h. What a connection needs beyond that, it declares here."""

    title = ""  # the paper's name of the method, a format string over params ('{spheret_p:g}-SpheretNorm')
    params: tuple[MethodParam, ...] = ()  # the model keys of this connection alone (config.key)
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


@register_connection("pre_ln")
class PreLN(Connection):
    """Pre-LN (GPT-2): h = h + F(LN(h))."""

    title = "Pre-LN"

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.ln = block_norm(config)

    def forward(self, h: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        return h + sublayer(self.ln(h))


@register_connection("post_ln")
class PostLN(Connection):
    """Post-LN (original Transformer): h = LN(h + F(h))."""

    title = "Post-LN"

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.ln = block_norm(config)

    def forward(self, h: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        return self.ln(h + sublayer(h))


@register_connection("pre_dyt")
class PreDyT(Connection):
    """Pre-DyT: h = h + F(DyT(h)); the final norm is DyT too."""

    title = "Pre-DyT"
    params = (MethodParam("dyt_alpha", 0.5, "initial scalar a of DyT(x) = g * tanh(a x) + b", in_key=False, any_connection=True),)

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.dyt = DyT(config.n_embd, config.dyt_alpha)

    @staticmethod
    def final_norm(config: GPTConfig) -> nn.Module:
        return DyT(config.n_embd, config.dyt_alpha)

    def forward(self, h: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        return h + sublayer(self.dyt(h))


@register_connection("peri_ln")
class PeriLN(Connection):
    """Peri-LN: h = h + LN_out(F(LN_in(h))), optional LN on the embedding."""

    title = "Peri-LN"
    params = (MethodParam("peri_embed_ln", False, "Peri-LN: also LayerNorm the embedding output", in_key=False, any_connection=True),)

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.ln_in = block_norm(config)
        self.ln_out = block_norm(config)

    @staticmethod
    def embed_norm(config: GPTConfig) -> nn.Module:
        return block_norm(config) if config.peri_embed_ln else nn.Identity()

    def forward(self, h: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        return h + self.ln_out(sublayer(self.ln_in(h)))


@register_connection("keel")
class Keel(Connection):
    """Keel: h = LN_post(alpha * h + F(LN_in(h))), alpha fixed (default 2L sublayers)."""

    title = "Keel"
    params = (
        MethodParam("keel_alpha", None, "Keel's fixed residual scale; None means 2 * n_layer", kind=float,
                    check=lambda a: a > 0, must="> 0 (or None for 2 * n_layer)", in_key=False, any_connection=True),
    )

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.alpha = config.keel_scale
        self.ln_in = block_norm(config)
        self.ln_post = block_norm(config)

    def forward(self, h: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        return self.ln_post(self.alpha * h + sublayer(self.ln_in(h)))


@register_connection("lns")
class LNS(Connection):
    """LayerNorm Scaling (curse-of-depth paper): h = h + F(LN(h) / sqrt(l))."""

    title = "LNS"

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.ln = block_norm(config)
        self.scale = 1.0 / math.sqrt(layer_idx)

    def forward(self, h: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        return h + sublayer(self.ln(h) * self.scale)


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


class SphereConnection(Connection):
    """Shared part of GeoNorm and SpheretNorm: tangent projection, step size, retraction. A subclass
    names its retraction (retractions.RETRACTIONS), whose angle map theta = phi(beta) alone tells the
    four apart. reference_update is the paper's update, the spec in code; the fused paths
    (kernels.py, triton_kernels.py) compute the same with a hand-derived backward."""

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
        constant_parameter(self, "a", (), math.log(math.e - 1.0))
        self.alpha_cap = config.alpha_cap
        self.alpha_cap_grad = config.alpha_cap_grad
        if config.sphere_input_gain:
            constant_parameter(self, "input_gain", (config.n_embd,), 1.0)
        else:
            self.input_gain = None

    @staticmethod
    def embed_norm(config: GPTConfig) -> nn.Module:
        return ScaleNorm(config.n_embd, config.radius_cap)

    def step_size(self) -> torch.Tensor:
        """alpha = min(softplus(a), alpha_cap) * lambda_l (alpha_cap 1 in the paper; None: softplus(a) * lambda_l);
        alpha_cap_grad says whether a learns above the cap."""
        return step_size(self.a, self.decay, self.alpha_cap, self.alpha_cap_grad)

    def sublayer_input(self, h: torch.Tensor) -> torch.Tensor:
        """What F reads: h, or g * h with sphere_input_gain (the stream itself stays h, on the sphere)."""
        return h if self.input_gain is None else h * self.input_gain.to(h.dtype)

    def forward(self, h: torch.Tensor, sublayer: Sublayer) -> torch.Tensor:
        f = sublayer(self.sublayer_input(h))
        if resolve_impl(self.impl, h.device.type) == "reference":
            return self.reference_update(h, f, self.step_size())
        # The fused paths take a and lambda_l, not alpha: the Triton kernels compute the step
        # size inside, saving step_size()'s small launches at every sublayer.
        return sphere_update(h, f, self.a, self.decay, self.retraction, self.p, self.angle_max, self.impl, self.alpha_cap,
                             self.alpha_cap_grad)

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


@register_connection("geonorm")
class GeoNorm(SphereConnection):
    """GeoNorm: the exponential map, theta = min(beta, angle_max) (Eq. 6)."""

    title = "GeoNorm"
    retraction = "geo"


@register_connection("proj_spheret")
class ProjSpheretNorm(SphereConnection):
    """1-SpheretNorm, the metric projection h = r (h + alpha z) / ||h + alpha z|| (Eq. 9):
    a rotation by theta = arctan(beta)."""

    title = "Proj-SpheretNorm (1-SpheretNorm)"
    retraction = "proj"


@register_connection("cay_spheret")
class CaySpheretNorm(SphereConnection):
    """2-SpheretNorm, the Cayley map h = ((4 - b^2) h + 4 g z) / (4 + b^2) (Eq. 10): a
    rotation by theta = 2 arctan(beta / 2), capped at angle_max (b = g s / r, g = alpha
    until the cap)."""

    title = "Cay-SpheretNorm (2-SpheretNorm)"
    retraction = "cay"


@register_connection("p_spheret")
class PSpheretNorm(SphereConnection):
    """p-SpheretNorm: theta = p arctan(beta / p), capped at angle_max when p > 1."""

    title = "{spheret_p:g}-SpheretNorm"
    params = (
        MethodParam("spheret_p", 0.5, "p of p-SpheretNorm: angle = p * arctan(beta / p)",
                    check=lambda p: p > 0, must="> 0", any_connection=True),
    )
    retraction = "p"

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.p = config.spheret_p


# nGPT (Loshchilov et al. 2024, arXiv 2410.01131; reference code NVIDIA/ngpt). A learnable scale s
# is stored at s_scale and used as s * (s_init / s_scale); docs/CONNECTIONS.md gives the values
# and where this implementation departs from the reference.

NGPT_ALPHA_INIT = 0.05  # alpha_A and alpha_M at init (the paper's 0.05; its s_scale is 1 / sqrt(d))


def ngpt_scaling(config: GPTConfig) -> float:
    """The paper's s_scale of alpha, s_qk and s_z: 1 / sqrt(d) (NVIDIA/ngpt's base_scale)."""
    return 1.0 / math.sqrt(config.n_embd)


def scaled_vector(module: nn.Module, name: str, size: int, scaling: float) -> None:
    """A learnable vector `name` of `module`, stored at s_scale (nGPT's parametrisation, see above)."""
    constant_parameter(module, name, (size,), scaling)


class NormalizedQK(nn.Module):
    """nGPT's attention scores: q and k unit per head, then times s_qk (init 1); the softmax
    scale sqrt(hs) restores the spread that 1 / sqrt(hs) assumes of unnormalised q, k."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        scaling = ngpt_scaling(config)
        self.n_head = config.n_head
        scaled_vector(self, "s_qk", config.n_embd, scaling)  # one entry per head dimension, all heads
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
        scaled_vector(self, "s_uv", width, 1.0)
        self.factor = math.sqrt(config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (self.s_uv * self.factor).to(x.dtype)


class ScaledHead(nn.Linear):
    """nGPT's LM head: logits = s_z * (E_out h), s_z per vocabulary entry (init 1)."""

    def __init__(self, config: GPTConfig):
        super().__init__(config.n_embd, config.vocab_size, bias=False)
        scaling = ngpt_scaling(config)
        scaled_vector(self, "s_z", config.vocab_size, scaling)
        self.factor = 1.0 / scaling

    def linear_weight(self) -> torch.Tensor:
        # s_z scales the rows of E_out (vocab x d) rather than the logits: the same product,
        # without keeping a second logits-sized tensor for backward.
        return self.weight * (self.s_z * self.factor)[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.linear_weight())


class UnitNorm(nn.Module):
    """x / ||x||: nGPT's Norm as a layer (on the embedding output)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return unit(x)


def embedding_axis(name: str) -> int:
    """The axis of a weight matrix that lies along the embedding dimension: 0 for the output
    projections into the residual stream (c_proj: d x hidden), 1 for every other matrix
    (embeddings, LM head, c_attn, c_fc: one row of length d per output)."""
    return 0 if name.endswith("c_proj.weight") else 1


@register_connection("ngpt")
class NGPT(Connection):
    """nGPT: h = Norm(h + |alpha| * (Norm(F(h)) - h)), alpha a learnable eigen learning rate per
    dimension. No normalisation layers, biases or weight decay; every matrix renormalised after each
    optimizer step; q, k, MLP pre-activations and logits scaled (NormalizedQK, ScaledHidden,
    ScaledHead); an LM head of its own.
    """

    title = "nGPT"
    biases = False
    tie_embeddings = False
    on_sphere = True

    def __init__(self, config: GPTConfig, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        scaling = ngpt_scaling(config)
        scaled_vector(self, "alpha", config.n_embd, scaling)
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


def sphere_connections() -> tuple[str, ...]:
    """The registered connections that move h by a retraction (SphereConnection's subclasses)."""
    return tuple(k for k, v in CONNECTIONS.items() if issubclass(v, SphereConnection))


SPHERE_CONNECTIONS = sphere_connections()


# -----------------------------------------------------------------------------
# The model


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
        connection = CONNECTIONS[config.connection]
        self.attn = CausalSelfAttention(config)
        self.mlp = BLOCK_MLPS[config.block](config)
        self.conn_attn = connection(config, layer_idx, slot=0)
        self.conn_mlp = connection(config, layer_idx, slot=1)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, pos: torch.Tensor | None = None) -> torch.Tensor:
        attn = self.attn if attn_mask is None and pos is None else functools.partial(self.attn, attn_mask=attn_mask, pos=pos)
        x = self.conn_attn(x, attn)
        x = self.conn_mlp(x, self.mlp)
        return x


def transformer_modules(config: GPTConfig, block: Callable[[GPTConfig, int], nn.Module]) -> nn.ModuleDict:
    """Embeddings, the blocks block(config, l) for l = 1..L, and the final norm, by GPT-2's names
    (LLaMA's block has no position table wpe: RoPE). The exported Hugging Face model builds its
    body here too, with its cached block."""
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


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        connection = CONNECTIONS[config.connection]
        self.transformer = transformer_modules(config, Block)
        self.lm_head = connection.lm_head(config)
        if connection.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight  # weight tying
        if config.loss_chunk_tokens:
            head_weight_bias(self.lm_head)  # a head the chunked loss cannot compute: refused here, not at the first step

        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Every parameter's initial value, drawn in one fixed order (the same seed gives the same
        model). Also run on a model built on the meta device once its shards exist (FSDP's start)."""
        for module in self.modules():  # constants first: they draw no random numbers
            for name, value in getattr(module, "constant_inits", {}).items():
                getattr(module, name).fill_(value)
        self.apply(self._init_weights)
        # Residual projections get std 0.02 / sqrt(2L), as GPT-2.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))
        self._scale_init_for_mup()
        CONNECTIONS[self.config.connection].after_init(self)

    def _scale_init_for_mup(self) -> None:
        """μP's init (mup.py): rescale the stds above by kind; nothing at all when the ratio is 1."""
        ratio = self.config.mup_ratio
        if ratio == 1.0:
            return
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.mul_(init_scale(param_kind(name, p), ratio))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; position embeddings excluded by default, token embeddings (tied to the head) counted, as nanoGPT."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def embed(self, idx: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        """Token embeddings (+ position embeddings in GPT-2's block), then the connection's embedding
        norm; pos (B, T) overrides the positions 0..T-1 (packed rows restart them per segment)."""
        b, t = idx.size()
        if t > self.config.block_size:
            raise ValueError(f"Cannot forward a sequence of length {t}; block_size is {self.config.block_size}.")
        x = self.transformer.wte(idx)
        if "wpe" in self.transformer:  # LLaMA's block places tokens by RoPE, in the attention
            if pos is None:
                pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
            x = x + self.transformer.wpe(pos)
        return self.transformer.embed_norm(self.transformer.drop(x))

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, V) and, given targets, the mean cross-entropy (-1 ignored); last_only=True
        computes logits for the last position only (fast sampling). Training with loss_chunk_tokens
        set returns (None, the same loss computed in chunks): no logits are formed."""
        x = self.final_hidden(idx)
        if targets is not None and self.config.loss_chunk_tokens and self.training:
            return None, head_loss(self.lm_head, x, targets, self.config.loss_chunk_tokens)  # no logits formed
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-1)
            return logits, loss
        if last_only:
            x = x[:, [-1], :]  # a list index keeps the time dimension
        return self.lm_head(x), None

    def final_hidden(self, idx: torch.Tensor, pos: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The hidden states (B, T, d) that the LM head reads, after ln_f (zero-shot scoring applies
        the head to the few rows it needs). pos (B, T) and attn_mask (B, T, T, True = may attend) let
        one row hold several sequences that share a prefix: every connection acts on each token
        alone, so only the attention and the position embedding need to know where one lies."""
        x = self.embed(idx, pos)
        for block in self.transformer.h:
            x = block(x, attn_mask, pos)
        x = self.transformer.ln_f(x)
        # μP's logit multiplier, on the head's input (the same for a bias-free linear head), so
        # every caller of lm_head gets it; skipped at ratio 1 so the model stays today's exactly.
        multiplier = output_multiplier(self.config.mup_ratio)
        return x if multiplier == 1.0 else x * multiplier

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """The connection's step after each optimizer step (Connection.after_optimizer_step)."""
        CONNECTIONS[self.config.connection].after_optimizer_step(self)


    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None) -> torch.Tensor:
        """Sample max_new_tokens after the prompt idx (B, T); temperature 0 is greedy."""
        for _ in range(max_new_tokens):
            idx_cond = idx[:, -self.config.block_size :]
            logits, _ = self(idx_cond, last_only=True)
            logits = logits[:, -1, :]
            if temperature == 0:
                idx_next = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("inf")
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
