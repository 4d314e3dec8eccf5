"""Write the legacy_3ab3f93 fixtures: what the code of commit 3ab3f93 wrote and printed.

tests/test_legacy_3ab3f93.py checks that later code still reads these files and computes
the same numbers from them. This script is NOT run by the tests: it was run once, on the
OLD code, and its output is committed next to it. How it was run:

    git -C /work/main worktree add /tmp/old3ab 3ab3f93
    cd /tmp/old3ab
    . /work/main/.venv/bin/activate
    PYTHONPATH=/tmp/old3ab:/tmp/old3ab/tests python /work/main/tests/data/legacy_3ab3f93/make_fixtures.py --repo=/tmp/old3ab
    git -C /work/main worktree remove --force /tmp/old3ab

(--repo is the checkout of 3ab3f93 whose spheretnorm, train.py, sample.py, scripts/export_hf.py
and tests/markov_data.py are imported; the output goes next to this file unless --out says
otherwise.) Everything runs on the CPU, in float32, on one thread, with
SPHERETNORM_EAGER_KERNELS=1 and TRITON_INTERPRET=1 as tests/conftest.py sets them.

For every connection of the old spheretnorm.model.CONNECTIONS in each block of BLOCKS:

  * train.py trains a tiny model (2 layers, n_embd 12, 2 heads of size 6, block 16) on the
    token stream of tests/markov_data.py for 2 iterations, evaluating every 2; its ckpt.pt
    (iteration 2, optimizer state included) is kept as <connection>-<block>.pt;
  * the checkpoint is resumed to iteration 4 (--init_from=resume --max_iters=4); the train
    losses of iterations 3 and 4 and the val loss at 4 are recorded. The same run straight
    to 4 iterations is also made, and whether it matches the resumed one bit for bit is
    recorded too (resume_matches_straight_run);
  * the logits of the model loaded from the checkpoint on expected.json's input_ids go into
    logits.pt (one float32 tensor per pair, under the key "<connection>-<block>"), and those of
    the same model with every parameter of 2 or more dimensions multiplied by SCALE (10) under
    "<connection>-<block>/scaled" (SCALE says why);
  * sample.py's stdout on the checkpoint, with SAMPLE_ARGS, is recorded.

Three checkpoints are exported with scripts/export_hf.py as Hugging Face folders
(hf-<block>-<connection>/): gpt2 pre_ln (a plain GPT2LMHeadModel), gpt2 p_spheret and llama
ngpt (both carry their own code). For each, logits.pt holds the logits transformers gives
(AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)) under the key
"hf-<block>-<connection>", and under ".../scaled" those of that model with its parameters
scaled alike; expected.json holds the losses `train.py --init_from=hf:DIR --eval_only=true`
prints. The README model cards name the kept checkpoint file instead of its temporary path.
After the run, the files the three folders share byte for byte were moved into hf-shared/ once
(2026-12-05), with hf-shared/folders.json naming each folder's; the test puts the folders back.

Run twice, it wrote the same expected.json, logits.pt and folders; the checkpoints differ only
in what they record of the run's temporary data_dir and out_dir and its elapsed_s. At 3ab3f93
every one of the 22 resumed runs matched its straight run bit for bit.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# As tests/conftest.py: before anything imports triton or the kernels.
os.environ["SPHERETNORM_EAGER_KERNELS"] = "1"
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["WANDB_MODE"] = "disabled"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

HERE = Path(__file__).resolve().parent
COMMIT = "3ab3f93"

# The tiny run of tests/test_train.py's tiny_args and tests/test_block_matrix.py's run_args,
# at n_embd 12 (22 checkpoints with their optimizer state in under 3 MB); every key is given
# explicitly, so that a later change of a default does not change the run.
TRAIN_ARGS = [
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=12",
    "--block_size=16",
    "--batch_size=4",
    "--global_batch_size=8",
    "--eval_iters=2",
    "--eval_interval=2",
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
]
RESUME_ARGS = ["--init_from=resume", "--max_iters=4"]
SAMPLE_ARGS = ["--start=AB", "--num_samples=1", "--max_new_tokens=20", "--seed=1", "--temperature=0.8",
               "--top_k=0", "--device=cpu", "--dtype=float32"]  # fmt: skip
EVAL_ONLY_ARGS = ["--eval_only=true", "--eval_iters=2", "--batch_size=4", "--global_batch_size=8", "--seed=1337",
                  "--device=cpu", "--dtype=float32", "--compile=false", "--wandb_log=false"]  # fmt: skip
# A checkpoint 2 iterations old has sublayer updates a few thousandths of a radian long, where
# geonorm, proj_spheret, cay_spheret and p_spheret agree to 1e-7: their logits cannot tell them
# apart. With every matrix scaled by SCALE (see scaled()) the steps are long and they differ by
# 0.02 to 0.6, so the "/scaled" logits check each connection's own maths.
SCALE = 10.0
EXPORTS = [("pre_ln", "gpt2"), ("p_spheret", "gpt2"), ("ngpt", "llama")]


def input_ids(vocab: int):
    import torch

    return (torch.arange(32).view(2, 16) * 7 + 3) % vocab


def logits_of(model, idx):
    """The (B, T, V) logits of our GPT (a tuple) or of a transformers model (.logits)."""
    import torch

    with torch.no_grad():
        out = model(idx)
    return (out[0] if isinstance(out, tuple) else out.logits).detach().clone().contiguous()


def scaled(model, factor: float = SCALE):
    """The model with every parameter of 2 or more dimensions multiplied by `factor`, in place."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(factor)
    return model


