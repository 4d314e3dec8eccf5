"""One rank of tests/test_fsdp.py's two-rank run (torchrun): every in-process FSDP check at once,
through train.py's own Trainer, so that the whole file starts processes only a few times.

    torchrun --nproc_per_node=2 tests/fsdp_worker.py DATA_DIR OUT_DIR

Rank 0 writes OUT_DIR/results.json: losses per scenario, norms, initial-weight differences,
meta-start statistics and the memory a start took.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import torch
import torch.distributed as torch_dist

import toy_optimizer  # noqa: F401 (registers toy_sgd: a third optimizer shards with no other edit)
import train
from spheretnorm.model import GPT, GPTConfig, embedding_axis
from spheretnorm.runtime.config import parse_config
from spheretnorm.runtime.distributed import init_distributed
from spheretnorm.runtime.parallel import build_model, full_parameters
from spheretnorm.runtime.stopping import StopSignal

CONNECTIONS = ("pre_ln", "p_spheret", "geonorm", "ngpt")
BLOCKS = ("gpt2", "llama")
STEPS = 10
MUON_SAVE_AT = 6  # past the warm-up (2 steps): Muon at its full rate
MUON_CHECKPOINT = "muonh"  # Muon's momentum and Newton-Schulz, and the radii the Hyperball keeps in its state
# The train.py runs of tests/test_fsdp.py (stopped, resumed on 1 and 4 ranks), besides tiny_args:
# 4, 2 and 1 micro-steps a step on 1, 2 and 4 ranks.
RUN_ARGS = ("--parallel=fsdp", "--backend=gloo", "--eval_interval=200", "--dist_timeout=60", "--global_batch_size=16")
# The model of the memory check: big enough that its weights (about 58 MB) dwarf the noise of a process.
MEMORY_MODEL = dict(n_layer=4, n_head=4, n_embd=512, block_size=16, vocab_size=4096, connection="pre_ln")


def tiny(data_dir: str, out_dir: Path, *extra: str) -> list[str]:
    """tests/test_train.py's tiny_args, with a global batch that makes two micro-steps per rank."""
    from test_train import tiny_args

    return tiny_args(Path(data_dir), out_dir, "--global_batch_size=16", "--eval_iters=3", "--backend=gloo", *extra)


def trainer(argv: list[str], dist) -> train.Trainer:
    return train.Trainer(parse_config(argv), dist, "cpu")


def losses(t: train.Trainer, steps: int) -> list[float]:
    stop = StopSignal()
    return [t.train_step(step, stop)[0] for step in range(steps)]


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    with full_parameters(model):
        return {n: p.detach().clone() for n, p in model.named_parameters()}


def unit_norm_error(model: torch.nn.Module) -> float:
    """The largest | ||w|| - 1 | over every matrix's rows along its embedding axis (whole tensors)."""
    worst = 0.0
    for name, p in model.named_parameters():
        if p.dim() == 2:
            whole = p.full_tensor() if hasattr(p, "full_tensor") else p
            worst = max(worst, (whole.norm(dim=embedding_axis(name)) - 1).abs().max().item())
    return worst


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_at_start(data_dir: str, out: Path, dist) -> dict[str, float]:
    """The peak memory a meta start added, then a whole start (first: the peak only grows)."""
    cfg = parse_config(tiny(data_dir, out, "--parallel=fsdp", "--fsdp_init=meta")).train
    config = GPTConfig(**MEMORY_MODEL)
    # The first meta build imports torch's meta kernels (about 100 MB): not the model's memory.
    build_model(GPTConfig(**{**MEMORY_MODEL, "n_embd": 32, "vocab_size": 64}), cfg, dist, "cpu", "float32")
    base = peak_rss_bytes()
    model = build_model(config, cfg, dist, "cpu", "float32")
    meta_peak = peak_rss_bytes() - base
    local = sum(p.to_local().numel() * 4 for p in model.parameters())
    del model
    with torch.device("meta"):
        whole = 4 * GPT(config).get_num_params(non_embedding=False)
    return {"meta_peak": meta_peak, "local_shard": local, "whole": whole}


