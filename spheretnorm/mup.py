"""Spherical μP: the rules that make learning rates transfer across width, in one table.

With width n = n_embd and base width n0 = mup_base_width, every parameter belongs to one kind,
and its kind alone decides how its init std and its AdamW learning rate change with the ratio
n0 / n (the model's output gets one multiplier of its own):

    | kind      | parameters                                     | init std        | AdamW LR   |
    |-----------|------------------------------------------------|-----------------|------------|
    | hidden    | attn c_attn, attn c_proj, mlp c_fc, mlp c_proj | x (n0 / n)^1/2  | x n0 / n   |
    | embedding | wte (tied to the LM head), wpe                 | x 1             | x 1        |
    | vector    | biases, norm gains, sphere a, ScaleNorm gamma  | x 1             | x 1        |
    | output    | the logits, W_e h                              | multiplier n0 / n              |

"x" multiplies today's value (the paper's parametrisation, the one at n = n0): hidden matrices
keep std 0.02 (0.02 / sqrt(2L) for c_proj) at n0, so their std is proportional to
1 / sqrt(fan_in) at every width. The same table is docs/MUP.md's; the derivation is there.

Why these exponents: a sphere connection puts every hidden state on the sphere of radius sqrt(n)
(coordinates of order 1). Adam moves each entry of a hidden matrix by about the LR per step, in
a direction correlated with its input, so W x moves by about LR * n per coordinate; LR ~ 1/n
keeps the angular velocity of the features on the sphere of order 1 at every width. Embedding
rows see one-hot inputs, so their updates do not add up over the width: their LR stays.

The tie: wte and the LM head are one matrix. It keeps the embedding rules (base init and LR),
and the 1/n that μP wants on the output layer goes into a multiplier n0 / n on the logits, so
logits = (n0 / n) W_e h stay of order 1 once W_e and h are correlated by training.

Other optimizers move the hidden matrices by other steps, and each step has its own learning-rate
exponent (HIDDEN_LR_EXPONENTS; docs/MUP.md derives each): Muon's orthogonal update with
Jordan's shape factor already has the spectral scale μP asks for (exponent 0; 1/2 with
Moonlight's RMS-matching factor), and a Hyperball step is an angle on the Frobenius sphere of the
matrix, whose radius follows the init (exponent 0 with Muon's direction, 1/2 with Adam's).
Embeddings, vectors and the output multiplier keep the rules above under every optimizer.

mup_base_width = 0 turns all of this off; n = n0 gives ratio 1, where every factor is exactly 1
and the model and optimizer are today's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rule:
    init_exponent: float  # init std x (n0 / n) ** init_exponent
    lr_exponent: float  # AdamW learning rate x (n0 / n) ** lr_exponent


# The hidden matrices' learning-rate exponent by the step that moves them (an optimizer names its
# step; docs/MUP.md, "Other optimizers", derives each). Entries of a table, not branches in code.
HIDDEN_LR_EXPONENTS: dict[str, float] = {
    "adam": 1.0,  # AdamW: every entry moves by about lr, coherently over the fan-in
    "spectral": 0.0,  # Muon, s = sqrt(max(1, out/in)) or 1: ||dW||_2 = lr s, width-free aspect ratios
    "spectral_rms": 0.5,  # Muon, s = 0.2 sqrt(max(out, in)): s itself grows as n^(1/2)
    "hyperball_spectral": 0.0,  # MuonH: ||dW||_2 / ||W||_2 ~ lr at every width
    "hyperball_adam": 0.5,  # AdamH: entries move lr R / sqrt(out in) ~ lr / sqrt(n), coherently over n
}

RULES: dict[str, Rule] = {
    "hidden": Rule(init_exponent=0.5, lr_exponent=HIDDEN_LR_EXPONENTS["adam"]),
    "embedding": Rule(init_exponent=0.0, lr_exponent=0.0),
    "vector": Rule(init_exponent=0.0, lr_exponent=0.0),
}
OUTPUT_EXPONENT = 1.0  # logits x (n0 / n) ** OUTPUT_EXPONENT

_HIDDEN = re.compile(r"^transformer\.h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")
_EMBEDDING = ("transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight")


def width_ratio(n_embd: int, base_width: int) -> float:
    """n0 / n, the number every rule is a power of; 1 when μP is off (base_width 0)."""
    return 1.0 if base_width == 0 else base_width / n_embd


def param_kind(name: str, param: torch.Tensor) -> str:
    """The row of the table that a parameter (by its name in GPT.named_parameters) follows."""
    if param.dim() < 2:
        return "vector"
    if _HIDDEN.match(name):
        return "hidden"
    if name in _EMBEDDING:
        return "embedding"
    # A new matrix must be placed in the table deliberately, not fall into a default row.
    raise ValueError(
        f"Parameter {name!r} is a matrix that the μP table does not cover; add it to mup.py as "
        f"one of: {', '.join(RULES)}."
    )


def init_scale(kind: str, ratio: float) -> float:
    """What today's init std is multiplied by for this kind."""
    return ratio ** RULES[kind].init_exponent


def lr_scale(kind: str, ratio: float, step: str = "adam") -> float:
    """What the learning rate (and the schedule's every value) is multiplied by for this kind, when
    the hidden matrices move by `step` (a key of HIDDEN_LR_EXPONENTS; AdamW's by default)."""
    exponent = HIDDEN_LR_EXPONENTS[step] if kind == "hidden" else RULES[kind].lr_exponent
    return ratio**exponent


def output_multiplier(ratio: float) -> float:
    """The factor on the logits (applied to the final hidden state, the LM head's input)."""
    return ratio**OUTPUT_EXPONENT
