"""Tests of the residual-stream diagnostics, the collapse alarm and the stop semantics of train.py.

Each diagnostic is checked against a direct computation on a tiny model: the attention sink
against a softmax matrix written out here (and checked to reproduce the fused attention's
output), the ratios against hidden states captured by forward hooks during an ordinary forward
pass. The collapse alarm runs on a tiny deep model driven into collapse (a 1-step warm-up to
lr 0.1) and on the same model trained sensibly.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import train
from spheretnorm.runtime.run_folder import EXIT_COLLAPSE, EXIT_CONFIG, EXIT_CRASH, EXIT_NON_FINITE, EXIT_OK, CollapseError
from spheretnorm.runtime.tracking import RunLog, wandb_payload
from spheretnorm.diagnostics import DIAGNOSTICS, residual_stream_report
from spheretnorm.model import GPT, GPTConfig
from spheretnorm.runtime.checkpoint import load_checkpoint
from spheretnorm.experiments import grid as runs
from test_train import REPO, data_dir, read_metrics, tiny_args  # noqa: F401 (fixture)

# Diagnostics: checked on a Euclidean and a sphere connection, and on the two whose norms sit
# where the others have none (after the residual sum, and inside the sublayer's output).
DIAG_CONNECTIONS = ("pre_ln", "post_ln", "peri_ln", "geonorm")
# A tiny deep model that collapses at lr 0.1 after a 1-step warm-up and trains at tiny_args' lr.
DEEP = ("--connection=geonorm", "--n_layer=8", "--eval_interval=5")
COLLAPSING = ("--warmup_iters=1", "--learning_rate=0.1", "--min_lr=0.01")
SUBPROCESS_ENV_EXTRA = {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def tiny_model(connection: str) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=16, block_size=8, vocab_size=11, connection=connection, sphere_impl="reference"))
    # Larger than the init, so that the attention is far from uniform and the states move.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def tokens() -> torch.Tensor:
    return torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(1))


def capture(model: GPT, idx: torch.Tensor) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """(inputs of each attention sublayer, (h before, h after) of each connection) in one forward pass."""
    attn_inputs, updates, hooks = [], [], []
    for block in model.transformer.h:
        hooks.append(block.attn.register_forward_hook(lambda m, args, out: attn_inputs.append(args[0])))
        for conn in (block.conn_attn, block.conn_mlp):
            hooks.append(conn.register_forward_hook(lambda m, args, out: updates.append((args[0], out))))
    with torch.no_grad():
        model(idx)
    for h in hooks:
        h.remove()
    return attn_inputs, updates


def explicit_attention(attn: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs)) with the causal mask, head by head, written out here."""
    B, T, C = x.shape
    nh, hs = attn.n_head, C // attn.n_head
    q, k, _ = (attn.c_attn(x)).split(C, dim=2)
    weights = torch.empty(B, nh, T, T)
    for h in range(nh):
        qh, kh = q[..., h * hs : (h + 1) * hs], k[..., h * hs : (h + 1) * hs]
        scores = torch.einsum("bid,bjd->bij", qh, kh) / math.sqrt(hs)
        scores = scores + torch.triu(torch.full((T, T), -math.inf), diagonal=1)
        weights[:, h] = torch.softmax(scores, dim=-1)
    return weights


@pytest.mark.parametrize("connection", DIAG_CONNECTIONS)
def test_attention_sink_matches_the_explicit_softmax(connection: str) -> None:
    model, idx = tiny_model(connection), tokens()
    attn_inputs, _ = capture(model, idx)
    expected = []
    for block, x in zip(model.transformer.h, attn_inputs):
        with torch.no_grad():
            w = explicit_attention(block.attn, x)
            # The matrix is the one the fused attention uses: it reproduces the sublayer's output.
            _, _, v = block.attn.heads(x)
            y = (w @ v).transpose(1, 2).reshape(x.shape)
            torch.testing.assert_close(block.attn.c_proj(y), block.attn(x), rtol=1e-5, atol=1e-5)
        expected.append(w[:, :, 1:, 0].mean().item())  # query 0 sees only token 0
    got = residual_stream_report(model, idx)["attn_sink"]
    assert got == pytest.approx(expected, rel=1e-5)
    assert len(set(round(v, 4) for v in got)) > 1  # the layers differ: not a constant


