"""Hugging Face configuration of a spheretnorm GPT (custom code, loaded with trust_remote_code=True).

The model keys and their defaults are those of spheretnorm's GPTConfig; spheretnorm/hf/folder.py writes
them into the exported copy of this file, so the folder needs nothing from the repository.
"""

from __future__ import annotations

from transformers import PretrainedConfig

MODEL_DEFAULTS = {'block_size': 1024,
 'vocab_size': 50304,
 'n_layer': 12,
 'n_head': 12,
 'n_embd': 768,
 'dropout': 0.0,
 'bias': True,
 'connection': 'pre_ln',
 'block': 'gpt2',
 'spheret_p': 0.5,
 'angle_max': 0.7853981633974483,
 'alpha_decay': 'sqrt',
 'alpha_index': 'block',
 'dyt_alpha': 0.5,
 'keel_alpha': None,
 'peri_embed_ln': False,
 'mup_base_width': 0,
 'connection_params': {}}


class SpheretNormConfig(PretrainedConfig):
    model_type = "spheretnorm"
    # The standard names that transformers' generation and lm-eval read.
    attribute_map = {
        "hidden_size": "n_embd",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "max_position_embeddings": "block_size",
    }

    def __init__(self, **kwargs) -> None:
        for key, default in MODEL_DEFAULTS.items():
            setattr(self, key, kwargs.pop(key, default))
        # A connection's own parameters are read as attributes, as from spheretnorm's GPTConfig.
        for key, value in (self.connection_params or {}).items():
            setattr(self, key, value)
        # The exported model always runs the reference (unfused) sphere update in plain torch.
        self.sphere_impl = "reference"
        kwargs.setdefault("tie_word_embeddings", True)
        super().__init__(**kwargs)

    # The GPTConfig properties that model.py's classes read (Keel's scale, the MLP's width).
    @property
    def keel_scale(self) -> float:
        return float(self.keel_alpha) if self.keel_alpha is not None else 2.0 * self.n_layer


    @property
    def mlp_hidden(self) -> int:
        """Width of the MLP's hidden layer: 4d in GPT-2; in LLaMA 2/3 of 4d (so that SwiGLU's three
        matrices cost what GELU's two do) rounded up to a multiple of 64, as Meta's code rounds it."""
        if self.block == "gpt2":
            return 4 * self.n_embd
        return 64 * ((8 * self.n_embd // 3 + 63) // 64)
