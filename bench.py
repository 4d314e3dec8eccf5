"""
Speed and activation memory of every deep connection: forward + backward + AdamW step.

    python bench.py config/openwebtext_s.py --compile=both               # a GPU: eager and compiled
    python bench.py --n_layer=12 --n_head=4 --n_embd=128 --block_size=128 --batch_size=8 --device=cpu
    python bench.py ... --connections=pre_ln,p_spheret --sphere_impl=reference,auto --json=bench.json
    python bench.py ... --json=- | tail -1 | jq .             # the results as one JSON line on stdout
    torchrun --standalone --nproc_per_node=8 bench.py config/openwebtext_xl.py --connections=pre_ln --parallel=fsdp

Model and training keys are read exactly as train.py reads them (--compile=True/False as in
train.py, or --compile=both). Every variant (connection x sphere_impl x compile) is built
first; then the timed steps go round-robin, one step of each variant per round, so that a
slow spell of a shared machine hits them all alike, and the median step counts. The data
are random tokens: only speed and memory mean anything.

Output: the setting line and the table on stdout; while it runs, progress lines on stderr
(each variant's warm-up, the timed rounds with the time left, each row's memory); JSON only
when asked: --json=FILE writes the full report to FILE, --json=- prints the results (without
the per-step times) as one line on stdout after the table.

'1st step s' is the first warm-up step of a variant, its torch.compile work included (the JSON
adds first_step_cpu_s, the CPU seconds in it, the compiler's processes included): a cold compile only where the compile
caches are empty (TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)) and the variant is the process's first
of its graph. The first variant of a process also pays the one-time imports of the compiler.

Memory: 'saved MB' is what autograd keeps for backward in one eager forward pass (tensors
packed by torch.autograd.graph.saved_tensors_hooks, each storage once, parameters left
out): the activation memory of a step, on any device (not measured for --parallel=fsdp, whose
weights are gathered during the forward). 'peak MB' is torch.cuda.max_memory_allocated of the
variant's own steps on CUDA; on a CPU, the process's peak resident memory (ru_maxrss), which covers
every variant built, so measure one variant per run there. glibc keeps freed blocks of up to 32 MB in
its heap, so that peak counts memory already given back; --tight_rss=true makes glibc return every
freed tensor at once (a fixed mmap threshold) for a tight peak, but then each step pays the page
faults of mapping its tensors anew, which slows a step by a share that differs between paths (a
model compiled per block allocates between its graphs, a whole-model graph reuses its buffers:
0.70 s against 0.25 s a step at 12 x 128 on a loaded 2-core machine, 2026-12-07), so time without it.

Under torchrun every rank steps its own copy (--parallel=ddp: DDP; --parallel=fsdp: FSDP2 shards,
runtime/parallel.py) on the same tokens; rank 0 prints, and 'peak MB' is the largest over the
ranks (every rank's in the JSON). --activation_checkpointing=true recomputes each block in backward.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import itertools
import json
import os
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before torch: a missing package is one line, not a traceback

import torch

from spheretnorm.runtime.device import DeviceError, autocast_context, enable_tf32, estimate_mfu, get_device, peak_flops_for, resolve_dtype
from spheretnorm.model import BLOCKS, CONNECTIONS, GPT, SPHERE_CONNECTIONS, GPTConfig
from spheretnorm.kernels import SPHERE_IMPLS, compile_mode_text, resolve_impl
from spheretnorm.experiments.memory import saved_activation_bytes  # what autograd keeps for backward
from spheretnorm.optim import OPTIMIZERS, build_optimizer
from spheretnorm.runtime.imports import import_modules, imports_of_overrides
from spheretnorm.runtime.config import COMPILE_SCOPES, ConfigError, TrainConfig, config_help, parse_config, parse_value, wants_help
from spheretnorm.runtime.methods import method_key
from spheretnorm.runtime.distributed import DistInfo, every_rank, init_distributed
from spheretnorm.runtime.parallel import build_model, init_process_group_for, is_sharded, wrap_model
from spheretnorm.runtime.run_folder import LossTermError
from spheretnorm.runtime.step import backward_step

BENCH_OPTIONS = {
    "--connections=all": "connections to measure: all, or a comma-separated list of names",
    "--sphere_impl=auto": "sphere update implementations, comma-separated (e.g. reference,auto); "
    "Euclidean connections run once",
    "--blocks=": "blocks to measure, comma-separated (gpt2, llama); default: the config's --block",
    "--optimizers=": "optimizers to measure, comma-separated or all (spheretnorm/optim.py); default: the config's --optimizer",
    "--compile=False": "as train.py (True/False), or both for eager and compiled rows",
    "--compile_scope=": "compiled rows per scope, comma-separated (auto, blocks, model: train.py's compile_scope); default: the config's",
    "--steps=20": "timed steps of each variant (round-robin); the median is reported",
    "--warmup=5": "untimed steps of each variant first (compilation, allocator)",
    "--json=": "also write the full report to this JSON file; '-': print the results as one JSON line on stdout",
    "--tight_rss=false": "on a CPU, make glibc return freed memory at once: a tight 'peak MB', slower steps (see above)",
    "--profile=0": "then profile this many more steps of each variant and print where a step's time goes "
    "(per kernel on a GPU, per op on a CPU) and, on a GPU, how much of the step the GPU is busy",
}
PROFILE_TOP = 15  # kernels (or ops) listed per variant
PROGRESS_EVERY_S = 5.0  # at most one progress line per timed round this often (and the first and last round)
JSON_STDOUT = "-"
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
USAGE = "usage: python bench.py [config/NAME.py ...] [--key=value ...]"


@dataclass
class BenchOptions:
    connections: list[str]
    sphere_impls: list[str]
    compile_modes: tuple[bool, ...]
    compile_scopes: list[str] = field(default_factory=list)  # empty: the config's compile_scope
    blocks: list[str] = field(default_factory=list)  # empty: the config's block
    optimizers: list[str] = field(default_factory=list)  # empty: the config's optimizer
    steps: int = 20
    warmup: int = 5
    json_path: str = ""
    profile_steps: int = 0
    tight_rss: bool = False


def _names(spec: str, valid: tuple[str, ...] | list[str], what: str) -> list[str]:
    names = list(valid) if spec == "all" else [n for n in spec.split(",") if n]
    unknown = [n for n in names if n not in valid]
    if unknown or not names:
        raise ConfigError(f"--{what}={spec!r}: unknown {unknown}; use some of: {', '.join(valid)}.")
    return names


def _flag(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"--{name}={value!r} is not valid; use true or false.")


def parse_bench_args(argv: list[str]) -> tuple[BenchOptions, list[str]]:
    """Take out the bench options; the rest goes to train.py's config parser."""
    raw = {"connections": "all", "sphere_impl": "auto", "blocks": "", "optimizers": "", "compile": None, "compile_scope": "", "tight_rss": "false", "steps": "20", "warmup": "5", "json": "", "profile": "0"}
    rest = []
    for arg in argv:
        key, _, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if key in raw:
            raw[key] = value
        else:
            rest.append(arg)
    import_modules(imports_of_overrides(rest), "--imports", ConfigError)  # before --connections names a connection of the user's
    if raw["compile"] == "both":
        modes: tuple[bool, ...] = (False, True)
    elif raw["compile"] is not None:
        modes = (bool(parse_value("compile", raw["compile"])),)
    else:
        modes = ()  # the config files decide (train.py's compile key)
    try:
        steps, warmup, profile = int(raw["steps"]), int(raw["warmup"]), int(raw["profile"])
    except ValueError:
        raise ConfigError(
            f"--steps={raw['steps']!r}, --warmup={raw['warmup']!r} and --profile={raw['profile']!r} must be integers."
        ) from None
    if steps < 1 or warmup < 0 or profile < 0:
        raise ConfigError(f"--steps must be >= 1, --warmup and --profile >= 0, got {steps}, {warmup} and {profile}.")
    opts = BenchOptions(
        connections=_names(raw["connections"], list(CONNECTIONS), "connections"),
        sphere_impls=_names(raw["sphere_impl"], list(SPHERE_IMPLS), "sphere_impl"),
        compile_modes=modes,
        compile_scopes=_names(raw["compile_scope"], list(COMPILE_SCOPES), "compile_scope") if raw["compile_scope"] else [],
        blocks=_names(raw["blocks"], list(BLOCKS), "blocks") if raw["blocks"] else [],
        optimizers=_names(raw["optimizers"], list(OPTIMIZERS), "optimizers") if raw["optimizers"] else [],
        steps=steps,
        warmup=warmup,
        json_path=raw["json"],
        profile_steps=profile,
        tight_rss=_flag("tight_rss", raw["tight_rss"]),
    )
    return opts, rest


