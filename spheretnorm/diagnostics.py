"""What the paper's argument rests on, as small pure functions of hidden states and attention weights.

residual_stream_report runs one batch through a GPT (model.py), hands each hidden state and
each attention matrix to these functions and returns the numbers; train.py decides when to
call it and where to write them. The model does not import this module. Every function reduces
to a plain float, averaged over the tokens of the batch, so a metrics row stays small at any
model size.

DIAGNOSTICS is the one table of what an eval row holds besides the losses: each entry's key,
what its index counts, its labels, its scale, whether it is drawn, shown on the console and
summarised in the CPU studies' tables. Every reader (runtime/tracking.py, experiments/figures.py,
experiments/study.py) takes the diagnostics from it; none keeps a list of its own.

Shapes: a hidden state h is (B, T, d); an attention matrix is (B, n_head, T, T) with rows the
queries (each row sums to 1 over the keys it may see).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.nn import functional as F

from spheretnorm.model import ScaleNorm, SphereConnection

# Guards the divisions below against an all-zero state (never seen in a trained model).
EPS = 1e-12

# What a series' index counts: the layer states (the embedding output, then each block's
# output), the blocks, or the connection calls (two per block).
INDEXES = ("layer", "block", "sublayer")
SCALES = ("linear", "log")
# Where a diagnostic is measured: one val batch through the model (residual_stream_report), or
# the model's parameters alone (step_sizes).
SOURCES = ("batch", "parameters")


def _last_over_first(values: list[float]) -> float | None:
    # Below 1: the last sublayer does less than the first (the curse of depth); no ratio to a 0.
    return values[-1] / values[0] if values[0] > 0 else None


# How a study reduces a diagnostic of one eval row to one number (Summary.reduce).
REDUCTIONS: dict[str, Callable[[Any], float | None]] = {
    "value": lambda value: value,
    "mean": statistics.fmean,
    "max": max,
    "last/first": _last_over_first,
}


@dataclass(frozen=True)
class Summary:
    """One number a study's table shows of a diagnostic of a run's last evaluation."""

    key: str  # its key in the study's rows (and <study>.json)
    reduce: str  # a name of REDUCTIONS
    header: str  # its column header
    fmt: str  # its format spec in a table cell

    def __post_init__(self) -> None:
        if self.reduce not in REDUCTIONS:
            raise ValueError(f"Summary {self.key!r}: reduce={self.reduce!r} is none of {', '.join(REDUCTIONS)}.")


@dataclass(frozen=True)
class Diagnostic:
    """One diagnostic of an eval row: its key, what its values are, and how every reader shows it.

    The console line, the metrics rows, W&B (runtime/tracking.py), the figures
    (experiments/figures.py) and the CPU studies' tables (experiments/study.py) all read
    DIAGNOSTICS; an entry here and its numbers in the row are all a new diagnostic needs.
    """

    name: str  # its key in the eval row; W&B: diag.<name>/<index>_NN per entry and diag/<name>_mean, ...
    index: str | None  # what a list's index counts (INDEXES); None: one number per row
    label: str  # what it is, in figure titles and colour bars
    short: str  # its name on the console line
    source: str = "batch"  # SOURCES
    scale: str = "linear"  # SCALES: the colour (or y) scale of its figure
    drawn: bool = False  # plot.py --diagnostics draws it (a heatmap for a series, a line per run for a number)
    console: str = ""  # its format spec on the eval console line; "": not shown there
    summaries: tuple[Summary, ...] = ()  # the columns a study's table gives it
    # The smallest value it can take (a ratio of magnitudes, a probability: 0); a value below it
    # is damage, flagged and left out of its figure rather than drawn as data. None: no bound.
    lowest: float | None = None

    def impossible(self, value: float) -> bool:
        """Whether `value` lies below the smallest value this diagnostic can take."""
        return self.lowest is not None and value < self.lowest

    def __post_init__(self) -> None:
        for field_name, value, allowed in (("index", self.index, (None, *INDEXES)), ("scale", self.scale, SCALES), ("source", self.source, SOURCES)):
            if value not in allowed:
                raise ValueError(f"Diagnostic {self.name!r}: {field_name}={value!r} is none of {', '.join(map(str, allowed))}.")

    @property
    def is_series(self) -> bool:
        return self.index is not None

    def summarise(self, value: Any) -> dict[str, float | None]:
        """Its study columns for one eval row's value (None: the row lacks it, or it is empty)."""
        present = value is not None and value != []
        return {s.key: REDUCTIONS[s.reduce](value) if present else None for s in self.summaries}


