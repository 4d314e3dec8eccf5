"""LLaMA in Hugging Face's form: parameter names, a pre_ln model with LLaMA's block as
LlamaForCausalLM, and the LlamaConfig values that block computes.

A pre_ln model with block=llama is exactly transformers' Llama (RMSNorm, SwiGLU, half-split
RoPE, as many key/value heads as query heads), so it is exported as a plain LlamaForCausalLM
and such a folder is read back (train.py --init_from=hf:DIR). Our attention keeps q, k, v in
one matrix (c_attn) and our MLP gate and up in one (c_fc); Llama holds them apart.
transformers is imported only by the functions that build its objects: reading a folder
(folder.py) needs only the names below.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch

from spheretnorm import mup
from spheretnorm.zeroshot.errors import EvalError
from spheretnorm.model import GPT, RMS_NORM_EPS, ROPE_BASE, GPTConfig

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

# Our fused matrices and the Llama ones they hold, in the order of their rows; and our other
# block modules by Llama's names.
LLAMA_FUSED = {
    "attn.c_attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.c_fc": ("mlp.gate_proj", "mlp.up_proj"),
}
LLAMA_RENAMES = {
    "attn.c_proj": "self_attn.o_proj",
    "mlp.c_proj": "mlp.down_proj",
    "conn_attn.ln": "input_layernorm",
    "conn_mlp.ln": "post_attention_layernorm",
}
LLAMA_TOP = {"transformer.wte.": "model.embed_tokens.", "transformer.ln_f.": "model.norm.", "lm_head.": "lm_head."}
_LLAMA_TOP_BACK = {theirs: ours for ours, theirs in LLAMA_TOP.items()}
# The LlamaConfig key of each pre_ln GPTConfig key (read on import, written on export).
LLAMA_KEYS = {
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_embd": "hidden_size",
    "block_size": "max_position_embeddings",
    "vocab_size": "vocab_size",
}
# The rotary embedding our attention runs (model.rotary_cos_sin, apply_rotary), in transformers 5's form.
LLAMA_ROPE = {"rope_type": "default", "rope_theta": ROPE_BASE}

_OUR_BLOCK = re.compile(r"^transformer\.h\.(\d+)\.(.+)\.(weight|bias)$")
_LLAMA_BLOCK = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
# Each Llama block module: (our module, its index among the parts of our fused matrix).
_FROM_LLAMA = {
    part: (ours, index)
    for ours, parts in {**LLAMA_FUSED, **{k: (v,) for k, v in LLAMA_RENAMES.items()}}.items()
    for index, part in enumerate(parts)
}


def _rename_top(name: str, table: dict[str, str]) -> str:
    """`name` with the first prefix of `table` that it starts with replaced; unchanged if none."""
    for old, new in table.items():
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def to_llama_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our pre_ln llama-block state dict under Llama's names, the fused matrices split."""
    out = {}
    for name, tensor in state.items():
        match = _OUR_BLOCK.match(name)
        if match is None:
            out[_rename_top(name, LLAMA_TOP)] = tensor
            continue
        layer, module, kind = match.groups()
        if module not in LLAMA_FUSED and module not in LLAMA_RENAMES:
            raise KeyError(f"Our weight {name!r} has no place in a Llama model.")
        parts = LLAMA_FUSED.get(module) or (LLAMA_RENAMES[module],)
        for part, piece in zip(parts, tensor.chunk(len(parts))):  # equal parts: q, k, v and gate, up
            out[f"model.layers.{layer}.{part}.{kind}"] = piece
    return out


