"""What a study's run costs on this machine, path by path: start-up and compile, the step, the evaluations.

    python scripts/run_cost.py                                    # the four study shapes, eager and compiled per block
    python scripts/run_cost.py --shapes 24x128 --arms pre_ln --paths compiled_blocks --iters 20,100
    python scripts/run_cost.py --shapes 12x128,36x128 --paths compiled,compiled_blocks --blocks llama,gpt2   # compile scopes
    python scripts/run_cost.py --dtypes float32,bfloat16 --json cost.json

Each (shape, arm, path, dtype) trains the real train.py in a subprocess of one thread, as a study's run
does (LLaMA's block unless --blocks says; the fair sweep's batch, block and recipe), SHORT and LONG
iterations (--iters), each ending as a study run ends (eval_iters batches per split, diagnostics and
the whole validation split). The costs are the processes' CPU seconds: on one thread about what the
run takes alone on its core, less moved by other work than wall time but not immune to it (a core's
sibling thread and the shared caches slowed it by up to 2x in one measurement here), so measure on
an idle machine. The difference of the two lengths is the step; what is left of the short run is the
fixed part (imports, data, model, compile, checkpoints). A compiled case trains LONG once more first,
cold (an empty cache directory of its own for torch.compile): `cold_extra_s` is that first compile's
extra, paid by a sweep's first run of a shape (its later runs find the caches), and `cold_start_s` =
fixed_s + cold_extra_s that run's start. The paths: eager; compiled (compile_scope=model, the whole
model one graph, the studies' path before 2026-12-07, DDP's default); compiled_blocks
(compile_scope=blocks, one graph for every layer, the studies' path since). torch.compile compiles on
one thread here (TORCHINDUCTOR_COMPILE_THREADS=1), so that the CPU seconds hold its whole work.
`study_run_s` projects a 600-iteration study run with six evaluations. A benchmark, not a test: its
numbers belong in the closing note or docs/LOG.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spheretnorm.experiments.fair_comparison import ARM_BY_SLUG, PAPER_RECIPE, SHAPE
from spheretnorm.experiments.study import DEFAULT_DATA_DIR, Column, as_args, ensure_data, markdown_table, method_settings
from spheretnorm.runtime.cli import REPO_ROOT, UsageError
from spheretnorm.runtime.run_folder import METRICS_NAME, read_metrics

STUDY_ITERS = 600  # the studies' run length
STUDY_EVALS = 6  # at 0, 120, ..., 600
# path -> (compile, compile_scope): the three ways a run's model can execute (kernels.compile_mode_text)
PATHS = {"eager": (False, "blocks"), "compiled": (True, "model"), "compiled_blocks": (True, "blocks")}
BLOCK_NAMES = ("llama", "gpt2")
WRITES_LINE = re.compile(r"checkpoint write\(s\) this session, ([0-9.]+) s in all")  # train.py's last line


@dataclass(frozen=True)
class Case:
    n_layer: int
    n_embd: int
    arm: str
    path: str
    dtype: str
    block: str = "llama"

    @property
    def name(self) -> str:
        return f"{self.n_layer}x{self.n_embd} {self.block} {self.arm} {self.path} {self.dtype}"


def train_args(case: Case, iters: int, out_dir: Path, data_dir: Path) -> list[str]:
    arm = ARM_BY_SLUG[case.arm]
    settings = {
        **SHAPE, **PAPER_RECIPE, **method_settings(arm.method), **dict(arm.keys),
        "n_layer": case.n_layer, "n_embd": case.n_embd, "block": case.block, "learning_rate": 2e-3, "min_lr": 2e-4,
        "warmup_iters": min(100, iters // 2), "max_iters": iters, "lr_decay_iters": iters, "eval_interval": iters,
        "log_interval": 1, "compile": PATHS[case.path][0], "compile_scope": PATHS[case.path][1], "dtype": case.dtype, "device": "cpu", "out_dir": str(out_dir),
        "data_dir": str(data_dir), "always_save_checkpoint": True, "wandb_log": False,
    }
    return [sys.executable, str(REPO_ROOT / "train.py"), *as_args(settings)]


def train_once(case: Case, iters: int, data_dir: Path, cache: Path) -> tuple[float, list[dict[str, Any]] | str]:
    """(CPU seconds of the train.py process, its metrics rows or an error line): one case trained
    for `iters` iterations, torch.compile's caches in `cache`. The rows end with a row of kind
    "checkpoint_writes" holding the seconds train.py's last line gives its checkpoint writes."""
    with tempfile.TemporaryDirectory(prefix="run_cost_") as tmp:
        out = Path(tmp) / "run"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCHINDUCTOR_COMPILE_THREADS": "1"}
        with open(Path(tmp) / "log", "w+", encoding="utf-8") as log:
            child = subprocess.Popen(train_args(case, iters, out, data_dir), env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
            log.seek(0)
            text = log.read()
        if child.returncode != 0:
            tail = text.strip().splitlines()[-1:] or ["no output"]
            return 0.0, f"train.py exited {child.returncode}: {tail[0]}"
        writes = WRITES_LINE.search(text)
        rows = read_metrics(out / METRICS_NAME) + [{"kind": "checkpoint_writes", "seconds": float(writes.group(1)) if writes else None}]
        return usage.ru_utime + usage.ru_stime, rows


def measure(case: Case, short: int, long: int, data_dir: Path) -> dict[str, Any]:
    """One case trained `short` and `long` iterations (the module's docstring says what their
    difference gives); a compiled case trains the short one second, so that both find
    torch.compile's caches as a sweep's later runs do."""
    with tempfile.TemporaryDirectory(prefix="run_cost_inductor_") as cache:
        first_cpu, first = train_once(case, long, data_dir, Path(cache))
        short_cpu, rows = train_once(case, short, data_dir, Path(cache))
        compiled = PATHS[case.path][0]
        long_cpu, long_rows = train_once(case, long, data_dir, Path(cache)) if compiled else (first_cpu, first)
    for result in (first, rows, long_rows):
        if isinstance(result, str):
            return {"case": case.name, "error": result}
    return costs(case, rows, short_cpu, long_cpu, short, long, first_cpu) | {"final_loss": final_train_loss(long_rows)}


def final_train_loss(rows: list[dict[str, Any]]) -> float | None:
    """The last train row's loss: the same case on two paths should agree to rounding."""
    train = [r for r in rows if r.get("kind") == "train" and r.get("train_loss") is not None]
    return train[-1]["train_loss"] if train else None


def costs(case: Case, short_rows: list[dict[str, Any]], short_cpu: float, long_cpu: float, short: int, long: int,
          first_cpu: float) -> dict[str, Any]:
    """The parts of a run's cost and a study run's projected cost (CPU seconds of one thread)."""
    step = (long_cpu - short_cpu) / (long - short)
    final = [r for r in short_rows if r.get("kind") == "eval"][-1]
    one_eval = (final.get("eval_s") or 0.0) + (final.get("diag_s") or 0.0)
    full = final.get("full_eval_s") or 0.0
    fixed = short_cpu - step * short - one_eval - full  # start-up, compile, checkpoint writes
    writes = [r["seconds"] for r in short_rows if r.get("kind") == "checkpoint_writes"]
    return {
        "case": case.name, "n_layer": case.n_layer, "n_embd": case.n_embd, "block": case.block, "arm": case.arm, "path": case.path,
        "dtype": case.dtype, "fixed_s": round(fixed, 1), "ckpt_s": writes[0] if writes else None, "cold_extra_s": round(first_cpu - long_cpu, 1),
        "cold_start_s": round(fixed + first_cpu - long_cpu, 1), "step_ms": round(1000 * step, 1),
        "eval_s": round(one_eval, 2), "full_eval_s": round(full, 2),
        "study_run_s": round(fixed + STUDY_ITERS * step + STUDY_EVALS * one_eval + full, 0),
    }


def parse_shape(spec: str) -> tuple[int, int]:
    layers, _, width = spec.partition("x")
    if not (layers.isdigit() and width.isdigit()):
        raise UsageError(f"--shapes entry {spec!r} is not LAYERSxWIDTH, e.g. 24x128.")
    return int(layers), int(width)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--shapes", default="12x128,24x128,12x256,36x128", help="LAYERSxWIDTH, comma-separated (default: 12x128,24x128,12x256,36x128)")
    p.add_argument("--arms", default="pre_ln,p_spheret-0.5", help="fair-sweep arms, comma-separated (default: pre_ln,p_spheret-0.5)")
    p.add_argument("--paths", default="eager,compiled_blocks",
                   help="eager, compiled (the whole model), compiled_blocks (each block), comma-separated (default: eager,compiled_blocks)")
    p.add_argument("--blocks", default="llama", help="llama, gpt2, comma-separated (default: llama, the studies' block)")
    p.add_argument("--dtypes", default="float32", help="float32, bfloat16, comma-separated (default: float32; bf16 only where the CPU has it natively)")
    p.add_argument("--iters", default="20,80",
                   help="SHORT,LONG: the two lengths each case trains, their difference gives the step (default: 20,80; a difference of 20 "
                        "was within the CPU time's own scatter of +-2 s between processes here)")
    p.add_argument("--jobs", type=int, default=2, help="cases at a time, one thread each (default: 2)")
    p.add_argument("--json", default="", help="also write the rows to this file")
    args = p.parse_args(argv)
    for key, valid in (("arms", ARM_BY_SLUG), ("paths", PATHS), ("dtypes", ("float32", "bfloat16")), ("blocks", BLOCK_NAMES)):
        bad = [v for v in getattr(args, key).split(",") if v not in valid]
        if bad:
            raise UsageError(f"--{key}: {', '.join(bad)} unknown; use some of: {', '.join(valid)}.")
    lengths = args.iters.split(",")
    if len(lengths) != 2 or not all(n.isdigit() for n in lengths) or not 0 < int(lengths[0]) < int(lengths[1]) or args.jobs < 1:
        raise UsageError(f"--iters must be SHORT,LONG with 0 < SHORT < LONG (e.g. 20,60) and --jobs >= 1, got {args.iters!r} and {args.jobs}.")
    args.short, args.long = map(int, lengths)
    return args


def progress_text(row: dict[str, Any]) -> str:
    """A finished case in one line, with every part, so that a long measurement cut short keeps
    what it measured (the table and the JSON come at the end)."""
    return (f"{row['study_run_s']:.0f} s a study run ({row['step_ms']} ms a step; cold start {row['cold_start_s']} s, "
            f"fixed {row['fixed_s']} s, of which checkpoint writes {row['ckpt_s']} s, an evaluation {row['eval_s']} s, the whole split {row['full_eval_s']} s)")


def table(rows: list[dict[str, Any]]) -> str:
    """The measured cases' parts as a table, and under it a line for each case that failed (its error,
    not a row whose every column repeats it)."""
    keys = ("case", "fixed_s", "ckpt_s", "cold_extra_s", "cold_start_s", "step_ms", "eval_s", "full_eval_s", "study_run_s", "final_loss")
    measured = [r for r in rows if "error" not in r]
    text = markdown_table(measured, [Column(k, lambda r, k=k: "-" if r.get(k) is None else str(r[k]), align="---") for k in keys]) if measured else ""
    failed = [f"not measured: {r['case']}: {r['error']}" for r in rows if "error" in r]
    return "\n".join(filter(None, [text, *failed]))


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        shapes = [parse_shape(s) for s in args.shapes.split(",")]
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ensure_data(DEFAULT_DATA_DIR)
    cases = [Case(n, d, arm, path, dtype, block) for n, d in shapes for block in args.blocks.split(",") for arm in args.arms.split(",")
             for dtype in args.dtypes.split(",") for path in args.paths.split(",")]
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = []
        for row in pool.map(lambda c: measure(c, args.short, args.long, DEFAULT_DATA_DIR), cases):
            print(f"  {row['case']}: " + (row.get("error") or progress_text(row)), file=sys.stderr, flush=True)
            rows.append(row)
    print(f"run_cost: CPU seconds of one thread; each case trained {args.short} and {args.long} iterations, {args.jobs} at a time, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0
