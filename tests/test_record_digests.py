"""A sweep record that cannot be rewritten unnoticed (issue 67, item 2): the declaration carries the
digest it was written with; each run's row, once the run has ended, the digests of its config.json
and metrics.jsonl, the declaration it ran under and the code's commit. A re-run or --table_only
checks them: a forged loss, swapped files or an edited rule are one line each and judge nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spheretnorm.experiments import p_sweep
from spheretnorm.experiments.study import UNVERIFIED, declaration_digest, ensure_data

TINY = ["--n_layer=1", "--n_embd=16", "--n_head=2", "--block_size=16", "--batch_size=4", "--global_batch_size=4", "--eval_iters=2",
        "--max_iters=6", "--lr_decay_iters=6", "--warmup_iters=1", "--eval_interval=6", "--log_interval=2", "--compile=false"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tiny runs of the p-sweep (p = 0.5 and 1, seed 1337) with a declared rule, trained once."""
    root = tmp_path_factory.mktemp("digests")
    play = root / "play.txt"
    play.write_text("\n".join(f"{who}: the {what} is {how}." for who in ("ANN", "BEN") for what in ("sea", "king") for how in ("near", "gone")) * 60)
    ensure_data(root / "data", str(play))
    assert p_sweep.main(argv(root, "out")) == 0
    return root


def argv(root: Path, out: str, *extra: str) -> list[str]:
    return ["--axis", "spheret_p=0.5,1", "--axis", "seed=1337", f"--out_dir={root / out}", f"--data_dir={root / 'data'}",
            "--rule", "every_gap>0", *TINY, *extra]


@pytest.fixture
def sweep(swept: Path, tmp_path: Path) -> Path:
    """A copy of the trained sweep to tamper with."""
    shutil.copytree(swept / "out", tmp_path / "out")
    (tmp_path / "data").symlink_to(swept / "data")
    return tmp_path


def table_only(root: Path, capsys: pytest.CaptureFixture) -> tuple[dict, str]:
    capsys.readouterr()
    assert p_sweep.main([*argv(root, "out"), "--table_only"]) == 0
    return json.loads((root / "out" / "p_sweep.json").read_text()), capsys.readouterr().out


def test_the_record_holds_each_runs_digests_the_declaration_and_the_code(swept: Path) -> None:
    record = json.loads((swept / "out" / "p_sweep.json").read_text())
    declared = record["declared"]
    assert declared["digest"] == declaration_digest(declared) and len(declared["digest"]) == 64
    for row in record["runs"]:
        run = swept / "out" / row["folder"]
        assert row["metrics_sha256"] == __import__("hashlib").sha256((run / "metrics.jsonl").read_bytes()).hexdigest()
        assert row["config_sha256"] == __import__("hashlib").sha256((run / "config.json").read_bytes()).hexdigest()
        assert row["declared_digest"] == declared["digest"] and set(row["code"]) == {"commit", "dirty"}


def test_a_forged_loss_is_one_line_and_counts_nowhere_until_the_file_is_restored(sweep: Path, capsys: pytest.CaptureFixture) -> None:
    metrics = sweep / "out" / "p0.5" / "seed1337" / "metrics.jsonl"
    honest = metrics.read_text()
    rows = [json.loads(line) for line in honest.splitlines()]
    last_eval = max(i for i, r in enumerate(rows) if r["kind"] == "eval")
    rows[last_eval]["val_loss_full"] = 0.5
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    record, out = table_only(sweep, capsys)
    (line,) = [line for line in out.splitlines() if line.startswith("warning:")]
    assert line.startswith("warning: p0.5/seed1337: its metrics.jsonl is not the file the record holds (sha256 ")
    forged = next(r for r in record["runs"] if r["folder"] == "p0.5/seed1337")
    assert forged["status"] == UNVERIFIED and forged["val_loss_full"] is None
    assert "0.500" not in (sweep / "out" / "p_sweep.md").read_text()
    metrics.write_text(honest)  # the record kept the digest it held: the honest file counts again
    record, out = table_only(sweep, capsys)
    assert "warning:" not in out and all(r["status"] != UNVERIFIED for r in record["runs"])