def read_metrics(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def train_rows(out_dir: Path) -> dict[int, dict]:
    return {r["iter"]: r for r in read_metrics(out_dir) if r["kind"] == "train"}


def eval_rows(out_dir: Path) -> dict[int, dict]:
    return {r["iter"]: r for r in read_metrics(out_dir) if r["kind"] == "eval"}


def quiet(fn, *args):
    """fn(*args) with its stdout captured; (result, stdout)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        result = fn(*args)
    return result, buf.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", default=".", help="the checkout of commit 3ab3f93 to import")
    parser.add_argument("--out", default=str(HERE), help="where to write the fixtures")
    args = parser.parse_args()
    repo, out = Path(args.repo).resolve(), Path(args.out).resolve()
    # The old checkout comes first on PYTHONPATH (see the top): its modules, not the installed ones.

    import torch

    torch.set_num_threads(1)  # as tests/conftest.py's one_thread
    import sample
    import spheretnorm
    import train
    from markov_data import VOCAB, write_markov_data
    from scripts import export_hf
    from spheretnorm.model import BLOCKS, CONNECTIONS, GPT, load_checkpoint

    for module in (spheretnorm, train, sample, export_hf):
        assert Path(module.__file__).resolve().is_relative_to(repo), f"{module.__name__} comes from {module.__file__}, not {repo}"
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert head.startswith(COMMIT), f"{repo} is at {head}, not {COMMIT}"
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert not dirty, f"{repo} has local changes:\n{dirty}"

    out.mkdir(parents=True, exist_ok=True)
    idx = input_ids(VOCAB)
    logits: dict[str, torch.Tensor] = {}
    pairs: dict[str, dict] = {}
    exports: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = write_markov_data(tmp / "data", with_vocabulary=True)
        for block in BLOCKS:
            for connection in CONNECTIONS:
                name = f"{connection}-{block}"
                print(f"== {name}", file=sys.stderr, flush=True)
                keys = [*TRAIN_ARGS, f"--connection={connection}", f"--block={block}"]
                where = [f"--data_dir={data}"]
                straight, split, resumed = tmp / name / "straight", tmp / name / "split", tmp / name / "resumed"
                quiet(train.main, [*keys, *where, f"--out_dir={straight}", "--max_iters=4"])
                quiet(train.main, [*keys, *where, f"--out_dir={split}", "--max_iters=2"])
                ckpt_file = out / f"{name}.pt"
                shutil.copy(split / "ckpt.pt", ckpt_file)
                ckpt = load_checkpoint(ckpt_file)
                assert ckpt["iter_num"] == 2, ckpt["iter_num"]
                assert (ckpt["model_config"]["connection"], ckpt["model_config"]["block"]) == (connection, block)

                # Resumed from the kept file, in a fresh out_dir, as the test does it.
                resumed.mkdir(parents=True)
                shutil.copy(ckpt_file, resumed / "ckpt.pt")
                quiet(train.main, [*keys, *where, f"--out_dir={resumed}", *RESUME_ARGS])
                got, want = train_rows(resumed), train_rows(straight)
                assert sorted(got) == [3, 4], sorted(got)
                matches = all(got[i]["train_loss"] == want[i]["train_loss"] for i in (3, 4)) and (
                    eval_rows(resumed)[4]["val_loss"] == eval_rows(straight)[4]["val_loss"]
                )

                model = GPT.from_checkpoint(ckpt_file).eval()
                logits[name] = logits_of(model, idx)
                logits[f"{name}/scaled"] = logits_of(scaled(model), idx)
                samples, stdout = quiet(sample.main, [str(ckpt_file), *SAMPLE_ARGS])
                pairs[name] = {
                    "connection": connection,
                    "block": block,
                    "checkpoint": ckpt_file.name,
                    "train_args": keys,
                    "split_train_loss": {str(i): r["train_loss"] for i, r in train_rows(split).items()},
                    "train_loss": {str(i): got[i]["train_loss"] for i in (3, 4)},
                    "val_loss": {"4": eval_rows(resumed)[4]["val_loss"]},
                    "straight_train_loss": {str(i): r["train_loss"] for i, r in want.items()},
                    "straight_val_loss": {"4": eval_rows(straight)[4]["val_loss"]},
                    "resume_matches_straight_run": matches,
                    "sample_stdout": stdout,
                }
                if not matches:
                    print(f"   NOTE: {name}: resuming is not bit-exact with the straight run", file=sys.stderr)

        from transformers import AutoModelForCausalLM
        from spheretnorm.hf.folder import load_folder_model

        for connection, block in EXPORTS:
            pair, name = f"{connection}-{block}", f"hf-{block}-{connection}"
            print(f"== {name}", file=sys.stderr, flush=True)
            folder = out / name
            if folder.exists():
                shutil.rmtree(folder)
            export_hf.main(["--ckpt", str(out / f"{pair}.pt"), "--out", str(folder)])
            # The model card names the path of the checkpoint it came from: make it the kept file's.
            card = folder / "README.md"
            card.write_text(card.read_text(encoding="utf-8").replace(str(out / f"{pair}.pt"), f"{pair}.pt"), encoding="utf-8")
            hf = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True).eval()
            logits[name] = logits_of(hf, idx)
            logits[f"{name}/scaled"] = logits_of(scaled(hf), idx)
            ours_logits = logits_of(load_folder_model(folder).eval(), idx)
            _, stdout = quiet(train.main, [f"--init_from=hf:{folder}", f"--data_dir={data}", f"--out_dir={tmp / name}", *EVAL_ONLY_ARGS])
            row = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
            exports[name] = {
                "folder": name,
                "from_checkpoint": f"{pair}.pt",
                "connection": connection,
                "block": block,
                "hf_class": type(hf).__name__,
                "model_type": json.loads((folder / "config.json").read_text())["model_type"],
                "eval_only_args": EVAL_ONLY_ARGS,
                "eval_only_val_loss": row["val_loss"],
                "eval_only_train_eval_loss": row["train_eval_loss"],
                # How far the three readings of one model were apart in the old code itself.
                "max_abs_diff_hf_vs_checkpoint": float((logits[name] - logits[pair]).abs().max()),
                "max_abs_diff_folder_model_vs_checkpoint": float((ours_logits - logits[pair]).abs().max()),
                "max_abs_diff_hf_vs_checkpoint_scaled": float((logits[f"{name}/scaled"] - logits[f"{pair}/scaled"]).abs().max()),
            }

    torch.save(logits, out / "logits.pt")
    expected = {
        "written_by": f"tests/data/legacy_3ab3f93/make_fixtures.py on spheretnorm at commit {head} "
        f"(torch {torch.__version__}, one thread, SPHERETNORM_EAGER_KERNELS=1)",
        "connections": list(CONNECTIONS),
        "blocks": list(BLOCKS),
        "vocab": VOCAB,
        "input_ids": idx.tolist(),
        "logits_file": "logits.pt",
        "scale": SCALE,
        "resume_args": RESUME_ARGS,
        "sample_args": SAMPLE_ARGS,
        "pairs": pairs,
        "exports": exports,
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {len(pairs)} checkpoints and {len(exports)} folders to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