# -----------------------------------------------------------------------------
# Measurements


def return_freed_memory() -> None:
    """On a CPU, glibc keeps freed blocks of up to 32 MB in its heap (its mmap threshold rises with
    every large free), so the process's peak RSS would count memory long given back; a fixed
    threshold of 128 KiB maps every tensor on its own and returns it when freed (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 128 * 1024)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@dataclass
class Variant:
    """One row of the table: a connection, its sphere_impl, the block and the compile mode."""

    cfg: GPTConfig
    compiled: bool
    step: Callable[[], tuple[float, float]]  # seconds of one training step, and of its optimizer step
    model: GPT
    times: list[float]
    optimizer: str = "adamw"
    optimizer_times: list[float] = field(default_factory=list)
    peak_mb: float | None = None
    first_step_s: float | None = None  # the first warm-up step, torch.compile's work included (wall seconds)
    first_step_cpu_s: float | None = None  # the same in CPU seconds, the compiler's processes included (cpu_seconds)

    device_type: str = "cpu"
    scope: str = "model"  # the resolved compile_scope of a compiled row

    @property
    def label(self) -> dict[str, Any]:
        impl = "-"
        if self.cfg.connection in SPHERE_CONNECTIONS:
            impl = self.cfg.sphere_impl
            if impl == "auto":  # say what auto picked here
                impl = f"auto ({resolve_impl(impl, self.device_type)})"
        return {"method": method_key(self.cfg), "block": self.cfg.block, "impl": impl, "mode": compile_mode_text(self.compiled, self.scope),
                "optimizer": self.optimizer}


def make_step(model: GPT, fwd: torch.nn.Module, train: TrainConfig, x: torch.Tensor, y: torch.Tensor, device: str, dtype: str) -> Callable[[], tuple[float, float]]:
    """A closure that runs one timed training step of `fwd` (the model, compiled or wrapped) with
    train.optimizer and returns its seconds, and those of the optimizer's step within it."""
    device_type = device.split(":")[0]
    optimizer = build_optimizer(model, train, device_type)

    def step() -> tuple[float, float]:
        synchronize(device)
        t0 = time.perf_counter()
        # train.py's step (its loss terms included), on one micro-batch; the clip's norm is global, over the shards too
        backward_step(fwd, lambda _: (x, y), train, autocast=autocast_context(device_type, dtype), clip=model)
        synchronize(device)
        t1 = time.perf_counter()
        optimizer.step()
        synchronize(device)
        t2 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model.after_optimizer_step()  # part of a training step (nGPT renormalises its matrices)
        synchronize(device)
        return time.perf_counter() - t0, t2 - t1

    return step