def test_swapped_metrics_and_a_config_that_ends_before_its_metrics_are_named(sweep: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = sweep / "out" / "p0.5" / "seed1337", sweep / "out" / "p1" / "seed1337"
    first, second = (a / "metrics.jsonl").read_bytes(), (b / "metrics.jsonl").read_bytes()
    (a / "metrics.jsonl").write_bytes(second)
    (b / "metrics.jsonl").write_bytes(first)
    record, out = table_only(sweep, capsys)
    assert sum(line.startswith("warning: ") and "metrics.jsonl is not the file" in line for line in out.splitlines()) == 2
    assert all(r["status"] == UNVERIFIED for r in record["runs"])
    (a / "metrics.jsonl").write_bytes(first)
    (b / "metrics.jsonl").write_bytes(second)
    config = json.loads((a / "config.json").read_text())
    (a / "config.json").write_text(json.dumps({**config, "max_iters": 2}))
    record, out = table_only(sweep, capsys)
    assert "its metrics.jsonl reaches iter 6, past the max_iters=2 of its config.json" in out


def test_an_edited_rule_judges_nothing(sweep: Path, capsys: pytest.CaptureFixture) -> None:
    path = sweep / "out" / "p_sweep.json"
    record = json.loads(path.read_text())
    assert "- rule every_gap>0 (" in (sweep / "out" / "p_sweep.md").read_text()
    path.write_text(json.dumps({**record, "declared": {**record["declared"], "rules": ["every_gap>-100"]}}))
    capsys.readouterr()
    assert p_sweep.main([a for a in argv(sweep, "out") if a not in ("--rule", "every_gap>0")] + ["--table_only"]) == 0
    out = capsys.readouterr().out
    assert out.count("warning: the declaration in") == 1 and "was changed after it was written" in out
    table = (sweep / "out" / "p_sweep.md").read_text()
    assert "- rule " not in table and "The declaration in" in table and "judge nothing here" in table


def test_compare_names_a_forged_run_and_leaves_its_arm_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--compare reads finished sweeps' records: a run whose file changed since is one line, and its
    arm's summary (the gaps the figure draws) is left out; the other arms are drawn as recorded."""
    import hashlib

    from spheretnorm.experiments.fair_comparison import checked_record

    def run(folder: str, loss: float) -> dict:
        out = tmp_path / folder
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({"max_iters": 6}))
        (out / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "iter": 6, "val_loss_full": loss}) + "\n")
        digest = {k: hashlib.sha256((out / n).read_bytes()).hexdigest() for k, n in (("config_sha256", "config.json"), ("metrics_sha256", "metrics.jsonl"))}
        return {"block": "llama", "arm": folder.split("/")[1], "status": "ok", "val_loss_full": loss, "folder": folder, **digest}

    record = {"runs": [run("llama/pre_ln/lr0.002_s1338", 1.8), run("llama/p_spheret-0.5/lr0.002_s1338", 1.9),
                       run("llama/geonorm/lr0.002_s1338", 1.85)],
              "best": [{"block": "llama", "arm": "p_spheret-0.5", "optimizer": "adamw"}, {"block": "llama", "arm": "geonorm", "optimizer": "adamw"}]}
    assert checked_record(record, tmp_path) == record and capsys.readouterr().out == ""  # every file as recorded: nothing said
    (tmp_path / "llama/p_spheret-0.5/lr0.002_s1338/metrics.jsonl").write_text(json.dumps({"kind": "eval", "iter": 6, "val_loss_full": 0.5}) + "\n")
    checked = checked_record(record, tmp_path)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "llama/p_spheret-0.5/lr0.002_s1338: its metrics.jsonl is not the file the record holds" in out[0]
    assert [r["status"] for r in checked["runs"]] == ["ok", UNVERIFIED, "ok"]
    assert checked["best"] == [{"block": "llama", "arm": "geonorm", "optimizer": "adamw"}]
    old = {"runs": [{k: v for k, v in r.items() if "sha256" not in k} for r in record["runs"]], "best": record["best"]}
    assert checked_record(old, tmp_path) == old  # a record from before digests: nothing to check it against