@pytest.mark.parametrize("connection", DIAG_CONNECTIONS)
def test_ratios_match_the_explicit_hidden_states(connection: str) -> None:
    model, idx = tiny_model(connection), tokens()
    _, updates = capture(model, idx)
    diag = residual_stream_report(model, idx)

    def cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.einsum("btd,btd->bt", a, b) / (a.norm(dim=-1) * b.norm(dim=-1))

    contribution = [(1 - cos(a, b)).mean().item() for a, b in updates]
    update = [((b - a).norm(dim=-1) / a.norm(dim=-1)).mean().item() for a, b in updates]
    angle = [torch.acos(cos(a, b).clamp(-1, 1)).mean().item() for a, b in updates]
    assert diag["contribution"] == pytest.approx(contribution, rel=1e-4, abs=1e-7)
    assert diag["update_ratio"] == pytest.approx(update, rel=1e-5)
    assert diag["angle"] == pytest.approx(angle, rel=1e-4, abs=1e-6)

    # Layer states: the embedding output (the first update's input), then every block's output.
    layers = [updates[0][0]] + [after for _, after in updates[1::2]]
    entries = [np.abs(h.numpy()).ravel() for h in layers]
    assert diag["massive_top"] == pytest.approx([e.max() for e in entries], rel=1e-6)
    # torch's median of an even count is the lower middle value, numpy's the mean of the two.
    lower_median = [np.sort(e)[(e.size - 1) // 2] for e in entries]
    assert diag["massive_ratio"] == pytest.approx([e.max() / m for e, m in zip(entries, lower_median)], rel=1e-5)
    assert diag["rms"] == pytest.approx([h.pow(2).mean(-1).sqrt().mean().item() for h in layers], rel=1e-5)


def test_final_cosine_of_one_point_and_of_opposite_points() -> None:
    from spheretnorm.diagnostics import final_cosine

    same = torch.tensor([1.0, 2.0, 3.0]).expand(2, 5, 3)
    assert final_cosine(same) == pytest.approx(1.0)
    opposite = torch.tensor([[[1.0, 0.0], [-1.0, 0.0]]])
    assert final_cosine(opposite) == pytest.approx(-1.0)


# -----------------------------------------------------------------------------
# The collapse alarm


def stop_rows(out_dir: Path) -> list[dict]:
    return read_metrics(out_dir, "stop")


def test_collapse_stop_fires_and_keeps_the_last_good_checkpoint(data_dir: Path, tmp_path: Path) -> None:
    args = tiny_args(data_dir, tmp_path, *DEEP, *COLLAPSING, "--max_iters=40", "--checkpoint_interval=1", "--collapse_evals=2")
    with pytest.raises(CollapseError, match=r"final_cosine .* collapse_cosine=0.95 for 2 evaluations.*--warmup_iters=.*--learning_rate="):
        train.main(args)
    evals = read_metrics(tmp_path, "eval")
    assert [r["iter"] for r in evals] == [0, 5, 10]
    assert evals[1]["final_cosine"] > 0.95 and evals[2]["final_cosine"] > 0.95
    (stop,) = stop_rows(tmp_path)
    assert stop["reason"] == "collapse" and stop["exit_code"] == EXIT_COLLAPSE == 3
    assert stop["iter"] == 10 and stop["checkpoint_iter"] == 4
    # The interval saves stopped at the first suspect evaluation (iter 5): the checkpoint is iter 4's.
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == 4

    run = runs.load_run(tmp_path)
    assert runs.classify(run, None, unigram=None)[0] == "stopped: collapse"
    assert runs.stopped_row(tmp_path) == stop


def test_healthy_run_does_not_stop(data_dir: Path, tmp_path: Path) -> None:
    train.main(tiny_args(data_dir, tmp_path, *DEEP, "--max_iters=30", "--collapse_evals=1"))
    evals = read_metrics(tmp_path, "eval")
    assert [r["iter"] for r in evals] == [0, 5, 10, 15, 20, 25, 30]
    assert max(r["final_cosine"] for r in evals) < 0.95
    assert stop_rows(tmp_path) == []
    assert runs.stopped_row(tmp_path) is None


def test_the_alarm_is_off_with_collapse_evals_zero(data_dir: Path, tmp_path: Path) -> None:
    train.main(tiny_args(data_dir, tmp_path, *DEEP, *COLLAPSING, "--max_iters=15", "--collapse_evals=0"))
    evals = read_metrics(tmp_path, "eval")
    assert evals[-1]["iter"] == 15 and evals[-1]["final_cosine"] > 0.95
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == 15


ENDINGS = {
    "collapse": ([*DEEP, *COLLAPSING, "--collapse_evals=2"], 3, "error: final_cosine"),
    "non_finite": (["--debug_nan_at_iter=3", "--eval_interval=2"], 4, "error: loss became nan at iter 3"),
    "crash": (["--debug_crash_at_iter=3", "--eval_interval=2"], 1, "RuntimeError: debug_crash_at_iter=3"),
}


@pytest.mark.parametrize("reason", list(ENDINGS))
def test_each_ending_has_its_own_exit_code_and_stop_row(data_dir: Path, tmp_path: Path, reason: str) -> None:
    extra, code, needle = ENDINGS[reason]
    result = subprocess.run(
        [sys.executable, "train.py", *tiny_args(data_dir, tmp_path, "--max_iters=40", *extra)],
        # os.environ now, not SUBPROCESS_ENV's import-time copy: it carries conftest's eager-kernel switch.
        cwd=REPO, env={**os.environ, **SUBPROCESS_ENV_EXTRA}, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == code, result.stderr
    assert needle in result.stderr
    (stop,) = stop_rows(tmp_path)
    assert stop["reason"] == reason and stop["exit_code"] == code
    assert len({EXIT_OK, EXIT_CRASH, EXIT_CONFIG, EXIT_COLLAPSE, EXIT_NON_FINITE}) == 5


def test_a_crash_is_resumable_and_its_stop_row_is_dropped(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="debug_crash_at_iter"):
        train.main(tiny_args(data_dir, tmp_path, "--max_iters=6", "--eval_interval=2", "--debug_crash_at_iter=5"))
    assert stop_rows(tmp_path)[0]["reason"] == "crash"
    assert runs.stopped_row(tmp_path) is None  # a crash is no end: the scripts resume it
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=6", "--eval_interval=2", "--init_from=resume"))
    assert stop_rows(tmp_path) == []  # the resume abandoned that ending
    assert read_metrics(tmp_path, "eval")[-1]["iter"] == 6


def test_eval_rows_carry_the_diagnostics_and_their_cost(data_dir: Path, tmp_path: Path) -> None:
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=2", "--eval_interval=2"))
    row = read_metrics(tmp_path, "eval")[-1]
    assert len(row["attn_sink"]) == 2 and len(row["contribution"]) == len(row["update_ratio"]) == 4
    assert len(row["massive_ratio"]) == len(row["massive_top"]) == 3
    assert row["eval_s"] > 0 and row["diag_s"] > 0
    payload = wandb_payload(row)
    assert "diag.attn_sink/block_01" in payload and "diag.update_ratio/sublayer_03" in payload
    # The row's format: the diagnostics sit between eval_s and diag_s, in this order.
    assert list(row) == ["kind", "iter", "tokens", "train_eval_loss", "val_loss", "val_ppl", "elapsed_s", "eval_s",
                         "val_loss_full", "val_full_tokens", "full_eval_s", "rms",  # the final row's whole-split loss
                         "massive_ratio", "massive_top", "attn_sink", "angle", "contribution", "update_ratio", "final_cosine",
                         "step_sizes", "step_pinned", "radius", "radius_pinned", "diag_s"]


def test_every_diagnostic_of_the_table_reaches_the_row_and_w_and_b(data_dir: Path, tmp_path: Path) -> None:
    """The table and the eval row agree both ways: no diagnostic is written that the table lacks,
    and every entry is in the row and in W&B under its index."""
    train.main(tiny_args(data_dir, tmp_path, "--max_iters=2", "--eval_interval=2", "--connection=geonorm"))
    row = read_metrics(tmp_path, "eval")[-1]
    report = residual_stream_report(tiny_model("geonorm"), tokens())
    assert set(report) == {d.name for d in DIAGNOSTICS if d.source == "batch"}
    losses_and_times = {"kind", "iter", "tokens", "train_eval_loss", "val_loss", "val_ppl", "elapsed_s", "eval_s", "diag_s",
                        "val_loss_full", "val_full_tokens", "full_eval_s"}
    assert set(row) - losses_and_times == {d.name for d in DIAGNOSTICS}
    payload = wandb_payload(row)
    assert all(isinstance(v, (int, float)) for v in payload.values())  # every list flattened
    for entry in DIAGNOSTICS:
        if entry.is_series:
            assert len(row[entry.name]) > 0, entry.name
            assert f"diag.{entry.name}/{entry.index}_00" in payload and f"diag/{entry.name}_mean" in payload
        else:
            assert payload[f"diag/{entry.name}"] == row[entry.name]


def test_the_eval_console_line_shows_the_tables_console_diagnostics(capsys: pytest.CaptureFixture) -> None:
    row = {"kind": "eval", "iter": 5, "train_eval_loss": 2.1, "val_loss": 2.0, "val_ppl": math.exp(2.0), "rms": [1.0, 1.5, 2.0],
           "final_cosine": 0.2, "attn_sink": [0.5], "step_sizes": []}
    RunLog(None, True, None).log_eval(row)
    assert capsys.readouterr().out == "eval iter 5 | train 2.1000 | val 2.0000 (ppl 7.39) | final cosine 0.200 | rms 1.00 -> 2.00\n"
    RunLog(None, True, None).log_eval({k: v for k, v in row.items() if k != "rms"})  # a row without it: left out
    assert capsys.readouterr().out == "eval iter 5 | train 2.1000 | val 2.0000 (ppl 7.39) | final cosine 0.200\n"


def test_classify_reads_the_collapse_exit_code_and_stop_rows(tmp_path: Path) -> None:
    assert runs.classify(None, 3, 3.35, "error: final_cosine 0.99 ...")[0] == "stopped: collapse"
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "stop", "iter": 3, "reason": "signal"}) + "\n")
    assert runs.stopped_row(tmp_path) is None  # pre-empted: to be resumed


