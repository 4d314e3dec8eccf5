"""The "stalled" status (issue 63, item 2; declared in docs/LOG.md on 2026-12-07): a run that
finished below the unigram line but whose final whole-split val loss lies above its data's bigram
loss (the val split's pairs under the train split's add-one smoothed pair counts).

Every expected number is worked out by hand in its comment, not by the code under test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from spheretnorm.experiments import grid
from spheretnorm.experiments.grid import STALLED, STUCK_AT_UNIGRAM, Run, Yardsticks, bigram_loss, classify


def write_tokens(root: Path, train: list[int], val: list[int], vocab: int) -> Path:
    """train.bin, val.bin and meta.json as data/prepare.py writes them (uint16 ids)."""
    root.mkdir(parents=True, exist_ok=True)
    np.asarray(train, dtype=np.uint16).tofile(root / "train.bin")
    np.asarray(val, dtype=np.uint16).tofile(root / "val.bin")
    meta = {"tokenizer": "char", "vocab_size": vocab, "eot_token": None, "dtype": "uint16", "train_tokens": len(train), "val_tokens": len(val)}
    (root / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    return root


def test_the_bigram_loss_is_the_add_one_cross_entropy_worked_out_by_hand(tmp_path: Path) -> None:
    # Three symbols a, b, c (0, 1, 2). Train "ababc": its pairs ab, ba, ab, bc, so n(a,b) = 2,
    # n(b,a) = 1, n(b,c) = 1; n(a) = 2, n(b) = 2, n(c) = 0 (c ends the split). Val "abca": pairs ab, bc, ca.
    # Add-one over V = 3: P(b|a) = (2+1)/(2+3) = 3/5, P(c|b) = (1+1)/(2+3) = 2/5, P(a|c) = (0+1)/(0+3) = 1/3
    # (a pair never seen, after a token never seen first: finite). Mean of -ln over the 3 pairs:
    # (ln 5/3 + ln 5/2 + ln 3) / 3 = ln(25/2) / 3 = 0.841910 (to 6 places).
    data = write_tokens(tmp_path / "abc", [0, 1, 0, 1, 2], [0, 1, 2, 0], vocab=3)
    assert bigram_loss(data) == pytest.approx(math.log(12.5) / 3, rel=1e-12)
    assert math.log(12.5) / 3 == pytest.approx(0.841910, abs=1e-6)


def test_the_bigram_loss_counts_the_whole_vocabulary_in_its_smoothing(tmp_path: Path) -> None:
    # The same splits with a vocabulary of 5 (ids 3 and 4 never occur): P(b|a) = 3/7, P(c|b) = 2/7,
    # P(a|c) = 1/5, so the loss is (ln 7/3 + ln 7/2 + ln 5) / 3 = ln(245/6) / 3 = 1.236500.
    data = write_tokens(tmp_path / "abc5", [0, 1, 0, 1, 2], [0, 1, 2, 0], vocab=5)
    assert bigram_loss(data) == pytest.approx(math.log(245 / 6) / 3, rel=1e-12)
    assert Yardsticks.of(data).bigram == pytest.approx(1.236500, abs=1e-6)


def test_a_folder_without_data_has_no_yardsticks(tmp_path: Path) -> None:
    sticks = Yardsticks.of(tmp_path / "nothing")
    assert math.isnan(sticks.unigram) and math.isnan(sticks.bigram)


def finished(tmp_path: Path, sampled: float, full: float | None = None) -> Run:
    """A run whose last eval row is at max_iters, with the sampled val_loss and (where given) val_loss_full."""
    row = {"kind": "eval", "iter": 100, "val_loss": sampled, **({"val_loss_full": full} if full is not None else {})}
    return Run(tmp_path, {"max_iters": 100}, [row], None)


UNIGRAM, BIGRAM = 3.35, 2.48  # stuck at unigram above 3.35 - 0.05 = 3.30 (the sampled loss); stalled above 2.48 (the whole split's)


@pytest.mark.parametrize("sampled,full,status", [
    (1.95, 1.94, "ok"),                # a trained run
    (3.14, 3.13, STALLED),             # E4's seed 1338: below 3.30, above 2.48
    (3.34, 3.33, STUCK_AT_UNIGRAM),    # above the unigram line: the older, stronger status
    (2.60, 2.40, "ok"),                # the whole split decides: 2.40 is below the bigram loss though the sampled batches are not
    (2.40, 2.60, STALLED),             # and the reverse
    (2.60, None, STALLED),             # a run from before val_loss_full: its sampled loss
    (2.48, 2.48, "ok"),                # strictly above, no margin: at the bigram loss is not a stall
])
def test_classify_tells_a_stall_from_a_trained_run_and_from_one_stuck_at_unigram(tmp_path: Path, sampled: float, full: float | None,
                                                                                 status: str) -> None:
    assert classify(finished(tmp_path, sampled, full), 0, UNIGRAM, "", BIGRAM)[0] == status


def test_a_stalls_reason_names_both_numbers_and_unknown_yardsticks_judge_none(tmp_path: Path) -> None:
    run = finished(tmp_path, 3.14, 3.133)
    assert classify(run, 0, UNIGRAM, "", BIGRAM) == (STALLED, "val loss 3.133 above the bigram loss 2.480 (unigram 3.350)")
    assert classify(run, None, UNIGRAM, "", BIGRAM)[0] == STALLED  # found finished (not started here): judged the same
    assert classify(run, 0, UNIGRAM)[0] == "ok"  # no bigram loss given: no stall can be judged
    assert classify(run, 0, math.nan, "", math.nan)[0] == "ok"  # a dry run's missing data


def test_a_stall_is_a_failure_as_a_collapse_in_the_studies_table_of_statuses() -> None:
    from spheretnorm.experiments.study import FAILURE_WORDS, UNSTABLE, final_loss, has_ended

    assert STALLED in UNSTABLE and FAILURE_WORDS[STALLED] == "stalled"
    assert set(UNSTABLE) == {"diverged", grid.STOPPED_COLLAPSE, STUCK_AT_UNIGRAM, STALLED}
    row = {"status": STALLED, "val_loss": 3.14, "val_loss_full": 3.133}
    assert has_ended(row) and final_loss(row, "val_loss_full") == math.inf  # ended for the plan, never a rate's loss


def test_a_stalled_selection_run_is_never_the_selected_rate() -> None:
    from spheretnorm.experiments.study import Seeds, selected_cell

    # Seed 1 at 2e-3 reads 1.90 but stalled (a made-up status beside a made-up loss): the rate is 4e-3 (1.95), where seed 2 has 2.00.
    runs = [{"lr": 2e-3, "seed": 1, "val_loss": 1.90, "status": STALLED}, {"lr": 2e-3, "seed": 2, "val_loss": 1.98, "status": "ok"},
            {"lr": 4e-3, "seed": 1, "val_loss": 1.95, "status": "ok"}, {"lr": 4e-3, "seed": 2, "val_loss": 2.00, "status": "ok"}]
    cell = selected_cell(runs, Seeds(1, (2,)), "val_loss")
    assert (cell["rate"], cell["selection_loss"], cell["held_out"].losses) == (4e-3, 1.95, {2: 2.00})