def main(data_dir: str, out_dir: str) -> None:
    out = Path(out_dir)
    dist = init_distributed("gloo", 120)
    results: dict = {"memory": memory_at_start(data_dir, out, dist)}
    results["losses"], results["unit_norm"], results["init_diff"], results["eval"], results["weight_diff"] = {}, {}, {}, {}, {}
    variants = [(c, b, ()) for c in CONNECTIONS for b in BLOCKS] + [("pre_ln", "gpt2", ("--mup_base_width=16",))]
    # Muon orthogonalises whole matrices, sharded or not; and an optimizer registered from a test module.
    variants += [("pre_ln", "gpt2", ("--optimizer=muon",)), ("p_spheret", "llama", ("--optimizer=muon",)), ("pre_ln", "gpt2", ("--optimizer=toy_sgd",))]
    # The Hyperball optimizers' norms are of whole matrices (a reduction over the ranks' shards). In
    # LLaMA's block: GPT-2's key bias has a zero gradient up to rounding, which Adam amplifies (1e-5 and more).
    variants += [("p_spheret", "llama", ("--optimizer=muonh",)), ("p_spheret", "llama", ("--optimizer=adamh", "--hyperball_radius=0.5"))]
    for connection, block, extra in variants:
        key = f"{connection}/{block}" + "".join(extra)
        args = tiny(data_dir, out / key.replace("-", ""), f"--connection={connection}", f"--block={block}", *extra)
        runs = {}
        for parallel in ("ddp", "fsdp"):
            start = ["--fsdp_init=full"] if parallel == "fsdp" else []  # DDP's initial weights, sharded (ddp refuses the key)
            t = trainer([*args, f"--parallel={parallel}", *start], dist)
            initial = full_weights(t.raw_model)
            runs[parallel] = (t, initial, losses(t, STEPS))
        (ddp, ddp_init, ddp_losses), (fsdp, fsdp_init, fsdp_losses) = runs["ddp"], runs["fsdp"]
        results["losses"][key] = {"ddp": ddp_losses, "fsdp": fsdp_losses}
        results["init_diff"][key] = max((ddp_init[n] - fsdp_init[n]).abs().max().item() for n in ddp_init)
        results["unit_norm"][key] = unit_norm_error(fsdp.raw_model)
        ddp_now, fsdp_now = full_weights(ddp.raw_model), full_weights(fsdp.raw_model)
        results["weight_diff"][key] = max((ddp_now[n] - fsdp_now[n]).abs().max().item() for n in ddp_now)
        if block == "gpt2":  # the evaluation row: loss shared among ranks, diagnostics on gathered weights
            rows = [t.evaluator.evaluate() for t in (ddp, fsdp)]
            results["eval"][key] = [{k: v for k, v in row.items() if not k.endswith("_s")} for row in rows]
    # Activation checkpointing, in both modes.
    args = tiny(data_dir, out / "ac", "--connection=p_spheret")
    results["checkpointing"] = {
        f"{parallel}/{ac}": losses(trainer([*args, f"--parallel={parallel}", f"--activation_checkpointing={ac}"], dist), STEPS)
        for parallel in ("ddp", "fsdp")
        for ac in ("false", "true")
    }
    # The meta start of nGPT: per-parameter statistics against the whole build, and distinct shards.
    meta = trainer(tiny(data_dir, out / "meta", "--connection=ngpt", "--parallel=fsdp", "--fsdp_init=meta"), dist)
    local = {n: p.to_local().detach().clone() for n, p in meta.raw_model.named_parameters()}
    gathered = [None] * dist.world_size
    torch_dist.all_gather_object(gathered, {n: v.flatten()[:8].tolist() for n, v in local.items() if v.numel() >= 8})
    results["meta"] = {
        "weights": {n: w.flatten().tolist() for n, w in full_weights(meta.raw_model).items()},
        "unit_norm": unit_norm_error(meta.raw_model),
        "same_shards": sorted(n for n in gathered[0] if n in gathered[1] and gathered[0][n] == gathered[1][n]),
        "losses": losses(meta, 3),
    }
    # The uninterrupted run that test_fsdp's resumes on 1 and 4 ranks must continue.
    results["reference"] = losses(trainer(train_reference_args(data_dir, out / "reference"), dist), 40)
    results["muon"] = muon_checkpoint(data_dir, out, dist)  # MuonH: Muon's state and the Hyperball's radii
    if dist.is_master:
        (out / "results.json").write_text(json.dumps(results))
    torch_dist.destroy_process_group()


def muon_checkpoint(data_dir: str, out: Path, dist) -> dict:
    """A MuonH run's sharded checkpoint after MUON_SAVE_AT steps, and the same run uninterrupted:
    test_fsdp resumes the folder on one process (resharded) and compares."""
    folder = out / "muon_ckpt"
    if dist.is_master:
        folder.mkdir(parents=True, exist_ok=True)
    torch_dist.barrier()
    t = trainer([*train_reference_args(data_dir, folder), f"--optimizer={MUON_CHECKPOINT}"], dist)
    losses(t, MUON_SAVE_AT)
    t.progress.iter_num = MUON_SAVE_AT
    t.save_checkpoint()
    reference = losses(trainer([*train_reference_args(data_dir, out / "muon_reference"), f"--optimizer={MUON_CHECKPOINT}"], dist), MUON_SAVE_AT + 4)
    return {"out_dir": str(folder), "reference": reference}


def train_reference_args(data_dir: str, out: Path) -> list[str]:
    """tests/test_fsdp.py's torchrun runs: tiny_args under fsdp (its resumes use the same)."""
    from test_train import tiny_args

    return tiny_args(Path(data_dir), out, *RUN_ARGS)


if __name__ == "__main__":
    main(*sys.argv[1:])
