"""nGPT (--connection=ngpt; Loshchilov et al. 2024, arXiv 2410.01131) against its equations,
written here from scratch and fed the model's weights from its state dict:

    h <- Norm(h + |alpha_A| (Norm(Attn(h)) - h)),  h <- Norm(h + |alpha_M| (Norm(MLP(h)) - h))

with q, k unit per head times s_qk and softmax scale sqrt(hs) (RoPE before the norm in LLaMA's
block), MLP pre-activations times s_uv sqrt(d), logits s_z (W_head h), no final norm, the
embedding output unit. Each scale s is stored at s_scale = 1/sqrt(d) (s_uv at 1) and used as
stored * (s_init / s_scale). Also: the weights stay unit along the embedding axis after every
optimizer step (in train.py's loop too), the init values, no weight decay, clear config errors.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import train
from spheretnorm.optim import build_optimizer
from spheretnorm.runtime.config import TrainConfig
from spheretnorm.runtime.config import ConfigError, parse_config
from spheretnorm.model import GPT, GPTConfig
from spheretnorm.runtime.checkpoint import load_checkpoint
from test_llama_block import causal_attention, merge_heads, rope_reference, silu, split_heads
from test_train import data_dir, tiny_args  # noqa: F401  (data_dir: a fixture)

ALPHA_INIT = 0.05  # the paper's alpha_A, alpha_M at init
SCALES = ("alpha", "s_qk", "s_uv", "s_z")
BLOCKS = ("gpt2", "llama")


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run faster on one thread


def ngpt_config(block: str, **keys) -> GPTConfig:
    base = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=48, dropout=0.0, connection="ngpt", block=block)
    return GPTConfig(**{**base, **keys})


def ngpt_model(block: str, seed: int = 0, **keys) -> GPT:
    torch.manual_seed(seed)
    return GPT(ngpt_config(block, **keys)).eval()


# -----------------------------------------------------------------------------
# The reference nGPT, fp64, from the equations above


def norm(x: torch.Tensor) -> torch.Tensor:
    """nGPT's Norm: x / ||x|| along the last dimension."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True))


def gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


class Reference:
    """nGPT's forward pass from a state dict. `wrong` names one scale to double (a self-check:
    the comparison must notice it)."""

    def __init__(self, state: dict[str, torch.Tensor], config: GPTConfig, wrong: str | None = None):
        self.W = {k: v.detach().double() for k, v in state.items()}
        self.config = config
        self.d = config.n_embd
        self.hs = config.n_embd // config.n_head
        self.wrong = wrong

    def used(self, key: str, kind: str, s_init: float, s_scale: float) -> torch.Tensor:
        """A scale as the model uses it: stored * (s_init / s_scale)."""
        value = self.W[key] * (s_init / s_scale)
        return 2.0 * value if kind == self.wrong else value

    def alpha(self, prefix: str) -> torch.Tensor:
        return self.used(prefix + ".alpha", "alpha", ALPHA_INIT, 1.0 / math.sqrt(self.d)).abs()

    def attention(self, h: torch.Tensor, p: str, pos: torch.Tensor) -> torch.Tensor:
        q, k, v = (split_heads(t, self.config.n_head) for t in (h @ self.W[p + "attn.c_attn.weight"].T).split(self.d, dim=-1))
        if self.config.block == "llama":  # RoPE before the normalisation
            q, k = rope_reference(q, pos), rope_reference(k, pos)
        s_qk = self.used(p + "attn.qk_norm.s_qk", "s_qk", 1.0, 1.0 / math.sqrt(self.d)).view(self.config.n_head, 1, self.hs)
        y = causal_attention(s_qk * norm(q), s_qk * norm(k), v, math.sqrt(self.hs))
        return merge_heads(y) @ self.W[p + "attn.c_proj.weight"].T

    def mlp(self, h: torch.Tensor, p: str) -> torch.Tensor:
        s_uv = self.used(p + "mlp.scale.s_uv", "s_uv", 1.0, 1.0) * math.sqrt(self.d)
        pre = (h @ self.W[p + "mlp.c_fc.weight"].T) * s_uv
        if self.config.block == "gpt2":
            act = gelu(pre)
        else:  # c_fc holds [gate; up], s_uv [s_v; s_u]
            gate, up = pre.chunk(2, dim=-1)
            act = silu(gate) * up
        return act @ self.W[p + "mlp.c_proj.weight"].T

    def block(self, h: torch.Tensor, layer: int, pos: torch.Tensor) -> torch.Tensor:
        p = f"transformer.h.{layer}."
        h = norm(h + self.alpha(p + "conn_attn") * (norm(self.attention(h, p, pos)) - h))
        return norm(h + self.alpha(p + "conn_mlp") * (norm(self.mlp(h, p)) - h))

    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1))
        x = self.W["transformer.wte.weight"][idx]
        if self.config.block == "gpt2":
            x = x + self.W["transformer.wpe.weight"][pos]
        h = norm(x)
        for layer in range(self.config.n_layer):
            h = self.block(h, layer, pos)
        s_z = self.used("lm_head.s_z", "s_z", 1.0, 1.0 / math.sqrt(self.d))
        return s_z * (h @ self.W["lm_head.weight"].T)  # no final norm, an untied head


