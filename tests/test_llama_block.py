"""LLaMA's block (--block=llama) against the formulas that define it, written here from scratch:
RoPE as a complex rotation, SwiGLU, RMSNorm, Meta's hidden-size rule, a whole pre-LN LLaMA
model; and what must not change: no biases or position table in LLaMA's block, GPT-2's block
as it was before the block key existed, packed zero-shot rows scored as if each sequence ran
alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from spheretnorm.model import CONNECTIONS, GPT, DyT, GPTConfig, LayerNorm, RMSNorm, apply_rotary, rotary_cos_sin

REPO = Path(__file__).resolve().parents[1]
THETA = 10000.0  # LLaMA's RoPE base
RMS_EPS = 1e-6  # LLaMA's RMSNorm epsilon
COMMIT_BEFORE_BLOCKS = "e377260~1"  # the last model.py without the block key


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run faster on one thread


def tiny_config(**keys) -> GPTConfig:
    base = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=48, dropout=0.0)
    return GPTConfig(**{**base, **keys})


def seeded_model(seed: int = 0, **keys) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny_config(**keys)).eval()


# -----------------------------------------------------------------------------
# Independent reference formulas (fp64); test_ngpt.py uses them too


def rope_reference(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """RoPE as a complex product: x[i] + 1j x[i + hs/2] times exp(1j pos theta^(-2i/hs)).

    x is (B, nh, T, hs); pos is (T,) or (B, T). Returns fp64.
    """
    hs = x.size(-1)
    half = hs // 2
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    freq = THETA ** (-2.0 * torch.arange(half, dtype=torch.float64) / hs)
    angle = pos.double()[..., None] * freq  # (T, half) or (B, T, half)
    if pos.dim() == 2:
        angle = angle[:, None]  # the same angles for every head
    turned = z * torch.exp(1j * angle)
    return torch.cat((turned.real, turned.imag), dim=-1)


def silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1.0 + torch.exp(-x))


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = RMS_EPS) -> torch.Tensor:
    x = x.double()
    return weight.double() * x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)


def meta_hidden(d: int, multiple_of: int = 64) -> int:
    """LLaMA's FeedForward width (Meta's model.py): 2/3 of 4d, rounded up to multiple_of."""
    hidden = int(2 * (4 * d) / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale q k^T, causal) v on (B, nh, T, hs)."""
    T = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) * scale
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v


def split_heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    B, T, C = x.shape
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    B, nh, T, hs = x.shape
    return x.transpose(1, 2).reshape(B, T, nh * hs)


