"""Hugging Face configuration of a spheretnorm GPT (custom code, loaded with trust_remote_code=True).

The model keys and their defaults are those of spheretnorm's GPTConfig; spheretnorm/hf/folder.py writes
them into the exported copy of this file, so the folder needs nothing from the repository.
"""

from __future__ import annotations

from transformers import PretrainedConfig

# >>> GPTConfig defaults: spheretnorm/hf/folder.py replaces these lines with the dict itself.
from spheretnorm.hf.folder import model_defaults  # noqa: E402
from spheretnorm.model import GPTConfig  # noqa: E402

MODEL_DEFAULTS = model_defaults()
# <<< GPTConfig defaults


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
    # >>> GPTConfig properties: spheretnorm/hf/folder.py replaces these lines with their source.
    keel_scale = GPTConfig.keel_scale
    mlp_hidden = GPTConfig.mlp_hidden
    # <<< GPTConfig properties