# Every diagnostic of an eval row. The series are in the order residual_stream_report fills
# them, so a metrics row keeps its key order; final_cosine, the collapse alarm's number, leads
# the console line and the study tables.
DIAGNOSTICS: tuple[Diagnostic, ...] = (
    Diagnostic("final_cosine", None, "mean pairwise cosine of the final states", "final cosine", console=".3f",
               summaries=(Summary("final_cosine", "value", "final cosine", ".3f"),)),
    Diagnostic("rms", "layer", "RMS of the state", "rms", console=".2f"),
    # The two ratios span decades between the first and the last layers, the attention sink does not.
    Diagnostic("massive_ratio", "layer", "max |h| / median |h|", "massive max/med", scale="log", drawn=True,
               summaries=(Summary("massive_ratio", "max", "massive max/med", ".1f"),), lowest=0.0),
    Diagnostic("massive_top", "layer", "max |h|", "massive max"),
    Diagnostic("attn_sink", "block", "attention mass on the first token", "attn sink", drawn=True,
               summaries=(Summary("attn_sink", "mean", "attn sink", ".3f"),), lowest=0.0),
    Diagnostic("angle", "sublayer", "angle (radians) between h before and h after", "angle"),
    Diagnostic("contribution", "sublayer", "layer contribution 1 - cos(h before, h after)", "1 - cos", scale="log", drawn=True,
               summaries=(Summary("contribution", "mean", "1 - cos", ".4f"), Summary("contribution_last_first", "last/first", "last/first", ".2f"))),
    Diagnostic("update_ratio", "sublayer", "update ||h after - h before|| / ||h before||", "update", scale="log", drawn=True,
               summaries=(Summary("update_ratio", "mean", "update", ".3f"),), lowest=0.0),
    Diagnostic("step_sizes", "sublayer", "sphere step size alpha", "alpha", source="parameters"),
    # Whether a clamp holds a learnable scale at its cap, where it passes no gradient: the paper's
    # step size starts at its cap and, in CPU runs, never left it (docs/LOG.md, issue 27).
    Diagnostic("step_pinned", "sublayer", "sphere step size at its cap (1: pinned)", "alpha pinned", source="parameters",
               drawn=True, summaries=(Summary("step_pinned", "mean", "alpha pinned", ".2f"),)),
    Diagnostic("radius", None, "embedding radius (ScaleNorm) / sqrt(d)", "radius", source="parameters",
               summaries=(Summary("radius", "value", "radius/sqrt(d)", ".3f"),)),
    Diagnostic("radius_pinned", None, "embedding radius at its cap (1: pinned)", "radius pinned", source="parameters",
               console=".0f", summaries=(Summary("radius_pinned", "value", "radius pinned", ".0f"),)),
)


# The same entries by eval-row key (a view of DIAGNOSTICS, not a second list).
DIAGNOSTIC_BY_NAME: dict[str, Diagnostic] = {d.name: d for d in DIAGNOSTICS}


def lacking(rows_per_run: Sequence[Sequence[dict[str, Any]]], entries: Iterable[Diagnostic]) -> dict[str, int]:
    """{name: how many runs have eval rows but none with it}, for the entries some runs lack.

    A run written before a diagnostic existed has no key for it; an empty list (step_sizes of a
    Euclidean model) is a value, not an absence, and a run with no eval row yet lacks nothing.
    """
    evaluated = [rows for rows in rows_per_run if rows]
    counts = {d.name: sum(not any(d.name in row for row in rows) for rows in evaluated) for d in entries}
    return {name: n for name, n in counts.items() if n}


