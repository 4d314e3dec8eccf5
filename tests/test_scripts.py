"""Tests of the experiment scripts: the paper's tables and their bold/underline cells, the launch
grid against the paper's hyperparameters, skipping and resuming runs, and the CPU reproduction
and LR sweep end to end on a tiny model.

Everything runs on data written to tmp_path and on reference/paper_results.json (the repo's
copy of the paper's numbers), so no test needs ../shared.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from itertools import product
from pathlib import Path

import numpy as np
import pytest

from spheretnorm.runtime import methods
from spheretnorm.runtime.methods import method_dirname
from spheretnorm.model import CONNECTIONS, GPTConfig
from spheretnorm.cluster import launcher as launch
from spheretnorm.cluster.sbatch import SLURM_SCRIPT
from spheretnorm.experiments import cpu_pipeline as reproduce_cpu, stability_sweep as lr_sweep
from spheretnorm.experiments import figures as plot
from spheretnorm.experiments import grid as runs
from spheretnorm.experiments import tabulate as tables
from spheretnorm.runtime.config import TrainConfig, parse_config
from spheretnorm.runtime.methods import method_key

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
REFERENCE = json.loads((REPO / "reference" / "paper_results.json").read_text())
TINY_MODEL = [
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=32",
    "--block_size=16",
    "--batch_size=4",
    "--global_batch_size=4",
    "--eval_iters=2",
    "--log_interval=2",
]


@pytest.fixture(autouse=True)
def no_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")  # inherited by the train.py subprocesses


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small, learnable English-like text: random sentences over a 30-word vocabulary."""
    rng = np.random.default_rng(0)
    words = "the king and queen of a fair city spoke to their good people at dawn with grace said".split()
    sentences = [" ".join(rng.choice(words, size=rng.integers(4, 9))).capitalize() + "." for _ in range(1500)]
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text("\n".join(sentences))
    return path


# -----------------------------------------------------------------------------
# Method keys


def test_method_keys_round_trip_through_the_config_parser() -> None:
    for connection in CONNECTIONS:
        key = methods.canonical_method(connection)
        parsed = parse_config(methods.method_args(key), world_size=1)
        assert method_key(parsed.model_config()) == key
    assert [methods.canonical_method(m) for m in methods.PAPER_METHODS] == list(methods.PAPER_METHODS)
    assert methods.canonical_method("p_spheret:0.50") == "p_spheret:0.5"
    assert methods.method_args("p_spheret:0.5") == ["--connection=p_spheret", "--spheret_p=0.5"]
    assert method_dirname("p_spheret:0.5") == "p_spheret-0.5"
    assert methods.resolve_wandb_names(TrainConfig(config_name="openwebtext_s"), methods.method_config("p_spheret:0.5")).wandb_run_name == "openwebtext_s/p_spheret-0.5"
    assert [methods.display_name(m) for m in methods.PAPER_METHODS] == [
        "Pre-LN", "Pre-DyT", "Peri-LN", "Keel", "GeoNorm", "0.5-SpheretNorm",
        "Proj-SpheretNorm (1-SpheretNorm)", "Cay-SpheretNorm (2-SpheretNorm)",
    ]  # fmt: skip
    assert list(REFERENCE["table2_loss"]["rows"]) == list(methods.PAPER_METHODS)


@pytest.mark.parametrize("bad", ["foo", "pre_ln:0.5", "p_spheret:x", "p_spheret:-1"])
def test_bad_method_is_one_clear_error(bad: str) -> None:
    with pytest.raises(methods.UsageError) as err:
        methods.canonical_method(bad)
    message = str(err.value)
    assert bad in message and "\n" not in message


def test_reference_copy_matches_shared() -> None:
    shared = SHARED / "reference" / "paper_results.json"
    if not shared.is_file():
        pytest.skip("../shared is absent")
    assert json.loads(shared.read_text()) == REFERENCE


# -----------------------------------------------------------------------------
# The paper's Tables 2 and 3: best bold, second underlined


