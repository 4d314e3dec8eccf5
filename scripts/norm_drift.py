"""Measure how well each sphere connection keeps ||h|| through a deep GPT.

    python scripts/norm_drift.py [--n_layer 36] [--n_embd 256] [--device cpu]

Builds a randomly initialised model per sphere connection, runs one batch, and prints
the largest relative change of any token's hidden-state norm across all blocks
against the embedding output, in fp32, under bf16 autocast, and with the whole model in bf16.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import

import argparse
import contextlib
import json

import torch

from spheretnorm.model import GPT, SPHERE_CONNECTIONS, GPTConfig

MODES = ("fp32", "bf16-autocast", "bf16-weights")


def norm_drift(model: GPT, idx: torch.Tensor, mode: str) -> float:
    """max over blocks and tokens of | ||h_l|| / ||h_0|| - 1 |, h_0 the embedding output."""
    norms: list[torch.Tensor] = []
    modules = [model.transformer.embed_norm, *model.transformer.h]
    hooks = [m.register_forward_hook(lambda _m, _in, output: norms.append(output.float().norm(dim=-1))) for m in modules]
    ctx = torch.autocast(idx.device.type, dtype=torch.bfloat16) if mode == "bf16-autocast" else contextlib.nullcontext()
    try:
        with ctx, torch.no_grad():
            model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return max((n / norms[0] - 1.0).abs().max().item() for n in norms[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--n_layer", type=int, default=36, help="blocks of the model")
    parser.add_argument("--n_embd", type=int, default=256, help="width of the hidden states")
    parser.add_argument("--n_head", type=int, default=4, help="attention heads per block")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence (also block_size)")
    parser.add_argument("--batch", type=int, default=4, help="sequences in the batch")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps")
    args = parser.parse_args()

    results = {}
    for name in SPHERE_CONNECTIONS:
        torch.manual_seed(0)
        config = GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.seq, connection=name)
        model = GPT(config).to(args.device).eval()
        idx = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=args.device)
        row = {}
        for mode in MODES:
            if mode == "bf16-weights":
                model = model.to(torch.bfloat16)
            row[mode] = norm_drift(model, idx, mode)
        results[name] = row
        print(f"{name:14s} " + "  ".join(f"{m}: {row[m]:.2e}" for m in MODES), flush=True)
    print(json.dumps({"n_layer": args.n_layer, "n_embd": args.n_embd, "drift": results}))


if __name__ == "__main__":
    main()
