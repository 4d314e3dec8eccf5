"""Hugging Face configuration of a spheretnorm GPT (custom code, loaded with trust_remote_code=True).

This file runs only inside an exported folder, where spheretnorm/hf/folder.py has copied it
unchanged beside spheretnorm's model.py and the model-core files model.py imports (so its
relative imports do not resolve in the repository). The model keys and their defaults are
model.py's GPTConfig fields; modeling_spheretnorm.py turns them back into a GPTConfig.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from transformers import PretrainedConfig

# The folder's connection, registered in model.py's CONNECTIONS (written at export). Imported
# here as well as in the modeling file so that this file's entry in transformers' module cache,
# named by a hash of the file and of what it imports relatively, covers all of the folder's
# code: transformers maps a configuration class to the model class it first loaded for it, so
# two exports whose code differs must never share this class.
from .connection_spheretnorm import CONNECTION  # noqa: F401
from .model import EXECUTION_KEYS, GPTConfig


def model_defaults() -> dict[str, Any]:
    """GPTConfig's keys and defaults (fresh ones: no two configs share a dict), less the execution
    keys: the exported model always runs the reference sphere update."""
    return {
        f.name: f.default_factory() if f.default is MISSING else f.default
        for f in fields(GPTConfig)
        if f.name not in EXECUTION_KEYS
    }


class SpheretNormConfig(PretrainedConfig):
    model_type = "spheretnorm"
    # The standard names that transformers' generation and lm-eval read.
    attribute_map = {
        "hidden_size": "n_embd",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "max_position_embeddings": "block_size",
    }

    def __init__(self, **kwargs: Any) -> None:
        for key, default in model_defaults().items():
            setattr(self, key, kwargs.pop(key, default))
        kwargs.setdefault("tie_word_embeddings", True)
        super().__init__(**kwargs)
