"""Write the legacy_c99ed0b fixture: a sharded checkpoint (ckpt.dcp) that a 2-rank FSDP run of
commit c99ed0b wrote, and the losses that code printed when it resumed that folder itself.

c99ed0b is the last commit before issue 47 gave every optimizer group a "peak_lr" key
(spheretnorm/optim.py, stamp_peak_rates): its folder's optimizer groups hold lr, betas, eps,
weight_decay and the rest, but no peak_lr. tests/test_legacy_c99ed0b.py checks that later code
resumes the folder and trains on as the old code did. This script is NOT run by the tests: it was
run once, on the OLD code, and its output is committed next to it. How it was run:

    git -C /work/main worktree add /tmp/oldc99 c99ed0b
    cd /tmp/oldc99
    PYTHONPATH=/tmp/oldc99:/tmp/oldc99/tests python /work/wt_h4/tests/data/legacy_c99ed0b/make_fixtures.py --repo=/tmp/oldc99
    git -C /work/main worktree remove --force /tmp/oldc99

(--repo is the checkout of c99ed0b whose train.py and tests/markov_data.py are run; the output
goes next to this file unless --out says otherwise.) Every run is on the CPU, in float32, with
gloo, OMP_NUM_THREADS=1 and SPHERETNORM_EAGER_KERNELS=1, as the tests run train.py.

  * `torchrun --standalone --nproc_per_node=2 train.py TRAIN_ARGS --max_iters=4` trains a tiny
    p_spheret model (2 layers, n_embd 16, block 16) under --parallel=fsdp on the token stream of
    tests/markov_data.py, 2 micro-steps of 4 sequences per rank and step; it saves ckpt.dcp at
    iteration 4 (with its optimizer state). Its run folder (ckpt.dcp, config.json,
    metrics.jsonl) is kept as run/;
  * a copy of run/ is resumed to iteration 7 (RESUME_ARGS) by the same code, once on 2 ranks
    under torchrun and once in 1 process (4 micro-steps, the shards of both ranks read by one):
    the train losses of iterations 5 to 7 and the val loss at 7, as metrics.jsonl holds them,
    go into expected.json under "resumed", by the number of processes;
  * the same run straight to iteration 7 on 2 ranks is also made, and whether the 2-rank resume
    matches it bit for bit is recorded (resume_matches_straight_run).

The kept config.json, metrics.jsonl and meta.pt record the run's temporary data_dir and out_dir;
a resume is given its own. At c99ed0b the 2-rank resume matched the straight run bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMMIT = "c99ed0b"

# Every key explicit, so that a later change of a default does not change the run.
TRAIN_ARGS = [
    "--connection=p_spheret",
    "--block=gpt2",
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=16",
    "--block_size=16",
    "--batch_size=4",
    "--global_batch_size=16",
    "--eval_iters=2",
    "--eval_interval=200",
    "--log_interval=1",
    "--warmup_iters=2",
    "--lr_decay_iters=40",
    "--learning_rate=3e-3",
    "--min_lr=3e-4",
    "--seed=1337",
    "--collapse_evals=0",
    "--device=cpu",
    "--dtype=float32",
    "--compile=false",
    "--wandb_log=false",
    "--parallel=fsdp",
    "--backend=gloo",
    "--dist_timeout=60",
]
SAVE_AT, RESUME_TO = 4, 7
RESUME_ARGS = ["--init_from=resume", f"--max_iters={RESUME_TO}"]
KEPT = ("ckpt.dcp", "config.json", "metrics.jsonl")  # the run folder a resume reads


def launcher(nproc: int) -> list[str]:
    if nproc == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def run_train(repo: Path, nproc: int, args: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "SPHERETNORM_EAGER_KERNELS": "1",
           "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "tests")])}
    result = subprocess.run([*launcher(nproc), "train.py", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        sys.exit(f"train.py {' '.join(args)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def rows(out_dir: Path, kind: str) -> dict[int, dict]:
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return {r["iter"]: r for r in map(json.loads, lines) if r["kind"] == kind}


def losses(out_dir: Path, first: int, last: int) -> dict[str, dict[str, float]]:
    train, evals = rows(out_dir, "train"), rows(out_dir, "eval")
    return {"train_loss": {str(i): train[i]["train_loss"] for i in range(first, last + 1)},
            "val_loss": {str(last): evals[last]["val_loss"]}}


def check_checkout(repo: Path) -> str:
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert head.startswith(COMMIT), f"{repo} is at {head}, not {COMMIT}"
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert not dirty, f"{repo} has local changes:\n{dirty}"
    return head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", default=".", help="the checkout of commit c99ed0b to run")
    parser.add_argument("--out", default=str(HERE), help="where to write the fixture")
    args = parser.parse_args()
    repo, out = Path(args.repo).resolve(), Path(args.out).resolve()
    head = check_checkout(repo)
    import torch
    from markov_data import write_markov_data

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = write_markov_data(tmp / "data")
        keys = [*TRAIN_ARGS, f"--data_dir={data}"]
        saved, straight = tmp / "saved", tmp / "straight"
        run_train(repo, 2, [*keys, f"--out_dir={saved}", f"--max_iters={SAVE_AT}"])
        run_train(repo, 2, [*keys, f"--out_dir={straight}", f"--max_iters={RESUME_TO}"])
        kept = out / "run"
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(parents=True)
        for name in KEPT:
            copy = shutil.copytree if (saved / name).is_dir() else shutil.copy2
            copy(saved / name, kept / name)
        resumed = {}
        for nproc in (2, 1):
            folder = tmp / f"resumed_{nproc}"
            shutil.copytree(kept, folder)
            run_train(repo, nproc, [*keys, f"--out_dir={folder}", *RESUME_ARGS])
            resumed[str(nproc)] = losses(folder, SAVE_AT + 1, RESUME_TO)
        reference = losses(straight, SAVE_AT + 1, RESUME_TO)
        expected = {
            "written_by": f"tests/data/legacy_c99ed0b/make_fixtures.py on spheretnorm at commit {head} "
            f"(torch {torch.__version__}, OMP_NUM_THREADS=1, SPHERETNORM_EAGER_KERNELS=1)",
            "folder": kept.name,
            "saved_by_processes": 2,
            "train_args": TRAIN_ARGS,
            "saved_at": SAVE_AT,
            "saved_train_loss": {str(i): r["train_loss"] for i, r in rows(saved, "train").items()},
            "resume_args": RESUME_ARGS,
            "resumed": resumed,
            "straight_2_processes": reference,
            "resume_matches_straight_run": resumed["2"] == reference,
        }
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {kept} and {out / 'expected.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
