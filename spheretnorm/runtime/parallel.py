"""How the model is laid over the processes: DDP (a whole copy per rank) or FSDP2 (every block
and the root sharded with torch.distributed.fsdp.fully_shard), activation checkpointing, and the
meta-device start of a model too big to build whole: train.py's model, gradient sync and global
gradient norm, and the gathered parameters the evaluator's diagnostics read (full_parameters).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Callable, Iterator

import torch
import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel as DDP

from spheretnorm.model import GPT, GPTConfig
from spheretnorm.runtime.config import ConfigError, TrainConfig
from spheretnorm.runtime.device import seed_everything
from spheretnorm.runtime.distributed import DistInfo, print0

# A model is built whole (on the CPU, as DDP builds it, then sharded) when its fp32 weights take at
# most this share of the memory one rank may use; above it, on the meta device (fsdp_init=auto).
# The whole build briefly holds weights, their copy on the device and the start of the optimizer.
FULL_BUILD_SHARE = 0.25


def fsdp_module_type() -> type | None:
    """FSDP2's module class, or None while nothing has imported FSDP (then no module is sharded):
    importing it costs about a second, which a DDP run never pays."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return None if fsdp is None else fsdp.FSDPModule


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether `model` is an FSDP2 root (its parameters are DTensor shards)."""
    kind = fsdp_module_type()
    return kind is not None and isinstance(model, kind)


# -----------------------------------------------------------------------------
# Which start: the whole model, or the meta device


def parameter_bytes(config: GPTConfig) -> int:
    """Bytes of the model's fp32 weights, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        return 4 * GPT(config).get_num_params(non_embedding=False)


def memory_per_rank(device: str, dist: DistInfo) -> int:
    """Free bytes one rank may use: the GPU's free memory, and the host's available memory shared
    by the ranks of this node (the whole build is made on the host first)."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", dist.world_size))
    host = 0  # unknown: the meta start, which needs no host copy
    with contextlib.suppress(OSError, ValueError):
        host = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with contextlib.suppress(OSError, ValueError, KeyError):  # Linux counts reclaimable caches as available
        with open("/proc/meminfo", encoding="utf-8") as f:
            info = dict(line.split(":", 1) for line in f)
        host = int(info["MemAvailable"].split()[0]) * 1024
    free = host // max(local_ranks, 1)
    if device.startswith("cuda"):
        free = min(free, torch.cuda.mem_get_info(torch.device(device))[0])
    return free


def choose_start(cfg: TrainConfig, config: GPTConfig, device: str, dist: DistInfo) -> tuple[str, str]:
    """("full" or "meta", why): fsdp_init when set, else whole when it fits (FULL_BUILD_SHARE)."""
    if cfg.fsdp_init != "auto":
        return cfg.fsdp_init, f"fsdp_init={cfg.fsdp_init}"
    need, free = parameter_bytes(config), memory_per_rank(device, dist)
    start = "full" if need <= FULL_BUILD_SHARE * free else "meta"
    sign = "<=" if start == "full" else ">"
    return start, f"fsdp_init=auto: fp32 weights {need / 2**20:,.0f} MiB {sign} {FULL_BUILD_SHARE:g} x {free / 2**20:,.0f} MiB free per rank"


# -----------------------------------------------------------------------------
# Building the model


def checkpoint_activations(model: GPT) -> None:
    """Recompute each block's forward in its backward (torch.utils.checkpoint): only a block's input
    is kept. The forward is replaced on the instance, so parameter names (and checkpoints) stay."""
    for block in model.transformer.h:
        block.forward = recomputed_in_backward(block.forward)


def recomputed_in_backward(forward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """forward under torch.utils.checkpoint. A function of this file, not a functools.partial of
    torch's checkpoint: torch.compile skips a frame whose forward is one of torch's own functions
    and traces this one, so a compiled block (compile_scope=blocks, FSDP) keeps both."""

    def run(*args: torch.Tensor | None, **kwargs: torch.Tensor | None) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def mixed_precision(dtype: str) -> object:
    """FSDP's policy: compute in the run's dtype, reduce gradients and keep master weights in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if dtype == "float16":
        raise ConfigError(
            "parallel=fsdp does not run dtype=float16 (its GradScaler is DDP's); choose dtype=bfloat16 or float32, "
            "or parallel=ddp."
        )
    return MixedPrecisionPolicy(param_dtype=getattr(torch, dtype), reduce_dtype=torch.float32)


