"""Bad input on the newer surfaces: one sentence, nothing written that was refused, no history lost.

Each case builds its input from the documented formats (lm-eval task YAMLs for --include_path,
the release files of eval/README.md for --local_data, run folders for scripts/tables.py and
scripts/plot.py, a checkpoint for scripts/export_hf.py) with one fault, and runs the command as
a user does, as a subprocess from the repository root. A refusal exits with status 2, its last
stderr line is one `error: ...` sentence naming the file (and line), and no traceback is printed.

The full disk is RLIMIT_FSIZE in the child, with SIGXFSZ ignored, so that a write past the limit
fails with EFBIG as on a full disk: the command must say so in one line and leave no partial file
(nor a temporary one) behind, and an earlier output under the same name must be untouched.
"""

from __future__ import annotations

import os

# No network here: datasets / huggingface_hub must not try the hub (set before they are imported).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import json
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from spheretnorm.model import GPT, GPTConfig
from spheretnorm.runtime.checkpoint import checkpoint_state
from spheretnorm.runtime.methods import method_dirname
from test_eval_faults import ckpt  # noqa: F401  (a fixture: a real tiny GPT-2-vocabulary checkpoint)

REPO = Path(__file__).resolve().parents[1]
DEEP = "[" * 10_000 + "]" * 10_000  # 10,000 nested lists: more than Python's parser recurses
CHARS = [chr(c) for c in range(ord("a"), ord("a") + 26)] + list(" .,;!?\n")


def run(argv: list[str | Path], fsize: int | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """A command of the repository as a user runs it; with fsize, on a 'disk' that takes at most fsize bytes per file."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited across exec: a write past the limit is EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run([sys.executable, *map(str, argv)], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit if fsize is not None else None)


def assert_one_line_refusal(proc: subprocess.CompletedProcess[str], *named: str | Path) -> str:
    """Exit status 2, no traceback, and a last stderr line `error: ...` naming each of `named`; returns that line."""
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    assert proc.returncode == 2, output
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), output
    for name in named:
        assert str(name) in last, output
    return last


def leftovers(folder: Path) -> list[str]:
    """Temporary or partial files a write left in folder (names as the atomic writers make them)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or ".tmp" in p.name or ".export-" in p.name)


# -----------------------------------------------------------------------------
# eval/zero_shot.py: --include_path task YAMLs and --local_data files


def task_yaml(data_file: Path, **changes: Any) -> str:
    """A loglikelihood task in lm-eval's YAML format reading one local jsonl file; None in changes drops a key."""
    config: dict[str, Any] = {
        "task": "my_task",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}},
        "test_split": "test",
        "output_type": "loglikelihood",
        "doc_to_text": "{{text}}",
        "doc_to_target": " {{target}}",
        "metric_list": [{"metric": "acc"}],
    }
    config.update(changes)
    return json.dumps({k: v for k, v in config.items() if v is not None})  # JSON is YAML


def include_case(**changes: Any) -> Callable[[Path], tuple[list[str | Path], list[str | Path]]]:
    """A --include_path folder with one task YAML (changed as given) and its data file; -> (extra argv, names the error must hold)."""

    def build(tmp: Path) -> tuple[list[str | Path], list[str | Path]]:
        data = tmp / "mine.jsonl"
        data.write_text(json.dumps({"text": "The sky is", "target": "blue"}) + "\n")
        folder = tmp / "tasks"
        folder.mkdir()
        (folder / "my_task.yaml").write_text(task_yaml(data, **{k: (v(tmp) if callable(v) else v) for k, v in changes.items()}))
        return ["--tasks", "my_task", "--include_path", folder], [folder / "my_task.yaml"]

    return build


