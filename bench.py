"""
Throughput of every deep connection at one model size: forward + backward + AdamW step.

    python bench.py config/openwebtext_s.py                         # eager and compiled on a GPU
    python bench.py --n_layer=4 --n_head=4 --n_embd=256 --block_size=256 --batch_size=8 --compile=off
    python bench.py config/openwebtext_s.py --connections=pre_ln,p_spheret --steps=50 --json=bench.json

Model and training keys (batch_size, block_size, dtype, device, ...) are read exactly as train.py
reads them. Bench options: --connections=all|a,b  --compile=off|on|both (default both on CUDA,
off elsewhere; here it replaces the training key of the same name)  --steps=N  --warmup=N
--json=PATH. The data are random tokens, so only the speed means anything. Each step is timed
on its own and the median is reported. Peak memory is torch.cuda.max_memory_allocated; on a
CPU it is not measured (n/a).
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from common import autocast_context, enable_tf32, get_device, resolve_dtype
from model import CONNECTIONS, GPT, GPTConfig
from trainconfig import ConfigError, TrainConfig, method_key, parse_config

COMPILE_MODES = {"off": (False,), "on": (True,), "both": (False, True)}


@dataclass
class BenchOptions:
    connections: list[str]
    compile_modes: tuple[bool, ...]
    steps: int = 20
    warmup: int = 5
    json_path: str = ""


def parse_bench_args(argv: list[str], device_type: str) -> tuple[BenchOptions, list[str]]:
    """Take out the bench options; the rest goes to the config parser."""
    raw = {"connections": "all", "compile": "both" if device_type == "cuda" else "off", "steps": "20", "warmup": "5", "json": ""}
    rest = []
    for arg in argv:
        key, _, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if key in raw:
            raw[key] = value
        else:
            rest.append(arg)
    names = list(CONNECTIONS) if raw["connections"] == "all" else raw["connections"].split(",")
    unknown = [n for n in names if n not in CONNECTIONS]
    if unknown:
        raise ConfigError(f"--connections: unknown {unknown}; use 'all' or some of: {', '.join(CONNECTIONS)}.")
    if raw["compile"] not in COMPILE_MODES:
        raise ConfigError(f"--compile={raw['compile']!r}; choose one of: {', '.join(COMPILE_MODES)}.")
    try:
        steps, warmup = int(raw["steps"]), int(raw["warmup"])
    except ValueError:
        raise ConfigError("--steps and --warmup take integers.") from None
    if steps < 1 or warmup < 0:
        raise ConfigError("--steps must be >= 1 and --warmup >= 0.")
    return BenchOptions(names, COMPILE_MODES[raw["compile"]], steps, warmup, raw["json"]), rest


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_one(model_cfg: GPTConfig, train: TrainConfig, device: str, dtype: str, compiled: bool, opts: BenchOptions) -> dict[str, Any]:
    """Time `opts.steps` training steps (after `opts.warmup` untimed ones) of one connection."""
    device_type = device.split(":")[0]
    torch.manual_seed(train.seed)
    model = GPT(model_cfg).to(device)
    optimizer = model.configure_optimizers(train.weight_decay, train.learning_rate, (train.beta1, train.beta2), device_type)
    if compiled:
        torch._dynamo.reset()  # every connection is a new graph; do not hit the recompile limit
    fwd = torch.compile(model) if compiled else model
    shape = (train.batch_size, model_cfg.block_size)
    x = torch.randint(model_cfg.vocab_size, shape, device=device)
    y = torch.randint(model_cfg.vocab_size, shape, device=device)
    if device_type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    autocast = autocast_context(device_type, dtype)
    step_times = []
    for i in range(opts.warmup + opts.steps):
        synchronize(device)
        t0 = time.perf_counter()
        with autocast:
            _, loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip if train.grad_clip > 0 else math.inf)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        if i >= opts.warmup:
            step_times.append(time.perf_counter() - t0)
    # The median step: robust to a stall from another process on a shared machine.
    dt = statistics.median(step_times)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device_type == "cuda" else None
    return {
        "method": method_key(model_cfg),
        "mode": "compiled" if compiled else "eager",
        "tokens_per_s": shape[0] * shape[1] / dt,
        "ms_per_step": 1000 * dt,
        "peak_memory_mb": peak,
        "final_loss": loss.item(),
    }


def add_ratios(results: list[dict[str, Any]]) -> None:
    """tokens/s relative to pre_ln in the same mode (None when pre_ln was not measured)."""
    base = {r["mode"]: r["tokens_per_s"] for r in results if r["method"] == "pre_ln" and "tokens_per_s" in r}
    for r in results:
        r["ratio_to_pre_ln"] = r["tokens_per_s"] / base[r["mode"]] if "tokens_per_s" in r and r["mode"] in base else None


def format_table(results: list[dict[str, Any]]) -> str:
    def cell(r: dict[str, Any], key: str, fmt: str) -> str:
        return format(r[key], fmt) if r.get(key) is not None else "n/a"

    lines = [
        f"| {'method':<14} | {'mode':<8} | {'tokens/s':>10} | {'ms/step':>8} | {'peak MB':>8} | {'vs pre_ln':>9} |",
        f"|{'-' * 16}|{'-' * 10}|{'-' * 12}|{'-' * 10}|{'-' * 10}|{'-' * 11}|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['method']:<14} | {r['mode']:<8} | failed: {r['error'][:60]}")
            continue
        lines.append(
            f"| {r['method']:<14} | {r['mode']:<8} | {cell(r, 'tokens_per_s', ',.0f'):>10} | "
            f"{cell(r, 'ms_per_step', '.1f'):>8} | {cell(r, 'peak_memory_mb', ',.0f'):>8} | "
            f"{cell(r, 'ratio_to_pre_ln', '.3f'):>9} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    opts, rest = parse_bench_args(argv, device_type)
    parsed = parse_config(rest, world_size=0)  # one micro-batch per step: no global batch
    train = parsed.train
    device = get_device(train.device)
    dtype = resolve_dtype(train.dtype, device.split(":")[0])
    if device.startswith("cuda"):
        enable_tf32()
    base_cfg = parsed.model_config()
    setting = {
        **{k: v for k, v in asdict(base_cfg).items() if k != "connection"},
        "batch_size": train.batch_size,
        "device": torch.cuda.get_device_name(device) if device.startswith("cuda") else f"cpu ({torch.get_num_threads()} threads)",
        "dtype": dtype,
        "steps": opts.steps,
        "warmup": opts.warmup,
        "torch": torch.__version__,
    }
    print("bench: " + ", ".join(f"{k}={v}" for k, v in setting.items()), flush=True)
    results = []
    for compiled in opts.compile_modes:
        for name in opts.connections:
            cfg = replace(base_cfg, connection=name)
            try:
                results.append(bench_one(cfg, train, device, dtype, compiled, opts))
            except Exception as e:  # e.g. torch.compile without a working C++ compiler
                results.append({"method": method_key(cfg), "mode": "compiled" if compiled else "eager", "error": f"{type(e).__name__}: {e}"})
            gc.collect()
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            print(f"  {results[-1]['method']} {results[-1]['mode']}: done", file=sys.stderr, flush=True)
    add_ratios(results)
    report = {"setting": setting, "results": results}
    print(format_table(results))
    print(json.dumps(report))
    if opts.json_path:
        with open(opts.json_path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    try:
        main()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