# -----------------------------------------------------------------------------
# scripts/jacobian.py


def orthonormal_complement(point: torch.Tensor) -> torch.Tensor:
    """A d x (d-1) orthonormal basis of the tangent space at point (the complement of its direction)."""
    u = (point / point.norm())[:, None]
    q, _ = torch.linalg.qr(torch.cat([u, torch.eye(point.numel(), dtype=point.dtype)], dim=1))
    return q[:, 1:]


@pytest.mark.parametrize("connection", ["pre_ln", "geonorm", "p_spheret", "ngpt"])
@pytest.mark.parametrize("scope", ["self", "prefix"])
def test_jacobian_singular_values_match_the_dense_jacobian(connection: str, scope: str) -> None:
    from spheretnorm.experiments import conditioning as jacobian

    model = tiny_model(connection).double()
    with torch.no_grad():
        h1 = model.embed(tokens()[:1, :6])[0]
    t = 4
    pmap = jacobian.PositionMap(model, h1, t, scope)
    sigma_max, sigma_min, steps, exact, resolved = jacobian.position_conditioning(pmap, None, torch.Generator().manual_seed(0))

    dense = torch.autograd.functional.jacobian(pmap.output, h1)  # (d, T, d)
    inputs = [t] if scope == "self" else list(range(t + 1))
    blocks = [dense[:, s, :] for s in inputs]
    if connection != "pre_ln":  # tangent spaces: at each input h_1[s] and at the output h_L[t]
        out_basis = orthonormal_complement(pmap.h_last)
        blocks = [out_basis.T @ b @ orthonormal_complement(h1[s]) for b, s in zip(blocks, inputs)]
    expected = torch.linalg.svdvals(torch.cat(blocks, dim=1))
    assert exact and resolved and steps == expected.numel()
    assert sigma_max == pytest.approx(expected.max().item(), rel=1e-3)
    assert sigma_min == pytest.approx(expected.min().item(), rel=1e-3)
    assert expected.max() / expected.min() > 1.5  # a map far from an isometry: the test can tell


