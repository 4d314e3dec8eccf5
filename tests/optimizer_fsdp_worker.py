"""One rank of tests/test_optimizer_contract.py's two-rank FSDP check (torchrun): every registered
optimizer in one launch, each trained a few steps under --parallel=fsdp through train.py's Trainer.

    torchrun --standalone --nproc_per_node=2 tests/optimizer_fsdp_worker.py PLAN.json OUT_DIR

PLAN.json: {"modules": the modules that register the optimizers (imported first, as train.py's
--imports), "data_dir": ..., "steps": N, "runs": {optimizer: its training arguments}}. Rank 0
writes OUT_DIR/results.json, {optimizer: {"losses": [...]}, {"refused": the ConfigError's
sentence} or {"error": the traceback of a failed step}}, and OUT_DIR/OPTIMIZER.pt, the whole
weights after the steps. The test compares them with one process's run of the same arguments.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as torch_dist

from spheretnorm.runtime.imports import import_modules


def main(plan_file: str, out_dir: str) -> None:
    plan = json.loads(Path(plan_file).read_text())
    import_modules(plan["modules"], "the plan's modules")  # before the optimizers' names are read

    import train
    from spheretnorm.runtime.config import ConfigError, parse_config
    from spheretnorm.runtime.distributed import init_distributed
    from spheretnorm.runtime.parallel import full_parameters
    from spheretnorm.runtime.stopping import StopSignal

    out = Path(out_dir)
    dist = init_distributed("gloo", 120)
    results: dict[str, dict] = {}
    for name, args in plan["runs"].items():
        argv = [f"--data_dir={plan['data_dir']}", f"--out_dir={out / name}", *args,
                "--parallel=fsdp", "--fsdp_init=full", "--backend=gloo", "--dist_timeout=60"]
        try:
            t = train.Trainer(parse_config(argv), dist, "cpu")
        except ConfigError as e:  # an optimizer that cannot run sharded refuses at the start, on every rank
            results[name] = {"refused": str(e)}
            continue
        try:
            stop = StopSignal()
            losses = [t.train_step(step, stop)[0] for step in range(plan["steps"])]
            with full_parameters(t.raw_model):  # a collective: every rank gathers
                weights = {n: p.detach().clone() for n, p in t.raw_model.named_parameters()}
        except Exception:  # noqa: BLE001 (a user's optimizer that breaks sharded: its own test fails, with this)
            results[name] = {"error": traceback.format_exc()[-3000:]}
            continue
        finally:
            t.close()
        if dist.is_master:
            torch.save(weights, out / f"{name}.pt")
        results[name] = {"losses": losses}
    if dist.is_master:
        (out / "results.json").write_text(json.dumps(results))
    torch_dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
