"""run_cost.py's parts of a run: the checkpoint writes it reads from train.py's last line."""

from pathlib import Path

from spheretnorm.experiments.study_cost import WRITES_LINE, Case, costs, table
from spheretnorm.runtime.tracking import Progress


def test_the_writes_line_reads_what_a_run_prints():
    progress = Progress(checkpoint=Path("ckpt.pt"), tokens_per_step=64)
    progress.note_checkpoint_write(0.25)
    progress.note_checkpoint_write(0.5)
    line = f"Done: iter 80, best val loss 2.0000; saved; {progress.checkpoint_writes_text()}."
    match = WRITES_LINE.search(line)
    assert match is not None and float(match.group(1)) == 0.75


def test_costs_split_the_short_run_into_its_parts():
    case = Case(24, 128, "pre_ln", "compiled_blocks", "float32")
    rows = [{"kind": "eval", "eval_s": 1.5, "diag_s": 0.5, "full_eval_s": 8.0}, {"kind": "checkpoint_writes", "seconds": 0.3}]
    # 20 and 80 iterations costing 20 and 50 CPU seconds: a step is 0.5 s, and the short run's
    # 20 s less 10 s of steps, 2 s of evaluation and 8 s of the whole split leave no fixed part.
    row = costs(case, rows, short_cpu=20.0, long_cpu=50.0, short=20, long=80, first_cpu=65.0)
    assert row["step_ms"] == 500.0
    assert row["fixed_s"] == 0.0 and row["ckpt_s"] == 0.3
    assert row["eval_s"] == 2.0 and row["full_eval_s"] == 8.0
    assert row["cold_extra_s"] == 15.0
    assert row["study_run_s"] == 600 * 0.5 + 6 * 2.0 + 8.0


def test_a_run_without_the_line_has_no_writes_figure():
    case = Case(12, 64, "pre_ln", "eager", "float32")
    rows = [{"kind": "eval", "eval_s": 1.0, "full_eval_s": 1.0}, {"kind": "checkpoint_writes", "seconds": None}]
    assert costs(case, rows, 10.0, 20.0, 20, 80, 20.0)["ckpt_s"] is None


def test_a_failed_case_is_a_line_under_the_table_not_a_row_of_its_error():
    case = Case(24, 128, "pre_ln", "compiled_blocks", "float32")
    rows = [{"kind": "eval", "eval_s": 1.5, "diag_s": 0.5, "full_eval_s": 8.0}]
    measured = costs(case, rows, short_cpu=20.0, long_cpu=50.0, short=20, long=80, first_cpu=65.0) | {"final_loss": 2.5}
    text = table([measured, {"case": "36x128_pre_ln_eager", "error": "train.py exited 1: out of memory"}])
    lines = text.splitlines()
    assert lines[-1] == "not measured: 36x128_pre_ln_eager: train.py exited 1: out of memory"
    assert text.count("out of memory") == 1 and sum(line.startswith("|") for line in lines) == 3  # header, rule, one case
    assert table([{"case": "x", "error": "boom"}]) == "not measured: x: boom"
    assert "| 2.5 |" in text and "None" not in text  # no checkpoint-writes line: '-', not 'None'