def test_lanczos_on_a_tangent_space_finds_the_true_smallest_singular_value() -> None:
    """A spectrum like a trained sphere model's tangent Jacobian (d = 128: a bulk of singular
    values in 0.42-0.73, one of 2.3 and one of 0.02): without the projection onto the tangent
    space, the rounding-level radial part of the Lanczos vectors grew into a whole vector and a
    spurious sigma_min of about 1e-8 replaced the true 0.02."""
    from spheretnorm.experiments import conditioning as jacobian

    d = 128
    g = torch.Generator().manual_seed(3)
    f64 = dict(dtype=torch.float64)
    s = torch.cat([torch.tensor([2.3], **f64), 0.42 + 0.31 * torch.rand(d - 3, generator=g, **f64), torch.tensor([0.02, 0.0], **f64)])
    u_in, u_out = (torch.randn(d, generator=g, dtype=torch.float64) for _ in range(2))
    basis_in, basis_out = orthonormal_complement(u_in), orthonormal_complement(u_out)
    rot_in = torch.linalg.qr(torch.randn(d - 1, d - 1, generator=g, dtype=torch.float64))[0]
    rot_out = torch.linalg.qr(torch.randn(d - 1, d - 1, generator=g, dtype=torch.float64))[0]
    # J maps the tangent space at u_in onto the one at u_out with singular values s[:d-1]
    J = basis_out @ rot_out @ torch.diag(s[: d - 1]) @ rot_in.T @ basis_in.T
    tangent_out = lambda v: jacobian.tangent(v[None], u_out[None])[0]  # noqa: E731
    fresh = lambda: tangent_out(torch.randn(d, generator=g, dtype=torch.float64))  # noqa: E731
    eig = jacobian.lanczos_eigenvalues(lambda q: J @ (J.T @ q), fresh, d - 1, d - 1, project=tangent_out)
    assert math.sqrt(eig.min()) == pytest.approx(0.02, rel=1e-6)
    assert math.sqrt(eig.max()) == pytest.approx(2.3, rel=1e-9)