def with_optimizer(train: TrainConfig, name: str) -> TrainConfig:
    """train with optimizer `name`: its keys as the config set them when it names that optimizer, else their defaults."""
    return train if name == train.optimizer else replace(train, optimizer=name, optimizer_params={})


def compile_variants(opts: BenchOptions, train: TrainConfig) -> list[tuple[bool, str]]:
    """(compiled, compile_scope) of the rows: an eager row once, a compiled row per scope of
    --compile_scope (default: the config's compile_scope)."""
    rows = []
    for compiled in opts.compile_modes or (train.compile,):
        scopes = (opts.compile_scopes or [train.compile_scope]) if compiled else [train.compile_scope]
        rows += [(compiled, scope) for scope in scopes]
    return rows


def build_variants(
    base: GPTConfig, train: TrainConfig, opts: BenchOptions, device: str, dtype: str, bias: bool | None = None,
    dist: DistInfo = DistInfo(),
) -> list[Variant]:
    """Every (compile mode, block, connection, sphere_impl) of opts; bias is the one the config set
    (None: each block's and connection's own, as GPTConfig resolves it); each optimizer of
    opts (default: the config's) steps its own copy of the model. Each model is built as
    train.py builds it (runtime/parallel.py: whole, or FSDP shards, with activation checkpointing)."""
    shape = (train.batch_size, base.block_size)
    g = torch.Generator().manual_seed(train.seed)
    x = torch.randint(base.vocab_size, shape, generator=g).to(device)
    y = torch.randint(base.vocab_size, shape, generator=g).to(device)
    variants = []
    for compiled, scope in compile_variants(opts, train):
        for block in opts.blocks or [base.block]:
            for name in opts.connections:
                impls = opts.sphere_impls if name in SPHERE_CONNECTIONS else ["auto"]
                for impl, optimizer in itertools.product(impls, opts.optimizers or [train.optimizer]):
                    cfg = replace(base, connection=name, sphere_impl=impl, block=block, bias=bias)
                    run = replace(with_optimizer(train, optimizer), compile=compiled, compile_scope=scope)
                    model = build_model(cfg, run, dist, device, dtype)
                    fwd, _ = wrap_model(model, run, dist, device.split(":")[0], dist.local_rank)
                    step = make_step(model, fwd, run, x, y, device, dtype)
                    variants.append(Variant(cfg, compiled, step, model, [], optimizer, device_type=device.split(":")[0], scope=run.resolved_compile_scope()))
    return variants


