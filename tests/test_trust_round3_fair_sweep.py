"""scripts/fair_sweep.py refuses what would run nothing it meant, in one line, before anything runs
(issue 48, point 9): an empty --compare, a --compare naming a file, --jobs or --threads below 1,
and --base_lr with AdamW alone, where it changes nothing (beside another optimizer it sets the
AdamW part: tests/test_opened_choices.py); and an --input too short to prepare (issue 67, item 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spheretnorm.experiments import fair_comparison as fair_sweep
from spheretnorm.experiments import study


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep that gets past its checks fails the test instead of training."""

    def start_study(*args: object, **kwargs: object) -> None:
        raise AssertionError("the sweep started")

    monkeypatch.setattr(study, "start_study", start_study)  # what sweep_main, fair_sweep's command, calls


def refusal(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """The one line of a command that exits with status 2."""
    assert fair_sweep.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith("error: --"), captured.err
    return captured.err


def test_an_empty_compare_trains_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert "--compare '' names 0 sweep folder(s); give two or more" in refusal(["--compare=", f"--out_dir={tmp_path}"], capsys)


def test_a_compare_naming_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "b").mkdir()
    message = refusal([f"--compare={tmp_path / 'a.txt'},{tmp_path / 'b'}", f"--out_dir={tmp_path}"], capsys)
    assert f"{tmp_path / 'a.txt'} is a file, not a sweep's folder" in message


def test_a_compare_whose_record_is_a_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "a" / "fair_sweep.json").mkdir(parents=True)
    message = refusal([f"--compare={tmp_path / 'a'},{tmp_path / 'a'}", f"--out_dir={tmp_path}"], capsys)
    assert f"{tmp_path / 'a' / 'fair_sweep.json'} cannot be read (" in message


@pytest.mark.parametrize("option", ["--jobs=0", "--jobs=-1", "--threads=0"])
def test_a_count_below_one_is_refused_before_anything_runs(option: str, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from spheretnorm.experiments import sweep_runner

    monkeypatch.setattr(study, "start_study", sweep_runner.start_study)  # the real one: it checks the options first
    name, value = option[2:].split("=")
    message = refusal(["--dry_run", option, f"--out_dir={tmp_path / 'out'}", f"--data_dir={tmp_path / 'data'}"], capsys)
    assert message == f"error: --{name} {value} is not valid; give a positive integer, such as 1 or 2.\n"
    assert not (tmp_path / "out").exists() and not (tmp_path / "data").exists()


def test_base_lr_with_adamw_alone_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    message = refusal(["--base_lr=1e-3", "--dry_run", f"--out_dir={tmp_path}"], capsys)
    assert "--base_lr 0.001 sets the AdamW part beside another optimizer, and --optimizers 'adamw' has none" in message



@pytest.mark.parametrize("text, problem", [("", "is empty"), ("a", "too few to split")])
def test_an_input_too_short_to_prepare_is_one_line(text: str, problem: str, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A real sweep (not the dry run, which prepares nothing) ended in data/prepare.py's PrepareError traceback."""
    from spheretnorm.experiments import sweep_runner

    monkeypatch.setattr(study, "start_study", sweep_runner.start_study)  # the real one: it prepares the data first
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text)
    assert fair_sweep.main([f"--input={corpus}", f"--out_dir={tmp_path / 'out'}", f"--data_dir={tmp_path / 'data'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --input {str(corpus)!r} cannot be prepared in {tmp_path / 'data'}: "), err
    assert problem in err and not (tmp_path / "data" / "meta.json").exists()
