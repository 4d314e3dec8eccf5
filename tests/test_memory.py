"""The activation memory formula of spheretnorm/experiments/memory.py against what autograd saves
on the CPU, and README's table of each scale's memory terms against the formula (one source)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spheretnorm.experiments import memory
from spheretnorm.experiments.grid import SCALES

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_formula_matches_what_autograd_saves(dtype: str) -> None:
    shape = memory.Shape(n_layer=2, n_embd=64, vocab_size=256, batch_size=2, block_size=64)
    measured, formula = memory.measure(shape, 4, dtype), memory.saved_bytes_formula(shape, dtype)
    assert formula <= measured <= 1.02 * formula  # the formula leaves out only a few bytes a token


def test_readme_has_each_scales_terms_as_the_formula_gives_them() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for row in memory.scale_rows(SCALES):
        assert f"  {row}\n" in readme, row
    xl = memory.scale_shape("XL")
    assert 40 * memory.GIB < memory.activation_bytes(xl) < 45 * memory.GIB  # the rough estimate of the issue


def test_the_xl_configs_say_gib_and_name_the_activations() -> None:
    for name in ("openwebtext_xl.py", "fineweb_edu_xl.py"):
        text = (REPO / "config" / name).read_text(encoding="utf-8")
        assert "3 GB" not in text and "3.2 GiB" in text and "42 GiB" in text