def pre_ln_llama_logits(state: dict[str, torch.Tensor], config: GPTConfig, idx: torch.Tensor) -> torch.Tensor:
    """A pre-LN LLaMA from its definition: h += Attn(RMSNorm(h)) with RoPE on q, k; h +=
    SwiGLU(RMSNorm(h)); logits = RMSNorm(h) E^T with the head tied to the embedding."""
    W = {k: v.double() for k, v in state.items()}
    d, nh = config.n_embd, config.n_head
    h = W["transformer.wte.weight"][idx]  # no position table: positions enter by RoPE
    pos = torch.arange(idx.size(1))
    for layer in range(config.n_layer):
        p = f"transformer.h.{layer}."
        x = rms_norm_reference(h, W[p + "conn_attn.ln.weight"])
        q, k, v = (split_heads(t, nh) for t in (x @ W[p + "attn.c_attn.weight"].T).split(d, dim=-1))
        y = causal_attention(rope_reference(q, pos), rope_reference(k, pos), v, 1.0 / math.sqrt(d // nh))
        h = h + merge_heads(y) @ W[p + "attn.c_proj.weight"].T
        x = rms_norm_reference(h, W[p + "conn_mlp.ln.weight"])
        gate, up = W[p + "mlp.c_fc.weight"].chunk(2, dim=0)
        h = h + (silu(x @ gate.T) * (x @ up.T)) @ W[p + "mlp.c_proj.weight"].T
    return rms_norm_reference(h, W["transformer.ln_f.weight"]) @ W["transformer.wte.weight"].T


# -----------------------------------------------------------------------------
# RoPE


def rotate(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """RoPE of x (B, nh, T, hs) at positions pos (T,) or (B, T), as the attention turns q and k."""
    return apply_rotary(x, *rotary_cos_sin(pos, x.size(-1), x.device))


@pytest.mark.parametrize("pos_shape", ["T", "BT"])
def test_rope_is_the_complex_rotation(pos_shape: str) -> None:
    gen = torch.Generator().manual_seed(0)
    B, nh, T, hs = 3, 2, 7, 16
    x = torch.randn(B, nh, T, hs, generator=gen)
    # (B, T): each row its own positions, not 0..T-1 (packed rows restart them).
    pos = torch.arange(T) if pos_shape == "T" else torch.randint(0, 60, (B, T), generator=gen)
    got = rotate(x, pos)
    assert got.dtype == x.dtype and got.shape == x.shape
    torch.testing.assert_close(got.double(), rope_reference(x, pos), rtol=1e-5, atol=2e-5)


def test_rope_rotates_the_half_split_planes_not_adjacent_pairs() -> None:
    # A vector in plane (0, hs/2) stays in that plane: the interleaved layout would move it to dims 0, 1.
    hs = 8
    x = torch.zeros(1, 1, 1, hs)
    x[..., 0] = 1.0
    got = rotate(x, torch.tensor([1]))[0, 0, 0]
    torch.testing.assert_close(got[[0, hs // 2]], torch.tensor([math.cos(1.0), math.sin(1.0)]))
    assert got[[1, 2, 3, 5, 6, 7]].abs().max() == 0


def test_rope_scores_depend_on_relative_positions_only() -> None:
    gen = torch.Generator().manual_seed(1)
    hs = 16
    q, k = torch.randn(2, 1, 1, 1, hs, generator=gen, dtype=torch.float64)

    def score(m: int, n: int) -> float:
        return float((rotate(q, torch.tensor([m])) * rotate(k, torch.tensor([n]))).sum())

    for m, n in [(0, 0), (5, 2), (3, 11), (17, 17)]:
        for shift in (1, 7, 40):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)  # the distance itself does matter


# -----------------------------------------------------------------------------
# SwiGLU and its width


# Meta's rule with multiple_of = 64. LLaMA-7B's 11008 at d = 4096 is the same rule with
# multiple_of = 256 (Meta's default); with 64 it is 10944.
@pytest.mark.parametrize("d, hidden", [(128, 384), (768, 2048), (1024, 2752), (4096, 10944)])
def test_swiglu_hidden_width_is_metas_rule(d: int, hidden: int) -> None:
    assert meta_hidden(d) == hidden  # the table above is Meta's rule
    if d == 4096:
        assert meta_hidden(d, multiple_of=256) == 11008  # LLaMA-7B's intermediate_size
    config = GPTConfig(n_layer=1, n_head=8, n_embd=d, block_size=8, vocab_size=64, block="llama")
    assert config.mlp_hidden == hidden
    assert GPTConfig(n_layer=1, n_head=8, n_embd=d, block_size=8, vocab_size=64).mlp_hidden == 4 * d  # GPT-2's


def test_swiglu_is_down_of_silu_gate_times_up() -> None:
    model = seeded_model(block="llama", n_embd=128, n_head=4)
    mlp = model.transformer.h[0].mlp
    d, hidden = 128, 384
    assert tuple(mlp.c_fc.weight.shape) == (2 * hidden, d) and tuple(mlp.c_proj.weight.shape) == (d, hidden)
    assert mlp.c_fc.bias is None and mlp.c_proj.bias is None
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():  # pre-activations of order 1, where SiLU is far from linear
        mlp.c_fc.weight.copy_(torch.randn(2 * hidden, d, generator=gen) / math.sqrt(d))
    x = torch.randn(2, 5, d, generator=gen)
    w_gate, w_up = mlp.c_fc.weight[:hidden].double(), mlp.c_fc.weight[hidden:].double()
    want = (silu(x.double() @ w_gate.T) * (x.double() @ w_up.T)) @ mlp.c_proj.weight.double().T
    with torch.no_grad():
        got = mlp(x)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


# -----------------------------------------------------------------------------
# RMSNorm


def rms_inputs(dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6, 32, generator=gen) * 3.0
    x[0, 0] = 1e-4  # mean(x^2) = 1e-8, so eps = 1e-6 sets the scale: 1e-5 would give 0.03, not 0.0995
    x[0, 1] = 0.0  # no division by zero
    return x.to(dtype)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_rms_norm_is_its_definition(dtype: torch.dtype, tol: float) -> None:
    norm = RMSNorm(32)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(-2.0, 3.0, 32))
    x = rms_inputs(dtype)
    with torch.no_grad():
        got = norm(x)
    want = rms_norm_reference(x, norm.weight)
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[0, 0].double(), norm.weight.double() * 1e-4 / math.sqrt(1e-8 + RMS_EPS), rtol=tol, atol=1e-6)


# -----------------------------------------------------------------------------
# The whole block


def test_pre_ln_llama_model_is_the_reference() -> None:
    model = seeded_model(block="llama")
    with torch.no_grad():  # norm gains away from 1, so a missing gain shows
        for name, p in model.named_parameters():
            if name.endswith("ln.weight") or name.endswith("ln_f.weight"):
                p.copy_(torch.linspace(0.5, 1.5, p.numel()))
    idx = torch.randint(0, 48, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got, _ = model(idx)
    want = pre_ln_llama_logits(model.state_dict(), model.config, idx)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def linear_and_norm_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.LayerNorm, LayerNorm, RMSNorm)):
            yield name, module


@pytest.mark.parametrize("connection", list(CONNECTIONS))
def test_llama_block_has_no_biases_and_no_position_table(connection: str) -> None:
    model = seeded_model(block="llama", connection=connection)
    assert model.config.bias is False
    assert "wpe" not in model.transformer
    assert not any("wpe" in key for key in model.state_dict())
    for name, module in linear_and_norm_modules(model):
        assert getattr(module, "bias", None) is None, f"{name} has a bias"
        # LLaMA normalises by RMSNorm; a LayerNorm anywhere means the block choice did not reach it.
        assert not isinstance(module, (nn.LayerNorm, LayerNorm)), f"{name} is a LayerNorm"
    # The only parameters named bias are DyT's own b (part of DyT's definition, not a layer bias).
    biases = [n for n, _ in model.named_parameters() if n.endswith(".bias")]
    dyt = {f"{n}.bias" for n, m in model.named_modules() if isinstance(m, DyT)}
    assert set(biases) <= dyt, biases
    for name, module in model.named_modules():
        if isinstance(module, RMSNorm):
            assert module.eps == RMS_EPS, name


def test_llama_pre_ln_norms_are_rms_norms() -> None:
    model = seeded_model(block="llama")
    norms = {n for n, m in model.named_modules() if isinstance(m, RMSNorm)}
    assert norms == {"transformer.h.0.conn_attn.ln", "transformer.h.0.conn_mlp.ln", "transformer.h.1.conn_attn.ln", "transformer.h.1.conn_mlp.ln", "transformer.ln_f"}


# The state dict of GPT-2's pre-LN block (1 layer, d = 32) as model.py wrote it before --block.
GPT2_PRE_LN_KEYS = [
    ("transformer.wte.weight", (48, 32)),
    ("transformer.wpe.weight", (16, 32)),
    ("transformer.h.0.attn.c_attn.weight", (96, 32)),
    ("transformer.h.0.attn.c_attn.bias", (96,)),
    ("transformer.h.0.attn.c_proj.weight", (32, 32)),
    ("transformer.h.0.attn.c_proj.bias", (32,)),
    ("transformer.h.0.mlp.c_fc.weight", (128, 32)),
    ("transformer.h.0.mlp.c_fc.bias", (128,)),
    ("transformer.h.0.mlp.c_proj.weight", (32, 128)),
    ("transformer.h.0.mlp.c_proj.bias", (32,)),
    ("transformer.h.0.conn_attn.ln.weight", (32,)),
    ("transformer.h.0.conn_attn.ln.bias", (32,)),
    ("transformer.h.0.conn_mlp.ln.weight", (32,)),
    ("transformer.h.0.conn_mlp.ln.bias", (32,)),
    ("transformer.ln_f.weight", (32,)),
    ("transformer.ln_f.bias", (32,)),
    ("lm_head.weight", (48, 32)),
]


def test_gpt2_pre_ln_state_dict_is_unchanged() -> None:
    model = seeded_model(n_layer=1)
    assert [(k, tuple(v.shape)) for k, v in model.state_dict().items()] == GPT2_PRE_LN_KEYS
    assert model.transformer.wte.weight is model.lm_head.weight  # still tied
    assert isinstance(model.transformer.h[0].conn_attn.ln, LayerNorm)


# What the package before --block computes: run in a subprocess on that commit's own package
# (git archive), so that the comparison holds however the package is laid out today.
OLD_PACKAGE_SCRIPT = """
import sys, torch
from spheretnorm.model import CONNECTIONS, GPT, GPTConfig
idx = torch.randint(0, 48, (2, 16), generator=torch.Generator().manual_seed(5))
out = {}
for connection in CONNECTIONS:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=48, connection=connection)).eval()
    with torch.no_grad():
        out[connection] = {"state": model.state_dict(), "logits": model(idx)[0], "idx": idx}
torch.save(out, sys.argv[1])
"""


@pytest.fixture(scope="module")
def before_blocks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, torch.Tensor]]:
    """Per connection of the package before --block: its initial weights at seed 0 and its logits."""
    root = tmp_path_factory.mktemp("before_blocks")
    archive = subprocess.run(["git", "archive", "--format=tar", COMMIT_BEFORE_BLOCKS, "spheretnorm"], cwd=REPO, capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"no git history with {COMMIT_BEFORE_BLOCKS} here: {archive.stderr.decode().strip()[:200]}")
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    out = root / "before.pt"
    # That commit's spheretnorm, not the installed one; the fused update in eager ops, as in this test.
    env = {**os.environ, "PYTHONPATH": str(root), "SPHERETNORM_EAGER_KERNELS": "1"}
    result = subprocess.run([sys.executable, "-c", OLD_PACKAGE_SCRIPT, str(out)], cwd=root, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    return torch.load(out, weights_only=True)


def test_gpt2_block_builds_and_computes_as_before(before_blocks: dict[str, dict[str, torch.Tensor]]) -> None:
    assert set(before_blocks) <= set(CONNECTIONS) and len(before_blocks) >= 10
    for connection, old in before_blocks.items():
        keys = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=48, connection=connection)
        now = seeded_model(**keys)
        want, got = old["state"], now.state_dict()
        assert list(got) == list(want), connection
        for key in want:
            assert torch.equal(got[key], want[key]), f"{connection}: {key} differs at the same seed"
        with torch.no_grad():
            assert torch.equal(now(old["idx"])[0], old["logits"]), connection


