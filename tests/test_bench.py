"""bench.py: the variants it times, the round-robin order, ratios and saved-bytes figures."""

import pytest

import bench
from spheretnorm.runtime.config import ConfigError

TINY = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=8", "--vocab_size=32", "--batch_size=2", "--device=cpu"]


def test_every_variant_is_timed_round_robin(monkeypatch):
    order = []
    real_step = bench.make_step

    def recording_make_step(model, train, x, y, compiled, device, dtype):
        step = real_step(model, train, x, y, compiled, device, dtype)
        name = (model.config.connection, model.config.sphere_impl)

        def recorded():
            order.append(name)
            return step()

        return recorded

    monkeypatch.setattr(bench, "make_step", recording_make_step)
    report = bench.main(TINY + ["--connections=pre_ln,geonorm", "--sphere_impl=reference,fused", "--steps=3", "--warmup=1"])
    rows = report["results"]
    assert [(r["method"], r["impl"]) for r in rows] == [("pre_ln", "-"), ("geonorm", "reference"), ("geonorm", "fused")]
    # warm-up: each variant once in turn; then three rounds of one step each, in the same order
    names = [("pre_ln", "auto"), ("geonorm", "reference"), ("geonorm", "fused")]
    assert order == names + names * 3
    for r in rows:
        assert len(r["step_ms_all"]) == 3 and r["ms_per_step"] > 0
        assert r["saved_mb"] > 0 and r["mode"] == "eager"
    assert rows[0]["ratio_to_pre_ln"] == 1.0
    assert rows[2]["saved_mb"] < rows[1]["saved_mb"]  # fused keeps less than the reference


def test_bad_options_are_one_clear_error():
    with pytest.raises(ConfigError, match="--connections='pre_lm': unknown \\['pre_lm'\\]"):
        bench.parse_bench_args(["--connections=pre_lm"])
    with pytest.raises(ConfigError, match="--sphere_impl='fast'"):
        bench.parse_bench_args(["--sphere_impl=fast"])
    with pytest.raises(ConfigError, match="--steps must be >= 1"):
        bench.parse_bench_args(["--steps=0"])
    opts, rest = bench.parse_bench_args(["--compile=True", "--n_layer=2"])
    assert opts.compile_modes == (True,) and rest == ["--n_layer=2"]
    assert bench.parse_bench_args(["--compile=both"])[0].compile_modes == (False, True)


def test_profile_lists_where_each_variant_spends_its_step():
    report = bench.main(TINY + ["--connections=pre_ln,geonorm", "--sphere_impl=fused", "--steps=1", "--warmup=1", "--profile=2"])
    profiles = report["profiles"]
    assert [(p["method"], p["impl"]) for p in profiles] == [("pre_ln", "-"), ("geonorm", "fused")]
    for p in profiles:
        top = [r["ms_per_step"] for r in p["top"]]
        assert 0 < len(top) <= bench.PROFILE_TOP and top == sorted(top, reverse=True)
        assert 0 < sum(top) <= p["busy_ms_per_step"] + 1e-9 and p["wall_ms_per_step"] > 0
    names = {r["name"] for r in profiles[1]["top"]}
    assert any("SphereUpdate" in n for n in names) or len(names) == bench.PROFILE_TOP
    assert not bench.parse_bench_args(["--profile=3"])[0].profile_steps == 0
    with pytest.raises(ConfigError, match="--profile='x'"):
        bench.parse_bench_args(["--profile=x"])


def test_progress_goes_to_stderr_and_json_only_where_asked(tmp_path, capsys):
    """While it times: a line per variant's warm-up, per timed round (first and last at least)
    and per finished row, on stderr. stdout holds the setting line and the table, and JSON only
    with --json=- (one line, after the table); --json=FILE writes the full report there."""
    import json

    args = TINY + ["--connections=pre_ln,geonorm", "--sphere_impl=fused", "--steps=2", "--warmup=1"]
    bench.main(args)
    out, err = capsys.readouterr()
    assert not [line for line in out.splitlines() if line.startswith("{")]  # no JSON unasked
    assert out.splitlines()[0].startswith("bench: ") and out.splitlines()[-1].startswith("| ")
    for expected in ("warmed up 1/2: pre_ln gpt2 - eager adamw (1 step in ", "warmed up 2/2: geonorm gpt2 fused eager adamw",
                     "timed round 1/2 (2 variants", "timed round 2/2 (2 variants", "row 1/2: pre_ln gpt2 - eager adamw: ",
                     "row 2/2: geonorm gpt2 fused eager adamw: "):  # fmt: skip
        assert expected in err, expected
    assert err.index("warmed up 2/2") < err.index("timed round 1/2") < err.index("row 1/2")

    bench.main(args + ["--json=-"])
    out = capsys.readouterr().out.splitlines()
    summary = json.loads(out[-1])
    assert out[-2].startswith("| ") and [r["method"] for r in summary["results"]] == ["pre_ln", "geonorm"]
    assert "step_ms_all" not in summary["results"][0]

    path = tmp_path / "bench.json"
    bench.main(args + [f"--json={path}"])
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(json.loads(path.read_text())["results"][1]["step_ms_all"]) == 2


def test_each_optimizer_is_a_row_with_its_share_of_the_step(capsys):
    report = bench.main(TINY + ["--connections=pre_ln", "--optimizers=adamw,muon", "--steps=2", "--warmup=1"])
    rows = {r["optimizer"]: r for r in report["results"]}
    assert set(rows) == {"adamw", "muon"}
    for r in rows.values():
        assert 0 < r["optimizer_ms_per_step"] < r["ms_per_step"]
        assert r["optimizer_share"] == r["optimizer_ms_per_step"] / r["ms_per_step"]
        assert r["ratio_to_pre_ln"] == 1.0  # against pre_ln with the same optimizer
    table = capsys.readouterr().out
    assert "| optimizer |" in table and "| opt share |" in table
