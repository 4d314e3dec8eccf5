"""Every registered connection in both blocks (--block=gpt2|llama) runs through the pipeline:
train.py trains it with finite losses, checkpoints it and resumes exactly; sample.py samples
a LLaMA-block checkpoint; the zero-shot evaluator scores LLaMA-block and nGPT checkpoints as
a direct forward pass does, choices packed into shared rows included.

Runs are in-process (train.main, sample.main, NanoGPTLM) on test_train's tiny model and
token stream, on one thread: the whole file takes seconds.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import sample
import train
from markov_data import VOCAB, write_markov_data
from spheretnorm.zeroshot.harness import NanoGPTLM
from spheretnorm.model import BLOCKS, CONNECTIONS, GPT, GPTConfig
from spheretnorm.runtime.checkpoint import checkpoint_state
from spheretnorm.runtime.checkpoint import load_checkpoint, load_model
from test_eval import LL_REQUESTS, direct_loglikelihood, ll_instances, many_choices
from test_train import read_metrics, tiny_args, train_curves

MATRIX = [(connection, block) for block in BLOCKS for connection in CONNECTIONS]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run faster on one thread


@pytest.fixture(scope="module")
def char_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """test_train's token stream with a character per token, so that sample.py can decode it."""
    return write_markov_data(tmp_path_factory.mktemp("matrix_data"), with_vocabulary=True)


def run_args(data: Path, out: Path, connection: str, block: str, max_iters: int, *extra: str) -> list[str]:
    """A tiny run that evaluates (and so checkpoints) every 2 iterations. The collapse alarm is
    off: a 2-layer model a few steps old may well have its tokens' final states all alike,
    and a suspect state would not be checkpointed."""
    keys = (f"--max_iters={max_iters}", "--eval_interval=2", "--collapse_evals=0", f"--connection={connection}", f"--block={block}")
    return tiny_args(data, out, *keys, *extra)


def test_the_matrix_covers_every_connection_and_block() -> None:
    assert set(BLOCKS) == {"gpt2", "llama"}
    assert len(MATRIX) == 2 * len(CONNECTIONS) and "ngpt" in CONNECTIONS


@pytest.mark.parametrize("connection, block", MATRIX)
def test_trains_checkpoints_and_resumes_exactly(connection: str, block: str, char_data: Path, tmp_path: Path) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    train.main(run_args(char_data, straight, connection, block, 4))
    train.main(run_args(char_data, split, connection, block, 2))

    first = load_checkpoint(split / "ckpt.pt")
    assert first["iter_num"] == 2
    assert first["model_config"]["block"] == block and first["model_config"]["connection"] == connection
    losses = [row["train_loss"] for row in read_metrics(split, "train")]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), losses

    train.main(run_args(char_data, split, connection, block, 4, "--init_from=resume"))
    # Bit-identical to the uninterrupted run, every iteration once.
    assert train_curves(split) == train_curves(straight)
    assert sorted(train_curves(split)) == [1, 2, 3, 4]
    assert [r["val_loss"] for r in read_metrics(split, "eval")] == [r["val_loss"] for r in read_metrics(straight, "eval")]
    a, b = load_checkpoint(straight / "ckpt.pt"), load_checkpoint(split / "ckpt.pt")
    assert a["iter_num"] == b["iter_num"] == 4
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


# -----------------------------------------------------------------------------
# sample.py


def greedy_continuation(model: GPT, ids: list[int], n: int) -> list[int]:
    """Greedy decoding by hand: the argmax of a full forward pass over the last block_size tokens."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits, _ = model(torch.tensor([ids[-model.config.block_size :]]))
            ids.append(int(logits[0, -1].argmax()))
    return ids


@pytest.mark.parametrize("connection", ["pre_ln", "ngpt"])
def test_sample_py_runs_on_a_llama_checkpoint(connection: str, char_data: Path, tmp_path: Path) -> None:
    train.main(run_args(char_data, tmp_path, connection, "llama", 2))
    alphabet = {chr(ord("A") + i) for i in range(VOCAB)}

    drawn = sample.main([str(tmp_path), "--start=AB", "--num_samples=2", "--max_new_tokens=10", "--device=cpu", "--seed=3"])
    assert len(drawn) == 2 and all(s.startswith("AB") and len(s) == 12 and set(s) <= alphabet for s in drawn), drawn

    # Greedy past block_size (16): sample.py crops the context as a direct forward pass does.
    greedy = sample.main([str(tmp_path), "--start=AB", "--num_samples=1", "--max_new_tokens=20", "--temperature=0", "--device=cpu"])
    model = load_model(tmp_path / "ckpt.pt").eval()
    want = "".join(chr(ord("A") + i) for i in greedy_continuation(model, [0, 1], 20))
    assert greedy == [want]


# -----------------------------------------------------------------------------
# Zero-shot scoring


@pytest.fixture
def gpt2_vocab_ckpt(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A GPT-2-vocabulary checkpoint of (block, connection), as the evaluator reads train.py's."""
    block, connection = request.param
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=50304, block=block, connection=connection))
    path = tmp_path / "ckpt.pt"
    torch.save({**checkpoint_state(model), "iter_num": 0, "data_meta": {"tokenizer": "gpt2"}}, path)
    return path


@pytest.mark.parametrize(
    "gpt2_vocab_ckpt", [("llama", "pre_ln"), ("llama", "ngpt"), ("gpt2", "ngpt")], indirect=True, ids=["llama", "llama-ngpt", "ngpt"]
)
def test_zero_shot_scores_as_a_direct_forward_pass(gpt2_vocab_ckpt: Path) -> None:
    # Eight choices of one question share packed rows (positions restart per choice); a context
    # longer than block_size is truncated on its own row.
    pairs = many_choices(8) + LL_REQUESTS
    got = NanoGPTLM(ckpt=str(gpt2_vocab_ckpt), device="cpu", batch_size=3).loglikelihood(ll_instances(pairs), disable_tqdm=True)
    model = load_model(gpt2_vocab_ckpt).eval()
    for (context, continuation), (logprob, greedy) in zip(pairs, got):
        want_logprob, want_greedy = direct_loglikelihood(model, context, continuation)
        assert logprob == pytest.approx(want_logprob, abs=1e-4), (context[:30], continuation)
        assert greedy == want_greedy