def independent_marks(ref_table: dict, higher_is_better: bool = False) -> dict[tuple[str, str], str]:
    """Bold = every method at the column's best value; underline = every method at the next value."""
    marks = {}
    for j, column in enumerate(ref_table["columns"]):
        values = {m: row[j] for m, row in ref_table["rows"].items()}
        ordered = sorted(set(values.values()), reverse=higher_is_better)
        for m, v in values.items():
            if v == ordered[0]:
                marks[(m, column)] = "best"
            elif v == ordered[1]:
                marks[(m, column)] = "second"
    return marks


def parse_markdown_marks(text: str, columns: list[str]) -> dict[tuple[str, str], str]:
    """(method display name, column key) of every **bold** and <u>underlined</u> cell."""
    marks = {}
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| Method"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        for column, cell in zip(columns, cells[1:]):
            if cell.startswith("**"):
                marks[(cells[0], column)] = "best"
            elif cell.startswith("<u>"):
                marks[(cells[0], column)] = "second"
    return marks


def parse_latex_marks(text: str, columns: list[str]) -> dict[tuple[str, str], str]:
    marks = {}
    for line in text.splitlines():
        if not line.endswith(r"\\") or "&" not in line or line.startswith(("Method", " &")):
            continue
        cells = [c.strip() for c in line.removesuffix(r"\\").split("&")]
        for column, cell in zip(columns, cells[1:]):
            if cell.startswith(r"\textbf{"):
                marks[(cells[0], column)] = "best"
            elif cell.startswith(r"\underline{"):
                marks[(cells[0], column)] = "second"
    return marks


@pytest.mark.parametrize("number,ref_key", [("2", "table2_loss"), ("3", "table3_val_ppl")])
def test_paper_tables_bold_and_underline_cells(number: str, ref_key: str) -> None:
    ref = REFERENCE[ref_key]
    expected = {(methods.display_name(m), c): mark for (m, c), mark in independent_marks(ref).items()}
    (table,) = tables.build_tables(None, [number], with_paper=False)
    assert [c.key for c in table.columns] == ref["columns"]
    assert parse_markdown_marks(tables.to_markdown(table), ref["columns"]) == expected
    assert parse_latex_marks(tables.to_latex(table), ref["columns"]) == expected


def test_paper_tables_spot_checks() -> None:
    """A few cells worked out by hand from paper_results.json, ties included."""
    t2, t3 = tables.build_tables(None, ["2", "3"], with_paper=False)
    m2, m3 = tables.rank_marks(t2), tables.rank_marks(t3)

    def cells(marks: dict, column: str, mark: str) -> set[str]:
        return {m for (m, c), v in marks.items() if c == column and v == mark}

    # FineWeb-Edu L val: Proj 2.832 beats 0.5-SpheretNorm 2.833 and Cay 2.834.
    assert cells(m2, "fineweb_edu/L/val", "best") == {"proj_spheret"}
    assert cells(m2, "fineweb_edu/L/val", "second") == {"p_spheret:0.5"}
    # FineWeb-Edu L train: Proj 2.808; 0.5- and Cay-SpheretNorm tie at 2.809, both underlined.
    assert cells(m2, "fineweb_edu/L/train", "best") == {"proj_spheret"}
    assert cells(m2, "fineweb_edu/L/train", "second") == {"p_spheret:0.5", "cay_spheret"}
    # OpenWebText M train: Proj and Cay tie at 2.931 (both bold), 0.5-SpheretNorm 2.932 next.
    assert cells(m2, "openwebtext/M/train", "best") == {"proj_spheret", "cay_spheret"}
    assert cells(m2, "openwebtext/M/train", "second") == {"p_spheret:0.5"}
    # S scale: Pre-LN is best in both datasets' val loss.
    assert cells(m2, "fineweb_edu/S/val", "best") == {"pre_ln"}
    assert cells(m2, "openwebtext/S/val", "second") == {"cay_spheret"}
    # Table 3, OpenWebText M: Proj 19.18; Cay and 0.5-SpheretNorm tie at 19.20.
    assert cells(m3, "openwebtext/M", "best") == {"proj_spheret"}
    assert cells(m3, "openwebtext/M", "second") == {"cay_spheret", "p_spheret:0.5"}
    assert cells(m3, "fineweb_edu/S", "best") == {"pre_ln"}