def lacking_note(counts: dict[str, int], runs: int, consequence: str) -> str:
    """One sentence naming each diagnostic some runs lack, how many lack it, and what that means."""
    named = ", ".join(f"{name} ({n} of {runs} runs)" for name, n in counts.items())
    return f"note: runs written before a diagnostic existed lack it, so it is {consequence} for them: {named}."


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
    """Every batch diagnostic of DIAGNOSTICS for one batch through a GPT (model.py): the
    embedding output, then each block's two connection calls, with the attention weights read
    where the connection hands the attention its input."""
    x = model.embed(idx)
    out: dict[str, Any] = {d.name: [] for d in DIAGNOSTICS if d.source == "batch" and d.is_series}
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


def _sphere_connections(model: torch.nn.Module) -> list[SphereConnection]:
    return [conn for block in model.transformer.h for conn in (block.conn_attn, block.conn_mlp) if isinstance(conn, SphereConnection)]


def step_sizes(model: torch.nn.Module) -> list[float]:
    """The current sphere step size alpha of every sublayer (empty for Euclidean models)."""
    return [conn.step_size().item() for conn in _sphere_connections(model)]


def step_pinned(model: torch.nn.Module) -> list[float]:
    """1.0 for every sublayer whose softplus(a) is at or above its cap alpha_cap (alpha is then
    alpha_cap * lambda_l, and under alpha_cap_grad=stop a gets no gradient once above), else 0.0;
    empty without a cap. 1 minus their mean is the share of sublayers whose step is below lambda_l."""
    return [
        float(F.softplus(conn.a.detach().float()).item() >= conn.alpha_cap)
        for conn in _sphere_connections(model)
        if conn.alpha_cap is not None
    ]


def embedding_radius(model: torch.nn.Module) -> tuple[float | None, float | None]:
    """(radius / sqrt(d), 1.0 if softplus(gamma) is at or above its cap else 0.0) of the
    embedding's ScaleNorm; (None, None) for a model without one, a cap of None gives (r, 0.0)."""
    norm = model.transformer.embed_norm
    if not isinstance(norm, ScaleNorm):
        return None, None
    raw = F.softplus(norm.gamma.detach().float()).item()
    pinned = norm.max_radius is not None and raw >= norm.max_radius
    return norm.radius().item() / math.sqrt(model.config.n_embd), float(pinned)


def pinned_note(row: dict[str, Any], step_learns_above_cap: bool = False) -> str:
    """' The sphere step size sits at its cap in 24 of 24 sublayers and ... (--alpha_cap=none ...).'
    for an eval row where a cap holds, '' elsewhere: the sentence the collapse alarm adds. With
    step_learns_above_cap (alpha_cap_grad=straight_through) the step size still learns there, so
    only the radius is called stuck."""
    pinned = row.get("step_pinned") or []
    stuck = [f"the sphere step size sits at its cap in {int(sum(pinned))} of {len(pinned)} sublayers"] if sum(pinned) and not step_learns_above_cap else []
    if row.get("radius_pinned"):
        stuck.append("the embedding radius sits at its cap")
    if not stuck:
        return ""
    text = " and ".join(stuck)
    return f" {text[0].upper()}{text[1:]}, where a scale learns no more (--alpha_cap=none and --radius_cap=none lift the caps)."


def parameter_report(model: torch.nn.Module) -> dict[str, Any]:
    """Every diagnostic of DIAGNOSTICS whose source is the parameters, by name."""
    radius, radius_pinned = embedding_radius(model)
    return {"step_sizes": step_sizes(model), "step_pinned": step_pinned(model), "radius": radius, "radius_pinned": radius_pinned}
