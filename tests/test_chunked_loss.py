"""chunked_loss.py: the LM head and the cross-entropy in chunks of tokens (model key loss_chunk_tokens)
equal the plain path, F.cross_entropy over the whole logits, up to rounding."""

import pytest
import torch
import torch.nn as nn
from torch.nn import functional as F

from spheretnorm.chunked_loss import ChunkedLossError, chunked_cross_entropy, head_weight_bias
from spheretnorm.model import EXECUTION_KEYS, GPT, GPTConfig
from spheretnorm.runtime.config import ConfigError, parse_config
from spheretnorm.runtime.identity import UNLABELLED_CHANGES

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=96)


def random_problem(n: int, d: int, v: int, bias: bool, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype, requires_grad=True)
    w = (torch.randn(v, d, generator=g, dtype=dtype) * 0.5).requires_grad_()
    b = (torch.randn(v, generator=g, dtype=dtype) * 0.5).requires_grad_() if bias else None
    t = torch.randint(0, v, (n,), generator=g)
    t[torch.randperm(n, generator=g)[: n // 4]] = -1  # a quarter of the rows ignored
    return x, w, b, t


def loss_and_grads(loss_fn, x, w, b, t):
    loss = loss_fn(x, w, b, t)
    grads = torch.autograd.grad(loss, [p for p in (x, w, b) if p is not None])
    return loss.detach(), grads


def plain(x, w, b, t):
    return F.cross_entropy(F.linear(x, w, b).float() if x.dtype != torch.float64 else F.linear(x, w, b), t, ignore_index=-1)


@pytest.mark.parametrize("chunk", [1, 7, 10, 40, 64, 1000])  # 40 rows: chunks that do and do not divide them
@pytest.mark.parametrize("bias", [False, True])
def test_loss_and_grads_equal_the_whole_logits_in_fp64(chunk: int, bias: bool) -> None:
    x, w, b, t = random_problem(40, 12, 30, bias, torch.float64)
    want_loss, want_grads = loss_and_grads(plain, x, w, b, t)
    got_loss, got_grads = loss_and_grads(lambda *a: chunked_cross_entropy(*a, chunk=chunk), x, w, b, t)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-12, atol=0)
    for got, want in zip(got_grads, want_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-14)


def test_fp32_and_batched_rows_match_within_float_rounding() -> None:
    x, w, b, t = random_problem(48, 16, 50, True, torch.float32, seed=3)
    xb, tb = x.detach().view(4, 12, 16).requires_grad_(), t.view(4, 12)  # (B, T, d) as GPT.forward gives it
    want_loss, want_grads = loss_and_grads(lambda x, w, b, t: plain(x.view(-1, 16), w, b, t.view(-1)), xb, w, b, tb)
    got_loss, got_grads = loss_and_grads(lambda *a: chunked_cross_entropy(*a, chunk=20), xb, w, b, tb)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-6, atol=1e-6)
    for got, want in zip(got_grads, want_grads):
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_every_row_ignored_is_nan_as_the_plain_mean_and_bad_chunks_are_refused() -> None:
    x, w, b, t = random_problem(8, 4, 6, False, torch.float64)
    t = torch.full_like(t, -1)
    assert chunked_cross_entropy(x, w, b, t, chunk=3).isnan() and plain(x, w, b, t).isnan()
    with pytest.raises(ValueError, match="chunk must be a positive"):
        chunked_cross_entropy(x, w, b, t, chunk=0)


def train_losses(steps: int = 3, **keys) -> tuple[list[float], torch.Tensor | None]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY, **keys}))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, TINY["vocab_size"], (4, 16), generator=g)
        y = torch.roll(x, -1, 1)
        y[:, -1] = -1
        logits, loss = model(x, y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
        model.after_optimizer_step()
    return losses, logits


@pytest.mark.parametrize("connection", ["pre_ln", "ngpt", "p_spheret"])  # tied head with a bias-free linear; nGPT's scaled head
def test_a_tiny_gpt_trains_to_the_same_losses_with_the_key_on(connection: str) -> None:
    want, logits = train_losses(connection=connection)
    got, none = train_losses(connection=connection, loss_chunk_tokens=24)  # 64 tokens a step: chunks of 24, 24, 16
    assert logits is not None and none is None  # the chunked path forms no logits
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_evaluation_keeps_the_plain_path_and_its_logits() -> None:
    model = GPT(GPTConfig(**TINY, loss_chunk_tokens=8)).eval()
    x = torch.randint(0, TINY["vocab_size"], (2, 16))
    logits, loss = model(x, x)
    assert logits.shape == (2, 16, TINY["vocab_size"]) and loss is not None


class SoftcapHead(nn.Linear):
    """A head whose logits are not a linear map: 30 * tanh(z / 30)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 30 * torch.tanh(super().forward(x) / 30)


def test_a_head_that_is_not_linear_is_refused_with_one_error() -> None:
    with pytest.raises(ChunkedLossError, match="loss_chunk_tokens needs an LM head whose logits are a linear map.*SoftcapHead"):
        head_weight_bias(SoftcapHead(4, 6))
    w, b = head_weight_bias(nn.Linear(4, 6))
    assert w.shape == (6, 4) and b.shape == (6,)


def test_the_key_is_an_execution_key_checked_and_refused_beside_loss_terms() -> None:
    assert "loss_chunk_tokens" in EXECUTION_KEYS and "loss_chunk_tokens" not in UNLABELLED_CHANGES
    assert GPTConfig().loss_chunk_tokens == 0  # off by default: no run changes
    assert parse_config(["--loss_chunk_tokens=4096"]).model_keys["loss_chunk_tokens"] == 4096
    with pytest.raises(ConfigError, match="loss_chunk_tokens must be 0"):
        parse_config(["--loss_chunk_tokens=-1"])
    with pytest.raises(ConfigError, match="never forms the logits, which the loss terms that are on \\(fixture_z_loss\\)"):
        parse_config(["--imports=zloss_term", "--loss_chunk_tokens=64", "--fixture_z_loss=0.0001"])  # tests/zloss_term.py


def test_under_torch_compile_the_loss_and_grads_match_eager() -> None:
    torch._dynamo.reset()
    x, w, b, t = random_problem(20, 8, 12, True, torch.float32, seed=5)
    compiled = torch.compile(lambda x, w, b, t: chunked_cross_entropy(x, w, b, t, chunk=8), backend="aot_eager", fullgraph=True)
    want_loss, want_grads = loss_and_grads(plain, x, w, b, t)
    got_loss, got_grads = loss_and_grads(compiled, x, w, b, t)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-6, atol=1e-6)
    for got, want in zip(got_grads, want_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_a_whole_model_compiled_with_inductor_gives_the_eager_plain_loss_and_grads() -> None:
    """torch.compile(model), as compile_scope=model trains it: the chunk loop traced into the graph."""
    torch._dynamo.reset()
    x = torch.randint(0, TINY["vocab_size"], (4, 16), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, 1)
    models = []
    for chunk in (0, 24):
        torch.manual_seed(0)
        models.append(GPT(GPTConfig(**TINY, loss_chunk_tokens=chunk)))
    plain_model, chunked_model = models
    _, want = plain_model(x, y)
    _, got = torch.compile(chunked_model)(x, y)
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(plain_model.named_parameters(), chunked_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