def test_jacobian_cli_table_compares_checkpoints(data_dir: Path, tmp_path: Path) -> None:
    from spheretnorm.experiments import conditioning as jacobian

    for name, connection in (("a", "pre_ln"), ("b", "geonorm")):
        train.main(tiny_args(data_dir, tmp_path / name, "--max_iters=2", "--eval_interval=2", f"--connection={connection}"))
    out = tmp_path / "cond.json"
    code = jacobian.main(["--ckpt", str(tmp_path / "a" / "ckpt.pt"), str(tmp_path / "b" / "ckpt.pt"), "--tokens", "2", "--steps", "4", "--json", str(out)])
    assert code == 0
    rows = json.loads(out.read_text())
    assert [(r["method"], r["position"]) for r in rows] == [("pre_ln", 0), ("pre_ln", 15), ("geonorm", 0), ("geonorm", 15)]
    assert all(r["sigma_max"] >= r["sigma_min"] > 0 and not r["exact"] for r in rows)
    assert jacobian.main(["--ckpt", str(tmp_path / "a" / "ckpt.pt"), "--tokens", "0"]) == 2


def test_launch_skips_and_reports_a_run_stopped_by_the_alarm(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from spheretnorm.cluster import launcher as launch

    filters = ["--runs_root", str(tmp_path), "--methods", "pre_ln,geonorm", "--scales", "S", "--datasets", "openwebtext"]
    stopped = tmp_path / "openwebtext_s" / "geonorm"
    stopped.mkdir(parents=True)
    rows = [{"kind": "eval", "iter": 3000, "val_loss": 7.0}, {"kind": "stop", "iter": 3000, "reason": "collapse", "message": "..."}]
    (stopped / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert launch.main(["--dry_run", *filters]) == 0
    out = capsys.readouterr().out
    assert "# skip openwebtext_s/geonorm: stopped: collapse at iter 3000" in out
    assert "# openwebtext_s/pre_ln (train, new)" in out
    assert runs.exit_text(3) == "stopped: collapse (exit status 3)" and runs.exit_text(7) == "exit status 7"


def eval_rows(scale: float, drop: tuple[str, ...] = ()) -> list[dict]:
    """Three eval rows of a 2-block model with every drawn diagnostic, less those in drop."""
    rows = [
        {"kind": "eval", "iter": i, "attn_sink": [0.1 * scale] * 2, "massive_ratio": [5.0 + i] * 3,
         "contribution": [1e-3 * (k + 1) for k in range(4)], "update_ratio": [0.1 * (k + 1) for k in range(4)], "final_cosine": 0.1 * scale,
         "step_pinned": [1.0, 0.0, 1.0, 1.0], "radius": 1.0, "radius_pinned": 1.0}
        for i in (0, 10, 20)
    ]
    return [{k: v for k, v in r.items() if k not in drop} for r in rows]


def test_plot_draws_one_heatmap_figure_per_diagnostic(tmp_path: Path) -> None:
    from spheretnorm.experiments import figures as plot

    def run(method: str, alpha_index: str, scale: float) -> runs.Run:
        return runs.Run(tmp_path, {"method": method, "alpha_index": alpha_index}, eval_rows(scale), None)

    chosen = [run("p_spheret:0.5", "sublayer", 2.0), run("pre_ln", "block", 1.0), run("p_spheret:0.5", "block", 3.0)]
    assert plot.diagnostic_matrix(chosen[0], "update_ratio")[1].shape == (4, 3)  # sublayers x evaluations
    paths = plot.plot_diagnostics(chosen, "tiny", tmp_path / "fig")
    drawn = [d.name for d in DIAGNOSTICS if d.drawn]
    assert drawn == ["massive_ratio", "attn_sink", "contribution", "update_ratio", "step_pinned"]
    assert sorted(p.name for p in paths) == sorted(f"fig_{k}.{ext}" for k in drawn for ext in ("png", "pdf"))
    assert all(p.stat().st_size > 0 for p in paths)
    assert plot.run_label(chosen[0]) == "0.5-SpheretNorm (alpha_index=sublayer)"


def test_an_impossible_value_is_flagged_and_not_drawn(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A negative massive_ratio (max |h| / median |h|) was drawn as data (issue 67, item 8e)."""
    from spheretnorm.experiments import figures as plot

    rows = eval_rows(1.0)
    rows[1]["massive_ratio"] = [5.0, -2.5, 5.0]
    run = runs.Run(tmp_path, {"method": "pre_ln"}, rows, None)
    iters, matrix = plot.diagnostic_matrix(run, "massive_ratio")
    assert iters == [0, 20] and (matrix > 0).all()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: ") and "massive_ratio holds -2.5, below 0, which max |h| / median |h| cannot be" in line
    assert line.endswith("that evaluation is left out of the massive_ratio figure.")


def record_figures(plot: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """{file stem: figure} of every figure plot writes from now on; the files are still written."""
    figures: dict[str, Any] = {}
    save = plot.save_figure

    def recording(fig: Any, out: Path) -> list[Path]:
        figures[out.name] = fig
        return save(fig, out)

    monkeypatch.setattr(plot, "save_figure", recording)
    return figures


def test_runs_without_any_diagnostic_are_drawn_blank_with_one_note(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from spheretnorm.experiments import figures as plot

    figures = record_figures(plot, monkeypatch)
    old = runs.Run(tmp_path, {"method": "pre_ln"}, [{"kind": "eval", "iter": 0, "val_loss": 3.0}], None)
    paths = plot.plot_diagnostics([old], "old", tmp_path / "old")
    drawn = [d.name for d in DIAGNOSTICS if d.drawn]
    assert sorted(p.name for p in paths) == sorted(f"old_{k}.{ext}" for k in drawn for ext in ("png", "pdf"))
    assert all(p.stat().st_size > 0 for p in paths)
    assert all(not fig.axes[0].images for fig in figures.values())  # every panel empty
    (note,) = capsys.readouterr().err.splitlines()
    assert note == ("note: runs written before a diagnostic existed lack it, so it is drawn blank for them: "
                    "massive_ratio (1 of 1 runs), attn_sink (1 of 1 runs), contribution (1 of 1 runs), update_ratio (1 of 1 runs), step_pinned (1 of 1 runs).")


def test_a_newer_diagnostic_is_drawn_blank_for_the_runs_that_predate_it(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from spheretnorm.experiments import figures as plot

    figures = record_figures(plot, monkeypatch)
    new = runs.Run(tmp_path, {"method": "geonorm"}, eval_rows(1.0), None)
    old = runs.Run(tmp_path, {"method": "pre_ln"}, eval_rows(2.0, drop=("update_ratio",)), None)  # written before update_ratio
    paths = plot.plot_diagnostics([new, old], "mixed", tmp_path / "mixed")
    assert len(paths) == 2 * len([d for d in DIAGNOSTICS if d.drawn]) and all(p.stat().st_size > 0 for p in paths)
    (note,) = capsys.readouterr().err.splitlines()
    assert note.endswith("drawn blank for them: update_ratio (1 of 2 runs).")
    # Panels in the paper's method order: Pre-LN (the old run), then GeoNorm.
    old_panel, new_panel = figures["mixed_update_ratio"].axes[:2]
    assert old_panel.get_title() == "Pre-LN" and not old_panel.images
    assert "no update_ratio" in old_panel.texts[0].get_text()
    assert new_panel.get_title() == "GeoNorm" and new_panel.images[0].get_array().shape == (4, 3)
    assert all(len(ax.images) == 1 for ax in figures["mixed_attn_sink"].axes[:2])  # its other figures are whole

    # A single number is a line per run: the run without it has none.
    plot.plot_diagnostic([new, runs.Run(tmp_path, {"method": "pre_ln"}, eval_rows(2.0, drop=("final_cosine",)), None)],
                         "final_cosine", "mixed", tmp_path / "cosine")
    (line,) = figures["cosine"].axes[0].lines
    assert line.get_label() == "GeoNorm" and list(line.get_ydata()) == [0.1, 0.1, 0.1]


def test_study_summaries_leave_a_newer_diagnostic_blank() -> None:
    from spheretnorm.experiments import study

    new, old = eval_rows(1.0)[-1], eval_rows(2.0, drop=("update_ratio",))[-1]
    summaries = [study.diagnostic_summary(new), study.diagnostic_summary(old)]
    assert summaries[0] == {"final_cosine": 0.1, "massive_ratio": 25.0, "attn_sink": pytest.approx(0.1),
                            "contribution": pytest.approx(2.5e-3), "contribution_last_first": pytest.approx(4.0), "update_ratio": pytest.approx(0.25),
                            "step_pinned": 0.75, "radius": 1.0, "radius_pinned": 1.0}
    assert summaries[1]["update_ratio"] is None and summaries[1]["attn_sink"] == pytest.approx(0.2)
    assert [c.header for c in study.diagnostic_columns()] == ["final cosine", "massive max/med", "attn sink", "1 - cos", "last/first", "update",
                                                                 "alpha pinned", "radius/sqrt(d)", "radius pinned"]
    assert [c.cell(summaries[1]) for c in study.diagnostic_columns()] == ["0.200", "25.0", "0.200", "0.0025", "4.00", "-", "0.75", "1.000", "1"]


def test_lanczos_finds_every_eigenvalue_of_a_singular_operator() -> None:
    from spheretnorm.experiments import conditioning as jacobian

    # diag(3, 2, 1, 0) as J J^T: exact in 4 steps, the zero included.
    eigen = torch.tensor([9.0, 4.0, 1.0, 0.0], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    values = jacobian.lanczos_eigenvalues(lambda u: eigen * u, lambda: torch.randn(4, generator=gen, dtype=torch.float64), 4, 4)
    assert values == pytest.approx([0.0, 1.0, 4.0, 9.0], abs=1e-9)


def test_a_single_panel_figures_title_fits_inside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-run figure is about 4.6 inches wide; its title (study and diagnostic) was clipped at both sides."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from spheretnorm.experiments import figures as plot

    figures: dict[str, Any] = {}
    monkeypatch.setattr(plot, "save_figure", lambda fig, out: figures.setdefault(out.name, fig) and [])  # drawn below, not written
    run = runs.Run(tmp_path, {"method": "p_spheret:0.5", "alpha_index": "sublayer"}, eval_rows(2.0), None)
    for key in ("contribution", "final_cosine"):  # a heatmap and a line figure, the longest labels
        plot.plot_diagnostic([run], key, "openwebtext_s (GPT-2 and LLaMA blocks)", tmp_path / key)
    assert len(figures) == 2
    for name, fig in figures.items():
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        box = fig._suptitle.get_window_extent(canvas.get_renderer())
        assert 0 <= box.x0 and box.x1 <= fig.bbox.width, (name, fig._suptitle.get_text())