def test_zero_shot_tables_rank_accuracy_high_and_perplexity_low() -> None:
    t4, t5 = tables.build_tables(None, ["4", "5"], with_paper=False)
    marks = tables.rank_marks(t4)
    assert marks[("proj_spheret", "arc_challenge/acc_norm")] == "best"  # 28.67, the highest
    assert marks[("proj_spheret", "wikitext/word_perplexity")] == "best"  # 33.70, the lowest
    assert {m for (m, c), v in marks.items() if c == "sciq/acc" and v == "best"} == {"peri_ln", "cay_spheret"}
    assert tables.rank_marks(t5)[("peri_ln", "hellaswag/acc_norm")] == "best"


# -----------------------------------------------------------------------------
# Tables from run folders


def write_run(root: Path, dataset: str, scale: str, method: str, val: float, *, last_iter: int = 100, max_iters: int = 100, zero_shot: dict | None = None) -> Path:
    shape = REFERENCE["scales"][scale] if scale in REFERENCE["scales"] else {"n_layer": 24, "n_head": 4, "n_embd": 128}
    cfg = GPTConfig(**methods.method_model_keys(method))
    out = root / f"{dataset}_{scale.lower()}" / method_dirname(method)
    out.mkdir(parents=True)
    config = {"dataset": dataset, "max_iters": max_iters, "method": method_key(cfg), "connection": cfg.connection, "connection_params": cfg.connection_params, **{k: shape[k] for k in ("n_layer", "n_head", "n_embd")}}
    (out / "config.json").write_text(json.dumps(config))
    rows = [
        {"kind": "train", "iter": last_iter - 10, "train_loss": 9.0, "train_loss_avg200": 9.0},
        {"kind": "train", "iter": last_iter, "train_loss": val + 0.3, "train_loss_avg200": val + 0.1},
        {"kind": "eval", "iter": last_iter, "val_loss": val, "final_cosine": 0.2},
    ]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"kind": "tr')  # a cut line
    if zero_shot is not None:
        (out / runs.ZERO_SHOT_NAME).write_text(json.dumps({"results": {}, "paper_table": zero_shot}))
    return out