def local_case(relative: str, content: str, *named: str) -> Callable[[Path], tuple[list[str | Path], list[str | Path]]]:
    """A --local_data folder whose file `relative` holds `content` (piqa's labels written healthy when needed)."""
    task = {"piqa": "piqa", "lambada_openai": "lambada_openai", "sciq": "sciq", "arc": "arc_easy", "hellaswag": "hellaswag"}[relative.split("/")[0]]

    def build(tmp: Path) -> tuple[list[str | Path], list[str | Path]]:
        data = tmp / "data"
        path = data / relative
        path.parent.mkdir(parents=True)
        path.write_text(content)
        if task == "piqa":
            (data / "piqa/valid-labels.lst").write_text("0\n")
        return ["--tasks", task, "--local_data", data], [path, *named]

    return build


PIQA = {"goal": "Open a jar.", "sol1": "Twist the lid.", "sol2": "Freeze the lid."}
ARC = {"id": "q1", "question": {"stem": "Which tool measures mass?", "choices": [{"text": "balance", "label": "A"}, {"text": "", "label": "B"}]}, "answerKey": "A"}
# One --include_path fault goes through the command (lm-eval indexes its ~14,000 task YAMLs in
# each process, ~10 s); the YAML check's other faults are test_task_yaml_problem's, in process.
ZERO_SHOT_CASES = {
    "include: data_files missing": include_case(dataset_kwargs=lambda tmp: {"data_files": {"test": str(tmp / "gone.jsonl")}}),
    "local: empty field": local_case("piqa/valid.jsonl", json.dumps({**PIQA, "goal": ""}) + "\n", "line 1", "goal"),
    "local: blank field on line 2": local_case("piqa/valid.jsonl", json.dumps(PIQA) + "\n" + json.dumps({**PIQA, "sol2": "  "}) + "\n", "line 2", "sol2"),
    "local: empty nested field": local_case("arc/ARC-Easy-Test.jsonl", json.dumps(ARC) + "\n", "question.choices[1].text"),
    "local: 10,000 nested lists": local_case("lambada_openai/lambada_test.jsonl", DEEP + "\n", "Line 1"),
    "local: 10,000 nested lists in a field": local_case("hellaswag/hellaswag_val.jsonl", '{"endings": ' + DEEP + "}\n", "Line 1"),
    "local: sciq nested deeply": local_case("sciq/test.json", DEEP),
}


@pytest.mark.parametrize("case", list(ZERO_SHOT_CASES))
def test_zero_shot_refuses_bad_task_input_in_one_line(case: str, ckpt: Path, tmp_path: Path) -> None:
    extra, named = ZERO_SHOT_CASES[case](tmp_path)
    out = tmp_path / "r.json"
    proc = run(["eval/zero_shot.py", "--ckpt", ckpt, *extra, "--limit", "2", "--bootstrap_iters", "0", "--out", out])
    assert_one_line_refusal(proc, *named)
    assert not list(tmp_path.glob("r*.json")), "a refused evaluation wrote results"


def yaml_config(tmp: Path, **changes: Any) -> dict[str, Any]:
    """task_yaml()'s config as lm-eval hands it over (a dict), over a data file that exists."""
    data = tmp / "mine.jsonl"
    data.write_text(json.dumps({"text": "The sky is", "target": "blue"}) + "\n")
    return json.loads(task_yaml(data, **changes))


@pytest.mark.parametrize("changes,problem", [
    ({}, None),
    ({"dataset_path": None}, "has no dataset_path"),
    ({"dataset_path": "  "}, "has no dataset_path"),
    ({"metric_list": [{"metric": "accuracy_of_vibes"}]}, "names the metric 'accuracy_of_vibes', which lm-eval does not know"),
    ({"metric_list": [{"aggregation": "mean"}]}, "has a metric_list entry {'aggregation': 'mean'} without a metric name"),
    ({"metric_list": [{"metric": "!function utils.score"}]}, None),  # the task's own code: not checked
    ({"dataset_kwargs": {"data_files": "{tmp}/none/*.jsonl"}}, "has data_files '{tmp}/none/*.jsonl', which matches no file"),
    ({"dataset_kwargs": {"data_files": {"test": "{tmp}/gone.jsonl"}}}, "has data_files '{tmp}/gone.jsonl', which is no file"),
    ({"dataset_kwargs": {"data_files": "https://example.org/x.jsonl"}}, None),  # a URL is the loader's to fetch
    ({"dataset_kwargs": {"data_dir": "{tmp}/nowhere"}}, "has data_dir '{tmp}/nowhere', which is no folder"),
])
def test_task_yaml_problem(changes: dict[str, Any], problem: str | None, tmp_path: Path) -> None:
    """The --include_path check of one task YAML: each fault as its phrase, a healthy task as None."""
    from spheretnorm.zeroshot.driver import task_yaml_problem

    filled = json.loads(json.dumps(changes).replace("{tmp}", str(tmp_path)))
    found = task_yaml_problem(yaml_config(tmp_path, **filled), {"acc", "acc_norm", "perplexity"})
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem.replace("{tmp}", str(tmp_path))), found