# -----------------------------------------------------------------------------
# Packed rows (zero-shot scoring): several sequences in one row, each as if alone

PACKED_CASES = [("llama", "pre_ln"), ("llama", "ngpt"), ("gpt2", "ngpt")]


def segment_mask(segments: list[int]) -> torch.Tensor:
    """(1, T, T): causal, and a query sees its own segment and segment 0 (the shared prefix) only."""
    seg = torch.tensor(segments)
    causal = torch.ones(len(seg), len(seg), dtype=torch.bool).tril()
    return (causal & ((seg[None, :] == 0) | (seg[None, :] == seg[:, None])))[None]


def block_causal_mask(lengths: list[int]) -> torch.Tensor:
    """(1, T, T): each sequence of the row attends causally to itself only."""
    seg = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    causal = torch.ones(len(seg), len(seg), dtype=torch.bool).tril()
    return (causal & (seg[None, :] == seg[:, None]))[None]


def two_sequences() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(6)
    return torch.randint(0, 48, (9,), generator=gen), torch.randint(0, 48, (6,), generator=gen)


@pytest.mark.parametrize("block, connection", PACKED_CASES)
def test_two_packed_sequences_get_the_hidden_states_they_get_alone(block: str, connection: str) -> None:
    model = seeded_model(block=block, connection=connection)
    first, second = two_sequences()
    idx = torch.cat((first, second))[None]
    pos = torch.cat((torch.arange(9), torch.arange(6)))[None]  # positions restart at the second
    mask = block_causal_mask([9, 6])
    with torch.no_grad():
        packed = model.final_hidden(idx, pos, mask)[0]
        alone = [model.final_hidden(seq[None])[0] for seq in (first, second)]
        plain_causal = model.final_hidden(idx, pos)[0]
    torch.testing.assert_close(packed[:9], alone[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed[9:], alone[1], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(plain_causal[9:], alone[1], atol=1e-4)  # the mask is what separates them


@pytest.mark.parametrize("block, connection", PACKED_CASES)
def test_continuations_sharing_a_prefix_get_the_hidden_states_they_get_alone(block: str, connection: str) -> None:
    """The evaluator's layout: prefix P, then continuations A and B, each after P alone; the
    positions of both continue from the end of P."""
    model = seeded_model(block=block, connection=connection)
    first, a = two_sequences()
    prefix, b = first[:7], a.flip(0)[:3]  # 7 + 6 + 3 = block_size
    n = len(prefix)
    idx = torch.cat((prefix, a, b))[None]
    pos = torch.cat((torch.arange(n), n + torch.arange(len(a)), n + torch.arange(len(b))))[None]
    mask = segment_mask([0] * n + [1] * len(a) + [2] * len(b))
    with torch.no_grad():
        packed = model.final_hidden(idx, pos, mask)[0]
        after_a = model.final_hidden(torch.cat((prefix, a))[None])[0]
        after_b = model.final_hidden(torch.cat((prefix, b))[None])[0]
        # B placed after A (positions not restarted): RoPE sees the wrong distance to P.
        unrestarted = model.final_hidden(idx, torch.arange(idx.size(1))[None], mask)[0]
    torch.testing.assert_close(packed[: n + len(a)], after_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed[n + len(a) :], after_b[n:], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(unrestarted[n + len(a) :], after_b[n:], atol=1e-4)