def perturb_scales(model: GPT, seed: int = 7) -> None:
    """Move every scale away from its init (alpha to either sign, several times larger), so
    that a factor the model applies wrongly shows in its output."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            kind = name.rsplit(".", 1)[-1]
            if kind == "alpha":
                sign = torch.where(torch.rand(p.shape, generator=gen) < 0.3, -1.0, 1.0)
                p.mul_(sign * (1.0 + 5.0 * torch.rand(p.shape, generator=gen)))
            elif kind in SCALES:
                p.mul_(0.5 + 1.5 * torch.rand(p.shape, generator=gen))


def perturbed_model(block: str) -> GPT:
    model = ngpt_model(block)
    perturb_scales(model)
    return model.double()


# RoPE's angles are computed in fp32 whatever the dtype (model.rotary_cos_sin), so LLaMA's block agrees
# to fp32 precision only; GPT-2's is fp64 throughout.
TOLERANCE = {"gpt2": 1e-9, "llama": 2e-5}


@pytest.mark.parametrize("block", BLOCKS)
def test_one_block_is_the_reference(block: str) -> None:
    model = perturbed_model(block)
    h = norm(torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    with torch.no_grad():
        got = model.transformer.h[0](h)
    want = Reference(model.state_dict(), model.config).block(h, 0, torch.arange(16))
    torch.testing.assert_close(got, want, rtol=TOLERANCE[block], atol=TOLERANCE[block])


@pytest.mark.parametrize("block", BLOCKS)
def test_model_logits_are_the_reference(block: str) -> None:
    model = perturbed_model(block)
    idx = torch.randint(0, 48, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got, _ = model(idx)
    want = Reference(model.state_dict(), model.config).logits(idx)
    torch.testing.assert_close(got, want, rtol=TOLERANCE[block], atol=TOLERANCE[block])


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("scale", SCALES)
def test_a_wrong_scale_would_be_noticed(block: str, scale: str) -> None:
    """The comparisons above are sensitive: doubling any one scale in the reference moves the
    logits far beyond their tolerance."""
    model = perturbed_model(block)
    idx = torch.randint(0, 48, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got, _ = model(idx)
    wrong = Reference(model.state_dict(), model.config, wrong=scale).logits(idx)
    assert (got - wrong).abs().max() > 1e-3


def test_fp32_model_agrees_with_the_fp64_reference() -> None:
    model = ngpt_model("llama")
    perturb_scales(model)
    idx = torch.randint(0, 48, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, _ = model(idx)
    torch.testing.assert_close(got.double(), Reference(model.state_dict(), model.config).logits(idx), rtol=1e-4, atol=1e-4)


# -----------------------------------------------------------------------------
# Unit-norm matrices along the embedding axis


def embedding_axis_of(name: str, shape: torch.Size, d: int) -> int:
    """The axis of length d that a matrix's unit vectors lie along, by the matrix's role: an
    output projection into the residual stream (c_proj, d x hidden; square for attention)
    writes one d-long column per input unit; every other matrix (wte, wpe, lm_head, c_attn,
    c_fc) reads or holds one d-long row per output."""
    axis = 0 if name.endswith("c_proj.weight") else 1
    assert shape[axis] == d, f"{name} {tuple(shape)}: its axis {axis} is not the embedding's"
    return axis


def expected_matrices(config: GPTConfig) -> set[str]:
    names = {"transformer.wte.weight", "lm_head.weight"} | ({"transformer.wpe.weight"} if config.block == "gpt2" else set())
    for layer in range(config.n_layer):
        names |= {f"transformer.h.{layer}.{m}.weight" for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    return names


def matrices(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in model.named_parameters() if p.dim() == 2}


def assert_unit_along_embedding(weights: dict[str, torch.Tensor], config: GPTConfig, atol: float = 1e-5) -> None:
    """Every matrix unit along its embedding axis, and (in general) not along the other."""
    assert set(weights) == expected_matrices(config)
    for name, w in weights.items():
        axis = embedding_axis_of(name, w.shape, config.n_embd)
        along = w.float().norm(dim=axis)
        torch.testing.assert_close(along, torch.ones_like(along), rtol=0, atol=atol, msg=f"{name} is not unit along axis {axis}")
        across = w.float().norm(dim=1 - axis)
        assert not torch.allclose(across, torch.ones_like(across), atol=1e-3), f"{name} is unit along axis {1 - axis} too"


def random_optimizer_step(model: GPT, seed: int = 0) -> torch.optim.Optimizer:
    """One AdamW step of the model's own optimizer on random gradients (then the after-step hook)."""
    opt = build_optimizer(model, TrainConfig(weight_decay=0.1, learning_rate=1e-2, min_lr=0.0, beta1=0.9, beta2=0.95), "cpu")
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()
    return opt


