"""Hugging Face model of a spheretnorm GPT (custom code, loaded with trust_remote_code=True).

This file runs only inside an exported folder, where spheretnorm/hf/folder.py has copied it
unchanged beside spheretnorm's model.py and the model-core files model.py imports, whole
(kernels.py, keys.py, mup.py, retractions.py): the connections, norms, MLP and GPTConfig below are
model.py's own, so the folder needs only torch and transformers. connection_spheretnorm.py,
written at export, registers the checkpoint's connection (and imports the module it was
defined in, when that is not model.py). What is added here is what transformers needs:
attention with a key/value cache, padding masks, and the PreTrainedModel / GenerationMixin
interface. Parameter names are model.py's, so the safetensors file holds GPT.state_dict() as it is.
"""

from __future__ import annotations

from dataclasses import fields

import torch
import torch.nn as nn
from torch.nn import functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_spheretnorm import SpheretNormConfig
from .connection_spheretnorm import CONNECTION  # noqa: F401 - registers the folder's connection in CONNECTIONS
from .model import BLOCK_MLPS, CONNECTIONS, EXECUTION_KEYS, CausalSelfAttention, GPTConfig, transformer_modules
from .mup import output_multiplier

# transformers 5.2x renamed the model outputs' past_key_values to cache: use this version's name.
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def model_config(config: SpheretNormConfig) -> GPTConfig:
    """model.py's GPTConfig of the folder's config, so that model.py's classes read their keys,
    properties (mlp_hidden, keel_scale) and a connection's declared parameters as in training.
    The sphere updates run the reference path, in plain torch (no fused or Triton kernel)."""
    keys = {f.name: getattr(config, f.name) for f in fields(GPTConfig) if f.name not in EXECUTION_KEYS}
    return GPTConfig(**keys, sphere_impl="reference")


def causal_padding_mask(
    attention_mask: torch.Tensor | None, past_len: int, n_new: int, device: torch.device
) -> torch.Tensor | None:
    """(B or 1, 1, n_new, past_len + n_new) boolean mask of the keys each new token may see.

    None when there is neither a past nor padding: attention is then plain causal SDPA, as in
    model.py. A token always sees itself, so that a padding row is never fully masked (NaN).
    """
    if past_len == 0 and (attention_mask is None or bool(attention_mask.all())):
        return None
    total = past_len + n_new
    query_pos = torch.arange(past_len, total, device=device)[:, None]
    key_pos = torch.arange(total, device=device)[None, :]
    mask = (key_pos <= query_pos)[None, None]
    if attention_mask is not None:
        mask = mask & attention_mask[:, None, None, :total].bool()
    return mask | (key_pos == query_pos)[None, None]


class SpheretNormAttention(CausalSelfAttention):
    """model.py's CausalSelfAttention, reading and extending a key/value cache.

    Its heads() gives q, k, v with the rotary positions (LLaMA's block) and the connection's
    q/k norm (nGPT) applied, so the cache holds keys as the attention reads them.
    """

    def __init__(self, config: GPTConfig, cache_index: int):
        super().__init__(config)
        self.cache_index = cache_index  # 0-based, as transformers' caches count layers

    def forward(
        self, x: torch.Tensor, cache: Cache | None, mask: torch.Tensor | None, positions: torch.Tensor
    ) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.heads(x, positions)  # each (B, nh, T, hs)
        if cache is not None:
            k, v = cache.update(k, v, self.cache_index)  # (B, nh, past + T, hs)
        dropout_p = self.dropout if self.training else 0.0
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=self.softmax_scale)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.softmax_scale)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class SpheretNormBlock(nn.Module):
    """model.py's Block: two connection calls, the first around the cached attention."""

    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
        connection = CONNECTIONS[config.connection]
        self.attn = SpheretNormAttention(config, layer_idx - 1)
        self.mlp = BLOCK_MLPS[config.block](config)
        self.conn_attn = connection(config, layer_idx, slot=0)
        self.conn_mlp = connection(config, layer_idx, slot=1)

    def forward(
        self, x: torch.Tensor, cache: Cache | None, mask: torch.Tensor | None, positions: torch.Tensor
    ) -> torch.Tensor:
        x = self.conn_attn(x, lambda h: self.attn(h, cache, mask, positions))
        return self.conn_mlp(x, self.mlp)


class SpheretNormPreTrainedModel(PreTrainedModel):
    config_class = SpheretNormConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["SpheretNormBlock"]

    def _init_weights(self, module: nn.Module) -> None:
        # For models built from a config; from_pretrained loads every weight from the file.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


class SpheretNormForCausalLM(SpheretNormPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config: SpheretNormConfig):
        super().__init__(config)
        self.gpt_config = model_config(config)  # what model.py's classes read; self.config is transformers'
        connection = CONNECTIONS[self.gpt_config.connection]
        self.transformer = transformer_modules(self.gpt_config, SpheretNormBlock)
        self.lm_head = connection.lm_head(self.gpt_config)  # nGPT's scales its logits
        if not connection.tie_embeddings:
            self._tied_weights_keys = {}  # nGPT's head has its own matrix, in the weights file
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.transformer.wte

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.transformer.wte = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def positions(self, position_ids: torch.Tensor | None, past_len: int, n_new: int, device: torch.device) -> torch.Tensor:
        """Absolute positions of the new tokens, checked against the learned position table
        where there is one (RoPE, LLaMA's block, computes any position)."""
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + n_new, device=device)[None]
        if "wpe" in self.transformer and int(position_ids.max()) >= self.config.block_size:
            raise ValueError(
                f"Cannot run position {int(position_ids.max())}; the model has learned positions 0..{self.config.block_size - 1} only (block_size {self.config.block_size})."
            )
        return position_ids

    def forward(
        self,
        input_ids: torch.LongTensor,
        cache: Cache | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        past_key_values: Cache | None = None,  # the name of `cache` before transformers 5.2x
        **kwargs,
    ) -> CausalLMOutputWithPast:
        cache = cache if cache is not None else past_key_values
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        past_len = cache.get_seq_length() if cache is not None else 0
        n_new = input_ids.size(1)
        positions = self.positions(position_ids, past_len, n_new, input_ids.device)
        mask = causal_padding_mask(attention_mask, past_len, n_new, input_ids.device)

        x = self.transformer.wte(input_ids)
        if "wpe" in self.transformer:  # GPT-2's block; LLaMA's places tokens by RoPE, in the attention
            x = x + self.transformer.wpe(positions)
        x = self.transformer.embed_norm(self.transformer.drop(x))
        for block in self.transformer.h:
            x = block(x, cache, mask, positions)
        x = self.transformer.ln_f(x)
        multiplier = output_multiplier(self.gpt_config.mup_ratio)  # μP, as model.py's GPT.final_hidden
        x = x if multiplier == 1.0 else x * multiplier
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        logits = self.lm_head(x)

        loss = None
        if labels is not None:  # labels are the inputs; the shift happens here, as in transformers
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)).float(), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache if use_cache else None})
