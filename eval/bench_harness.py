"""Throughput of the nanogpt lm-eval model against lm-eval's hf model on the same weights.

Both score the same PIQA loglikelihood requests (2 per question, built as lm-eval's piqa task
builds them) on the CPU, with the same batch size; the script prints requests/s for each and
the largest difference between their loglikelihoods.

    python eval/bench_harness.py --data_dir ../shared/evaldata --n 200 --batch_size 8
    python eval/bench_harness.py --ckpt out/ckpt.pt ...   (a pre_ln checkpoint)

Without --ckpt the model is a randomly initialised pre_ln GPT of --preset size (speed does
not depend on the weights). Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this clone's package, installed or not (docs/ARCHITECTURE.md)
from spheretnorm.runtime.cli import explain_missing_packages

explain_missing_packages(__file__)  # before any third-party import

import argparse
import os
import time
from typing import Any

import torch

from spheretnorm.zeroshot.local_tasks import PIQA_FILE, PIQA_LABELS_FILE, piqa_records
from spheretnorm.model import GPT, GPTConfig

PRESETS = {
    "tiny": dict(n_layer=2, n_head=2, n_embd=32, block_size=256),  # PIQA fits: hf fails otherwise
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),  # the paper's S scale
}


def piqa_requests(data_dir: Path, n: int) -> list[Any]:
    """lm-eval Instances for the first n PIQA questions: 'Question: goal\\nAnswer:' + ' solution'."""
    from lm_eval.api.instance import Instance

    records = piqa_records(
        (data_dir / PIQA_FILE).read_text(encoding="utf-8"), (data_dir / PIQA_LABELS_FILE).read_text(encoding="utf-8")
    )[:n]
    requests = []
    for doc_id, doc in enumerate(records):
        context = f"Question: {doc['goal']}\nAnswer:"
        for choice, solution in enumerate((doc["sol1"], doc["sol2"])):
            requests.append(
                Instance("loglikelihood", doc, (context, " " + solution), idx=choice, doc_id=doc_id, task_name="piqa")
            )
    return requests


def build_model(args: argparse.Namespace) -> GPT:
    if args.ckpt:
        from spheretnorm.zeroshot.harness import load_eval_model

        return load_eval_model(args.ckpt)[0]
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=50304, connection="pre_ln", **PRESETS[args.preset]))


def time_loglikelihood(lm: Any, requests: list[Any]) -> tuple[float, list[float]]:
    """(requests per second, loglikelihoods) of one pass over the requests."""
    start = time.perf_counter()
    scores = lm.loglikelihood(requests, disable_tqdm=True)
    elapsed = time.perf_counter() - start
    return len(requests) / elapsed, [s[0] for s in scores]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data_dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "evaldata"))
    p.add_argument("--n", type=int, default=200, help="PIQA questions (2 requests each)")
    p.add_argument("--batch_size", type=int, default=8, help="nanogpt rows (one question each) per forward pass")
    p.add_argument("--hf_batch_size", type=int, default=None, help="hf requests per forward pass (default: --batch_size)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="gpt2")
    p.add_argument("--ckpt", default=None, help="a pre_ln checkpoint instead of a random model")
    p.add_argument("--repeats", type=int, default=2, help="timed passes per model, alternating; the best counts")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from lm_eval.models.huggingface import HFLM

    from spheretnorm.zeroshot.harness import NanoGPTLM
    from spheretnorm.hf.gpt2 import offline_gpt2_tokenizer, to_hf_gpt2

    model = build_model(args).eval()
    requests = piqa_requests(Path(args.data_dir), args.n)
    ours = NanoGPTLM(model=model, device="cpu", batch_size=args.batch_size)
    hf_batch_size = args.hf_batch_size or args.batch_size
    hf = HFLM(pretrained=to_hf_gpt2(model), tokenizer=offline_gpt2_tokenizer(), batch_size=hf_batch_size)
    for lm in (ours, hf):  # warm-up: first calls pay for allocations and lazy initialisation
        lm.loglikelihood(requests[:8], disable_tqdm=True)
    rates: dict[str, list[float]] = {"nanogpt": [], "hf": []}
    loglikelihoods: dict[str, list[float]] = {}
    for _ in range(args.repeats):  # alternate, so that a slow spell of the machine hits both
        for name, lm in (("nanogpt", ours), ("hf", hf)):
            rate, lls = time_loglikelihood(lm, requests)
            rates[name].append(rate)
            loglikelihoods[name] = lls
    max_diff = max(abs(a - b) for a, b in zip(loglikelihoods["nanogpt"], loglikelihoods["hf"]))
    cfg = model.config
    print(
        f"PIQA, {len(requests)} loglikelihood requests, batch_size {args.batch_size} "
        f"(hf {hf_batch_size}), "
        f"{torch.get_num_threads()} CPU threads ({os.cpu_count()} cores), model n_layer={cfg.n_layer} "
        f"n_embd={cfg.n_embd} block_size={cfg.block_size}"
    )
    for name, values in rates.items():
        print(f"{name:8s} {max(values):8.1f} requests/s (best of {', '.join(f'{v:.1f}' for v in values)})")
    print(f"largest |loglikelihood difference|: {max_diff:.2e}")


if __name__ == "__main__":
    main()