def progress(line: str) -> None:
    """One progress line on stderr (stdout holds the table, and JSON when asked for); rank 0's only."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(line, file=sys.stderr, flush=True)


def variant_name(v: Variant) -> str:
    return f"{v.label['method']} {v.label['block']} {v.label['impl']} {v.label['mode']} {v.optimizer}"


def cpu_seconds() -> float:
    """CPU seconds of this process and of the children it waited for (the C++ compiler that
    torch.compile runs on a CPU): compile work that wall time on a busy machine overstates."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_round_robin(variants: list[Variant], opts: BenchOptions, device: str) -> None:
    """Warm every variant up, then time one step of each per round; progress on stderr as it goes."""
    if any(v.compiled for v in variants):
        # Every model is its own graph: do not let the recompile limit send some to eager.
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 8 * len(variants))
    n = len(variants)
    for i, v in enumerate(variants, 1):
        started = time.perf_counter()
        for w in range(opts.warmup):
            cpu = cpu_seconds()
            v.step()
            if w == 0:
                v.first_step_s, v.first_step_cpu_s = time.perf_counter() - started, cpu_seconds() - cpu
        progress(f"  warmed up {i}/{n}: {variant_name(v)} ({opts.warmup} step{'' if opts.warmup == 1 else 's'} in {time.perf_counter() - started:.1f} s)")
    cuda = device.startswith("cuda")
    started = last_line = time.perf_counter()
    for r in range(1, opts.steps + 1):
        for v in variants:
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            total, optimizer = v.step()
            v.times.append(total)
            v.optimizer_times.append(optimizer)
            peak = torch.cuda.max_memory_allocated(device) if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            v.peak_mb = max(v.peak_mb or 0.0, peak / 2**20)
        now = time.perf_counter()
        if r in (1, opts.steps) or now - last_line >= PROGRESS_EVERY_S:
            left = (now - started) / r * (opts.steps - r)
            progress(f"  timed round {r}/{opts.steps} ({n} variants, {now - started:.1f} s so far, about {left:.0f} s left)")
            last_line = now


def profile_variant(v: Variant, steps: int, cuda: bool) -> dict[str, Any]:
    """Where the time of one step goes, from torch.profiler over `steps` more steps.

    On a GPU: every kernel (and copy) by its device time per step, and the share of the wall
    time the GPU is busy; a step far from 100% busy is held back by the host (launches,
    Python), not by the kernels. On a CPU: every op by its self time per step.
    """
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        wall = sum(v.step()[0] for _ in range(steps))
    kernels: dict[str, list[float]] = {}  # name -> [microseconds, calls]
    for e in prof.events() if cuda else ():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t = kernels.setdefault(e.name, [0.0, 0])
            t[0] += e.time_range.elapsed_us()
            t[1] += 1
    host = {e.key: [e.self_cpu_time_total, e.count] for e in prof.key_averages()}

    def top(totals: dict[str, list[float]]) -> list[dict[str, Any]]:
        rows = sorted(totals.items(), key=lambda kv: -kv[1][0])[:PROFILE_TOP]
        return [{"name": name, "ms_per_step": t / 1000 / steps, "calls_per_step": n / steps} for name, (t, n) in rows]

    busy = kernels if cuda else host
    return {
        **v.label,
        "wall_ms_per_step": 1000 * wall / steps,
        "busy_ms_per_step": sum(t for t, _ in busy.values()) / 1000 / steps,  # GPU: kernel time; CPU: the ops' self time
        "top": top(busy),
        "host_top": top(host),  # host ops by self time (on a CPU the same as top)
    }