def test_tables_from_runs_with_paper_values(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_run(tmp_path, "openwebtext", "L", "pre_ln", 2.90, zero_shot={"piqa/acc_norm": 60.0, "wikitext/word_perplexity": 40.0})
    write_run(tmp_path, "openwebtext", "L", "p_spheret:0.5", 2.80, zero_shot={"piqa/acc_norm": 61.0, "wikitext/word_perplexity": 35.0})
    write_run(tmp_path, "openwebtext", "L", "geonorm", 2.85, last_iter=50)  # not finished
    assert tables.main(["--runs_root", str(tmp_path), "--paper", "--out", str(tmp_path / "t")]) == 0
    text = capsys.readouterr().out
    # train loss = the last row's 200-iteration average; the paper's value in parentheses.
    assert "| 0.5-SpheretNorm | **2.900** (2.826) | **2.800** (2.847) |" in text
    assert "| GeoNorm | <u>2.950</u>* (3.001) | <u>2.850</u>* (3.017) |" in text
    assert f"**{math.exp(2.80):.2f}** (17.24)" in text
    assert "**Table 5." in text and "**61.00** (63.44)" in text and "**35.00** (31.02)" in text
    assert (tmp_path / "t.md").read_text().strip() == text.strip()
    assert r"\textbf{2.800}" in (tmp_path / "t.tex").read_text()


def test_tables_refuse_two_runs_of_one_cell(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_run(tmp_path / "a", "openwebtext", "S", "pre_ln", 3.0)
    write_run(tmp_path / "b", "openwebtext", "S", "pre_ln", 3.1)
    assert tables.main(["--runs_root", str(tmp_path)]) == 2
    assert "Two runs of pre_ln" in capsys.readouterr().err


def test_plot_writes_png_and_pdf(tmp_path: Path) -> None:
    for method, val in (("pre_ln", 3.0), ("proj_spheret", 2.9)):
        write_run(tmp_path, "openwebtext", "S", method, val)
    paths = plot.plot_group(tmp_path, "openwebtext", "S", tmp_path / "fig", smooth=0.9)
    assert [p.suffix for p in paths] == [".png", ".pdf"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(methods.UsageError, match="--dataset openwebtext --scale S"):
        plot.plot_group(tmp_path, "openwebtext", "L")


def test_ema_is_bias_corrected() -> None:
    assert plot.ema([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])
    assert plot.ema([1.0, 3.0], 0.0) == [1.0, 3.0]


# -----------------------------------------------------------------------------
# The launch grid


def grid_commands(capsys: pytest.CaptureFixture, *argv: str) -> list[list[str]]:
    assert launch.main(["--dry_run", *argv]) == 0
    # The run commands; a slurm plan's `mkdir -p <run folder>` before each sbatch is not one.
    return [shlex.split(line) for line in capsys.readouterr().out.splitlines() if line and not line.startswith(("#", "mkdir -p "))]


def train_argv(command: list[str], entry: str) -> list[str]:
    return command[command.index(entry) + 1 :]


def test_dry_run_grid_is_the_papers(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    commands = grid_commands(capsys, "--runs_root", str(tmp_path))
    assert len(commands) == 48
    assert len({shlex.join(c) for c in commands}) == 48
    shared = REFERENCE["shared_hparams"]
    seen, out_dirs = set(), set()
    for command in commands:
        assert command[:3] == ["torchrun", "--standalone", "--nproc_per_node=8"]
        parsed = parse_config(train_argv(command, "train.py"), world_size=8)
        t, m = parsed.train, parsed.model_config()
        scale = methods.scale_of({"n_layer": m.n_layer, "n_head": m.n_head, "n_embd": m.n_embd})
        hp = REFERENCE["scales"][scale]
        assert (t.learning_rate, t.min_lr) == (hp["learning_rate"], hp["min_lr"])
        assert (t.max_iters, t.lr_decay_iters, t.warmup_iters) == (shared["max_iters"], shared["lr_decay_iters"], shared["warmup_iters"])
        assert t.global_batch_size == shared["global_batch_sequences"] and t.batch_size == shared["batch_size_per_gpu"]
        assert (m.block_size, m.bias, m.dropout, m.vocab_size) == (shared["block_size"], shared["bias"], shared["dropout"], shared["vocab_size"])
        assert (t.seed, t.weight_decay, t.beta1, t.beta2, t.grad_clip) == (shared["seed"], shared["weight_decay"], shared["beta1"], shared["beta2"], shared["grad_clip"])
        assert t.decay_lr and not t.compile and t.dtype == "auto"
        method = method_key(m)
        seen.add((t.dataset, scale, method))
        out_dirs.add(t.out_dir)
        assert t.out_dir == str(tmp_path / t.config_name / method_dirname(method))
        assert t.config_name == f"{t.dataset}_{scale.lower()}"
    assert seen == set(product(runs.PAPER_DATASETS, runs.PAPER_SCALES, methods.PAPER_METHODS))
    assert len(out_dirs) == 48


def test_dry_run_filters_skips_finished_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    filters = ["--runs_root", str(tmp_path), "--methods", "pre_ln,p_spheret:0.5,geonorm", "--scales", "S", "--datasets", "openwebtext"]
    done = tmp_path / "openwebtext_s" / "pre_ln"
    done.mkdir(parents=True)
    (done / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "iter": 50_000, "val_loss": 3.0}) + "\n")
    (done / "ckpt.pt").write_bytes(b"")  # finished: its last evaluation at max_iters, and its checkpoint
    half = tmp_path / "openwebtext_s" / "p_spheret-0.5"
    half.mkdir(parents=True)
    (half / "ckpt.pt").write_bytes(b"")
    (half / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "iter": 1000, "val_loss": 3.5}) + "\n")
    commands = grid_commands(capsys, *filters)
    assert [method_key(parse_config(train_argv(c, "train.py"), world_size=8).model_config()) for c in commands] == ["p_spheret:0.5", "geonorm"]
    # Every run resumes by itself when a checkpoint exists by the time it starts.
    assert all(c[-1] == "--init_from=auto" and "--init_from=resume" not in c for c in commands)
    assert launch.main(["--dry_run", *filters]) == 0
    out = capsys.readouterr().out
    assert "# skip openwebtext_s/pre_ln: finished" in out
    assert "# openwebtext_s/p_spheret-0.5 (train, resume)" in out and "# openwebtext_s/geonorm (train, new)" in out
    # A folder holding a run with other settings is reported and skipped; the others are planned.
    (half / "config.json").write_text(json.dumps({"learning_rate": 1e-3}))
    commands = grid_commands(capsys, *filters)
    assert [method_key(parse_config(train_argv(c, "train.py"), world_size=8).model_config()) for c in commands] == ["geonorm"]
    assert launch.main(["--dry_run", *filters]) == 0
    captured = capsys.readouterr()
    assert "# skip openwebtext_s/p_spheret-0.5: " in captured.out
    assert "learning_rate: the run has 0.001, asked for 0.0006" in captured.out
    assert "1 of 3 runs skipped" in captured.err


