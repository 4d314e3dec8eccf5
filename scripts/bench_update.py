"""
The sphere update alone against Pre-LN's per-sublayer work, forward + backward.

    python scripts/bench_update.py                          # CUDA if present, else CPU
    python scripts/bench_update.py --rows=16384 --d=768 --impls=reference,fused,triton

Pre-LN's work outside the sublayer F is LayerNorm(h) and the add h + F(h); a sphere
connection's is its step size and the update of h from h and F(h). Both are timed with
their backward, h in fp32 and F(h) in --f_dtype (bf16: as a Linear hands it over under
autocast). Two sizes: --rows x d, where the device's memory speed decides, and --small_rows
x d, where only the host's cost per call (Python, dispatch, launches) shows; a model whose
sublayers are small or whose GPU is fast pays the second one at every sublayer.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import

import argparse
import statistics
import time
from typing import Callable

import torch

from spheretnorm.model import CONNECTIONS, SPHERE_CONNECTIONS, GPTConfig
from spheretnorm.kernels import SPHERE_IMPLS, resolve_impl


def pre_ln_work(d: int, device: str) -> Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]]:
    ln = torch.nn.LayerNorm(d).to(device)
    return lambda h, f: [ln(h), h + f]


def sphere_work(name: str, impl: str, d: int, device: str) -> Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]]:
    cfg = GPTConfig(n_layer=12, n_head=1, n_embd=d, connection=name, sphere_impl=impl)
    conn = CONNECTIONS[name](cfg, 1, slot=0).to(device)
    return lambda h, f: [conn(h, lambda _: f)]


def seconds_per_call(work, rows: int, d: int, f_dtype: torch.dtype, device: str, calls: int, repeats: int) -> float:
    """Median over repeats of the wall time of `calls` forward + backward calls, synchronised once."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(rows, d, generator=g).to(device).requires_grad_(True)  # norm about sqrt(d)
    f = torch.randn(rows, d, generator=g).to(device=device, dtype=f_dtype).requires_grad_(True)
    grads = [torch.randn(rows, d, generator=g).to(device) for _ in range(2)]

    def call() -> None:
        outs = work(h, f)
        torch.autograd.backward(outs, grads[: len(outs)])

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def main() -> None:
    head, rest = __doc__.strip().split("\n\n", 1)
    ap = argparse.ArgumentParser(description=head, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="(default: cuda where present, else cpu)")
    ap.add_argument("--rows", type=int, default=16384, help="rows of the large case (default 16384 = 16 x 1024 tokens)")
    ap.add_argument("--small_rows", type=int, default=16, help="rows of the host-bound case (default 16)")
    ap.add_argument("--d", type=int, default=768, help="width (default 768)")
    ap.add_argument("--f_dtype", default="bfloat16", choices=["bfloat16", "float32"], help="dtype of F(h) (default bfloat16)")
    ap.add_argument("--connections", default="p_spheret,geonorm", help="sphere connections (default p_spheret,geonorm)")
    ap.add_argument("--impls", default="reference,auto", help=f"sphere_impl values, comma-separated, of {', '.join(SPHERE_IMPLS)} (default reference,auto)")
    ap.add_argument("--calls", type=int, default=50, help="calls per timing (default 50)")
    ap.add_argument("--repeats", type=int, default=5, help="timings per figure; the median counts (default 5)")
    args = ap.parse_args()
    names = [n for n in args.connections.split(",") if n]
    impls = [i for i in args.impls.split(",") if i]
    bad = [n for n in names if n not in SPHERE_CONNECTIONS] + [i for i in impls if i not in SPHERE_IMPLS]
    if bad:
        ap.error(f"unknown {bad}; connections are {', '.join(SPHERE_CONNECTIONS)} and impls {', '.join(SPHERE_IMPLS)}")
    f_dtype = getattr(torch, args.f_dtype)
    device_type = args.device.split(":")[0]

    variants = [("pre_ln (LayerNorm + add)", pre_ln_work(args.d, args.device))]
    for name in names:
        for impl in impls:
            label = impl if impl != "auto" else f"auto ({resolve_impl(impl, device_type)})"
            variants.append((f"{name} {label}", sphere_work(name, impl, args.d, args.device)))
    print(f"device={args.device} d={args.d} f_dtype={args.f_dtype} rows={args.rows} small_rows={args.small_rows} torch={torch.__version__}")
    print(f"| work | ms per call, {args.rows} rows | vs pre_ln | us per call, {args.small_rows} rows | vs pre_ln |")
    print("|---|--:|--:|--:|--:|")
    base = None
    for label, work in variants:
        big = seconds_per_call(work, args.rows, args.d, f_dtype, args.device, args.calls, args.repeats)
        small = seconds_per_call(work, args.small_rows, args.d, f_dtype, args.device, args.calls, args.repeats)
        base = base or (big, small)
        print(f"| {label} | {1e3 * big:.3f} | {big / base[0]:.2f} | {1e6 * small:.1f} | {small / base[1]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
