"""compile_scope: one torch.compile per block type (blocks) against the whole-model graph (model).

What must hold: the number of graphs does not grow with depth under 'blocks'; both scopes
compute what the eager model computes (to float rounding), step after step; activation
checkpointing keeps the blocks compiled; the run record names the scope; the keys are checked.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import bench
from spheretnorm.kernels import kernel_path_text
from spheretnorm.model import GPT, GPTConfig
from spheretnorm.runtime.config import ConfigError, TrainConfig, parse_config
from spheretnorm.runtime.parallel import checkpoint_activations, compile_model


def tiny_model(connection: str, n_layer: int, block: str = "llama", seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    extra = {"spheret_p": 0.5} if connection == "p_spheret" else {}
    return GPT(GPTConfig(connection=connection, n_layer=n_layer, n_head=2, n_embd=32, block_size=16, vocab_size=40,
                         block=block, dropout=0.0, **extra))


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(40, (4, 16), generator=g), torch.randint(40, (4, 16), generator=g)


def graphs_for_one_step(model: GPT, scope: str) -> int:
    """Graphs dynamo compiled for one forward and backward of `model` under `scope`."""
    torch._dynamo.reset()
    counters.clear()
    x, y = batch()
    _, loss = compile_model(model, scope)(x, y)
    loss.backward()
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("connection", ["p_spheret", "ngpt"])
def test_blocks_scope_compiles_as_many_graphs_at_any_depth(connection: str) -> None:
    shallow = graphs_for_one_step(tiny_model(connection, 2), "blocks")
    deep = graphs_for_one_step(tiny_model(connection, 6), "blocks")
    # One graph for the block (a sphere connection's per-layer depth decay fails one guard at
    # layer 2 and compiles once more with the number as an input; no layer after that compiles),
    # and one for each module around the blocks that is not an Identity (embedding norm, final
    # norm, head): at most 2 + 3, whatever the depth.
    assert 2 <= shallow == deep <= 5


def train_losses(model: GPT, scope: str | None, steps: int = 3) -> list[float]:
    """AdamW steps on one batch; scope None runs the model eagerly."""
    torch._dynamo.reset()
    run = model if scope is None else compile_model(model, scope)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = batch()
    losses = []
    for _ in range(steps):
        _, loss = run(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("scope", ["blocks", "model"])
def test_both_scopes_train_as_the_eager_model_does(scope: str) -> None:
    eager = train_losses(tiny_model("p_spheret", 2), None)
    assert eager[-1] < eager[0]  # the steps learn something: equal losses below mean something
    assert train_losses(tiny_model("p_spheret", 2), scope) == pytest.approx(eager, rel=1e-5, abs=1e-6)


def test_activation_checkpointing_keeps_the_blocks_compiled() -> None:
    # A functools.partial of torch's checkpoint as the block's forward made torch.compile skip
    # the block's frame without a word: the run trained eagerly.
    model = tiny_model("p_spheret", 3)
    reference = tiny_model("p_spheret", 3)
    checkpoint_activations(model)
    assert graphs_for_one_step(model, "blocks") >= 1
    x, y = batch()
    _, loss = reference(x, y)
    loss.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), name


def test_kernel_path_names_the_scope_and_keeps_the_old_text() -> None:
    # Records written before compile_scope existed say 'compiled': the whole model, as then.
    assert kernel_path_text("float32", True, "fused_in_model_compile", "model") == "float32 compiled fused_in_model_compile"
    assert kernel_path_text("float32", True, None, "blocks") == "float32 compiled_blocks none"
    assert kernel_path_text("bfloat16", False, "triton", "blocks") == "bfloat16 eager triton"


def test_auto_keeps_what_each_layout_compiled_before_the_key() -> None:
    # DDP and a single process traced the whole model; FSDP compiled each block it wraps.
    assert TrainConfig().compile_scope == "auto"
    assert TrainConfig().resolved_compile_scope() == "model"
    assert TrainConfig(parallel="fsdp").resolved_compile_scope() == "blocks"
    assert TrainConfig(compile_scope="blocks").resolved_compile_scope() == "blocks"
    # The CPU studies compile per block (one compile at any depth); a study can still ask for model.
    from spheretnorm.experiments.study import CPU_MODEL
    assert CPU_MODEL["compile_scope"] == "blocks"


def test_compile_scope_keys_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"compile_scope='whole' is not valid; choose one of: auto, blocks, model"):
        parse_config(["--compile_scope=whole"])
    with pytest.raises(ConfigError, match=r"compile_scope=model .* parallel=fsdp"):
        TrainConfig(compile_scope="model", parallel="fsdp")
    with pytest.raises(ValueError, match=r"compile_scope='graph' is not valid"):
        compile_model(tiny_model("pre_ln", 1), "graph")


def test_bench_rows_per_compile_scope() -> None:
    opts, _ = bench.parse_bench_args(["--compile=both", "--compile_scope=blocks,model"])
    assert bench.compile_variants(opts, TrainConfig()) == [(False, "auto"), (True, "blocks"), (True, "model")]
    opts, _ = bench.parse_bench_args(["--compile=True"])
    assert bench.compile_variants(opts, TrainConfig(compile_scope="blocks")) == [(True, "blocks")]
    with pytest.raises(ConfigError, match="compile_scope"):
        bench.parse_bench_args(["--compile_scope=whole"])
    # The CPU's tight peak RSS slows the steps of a per-block model more than a whole-model graph's: off unless asked.
    assert bench.parse_bench_args([])[0].tight_rss is False
    assert bench.parse_bench_args(["--tight_rss=true"])[0].tight_rss is True
    with pytest.raises(ConfigError, match=r"--tight_rss='maybe' is not valid; use true or false"):
        bench.parse_bench_args(["--tight_rss=maybe"])