@pytest.mark.parametrize("block", BLOCKS)
def test_matrices_are_unit_along_the_embedding_axis_at_init(block: str) -> None:
    model = ngpt_model(block)
    assert_unit_along_embedding(matrices(model), model.config)


@pytest.mark.parametrize("block", BLOCKS)
def test_matrices_are_unit_along_the_embedding_axis_after_a_step(block: str) -> None:
    model = ngpt_model(block)
    random_optimizer_step(model)
    stepped = {name: w.clone() for name, w in matrices(model).items()}
    vectors = {name: p.detach().clone() for name, p in model.named_parameters() if p.dim() < 2}
    # The step alone leaves the unit sphere, so what follows is the hook's doing.
    wte = stepped["transformer.wte.weight"].norm(dim=1)
    assert not torch.allclose(wte, torch.ones_like(wte), atol=1e-3)
    model.after_optimizer_step()
    assert_unit_along_embedding(matrices(model), model.config)
    for name, w in matrices(model).items():  # a rescaling along the right axis, no more
        axis = embedding_axis_of(name, w.shape, model.config.n_embd)
        torch.testing.assert_close(w, stepped[name] / stepped[name].norm(dim=axis, keepdim=True))
    for name, p in model.named_parameters():  # the scales are vectors: left alone
        if p.dim() < 2:
            assert torch.equal(p.detach(), vectors[name]), name