def test_multi_node_and_slurm_commands(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    one = ["--runs_root", str(tmp_path), "--methods", "cay_spheret", "--scales", "L", "--datasets", "fineweb_edu", "--batch_size=8"]
    (command,) = grid_commands(capsys, *one, "--nnodes", "2", "--node_rank", "1", "--rdzv_endpoint", "node0:29500")
    assert command[:7] == [
        "torchrun", "--nnodes=2", "--nproc_per_node=8", "--node_rank=1",
        "--rdzv_id=fineweb_edu_l-cay_spheret", "--rdzv_backend=c10d", "--rdzv_endpoint=node0:29500",
    ]  # fmt: skip
    (sbatch,) = grid_commands(capsys, *one, "--nnodes", "2", "--mode", "slurm")
    assert sbatch[0] == "sbatch" and "--nodes=2" in sbatch and "--gpus-per-node=8" in sbatch
    parsed = parse_config(train_argv(sbatch, SLURM_SCRIPT), world_size=16)
    assert parsed.train.batch_size == 8 and parsed.model_config().connection == "cay_spheret"
    # 16 GPUs x 16 sequences overshoot the global batch of 128: refused before anything runs.
    assert launch.main(["--dry_run", *one[:-1], "--nnodes", "2", "--mode", "slurm"]) == 2
    assert "global_batch_size=128" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--methods", "pre_lnn"], "Unknown method 'pre_lnn'; valid methods are: pre_ln,"),
        (["--scales", "XXL"], "--scales 'XXL' is not valid; choose from: S, M, L, XL."),
        (["--connection=geonorm"], "--connection is set by this script; use --methods"),
        (["--learning_rat=1e-3"], "--learning_rat is neither an option"),
        (["--nnodes", "2"], "--rdzv_endpoint"),
    ],
)
def test_launch_errors_are_one_line(argv: list[str], needle: str, capsys: pytest.CaptureFixture) -> None:
    assert launch.main(["--dry_run", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


# -----------------------------------------------------------------------------
# CPU reproduction and LR sweep, end to end on a tiny model


def test_reproduce_cpu_two_methods(tmp_path: Path, tiny_corpus: Path, capsys: pytest.CaptureFixture) -> None:
    argv = [
        "--methods", "pre_ln,proj_spheret", "--max_iters", "20", "--out_dir", str(tmp_path / "repro"),
        "--data_dir", str(tmp_path / "data"), "--input", str(tiny_corpus), "--warmup_iters=4", *TINY_MODEL,
    ]  # fmt: skip
    assert reproduce_cpu.main(argv) == 0
    out = capsys.readouterr().out
    assert "AdamW peak lr 0.001 after a 4-iteration linear warm-up" in out
    assert re.search(r"Wall-clock: [\d.]+ min", out)
    repro = tmp_path / "repro"
    markdown = (repro / "tables.md").read_text()
    for name in ("Pre-LN", "Proj-SpheretNorm (1-SpheretNorm)"):
        assert re.search(rf"\| {re.escape(name)} \| [^|]*\d\.\d{{3}}", markdown)
    assert "Shakespeare-char 2x32 val" in markdown and (repro / "tables.tex").is_file()
    png = repro / "figures" / "shakespeare_char_2x32.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((repro / "summary.json").read_text())
    assert [r["method"] for r in summary["runs"]] == ["pre_ln", "proj_spheret"]
    assert all(r["status"] in ("ok", "stuck at unigram", "stalled") and r["last_eval_iter"] == 20 for r in summary["runs"])  # 20 steps of a tiny model
    # A second call reuses the finished runs instead of training again.
    assert reproduce_cpu.main(argv) == 0
    assert "already finished" in capsys.readouterr().out


def test_lr_sweep_marks_diverged_runs(tmp_path: Path, tiny_corpus: Path) -> None:
    argv = [
        "--methods", "geonorm", "--lrs", "1e-3", "--warmups", "2,4", "--max_iters", "8",
        "--out_dir", str(tmp_path / "sweep"), "--data_dir", str(tmp_path / "data"), "--input", str(tiny_corpus),
        "--debug_nan_at_iter=6", *TINY_MODEL,
    ]  # fmt: skip
    assert lr_sweep.main(argv) == 0
    summary = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [(r["warmup"], r["status"], r["val_loss"]) for r in summary["runs"]] == [(2, "diverged", None), (4, "diverged", None)]
    assert "| GeoNorm | diverged | diverged |" in (tmp_path / "sweep" / "sweep.md").read_text()
    assert (tmp_path / "sweep" / "lr_sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_classify_unigram_rule(tmp_path: Path) -> None:
    def run_with(val: float, last_iter: int = 100) -> runs.Run:
        return runs.Run(tmp_path, {"max_iters": 100}, [{"kind": "eval", "iter": last_iter, "val_loss": val, "final_cosine": 0.99}], None)

    assert runs.classify(run_with(3.34), 0, unigram=3.35)[0] == "stuck at unigram"
    assert runs.classify(run_with(3.29), 0, unigram=3.35)[0] == "ok"
    assert runs.classify(run_with(2.0, last_iter=50), 0, unigram=3.35)[0] == "unfinished"
    assert runs.classify(None, 4, 3.35, "error: loss became nan at iter 6; stopping")[0] == "diverged"
    assert runs.classify(None, 1, 3.35, "")[0] == "failed"  # a crash: a traceback, no error: line
    assert runs.classify(None, 2, 3.35, "error: bad key")[0] == "failed"


def test_sweep_rejects_bad_numbers(capsys: pytest.CaptureFixture) -> None:
    assert lr_sweep.main(["--lrs", "1e-3,fast"]) == 2
    assert "'fast' is not a number" in capsys.readouterr().err
    assert lr_sweep.main(["--warmups", "100", "--max_iters", "50"]) == 2
    assert "--max_iters 50 must exceed the longest warm-up (100)" in capsys.readouterr().err


def test_depth_study_seed_summary_pairs_each_seed_with_its_baseline() -> None:
    from spheretnorm.experiments import depth as depth_study
    from spheretnorm.experiments.study import name_rows, paired_seed_summary, point

    sweep = depth_study.depth_sweep(["pre_ln", "geonorm"], [1, 2, 3], True, 400, 800, 100)

    def summary(losses: dict) -> str:
        points = [point(method=m, seed=s, alpha_index=a) for m, s, a in losses]
        rows = {p: {**p.values, "val_loss": loss, "status": "ok" if loss is not None else "diverged"} for p, loss in zip(points, losses.values())}
        return paired_seed_summary(name_rows(sweep, points, rows), "Pre-LN")[0]

    pre_ln = {("pre_ln", 1, "block"): 2.0, ("pre_ln", 2, "block"): 2.2, ("pre_ln", 3, "block"): 2.1}
    lines = summary({**pre_ln, ("geonorm", 1, "block"): 1.9, ("geonorm", 2, "block"): 2.15, ("geonorm", 3, "block"): 2.0,
                     ("p_spheret:0.5", 1, "sublayer"): 2.1}).splitlines()
    geo = next(line for line in lines if line.startswith("| GeoNorm |"))
    # mean 2.01667, SD 0.12583; gaps -0.10, -0.05, -0.10 against the same seed's Pre-LN (not against Pre-LN's mean 2.1):
    # mean -0.08333, SD 0.028868, half width 4.302653 * 0.028868 / sqrt(3) = 0.071711
    assert geo == "| GeoNorm | 3 | 2.017 | 0.126 | -0.083 | 0.029 | -0.155 to -0.012 |"
    assert any(line.startswith("| 0.5-SpheretNorm (alpha_index=sublayer) | 1 | 2.100 | - | +0.100 | - | no interval (1 seed; it needs 3) |")
               for line in lines)
    # A seed that diverged fails the variant's cell: never the mean of the two that trained.
    failed = summary({**pre_ln, ("geonorm", 1, "block"): 1.9, ("geonorm", 2, "block"): 2.15, ("geonorm", 3, "block"): None}).splitlines()
    assert "| GeoNorm | 3 | failed (seed 3 diverged) | - | failed (seed 3: the arm failed) | - | - |" in failed
    assert summary({("pre_ln", 1, "block"): 2.0, ("geonorm", 1, "block"): 1.9}) == ""  # one seed: nothing


def test_block_study_gives_ngpt_its_recipe_and_pairs_each_run_with_its_blocks_pre_ln() -> None:
    from spheretnorm.experiments import block_variants as block_study
    from spheretnorm.experiments.study import as_args, grid_points, markdown_table, name_rows, run_settings

    sweep = block_study.block_sweep([7], [1e-3, 3e-3], 800, 100)
    variants = grid_points(sweep)
    assert [(v["method"], v["block"], v["ngpt_lr"]) for v in variants] == [
        ("pre_ln", "gpt2", None), ("p_spheret:0.5", "gpt2", None), ("geonorm", "gpt2", None),
        ("ngpt", "gpt2", 1e-3), ("ngpt", "gpt2", 3e-3), ("pre_ln", "llama", None), ("p_spheret:0.5", "llama", None),
    ]

    def args(v: object) -> dict:
        return dict(a[2:].split("=", 1) for a in as_args(run_settings(sweep, v)))

    ngpt = args(variants[4])
    assert (ngpt["learning_rate"], ngpt["warmup_iters"], ngpt["weight_decay"], ngpt["min_lr"]) == ("0.003", "0", "0.0", "0.0")
    assert (ngpt["connection"], ngpt["block"], ngpt["seed"]) == ("ngpt", "gpt2", "7")
    llama = args(variants[6])
    assert (llama["block"], llama["warmup_iters"], llama["learning_rate"], llama["spheret_p"]) == ("llama", "400", "0.001", "0.5")
    assert sweep.folder(variants[4]) == "seed7/gpt2/ngpt-lr0.003"

    losses = {variants[0]: 2.0, variants[5]: 2.5, variants[6]: 2.4, variants[3]: 1.9}
    rows = {v: {**v.values, "val_loss": loss, "final_cosine": None, "ms_per_step": None, "status": "ok"} for v, loss in losses.items()}
    lines = markdown_table(name_rows(sweep, variants, rows), sweep.columns).splitlines()
    assert lines[3].startswith("| nGPT (GPT-2, lr 0.001) | 7 | 1.900 | -0.100 |")
    assert lines[5].startswith("| 0.5-SpheretNorm (LLaMA) | 7 | 2.400 | -0.100 |")  # against LLaMA's Pre-LN, not GPT-2's


def test_a_run_from_before_the_block_key_is_a_gpt2_run(tmp_path: Path) -> None:
    from spheretnorm.runtime.config import parse_config
    from spheretnorm.experiments.grid import CONFIG_NAME
    from spheretnorm.runtime.identity import config_conflicts

    (tmp_path / CONFIG_NAME).write_text(json.dumps({"connection": "pre_ln", "n_layer": 2}), encoding="utf-8")
    assert config_conflicts(tmp_path, parse_config(["--connection=pre_ln", "--n_layer=2"], world_size=1)) == []
    conflicts = config_conflicts(tmp_path, parse_config(["--connection=pre_ln", "--n_layer=2", "--block=llama"], world_size=1))
    assert conflicts == ["block: the run has 'gpt2', asked for 'llama'"]