def format_profile(p: dict[str, Any], cuda: bool) -> str:
    what = "GPU busy" if cuda else "ops"
    lines = [
        f"profile: {p['method']} {p['impl']} {p['mode']} | wall {p['wall_ms_per_step']:.2f} ms/step | "
        f"{what} {p['busy_ms_per_step']:.2f} ms/step ({100 * p['busy_ms_per_step'] / p['wall_ms_per_step']:.0f}%)",
        f"  {'ms/step':>8} {'calls':>6}  {'kernel' if cuda else 'op'}",
    ]
    row = "  {ms_per_step:8.3f} {calls_per_step:6.0f}  {name:.110}"
    lines += [row.format(**r) for r in p["top"]]
    if cuda:  # what the host spends its time on while the GPU waits
        lines.append(f"  {'ms/step':>8} {'calls':>6}  host op (self time)")
        lines += [row.format(**r) for r in p["host_top"]]
    return "\n".join(lines)


def result_row(v: Variant, train: TrainConfig, device: str, dtype: str, saved: int | None) -> dict[str, Any]:
    dt = statistics.median(v.times)
    optimizer_dt = statistics.median(v.optimizer_times)
    tokens = train.batch_size * v.cfg.block_size
    peak_flops = train.peak_flops or peak_flops_for(device)
    return {
        **v.label,
        "ms_per_step": 1000 * dt,
        "optimizer_ms_per_step": 1000 * optimizer_dt,
        "optimizer_share": optimizer_dt / dt,
        "tokens_per_s": tokens / dt,
        "saved_mb": saved / 2**20 if saved is not None else None,
        "peak_memory_mb": v.peak_mb,
        "mfu": estimate_mfu(v.model, train.batch_size, dt, peak_flops) if peak_flops else None,
        "first_step_s": v.first_step_s,
        "first_step_cpu_s": v.first_step_cpu_s,
        "step_ms_all": [round(1000 * t, 3) for t in v.times],
    }


def add_ratios(results: list[dict[str, Any]]) -> None:
    """Step time relative to pre_ln in the same block, mode and optimizer (None when pre_ln was not measured)."""
    base = {(r["block"], r["mode"], r["optimizer"]): r["ms_per_step"] for r in results if r["method"] == "pre_ln"}
    for r in results:
        key = (r["block"], r["mode"], r["optimizer"])
        r["ratio_to_pre_ln"] = r["ms_per_step"] / base[key] if key in base else None
        saved_base = next((b["saved_mb"] for b in results if b["method"] == "pre_ln" and b["block"] == r["block"] and b["mode"] == "eager"), None)
        r["saved_ratio_to_pre_ln"] = r["saved_mb"] / saved_base if saved_base and r["saved_mb"] is not None else None