def test_include_path_help_says_a_task_folder_is_code() -> None:
    proc = run(["eval/zero_shot.py", "--help"])
    assert proc.returncode == 0 and "!function" in proc.stdout and "trust" in proc.stdout, proc.stdout
    assert "!function" in (REPO / "eval" / "README.md").read_text()


def results_writer(path: Path, fsize: int) -> subprocess.CompletedProcess[str]:
    """driver.write_results of a 20 kB results JSON on a full disk, reported as eval/zero_shot.py reports it."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from spheretnorm.zeroshot.driver import write_results\n"
        "from spheretnorm.zeroshot.errors import EvalError\n"
        "try:\n"
        f"    write_results({{'results': {{'t{{}}'.format(i): {{'acc,none': 0.5}} for i in range(800)}}}}, Path({str(path)!r}))\n"
        "except EvalError as exc:\n"
        "    print(f'error: {exc}', file=sys.stderr)\n"
        "    sys.exit(2)\n"
    )
    return run(["-c", code], fsize=fsize)


def test_zero_shot_results_on_a_full_disk_leave_the_earlier_file(tmp_path: Path) -> None:
    path = tmp_path / "ckpt_zero_shot.json"
    path.write_text('{"earlier": true}\n')
    last = assert_one_line_refusal(results_writer(path, 4096), path)
    assert "disk" in last
    assert path.read_text() == '{"earlier": true}\n' and leftovers(tmp_path) == []
    proc = results_writer(path, 10**8)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(path.read_text())["results"]) == 800 and leftovers(tmp_path) == []


# -----------------------------------------------------------------------------
# scripts/tables.py and scripts/plot.py: damaged metrics rows, bad diagnostics, outputs

SHAPE_S = {"n_layer": 12, "n_head": 12, "n_embd": 768}
SERIES = "massive_ratio"  # a drawn per-layer diagnostic: 13 values per row at S (embedding output and 12 blocks)


def write_runs(root: Path) -> dict[str, Path]:
    """Two finished openwebtext S runs (pre_ln, geonorm) with a drawn diagnostic; {method: metrics.jsonl}."""
    paths = {}
    for method, val in (("pre_ln", 3.0), ("geonorm", 2.9)):
        out = root / "openwebtext_s" / method_dirname(method)
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({"dataset": "openwebtext", "method": method, "max_iters": 100, **SHAPE_S}))
        rows = [
            {"kind": "train", "iter": 50, "train_loss": val + 0.5, "train_loss_avg200": val + 0.5},
            {"kind": "eval", "iter": 50, "val_loss": val + 0.4, SERIES: [0.5] * 13},
            {"kind": "train", "iter": 100, "train_loss": val + 0.1, "train_loss_avg200": val + 0.2},
            {"kind": "eval", "iter": 100, "val_loss": val, SERIES: [0.4] * 13},
        ]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (out / "ckpt_zero_shot.json").write_text(json.dumps({"results": {}, "paper_table": {"piqa/acc_norm": 60.0}}))
        paths[method] = out / "metrics.jsonl"
    return paths


def damage_line(path: Path, number: int, row: str) -> None:
    lines = path.read_text().splitlines()
    lines[number - 1] = row
    path.write_text("\n".join(lines) + "\n")


EVAL_ROW = {"kind": "eval", "iter": 100, "val_loss": 3.0}
# (the metrics.jsonl line 4 of pre_ln, damaged) -> refused by both commands, naming file and line
ROW_CASES = {
    "10,000 nested lists": DEEP,
    "a field nested 10,000 deep": '{"kind": "eval", "iter": 100, "val_loss": ' + DEEP + "}",
    "val_loss Infinity": json.dumps({**EVAL_ROW, "val_loss": float("inf")}),
    "val_loss NaN": json.dumps({**EVAL_ROW, "val_loss": float("nan")}),
    "train_loss -Infinity": json.dumps({"kind": "train", "iter": 100, "train_loss": float("-inf"), "train_loss_avg200": 3.0}),
}


def tables_cmd(root: Path, *extra: str | Path) -> list[str | Path]:
    return ["scripts/tables.py", "--runs_root", root, "--tables", "2", *extra]


def plot_cmd(root: Path, *extra: str | Path) -> list[str | Path]:
    return ["scripts/plot.py", "--runs_root", root, "--dataset", "openwebtext", "--scale", "S", *extra]


@pytest.mark.parametrize("command", ["tables", "plot"])
@pytest.mark.parametrize("case", list(ROW_CASES))
def test_a_damaged_metrics_row_is_one_sentence_with_file_and_line(case: str, command: str, tmp_path: Path) -> None:
    metrics = write_runs(tmp_path / "runs")["pre_ln"]
    damage_line(metrics, 4, ROW_CASES[case])
    argv = tables_cmd(tmp_path / "runs") if command == "tables" else plot_cmd(tmp_path / "runs", "--out", tmp_path / "fig")
    assert_one_line_refusal(run(argv), metrics, "Line 4")
    assert not list(tmp_path.glob("fig*")), "a refused plot wrote a figure"


def test_zero_shot_results_nested_deeply_are_one_sentence(tmp_path: Path) -> None:
    write_runs(tmp_path / "runs")
    path = tmp_path / "runs" / "openwebtext_s" / method_dirname("pre_ln") / "ckpt_zero_shot.json"
    path.write_text('{"paper_table": ' + DEEP + "}")
    assert_one_line_refusal(run(["scripts/tables.py", "--runs_root", tmp_path / "runs", "--tables", "4"]), path)


# A diagnostic of the wrong type is refused, naming the file and line; a nan or inf is skipped with a note.
DIAGNOSTIC_CASES = {
    "an object": ({"layer0": 0.5}, "refused"),
    "a string": ("0.5", "refused"),
    "a list of strings": (["0.5"] * 13, "refused"),
    "a list of lists": ([[0.5]] * 13, "refused"),
    "ragged": ([0.5] * 12, "refused"),
    "nan inside": ([0.5] * 12 + [float("nan")], "skipped"),
    "inf inside": ([float("inf")] + [0.5] * 12, "skipped"),
}


@pytest.mark.parametrize("case", list(DIAGNOSTIC_CASES))
def test_plot_diagnostics_of_the_wrong_type_are_refused_or_skipped_with_a_note(case: str, tmp_path: Path) -> None:
    value, outcome = DIAGNOSTIC_CASES[case]
    metrics = write_runs(tmp_path / "runs")["pre_ln"]
    damage_line(metrics, 4, json.dumps({**EVAL_ROW, SERIES: value}))
    proc = run(plot_cmd(tmp_path / "runs", "--diagnostics", "--out", tmp_path / "fig"))
    if outcome == "refused":
        assert_one_line_refusal(proc, metrics, "line 4", SERIES)
        return
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note: ") and str(metrics) in line]
    assert len(notes) == 1 and "line 4" in notes[0] and SERIES in notes[0] and "left out" in notes[0], proc.stderr
    assert (tmp_path / f"fig_{SERIES}.png").is_file()


def test_tables_ignore_diagnostics_they_do_not_show(tmp_path: Path) -> None:
    """tables.py tabulates losses only: a broken diagnostic in a row is not its input (and not refused)."""
    metrics = write_runs(tmp_path / "runs")["pre_ln"]
    damage_line(metrics, 4, json.dumps({**EVAL_ROW, SERIES: {"layer0": 0.5}}))
    proc = run(tables_cmd(tmp_path / "runs"))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", ["tables", "plot"])
def test_an_output_path_that_cannot_be_written_is_one_sentence(command: str, tmp_path: Path) -> None:
    write_runs(tmp_path / "runs")
    (tmp_path / "a_file").write_text("not a folder")
    out = tmp_path / "a_file" / "sub" / "out"
    argv = tables_cmd(tmp_path / "runs", "--out", out) if command == "tables" else plot_cmd(tmp_path / "runs", "--out", out)
    assert_one_line_refusal(run(argv), tmp_path / "a_file")
    assert (tmp_path / "a_file").read_text() == "not a folder"


@pytest.mark.parametrize("command", ["tables", "plot"])
def test_outputs_on_a_full_disk_are_one_line_and_leave_the_earlier_files(command: str, tmp_path: Path) -> None:
    write_runs(tmp_path / "runs")
    outdir = tmp_path / "outputs"
    outdir.mkdir()
    earlier = {outdir / (f"t{ext}" if command == "tables" else f"t{ext}"): f"earlier {ext}" for ext in ((".md", ".tex") if command == "tables" else (".png", ".pdf"))}
    for path, text in earlier.items():
        path.write_text(text)
    argv = tables_cmd(tmp_path / "runs", "--out", outdir / "t") if command == "tables" else plot_cmd(tmp_path / "runs", "--out", outdir / "t")
    last = assert_one_line_refusal(run(argv, fsize=64), outdir)
    assert "disk" in last
    assert {p: p.read_text() for p in earlier} == earlier and leftovers(outdir) == []
    proc = run(argv)
    assert proc.returncode == 0, proc.stderr
    assert all(p.read_bytes() != t.encode() for p, t in earlier.items()) and leftovers(outdir) == []


# -----------------------------------------------------------------------------
# scripts/export_hf.py: a full disk mid-export removes what the export wrote


@pytest.fixture(scope="module")
def char_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A character-level geonorm checkpoint (its tokenizer needs no files); the weights are ~100 kB."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=len(CHARS), connection="geonorm"))
    path = tmp_path_factory.mktemp("char") / "ckpt.pt"
    meta = {"tokenizer": "char", "vocab_size": len(CHARS), "itos": CHARS}
    torch.save({**checkpoint_state(model), "iter_num": 7, "data_meta": meta}, path)
    return path


# Each format and each kind of destination once (a process each, 12 s apiece: not all six pairs).
@pytest.mark.parametrize("fmt,where", [("hf", "new folder"), ("safetensors", "new nested folder"), ("hf", "empty folder")])
def test_export_on_a_full_disk_removes_what_it_wrote(fmt: str, where: str, char_ckpt: Path, tmp_path: Path) -> None:
    parent = tmp_path / "exports"
    parent.mkdir()
    out = parent / "a" / "b" / "model" if where == "new nested folder" else parent / "model"
    if where == "empty folder":
        out.mkdir()
    argv = ["scripts/export_hf.py", "--ckpt", char_ckpt, "--out", out, "--format", fmt]
    last = assert_one_line_refusal(run(argv, fsize=8192), out)
    assert "disk" in last
    assert sorted(p.name for p in parent.iterdir()) == (["model"] if where == "empty folder" else [])
    if where == "empty folder":
        assert list(out.iterdir()) == []
    proc = run(argv)
    assert proc.returncode == 0, proc.stderr
    assert (out / ("model.safetensors" if fmt == "hf" else "ckpt.safetensors")).is_file()
    assert leftovers(out.parent) == []
