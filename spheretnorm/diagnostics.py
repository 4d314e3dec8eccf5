"""What the paper's argument rests on, as small pure functions of hidden states and attention weights.

residual_stream_report runs one batch through a GPT (model.py), hands each hidden state and
each attention matrix to these functions and returns the numbers; train.py decides when to
call it and where to write them. The model does not import this module. Every function reduces to a plain float, averaged over the tokens of
the batch, so a metrics row stays small at any model size.

Shapes: a hidden state h is (B, T, d); an attention matrix is (B, n_head, T, T) with rows the
queries (each row sums to 1 over the keys it may see).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from spheretnorm.model import SphereConnection

# Guards the divisions below against an all-zero state (never seen in a trained model).
EPS = 1e-12
# The per-layer lists of residual_stream_report, and what their index counts (for W&B names and plots).
DIAGNOSTIC_SERIES = {
    "rms": "layer",
    "massive_ratio": "layer",
    "massive_top": "layer",
    "attn_sink": "block",
    "angle": "sublayer",
    "contribution": "sublayer",
    "update_ratio": "sublayer",
}


def rms(h: torch.Tensor) -> float:
    """Root mean square of each token's state, averaged over the tokens."""
    return h.float().pow(2).mean(dim=-1).sqrt().mean().item()


def mean_angle(h_in: torch.Tensor, h_out: torch.Tensor) -> float:
    """Mean angle (radians) between each token's state before and after an update."""
    cos = F.cosine_similarity(h_in.float(), h_out.float(), dim=-1, eps=EPS)
    return torch.acos(cos.clamp(-1.0, 1.0)).mean().item()


def contribution(h_in: torch.Tensor, h_out: torch.Tensor) -> float:
    """Layer contribution 1 - cos(h_in, h_out), averaged over the tokens.

    0 means the sublayer left every token's direction as it was (a layer that does nothing, the
    curse of depth); it is comparable between Euclidean and sphere connections because it
    ignores the norm.
    """
    cos = F.cosine_similarity(h_in.float(), h_out.float(), dim=-1, eps=EPS)
    return (1.0 - cos).mean().item()


def update_ratio(h_in: torch.Tensor, h_out: torch.Tensor) -> float:
    """Effective update norm ||h_out - h_in|| / ||h_in||, averaged over the tokens."""
    h_in, h_out = h_in.float(), h_out.float()
    ratio = (h_out - h_in).norm(dim=-1) / h_in.norm(dim=-1).clamp_min(EPS)
    return ratio.mean().item()


def massive_activation(h: torch.Tensor) -> tuple[float, float]:
    """(max |h_i| / median |h_i|, max |h_i|) over every entry of the batch's states.

    Massive activations (Sun et al. 2024) are a few entries thousands of times the typical
    magnitude; the ratio to the median finds them at any overall scale.
    """
    a = h.float().abs().flatten()
    top = a.max()
    return (top / a.median().clamp_min(EPS)).item(), top.item()


def first_token_mass(weights: torch.Tensor) -> float:
    """Attention sink: mean attention mass on the first token over batch, heads and queries.

    Query 0 can see only itself, so its mass 1 says nothing; it is left out (a one-token
    sequence has no other query and returns 1).
    """
    if weights.size(-2) < 2:
        return 1.0
    return weights[..., 1:, 0].float().mean().item()


def final_cosine(h: torch.Tensor) -> float:
    """Mean pairwise cosine between all tokens' states of the batch (1.0: every token one point).

    The sum over i != j of <u_i, u_j> is ||sum_i u_i||^2 - sum_i ||u_i||^2, which needs no
    n x n matrix (at 16 x 1024 tokens that matrix would be 1 GiB).
    """
    u = F.normalize(h.float().reshape(-1, h.size(-1)), dim=-1)
    n = u.size(0)
    if n < 2:
        return 1.0
    total = u.double().sum(dim=0)
    return ((total @ total - u.double().pow(2).sum()) / (n * (n - 1))).item()


@torch.no_grad()
def residual_stream_report(model: torch.nn.Module, idx: torch.Tensor) -> dict[str, Any]:
    """Every series of DIAGNOSTIC_SERIES and final_cosine for one batch through a GPT (model.py):
    the embedding output, then each block's two connection calls, with the attention weights
    read where the connection hands the attention its input."""
    x = model.embed(idx)
    out: dict[str, Any] = {key: [] for key in DIAGNOSTIC_SERIES}
    _record_layer(out, x)
    for block in model.transformer.h:
        sink: list[float] = []

        def attn(u: torch.Tensor, attn: torch.nn.Module = block.attn) -> torch.Tensor:
            # The connection decides what the attention sees (LN(h), h, ...): record it there.
            sink.append(first_token_mass(attn.attention_weights(u)))
            return attn(u)

        for conn, sub in ((block.conn_attn, attn), (block.conn_mlp, block.mlp)):
            y = conn(x, sub)
            out["angle"].append(mean_angle(x, y))
            out["contribution"].append(contribution(x, y))
            out["update_ratio"].append(update_ratio(x, y))
            x = y
        out["attn_sink"].extend(sink)
        _record_layer(out, x)
    out["final_cosine"] = final_cosine(model.transformer.ln_f(x))
    return out


def _record_layer(out: dict[str, Any], h: torch.Tensor) -> None:
    ratio, top = massive_activation(h)
    out["rms"].append(rms(h))
    out["massive_ratio"].append(ratio)
    out["massive_top"].append(top)


def step_sizes(model: torch.nn.Module) -> list[float]:
    """The current sphere step size alpha of every sublayer (empty for Euclidean models)."""
    return [
        conn.step_size().item()
        for block in model.transformer.h
        for conn in (block.conn_attn, block.conn_mlp)
        if isinstance(conn, SphereConnection)
    ]