def test_train_py_keeps_the_matrices_unit(data_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=2", "--eval_interval=2", "--connection=ngpt"))
    ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    assert ckpt["iter_num"] == 2
    config = GPTConfig(**ckpt["model_config"])
    weights = {k: v for k, v in ckpt["model"].items() if v.dim() == 2}
    # Adam's steps move each entry by about the learning rate, which would put the norms ~1e-3 off.
    assert_unit_along_embedding(weights, config, atol=1e-6)
    assert ckpt["model"]["lm_head.weight"].data_ptr() != ckpt["model"]["transformer.wte.weight"].data_ptr()


# -----------------------------------------------------------------------------
# Init values, optimizer, config errors


@pytest.mark.parametrize("block", BLOCKS)
def test_scales_start_at_the_papers_values(block: str) -> None:
    model = ngpt_model(block)
    d = 32
    s_scale = 1.0 / math.sqrt(d)
    for name, p in model.named_parameters():
        kind = name.rsplit(".", 1)[-1]
        stored = {"alpha": s_scale, "s_qk": s_scale, "s_z": s_scale, "s_uv": 1.0}.get(kind)
        if stored is not None:
            torch.testing.assert_close(p.detach(), torch.full_like(p, stored), msg=name)
    for block_ in model.transformer.h:
        for conn in (block_.conn_attn, block_.conn_mlp):
            torch.testing.assert_close(conn.eigen_lr(), torch.full((d,), ALPHA_INIT))


@pytest.mark.parametrize("block", BLOCKS)
def test_alpha_acts_as_0_05_and_s_z_as_1_at_init(block: str) -> None:
    model = ngpt_model(block)
    gen = torch.Generator().manual_seed(4)
    h, f = norm(torch.randn(2, 5, 32, generator=gen)), torch.randn(2, 5, 32, generator=gen)
    with torch.no_grad():
        for conn in (model.transformer.h[1].conn_attn, model.transformer.h[1].conn_mlp):
            torch.testing.assert_close(conn(h, lambda x: f), norm(h + ALPHA_INIT * (norm(f) - h)))
        torch.testing.assert_close(model.lm_head(h), h @ model.lm_head.weight.T)


@pytest.mark.parametrize("block", BLOCKS)
def test_nothing_is_weight_decayed(block: str) -> None:
    model = ngpt_model(block)
    opt = build_optimizer(model, TrainConfig(weight_decay=0.1, learning_rate=1e-3, min_lr=0.0, beta1=0.9, beta2=0.95), "cpu")
    assert all(group["weight_decay"] == 0.0 for group in opt.param_groups)
    in_groups = [id(p) for group in opt.param_groups for p in group["params"]]
    assert sorted(in_groups) == sorted(id(p) for p in model.parameters())


@pytest.mark.parametrize(
    "keys, message",
    [
        (dict(bias=True), r"Connection 'ngpt' has no biases; set bias=False"),
        (dict(mup_base_width=16), r"nGPT .*no μP; set mup_base_width=0 \(got 16\)"),
    ],
)
@pytest.mark.parametrize("block", BLOCKS)
def test_unsupported_keys_are_clear_errors(block: str, keys: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ngpt_config(block, **keys)
    argv = ["--connection=ngpt", f"--block={block}", *(f"--{k}={str(v).lower()}" for k, v in keys.items())]
    with pytest.raises(ConfigError, match=message):
        parse_config(argv, world_size=1).model_config()


def test_bias_unset_or_false_is_fine() -> None:
    assert ngpt_config("gpt2").bias is False and ngpt_config("gpt2", bias=False).bias is False


# -----------------------------------------------------------------------------
# The update with a hand-derived backward (kernels.NGPTUpdate)


def test_the_fused_update_and_its_gradients_are_the_equation() -> None:
    from spheretnorm.kernels import ngpt_update

    g = torch.Generator().manual_seed(3)
    h, f = (torch.randn(2, 5, 16, generator=g, dtype=torch.float64) * 3 for _ in range(2))
    lr = (torch.rand(16, generator=g, dtype=torch.float64) - 0.2).requires_grad_()  # some below 0
    h.requires_grad_(), f.requires_grad_()
    assert torch.autograd.gradcheck(ngpt_update, (h, f, lr))
    expected = norm(norm(h) + lr * (norm(f) - norm(h)))  # the equation, autograd's derivative
    got = ngpt_update(h, f, lr)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)
    upstream = torch.randn(expected.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(got, (h, f, lr), upstream), torch.autograd.grad(expected, (h, f, lr), upstream)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("block", BLOCKS)
def test_reference_and_fused_models_have_the_same_loss_and_gradients(block: str) -> None:
    idx = torch.randint(0, 48, (2, 8), generator=torch.Generator().manual_seed(5))
    grads = []
    for impl in ("reference", "auto"):
        model = ngpt_model(block, sphere_impl=impl).double()
        perturb_scales(model)
        _, loss = model(idx, idx)
        loss.backward()
        grads.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_ref, g_ref), (loss_fused, g_fused) = grads
    torch.testing.assert_close(loss_fused, loss_ref, rtol=0, atol=1e-12)
    for name, grad in g_ref.items():
        torch.testing.assert_close(g_fused[name], grad, rtol=1e-9, atol=1e-12, msg=name)


def test_the_fused_update_keeps_bf16_states_in_bf16() -> None:
    from spheretnorm.kernels import ngpt_update

    g = torch.Generator().manual_seed(4)
    h, f = (torch.randn(4, 32, generator=g) for _ in range(2))
    lr = torch.full((32,), 0.05)
    out = ngpt_update(h.bfloat16(), f.bfloat16(), lr)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ngpt_update(h, f, lr), rtol=0, atol=1e-2)