def format_table(results: list[dict[str, Any]]) -> str:
    def cell(r: dict[str, Any], key: str, fmt: str) -> str:
        return format(r[key], fmt) if r.get(key) is not None else "n/a"

    cols = [
        ("method", "method", "<14", None),
        ("block", "block", "<5", None),
        ("impl", "sphere_impl", "<16", None),
        ("mode", "mode", "<8", None),
        ("optimizer", "optimizer", "<9", None),
        ("ms_per_step", "ms/step", ">8", ".2f"),
        ("optimizer_ms_per_step", "opt ms", ">7", ".2f"),
        ("optimizer_share", "opt share", ">9", ".1%"),
        ("ratio_to_pre_ln", "vs pre_ln", ">9", ".3f"),
        ("tokens_per_s", "tokens/s", ">10", ",.0f"),
        ("saved_mb", "saved MB", ">8", ".1f"),
        ("peak_memory_mb", "peak MB", ">8", ",.0f"),
        ("mfu", "MFU", ">6", ".1%"),
        ("first_step_s", "1st step s", ">10", ".1f"),
    ]
    head = "| " + " | ".join(format(title, align) for _, title, align, _ in cols) + " |"
    rule = "|" + "|".join("-" * (len(format(title, align)) + 2) for _, title, align, _ in cols) + "|"
    lines = [head, rule]
    for r in results:
        cells = [format(r[k], a) if f is None else format(cell(r, k, f), a) for k, _, a, f in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv):
        print(config_help(BENCH_OPTIONS, usage=USAGE, description=__doc__.strip().split("\n\n")[0]))
        return {}
    opts, rest = parse_bench_args(argv)
    parsed = parse_config(rest, world_size=0)  # one micro-batch per step: no global batch
    train = parsed.train
    device = get_device(train.device)
    dtype = resolve_dtype(train.dtype, device.split(":")[0])
    if device.startswith("cuda"):
        enable_tf32()
    elif opts.tight_rss:
        return_freed_memory()  # before the models: the peak RSS is then what they hold
    backend = train.backend or ("nccl" if device.startswith("cuda") else "gloo")
    dist = init_distributed(backend, train.dist_timeout)  # under torchrun; else one process
    init_process_group_for(train, dist, backend)
    if dist.enabled and device.startswith("cuda"):
        device = f"cuda:{dist.local_rank}"
    try:
        return run_bench(opts, parsed.model_config(), train, parsed.model_keys.get("bias"), device, dtype, dist)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def run_bench(opts: BenchOptions, base: GPTConfig, train: TrainConfig, bias: bool | None, device: str, dtype: str, dist: DistInfo) -> dict[str, Any]:
    """Build, time and report every variant; every rank steps, rank 0 prints."""
    setting = {
        **{k: v for k, v in asdict(base).items() if k not in ("connection", "sphere_impl", "block", "bias")},
        "batch_size": train.batch_size,
        "device": torch.cuda.get_device_name(device) if device.startswith("cuda") else f"cpu ({torch.get_num_threads()} threads)",
        "dtype": dtype,
        "steps": opts.steps,
        "warmup": opts.warmup,
        "torch": torch.__version__,
        "parallel": f"{train.parallel} x {dist.world_size}",
        "activation_checkpointing": train.activation_checkpointing,
    }
    if dist.is_master:
        print("bench: " + ", ".join(f"{k}={v}" for k, v in setting.items()), flush=True)
    variants = build_variants(base, train, opts, device, dtype, bias, dist)
    run_round_robin(variants, opts, device)
    peaks = every_rank([v.peak_mb for v in variants])  # every rank's peak: a sharded model's ranks differ
    cuda = device.startswith("cuda")
    profiles = [profile_variant(v, opts.profile_steps, cuda) for v in variants] if opts.profile_steps else []
    autocast = autocast_context(device.split(":")[0], dtype)
    idx = torch.randint(base.vocab_size, (train.batch_size, base.block_size), device=device)
    results = []
    for i, v in enumerate(variants, 1):
        saved = None if v.compiled or is_sharded(v.model) else saved_activation_bytes(v.model, idx, autocast)
        results.append(result_row(v, train, device, dtype, saved))
        if dist.enabled:
            results[-1]["peak_memory_mb_per_rank"] = [rank_peaks[i - 1] for rank_peaks in peaks]
            results[-1]["peak_memory_mb"] = max(results[-1]["peak_memory_mb_per_rank"])
        r = results[-1]
        memory = f", saved {r['saved_mb']:.1f} MB" if r["saved_mb"] is not None else ""
        progress(f"  row {i}/{len(variants)}: {variant_name(v)}: {r['ms_per_step']:.2f} ms/step{memory}")
    del variants
    gc.collect()
    add_ratios(results)
    report = {"setting": setting, "results": results}
    if profiles:
        report["profiles"] = profiles
    if not dist.is_master:
        return report
    for p in profiles:
        print(format_profile(p, cuda))
    print(format_table(results))
    if opts.json_path == JSON_STDOUT:
        print(json.dumps({"setting": setting, "results": [{k: v for k, v in r.items() if k != "step_ms_all"} for r in results]}))
    elif opts.json_path:
        with open(opts.json_path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    try:
        main()
    except (ConfigError, DeviceError, LossTermError) as e:  # a loss term of --imports that breaks its contract too
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
