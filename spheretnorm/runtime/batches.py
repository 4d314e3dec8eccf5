"""The training data as train.py samples it: flat uint16 token files at random offsets, a pure
function of (seed, stream, index), so the batches of optimizer step k depend on the seed and k
alone, neither on the number of processes nor on a resume. scripts/coord_check.py draws here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spheretnorm.runtime.config import ConfigError
from spheretnorm.runtime.token_files import SPLITS, PrepareError, load_meta, open_split

# Independent random streams of the data sampler: (seed, stream, index) seeds one draw.
TRAIN_STREAM, EVAL_STREAM = 0, 1


@dataclass
class TokenData:
    data_dir: Path
    meta: dict[str, Any]

    def split(self, name: str) -> np.ndarray:
        # A fresh memmap per batch keeps the mapped pages from piling up in the RSS.
        return open_split(self.data_dir, name, self.meta)

    def num_tokens(self, name: str) -> int:
        return int(self.meta[f"{name}_tokens"])


def load_data(data_dir: str) -> TokenData:
    """The one place that knows the on-disk layout (spheretnorm/runtime/token_files.py's readers)."""
    try:
        meta = load_meta(data_dir)
        for split in SPLITS:
            open_split(data_dir, split, meta)  # checks that the bins exist and match meta.json
    except (PrepareError, KeyError) as e:
        raise ConfigError(f"Dataset in {data_dir} is not usable: {e}") from None
    return TokenData(Path(data_dir), meta)


def batch_offsets(seed: int, stream: int, index: int, count: int, n_tokens: int, block_size: int) -> np.ndarray:
    """`count` random start offsets, a pure function of (seed, stream, index): step k draws all its
    global_batch_size offsets at once and each rank takes its own slice."""
    rng = np.random.default_rng([seed, stream, index])
    return rng.integers(0, n_tokens - block_size, size=count)


def get_batch(tokens: np.ndarray, offsets: np.ndarray, block_size: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets (B, T) at the given offsets."""
    rows = np.stack([tokens[i : i + block_size + 1] for i in offsets]).astype(np.int64)
    # One (2, B, T) tensor: a single host-to-device copy, and x, y are contiguous views.
    xy = torch.from_numpy(np.stack([rows[:, :-1], rows[:, 1:]]))
    if device.startswith("cuda"):
        xy = xy.pin_memory().to(device, non_blocking=True)  # overlaps with the running step
    else:
        xy = xy.to(device)
    return xy[0], xy[1]