def shard(model: GPT, dist: DistInfo, device: str, dtype: str, compile_blocks: bool) -> GPT:
    """fully_shard every block, then the root (embeddings, final norm, head), over one mesh of all
    ranks; each block compiled on its own first when asked (names kept: Module.compile)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.split(":")[0], (dist.world_size,))
    policy = mixed_precision(dtype)
    # FSDP2 warns at every start that a block returned a view: the sphere updates reshape their
    # 2-D result back to (B, T, d) with a view, at no cost. Its worry, an in-place op on that
    # output skipping the next all-gather, cannot happen here: no activation of the model is
    # changed in place (tests/test_layout.py reads model.py for in-place ops). That message only.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor", category=UserWarning)
    if compile_blocks:
        compile_blocks_of(model)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, mp_policy=policy, ignored_params=scalar_parameters(block))
    fully_shard(model, mesh=mesh, mp_policy=policy, ignored_params=scalar_parameters(model))
    return model


def compile_blocks_of(model: GPT) -> None:
    """torch.compile each block in place (Module.compile: parameter names and checkpoints unchanged).

    The blocks share one forward, and torch.compile takes their parameters as inputs, so the first
    block's graph serves every layer (a per-layer number, a sphere connection's depth decay, compiles
    once more at the second): the compile costs about one block's at any depth (docs/LOG.md, 2026-12-07).
    """
    for block in model.transformer.h:
        block.compile()


def compile_model(model: GPT, scope: str) -> torch.nn.Module:
    """The model as the training step calls it under compile=true: its blocks and the modules around
    them compiled in place (scope 'blocks', the model itself), or one torch.compile of the whole ('model')."""
    if scope == "model":
        return torch.compile(model)
    if scope != "blocks":
        raise ValueError(f"compile_scope={scope!r} is not valid here; choose blocks or model (auto is resolved first: TrainConfig.resolved_compile_scope).")
    compile_blocks_of(model)
    # The modules around the blocks, one small graph each: left eager beside compiled blocks they cost
    # about 12% of a 12 x 128 step on a CPU core in one comparison (docs/LOG.md, 2026-12-07).
    for module in (model.transformer.embed_norm, model.transformer.ln_f, model.lm_head):
        if not isinstance(module, torch.nn.Identity):
            module.compile()
    return model


def scalar_parameters(module: torch.nn.Module) -> set[torch.nn.Parameter]:
    """The 0-dim parameters (sphere step sizes, DyT's alpha, ScaleNorm's gain), which fully_shard
    cannot shard: they stay whole on every rank, in fp32, and clip_grad_norm averages their gradients."""
    return {p for p in module.parameters() if p.dim() == 0}


def build_model(
    config: GPTConfig, cfg: TrainConfig, dist: DistInfo, device: str, dtype: str,
    prepare: Callable[[GPT], None] | None = None,
) -> GPT:
    """The run's GPT on `device`: whole under DDP, sharded under FSDP. The weights are drawn from
    seed cfg.seed on every rank, then each rank seeds its own dropout stream (seed + rank).

    prepare (e.g. loading a Hugging Face folder) runs on the whole model before it moves. FSDP's
    meta start (choose_start) builds no whole model: GPT.init_weights draws the shards on the
    device (seed + rank: every parameter keeps its init rule, but not the whole build's values).
    """
    start = "full"
    if cfg.parallel == "fsdp":
        start, why = choose_start(cfg, config, device, dist)
        if start == "meta" and prepare is not None:
            start, why = "full", "a Hugging Face start loads the folder into the whole model"
        print0(f"FSDP start: {'whole model, then sharded' if start == 'full' else 'meta device, initialised shard by shard'} ({why})")
    torch.manual_seed(cfg.seed)
    if start == "meta":
        with torch.device("meta"):
            model = GPT(config)
    else:
        model = GPT(config)
        if prepare is not None:
            prepare(model)
    seed_everything(cfg.seed + dist.rank)
    if cfg.activation_checkpointing:
        checkpoint_activations(model)
    if cfg.parallel == "ddp":
        return model.to(device)
    if start == "full":
        model.to(device)
    shard(model, dist, device, dtype, cfg.compile)
    if start == "meta":
        model.to_empty(device=device)
        torch.manual_seed(cfg.seed + dist.rank)
        model.init_weights()
        for p in scalar_parameters(model):  # whole on every rank (not sharded): rank 0's values for all
            torch_dist.broadcast(p.data, src=0)
        seed_everything(cfg.seed + dist.rank)
    return model


def wrap_model(model: GPT, cfg: TrainConfig, dist: DistInfo, device_type: str, local_rank: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(what the training step calls, what the evaluation calls): DDP around the (compiled) model,
    or the FSDP root itself for both (its blocks are compiled already)."""
    if cfg.parallel == "fsdp":
        return model, model
    fwd_model = compile_model(model, cfg.resolved_compile_scope()) if cfg.compile else model
    if not dist.enabled:
        return fwd_model, fwd_model
    return DDP(fwd_model, device_ids=[local_rank] if device_type == "cuda" else None), fwd_model


# -----------------------------------------------------------------------------
# The step


def grad_sync(model: torch.nn.Module, last: bool, dist: DistInfo) -> contextlib.AbstractContextManager:
    """Gradients are reduced on the last micro-step only: DDP's no_sync on the others, FSDP's
    set_requires_gradient_sync (which keeps the unreduced gradients until the last)."""
    if is_sharded(model):
        model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()
    return contextlib.nullcontext() if last or not dist.enabled else model.no_sync()


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip to max_norm and return the global gradient norm (of the whole model, on every rank).
    Under FSDP the whole (scalar) parameters' gradients are averaged over the ranks first, as DDP's."""
    if not is_sharded(model):
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    from torch.distributed.tensor import DTensor  # imported here: 0.85 s at every start of a DDP run

    params = [p for p in model.parameters() if p.grad is not None]
    sharded = [p for p in params if isinstance(p.grad, DTensor)]
    whole = [p for p in params if not isinstance(p.grad, DTensor)]
    if whole and torch_dist.get_world_size() > 1:
        flat = torch.cat([p.grad.flatten() for p in whole])
        torch_dist.all_reduce(flat)
        flat /= torch_dist.get_world_size()
        for p, g in zip(whole, flat.split([p.numel() for p in whole])):
            p.grad.copy_(g.view_as(p.grad))
    norms = [torch.nn.utils.get_total_norm([p.grad for p in sharded]).full_tensor()] if sharded else []
    norms += [torch.nn.utils.get_total_norm([p.grad for p in whole])] if whole else []
    total = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
    for group in (sharded, whole):
        if group:
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


@contextlib.contextmanager
def full_parameters(model: torch.nn.Module) -> Iterator[None]:
    """Every parameter of an FSDP model gathered whole on every rank (all ranks must enter), for
    code that calls submodules directly (the diagnostics); nothing to do for a whole model."""
    kind = fsdp_module_type()
    sharded = [m for m in model.modules() if kind is not None and isinstance(m, kind)]
    for module in sharded:
        module.unshard()
    try:
        yield
    finally:
        for module in sharded:
            module.reshard()


def init_process_group_for(cfg: TrainConfig, dist: DistInfo, backend: str) -> None:
    """FSDP needs a process group even on one process (python train.py, no torchrun): a group of one."""
    if cfg.parallel == "fsdp" and not torch_dist.is_initialized():
        torch_dist.init_process_group(backend, store=torch_dist.HashStore(), rank=0, world_size=1)