def from_llama_state(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Llama state dict under our names, the fused matrices joined; the tied head dropped.

    A name we do not know, or a fused matrix with a part missing or of another width, is kept
    under its Llama names, so that check_weights names it.
    """
    out: dict[str, torch.Tensor] = {}
    # our name -> (how many parts it has, {part index: (Llama name, tensor)})
    grouped: dict[str, tuple[int, dict[int, tuple[str, torch.Tensor]]]] = {}
    for name, tensor in hf_state.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue  # older transformers saved RoPE's frequencies; they are computed, not learned
        match = _LLAMA_BLOCK.match(name)
        if match is None or match.group(2) not in _FROM_LLAMA:
            out[_rename_top(name, _LLAMA_TOP_BACK)] = tensor
            continue
        layer, module, kind = match.groups()
        ours, index = _FROM_LLAMA[module]
        n_parts = len(LLAMA_FUSED.get(ours, (module,)))
        grouped.setdefault(f"transformer.h.{layer}.{ours}.{kind}", (n_parts, {}))[1][index] = (name, tensor)
    for name, (n_parts, parts) in grouped.items():
        tensors = [parts[i][1] for i in sorted(parts)]
        if len(parts) < n_parts or len({t.shape[1:] for t in tensors}) > 1:
            out.update(parts.values())  # left apart, under Llama's names
        else:  # one part is taken as it is: a copy would double a large model's memory
            out[name] = tensors[0] if n_parts == 1 else torch.cat(tensors)
    if "transformer.wte.weight" in out:
        out.pop("lm_head.weight", None)  # tied (llama_features requires it): the embedding is the head
    return out


def llama_config(cfg: GPTConfig) -> dict[str, Any]:
    """LlamaConfig keys of a pre_ln model with LLaMA's block."""
    return {
        **{theirs: getattr(cfg, ours) for ours, theirs in LLAMA_KEYS.items()},
        "intermediate_size": cfg.mlp_hidden,
        "num_key_value_heads": cfg.n_head,
        "head_dim": cfg.n_embd // cfg.n_head,
        "hidden_act": "silu",
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_parameters": dict(LLAMA_ROPE),
        "attention_bias": cfg.bias,
        "mlp_bias": cfg.bias,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "bos_token_id": None,  # LlamaConfig's defaults (1, 2) are SentencePiece's; export.py sets ours
        "eos_token_id": None,
    }


def to_hf_llama(model: GPT) -> "LlamaForCausalLM":
    """A transformers LlamaForCausalLM (fp32, eval mode) computing the same function as `model`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = model.config
    if (cfg.connection, cfg.block) != ("pre_ln", "llama"):
        raise EvalError(
            f"Only pre_ln models with block llama are Llamas; a {cfg.connection!r} model with block {cfg.block!r} has no HF Llama equivalent."
        )
    hf = LlamaForCausalLM(LlamaConfig(**llama_config(cfg)))
    with torch.no_grad():
        hf.load_state_dict({k: v.float() for k, v in to_llama_state(model.state_dict()).items()})
        # Llama has no logit multiplier: μP's goes into the final RMSNorm's gain, whose output is
        # the head's input (m * (g x) = (m g) x).
        hf.model.norm.weight.mul_(mup.output_multiplier(cfg.mup_ratio))
    return hf.eval()


def llama_rope(hf: dict[str, Any]) -> Any:
    """The RoPE a Llama config.json asks for, in transformers 5's form whatever version wrote it
    (transformers 4 kept rope_theta apart and a scaling in rope_scaling, None for none)."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        return rope  # damaged: the error names it as it is
    rope = dict(rope)
    rope.setdefault("rope_type", rope.pop("type", "default"))
    rope.setdefault("rope_theta", hf.get("rope_theta", ROPE_BASE))
    fraction = rope.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if fraction != 1.0:  # 1.0: every dimension of a head rotates, as ours do
        rope["partial_rotary_factor"] = fraction
    return rope


def _value(hf: dict[str, Any], key: str, default: Any) -> Any:
    """A config.json value as LlamaConfig reads it: absent or null is the default."""
    return default if hf.get(key) is None else hf[key]


def llama_features(hf: dict[str, Any], cfg: GPTConfig) -> dict[str, tuple[Any, Any, str]]:
    """{key: (the config.json's value, the value our block computes, what that is)} of every
    LlamaConfig key whose other values compute something our LLaMA block does not. Absent keys
    take LlamaConfig's defaults (untied embeddings among them); `cfg` is read from the same file.
    attention_bias is our `bias`, so only mlp_bias is checked against it."""
    head_dim = cfg.n_embd // cfg.n_head
    return {
        "hidden_act": (_value(hf, "hidden_act", "silu"), "silu", "SwiGLU's activation"),
        "num_key_value_heads": (_value(hf, "num_key_value_heads", cfg.n_head), cfg.n_head, "one key/value head per query head"),
        "head_dim": (_value(hf, "head_dim", head_dim), head_dim, "hidden_size / num_attention_heads"),
        "intermediate_size": (hf.get("intermediate_size"), cfg.mlp_hidden, "8/3 hidden_size rounded up to a multiple of 64"),
        "rms_norm_eps": (_value(hf, "rms_norm_eps", RMS_NORM_EPS), RMS_NORM_EPS, "LLaMA's RMSNorm"),
        "rope_parameters": (llama_rope(hf), LLAMA_ROPE, "plain RoPE, no scaling"),
        "mlp_bias": (_value(hf, "mlp_bias", False), cfg.bias, "biases in all Linear layers or in none, as attention_bias says"),
        "tie_word_embeddings": (_value(hf, "tie_word_embeddings", False), True, "the LM head is the token embedding"),
    }
