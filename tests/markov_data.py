"""The tests' learnable token stream: each token has three likely successors (a random Markov chain).

tests/test_train.py trains on it, and tests/data/ckpt_v1/ holds a checkpoint trained on it by an
older version of the code (tests/test_compat.py): change nothing here, or that golden data
no longer matches.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VOCAB = 48


def write_markov_data(root: Path, with_vocabulary: bool = False) -> Path:
    """train.bin (27,000 tokens), val.bin (3,000) and meta.json in root; with_vocabulary adds a
    character for each token (so sample.py can decode it and an export can write a tokenizer)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    successors = rng.integers(0, VOCAB, size=(VOCAB, 3))
    ids = np.empty(30_000, dtype=np.uint16)
    ids[0] = 0
    for i in range(1, len(ids)):
        ids[i] = successors[ids[i - 1], rng.integers(0, 3)]
    train_ids, val_ids = ids[:27_000], ids[27_000:]
    train_ids.tofile(root / "train.bin")
    val_ids.tofile(root / "val.bin")
    meta = {
        "tokenizer": "char",
        "vocab_size": VOCAB,
        "eot_token": None,
        "dtype": "uint16",
        "train_tokens": len(train_ids),
        "val_tokens": len(val_ids),
    }
    if with_vocabulary:
        itos = [chr(ord("A") + i) for i in range(VOCAB)]
        meta |= {"itos": itos, "stoi": {c: i for i, c in enumerate(itos)}}
    (root / "meta.json").write_text(json.dumps(meta))
    return root
