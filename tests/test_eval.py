"""Tests of eval/: the nanogpt lm-eval model, the local benchmark tasks and the zero-shot CLI.

Everything runs offline on tiny random models. The benchmark files come from
../shared/evaldata (tests needing them skip when it is absent); task YAMLs are written into
tmp folders by eval.local_tasks, the same code users run.
"""

from __future__ import annotations

import os

# No network here: datasets / huggingface_hub must not try the hub (set before they are imported).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lm_eval import simple_evaluate
from lm_eval.api.instance import Instance
from lm_eval.tasks import TaskManager

from spheretnorm.runtime.methods import method_dirname
from spheretnorm.runtime.checkpoint import checkpoint_state
from spheretnorm.data.tokenizer import EOT_TOKEN, GPT2_VOCAB_SIZE, get_gpt2_encoding
from spheretnorm.zeroshot.errors import EvalError
from spheretnorm.zeroshot.harness import NanoGPTLM, load_eval_model, pack_pieces
from spheretnorm.hf.gpt2 import offline_gpt2_tokenizer, to_hf_gpt2
from spheretnorm.zeroshot.local_tasks import piqa_records, wikitext_documents, write_local_tasks
from spheretnorm.zeroshot import driver as zero_shot
from spheretnorm.zeroshot.driver import PAPER_COLUMNS, check_tasks_known, main, results_limit, results_path, run_lm_eval
from spheretnorm.model import CONNECTIONS, GPT, GPTConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"
EVALDATA = SHARED / "evaldata"
BLOCK = 64
ENC = get_gpt2_encoding()

# A context longer than BLOCK tokens, so that left truncation is exercised.
LONG_CONTEXT = " ".join(f"Sentence {i} tells of the river and the hills." for i in range(12))
LL_REQUESTS = [
    ("Question: How do I boil an egg?\nAnswer:", " Put it in boiling water for eight minutes."),
    ("Question: How do I boil an egg?\nAnswer:", " Put it in the freezer overnight."),
    ("The capital of France is", " Paris"),
    ("", " An empty context is conditioned on the end-of-text token."),
    (LONG_CONTEXT, " The end."),
]


def tiny_gpt(connection: str = "pre_ln", block_size: int = BLOCK) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=block_size, vocab_size=50304, connection=connection)
    return GPT(config).eval()


def ll_instances(pairs: list[tuple[str, str]]) -> list[Instance]:
    return [Instance("loglikelihood", {}, pair, idx=0) for pair in pairs]


def direct_logprobs(model: GPT, tokens: list[int]) -> torch.Tensor:
    """log p(tokens[i] | tokens[:i]) for i = 1.., from one unbatched forward pass."""
    with torch.no_grad():
        logits, _ = model(torch.tensor([tokens[:-1]]))
    logprobs = F.log_softmax(logits[0].float(), dim=-1)
    return logprobs[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])]


def direct_loglikelihood(model: GPT, context: str, continuation: str) -> tuple[float, bool]:
    """Sum of the continuation's token log-probs within the last block_size+1 tokens, and greediness."""
    ctx = ENC.encode(context) if context else [EOT_TOKEN]
    cont = ENC.encode(continuation)
    assert ENC.encode(context + continuation)[len(ctx) :] == cont or not context  # tokenisation splits cleanly
    window = (ctx + cont)[-(model.config.block_size + 1) :]
    with torch.no_grad():
        logits, _ = model(torch.tensor([window[:-1]]))
    predictions = logits[0, -len(cont) :].argmax(dim=-1).tolist()
    return float(direct_logprobs(model, window)[-len(cont) :].sum()), predictions == cont


# -----------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def pre_ln() -> GPT:
    return tiny_gpt("pre_ln")


@pytest.fixture(scope="module")
def evaldata() -> Path:
    if not EVALDATA.is_dir():
        pytest.skip(f"benchmark files not found at {EVALDATA}")
    return EVALDATA


@pytest.fixture(scope="module")
def task_manager(evaldata: Path, tmp_path_factory: pytest.TempPathFactory) -> TaskManager:
    tasks_dir = tmp_path_factory.mktemp("local_tasks")
    assert write_local_tasks(evaldata, tasks_dir) == ["lambada_openai", "wikitext", "piqa"]
    return TaskManager(include_path=str(tasks_dir), include_defaults=False)


@pytest.fixture
def sphere_ckpt(tmp_path: Path) -> Path:
    """A checkpoint as train.py writes it, of a sphere connection."""
    path = tmp_path / "ckpt.pt"
    torch.save({**checkpoint_state(tiny_gpt("p_spheret")), "iter_num": 0, "data_meta": {"tokenizer": "gpt2"}}, path)
    return path


# -----------------------------------------------------------------------------
# loglikelihood


@pytest.mark.parametrize("connection", list(CONNECTIONS))
def test_loglikelihood_is_sum_of_direct_token_logprobs(connection: str) -> None:
    model = tiny_gpt(connection)
    got = NanoGPTLM(model=model, batch_size=1).loglikelihood(ll_instances(LL_REQUESTS), disable_tqdm=True)
    for (context, continuation), (logprob, greedy) in zip(LL_REQUESTS, got):
        want_logprob, want_greedy = direct_loglikelihood(model, context, continuation)
        assert logprob == pytest.approx(want_logprob, abs=1e-4)
        assert greedy == want_greedy


def test_batch_size_1_and_8_give_the_same_numbers(pre_ln: GPT) -> None:
    requests = ll_instances(LL_REQUESTS * 3)  # 15 requests: batches of mixed lengths
    one = NanoGPTLM(model=pre_ln, batch_size=1).loglikelihood(requests, disable_tqdm=True)
    eight = NanoGPTLM(model=pre_ln, batch_size=8).loglikelihood(requests, disable_tqdm=True)
    assert [g for _, g in one] == [g for _, g in eight]
    # Equal up to fp32 rounding: a batch's shape may change the order of the matmul's sums.
    assert [lp for lp, _ in one] == pytest.approx([lp for lp, _ in eight], rel=1e-6)


def test_bfloat16_autocast_stays_close_to_float32(pre_ln: GPT) -> None:
    requests = ll_instances(LL_REQUESTS)
    fp32 = NanoGPTLM(model=pre_ln, dtype="float32").loglikelihood(requests, disable_tqdm=True)
    bf16 = NanoGPTLM(model=pre_ln, dtype="bfloat16").loglikelihood(requests, disable_tqdm=True)
    assert [lp for lp, _ in bf16] == pytest.approx([lp for lp, _ in fp32], rel=1e-3)


def test_is_greedy_exactly_when_every_token_is_the_argmax(pre_ln: GPT) -> None:
    context = ENC.encode("Once upon a time")
    greedy = []
    for _ in range(3):
        with torch.no_grad():
            logits, _ = pre_ln(torch.tensor([context + greedy]))
        greedy.append(int(logits[0, -1].argmax()))
    not_greedy = greedy[:2] + [(greedy[2] + 1) % GPT2_VOCAB_SIZE]
    lm = NanoGPTLM(model=pre_ln, batch_size=2)
    results = lm._loglikelihood_tokens([(None, context, greedy), (None, context, not_greedy)], disable_tqdm=True)
    assert [g for _, g in results] == [True, False]


def many_choices(n: int) -> list[tuple[str, str]]:
    """n choices of one question, of different lengths (one of a single token)."""
    answers = [" Yes", " It floats on the water for a while.", " No, never.", " Only when the river is high in spring."]
    return [("Question: Does the boat float?\nAnswer:", answers[i % len(answers)] * (1 + i % 3)) for i in range(n)]


@pytest.mark.parametrize("connection", ["pre_ln", "geonorm", "p_spheret"])
def test_choices_sharing_a_context_score_as_if_alone(connection: str) -> None:
    # Twelve choices of one question overflow a 64-token row, so they spread over several
    # packed rows; the long-context requests are truncated on their own.
    model = tiny_gpt(connection)
    pairs = many_choices(12) + [(LONG_CONTEXT, " The end."), (LONG_CONTEXT, " Yes")]
    got = NanoGPTLM(model=model, batch_size=3).loglikelihood(ll_instances(pairs), disable_tqdm=True)
    for (context, continuation), (logprob, greedy) in zip(pairs, got):
        want_logprob, want_greedy = direct_loglikelihood(model, context, continuation)
        assert logprob == pytest.approx(want_logprob, abs=1e-4)
        assert greedy == want_greedy


def test_pack_pieces_shares_rows_by_context_within_block_size() -> None:
    question, other = [1, 2, 3, 4], [9, 8]
    pieces = [(question, [5, 6, 7]), (other, [1]), (question, [5]), (question, [6, 6, 6, 6]), ([7] * 10, [1, 2, 3])]
    packs = pack_pieces(pieces, block_size=9)
    # The question's row: 4 prefix tokens + 2 + 0 + 3 segment tokens = 9, exactly full. The
    # long context, alone too long, keeps its last 9 - 2 = 7 tokens.
    assert [(p.prefix, p.continuations, p.pieces) for p in packs] == [
        (question, [[5, 6, 7], [5], [6, 6, 6, 6]], [0, 2, 3]),
        (other, [[1]], [1]),
        ([7] * 7, [[1, 2, 3]], [4]),
    ]
    assert packs[0].tokens() == question + [5, 6] + [6, 6, 6]
    assert packs[0].positions() == [0, 1, 2, 3, 4, 5, 4, 5, 6]
    assert packs[0].scored_columns() == [[3, 4, 5], [3], [3, 6, 7, 8]]
    assert pack_pieces(pieces, block_size=8)[0].continuations == [[5, 6, 7], [5]]  # the third one moves on


def test_continuation_longer_than_block_size_is_scored_in_pieces(pre_ln: GPT) -> None:
    context = ENC.encode("A long answer follows.")
    continuation = ENC.encode(LONG_CONTEXT)[: BLOCK + 40]
    want = 0.0
    for start in range(0, len(continuation), BLOCK):  # each piece sees the text before it
        piece = continuation[start : start + BLOCK]
        window = (context + continuation[: start + len(piece)])[-(BLOCK + 1) :]
        want += float(direct_logprobs(pre_ln, window)[-len(piece) :].sum())
    [(logprob, _)] = NanoGPTLM(model=pre_ln)._loglikelihood_tokens([(None, context, continuation)], disable_tqdm=True)
    assert logprob == pytest.approx(want, abs=1e-4)


# -----------------------------------------------------------------------------
# loglikelihood_rolling and generate_until


def test_rolling_loglikelihood_matches_direct_windows(pre_ln: GPT) -> None:
    text = LONG_CONTEXT * 2
    tokens = ENC.encode(text)
    assert len(tokens) > 3 * BLOCK and len(tokens) % BLOCK != 0  # several windows, a partial last one
    # The first window predicts BLOCK tokens after <|endoftext|>; each later one predicts the next
    # (up to) BLOCK tokens with a full BLOCK-token input ending just before its last target.
    want = float(direct_logprobs(pre_ln, [EOT_TOKEN] + tokens[:BLOCK]).sum())
    for start in range(BLOCK, len(tokens), BLOCK):
        end = min(start + BLOCK, len(tokens))
        want += float(direct_logprobs(pre_ln, tokens[end - BLOCK - 1 : end])[-(end - start) :].sum())
    requests = [Instance("loglikelihood_rolling", {}, (text,), idx=0)]
    [got] = NanoGPTLM(model=pre_ln, batch_size=4).loglikelihood_rolling(requests, disable_tqdm=True)
    assert got == pytest.approx(want, abs=1e-3)


def direct_greedy_text(model: GPT, context: str, n_tokens: int) -> str:
    tokens = ENC.encode(context)
    for _ in range(n_tokens):
        with torch.no_grad():
            logits, _ = model(torch.tensor([tokens[-BLOCK:]]))
        tokens.append(int(logits[0, -1, :GPT2_VOCAB_SIZE].argmax()))
    return ENC.decode(tokens[len(ENC.encode(context)) :]).split("<|endoftext|>")[0]


def test_generate_until_is_greedy_and_honours_max_gen_toks_and_stop_strings(pre_ln: GPT) -> None:
    context = "The weather today is"
    full = direct_greedy_text(pre_ln, context, 8)
    stop = full.strip()[len(full.strip()) // 2 :][:2]
    assert stop, "the greedy text is too short to pick a stop string from"
    requests = [
        Instance("generate_until", {}, (context, {"until": [], "max_gen_toks": 8}), idx=0),
        Instance("generate_until", {}, (context, {"until": [stop], "max_gen_toks": 8}), idx=0),
        Instance("generate_until", {}, (LONG_CONTEXT, {"until": ["\n"], "max_gen_toks": 3}), idx=0),
    ]
    got = NanoGPTLM(model=pre_ln, batch_size=2).generate_until(requests, disable_tqdm=True)
    assert got[:2] == [full, full.split(stop)[0]]
    assert got[2] == direct_greedy_text(pre_ln, LONG_CONTEXT, 3).split("\n")[0]


def test_generate_until_refuses_sampling(pre_ln: GPT) -> None:
    request = Instance("generate_until", {}, ("Hi", {"do_sample": True, "temperature": 0.7}), idx=0)
    with pytest.raises(EvalError, match="greedily"):
        NanoGPTLM(model=pre_ln).generate_until([request], disable_tqdm=True)


# -----------------------------------------------------------------------------
# lm-eval end to end, and against lm-eval's hf model


def test_simple_evaluate_on_local_tasks_has_the_metric_keys(task_manager: TaskManager, sphere_ckpt: Path) -> None:
    results = simple_evaluate(
        model="nanogpt",  # through lm-eval's registry and argument string
        model_args=f"ckpt={sphere_ckpt}",
        tasks=["lambada_openai", "wikitext", "piqa"],
        task_manager=task_manager,
        limit=2,
        batch_size=8,
        bootstrap_iters=0,
        log_samples=False,
    )["results"]
    assert {"perplexity,none", "acc,none"} <= set(results["lambada_openai"])
    assert {"word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"} <= set(results["wikitext"])
    assert {"acc,none", "acc_norm,none"} <= set(results["piqa"])


def per_request_loglikelihoods(results: dict, task: str) -> list[tuple[float, bool]]:
    samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
    return [tuple(resp) for s in samples for resp in s["filtered_resps"]]


def test_matches_lm_eval_hf_model_on_the_same_gpt2_weights(task_manager: TaskManager, pre_ln: GPT) -> None:
    from lm_eval.models.huggingface import HFLM

    ours = NanoGPTLM(model=pre_ln, batch_size=8)
    hf = HFLM(pretrained=to_hf_gpt2(pre_ln), tokenizer=offline_gpt2_tokenizer(), batch_size=8)
    tasks = ["piqa", "lambada_openai"]  # LAMBADA's passages exceed BLOCK: truncation included
    kwargs = dict(tasks=tasks, task_manager=task_manager, limit=20, bootstrap_iters=0, log_samples=True)
    ours_results, hf_results = simple_evaluate(model=ours, **kwargs), simple_evaluate(model=hf, **kwargs)
    for task in tasks:
        ours_ll, hf_ll = per_request_loglikelihoods(ours_results, task), per_request_loglikelihoods(hf_results, task)
        assert len(ours_ll) == len(hf_ll) > 0
        assert [lp for lp, _ in ours_ll] == pytest.approx([lp for lp, _ in hf_ll], abs=1e-4)
        assert [g for _, g in ours_ll] == [g for _, g in hf_ll]
        for metric in ("acc,none", "acc_norm,none"):
            assert ours_results["results"][task].get(metric) == hf_results["results"][task].get(metric)


def test_only_pre_ln_converts_to_hf_gpt2() -> None:
    with pytest.raises(EvalError, match="pre_ln"):
        to_hf_gpt2(tiny_gpt("geonorm"))


# -----------------------------------------------------------------------------
# Local tasks


def test_wikitext_is_split_into_articles_at_top_level_titles() -> None:
    raw = " \n = First = \n \n Text one . \n = = Section = = \n More .\n = Second = \n Text two .\n"
    docs = wikitext_documents(raw)
    assert [d.split("\n")[0] for d in docs] == [" = First = ", " = Second = "]
    assert " = = Section = = " in docs[0]


def test_piqa_labels_are_merged_and_must_match_in_number() -> None:
    questions = '{"goal": "g", "sol1": "a", "sol2": "b"}\n{"goal": "h", "sol1": "c", "sol2": "d"}\n'
    assert [r["label"] for r in piqa_records(questions, "1\n0\n")] == [1, 0]
    with pytest.raises(EvalError, match="labels"):
        piqa_records(questions, "1\n")


def test_missing_local_benchmark_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "lambada_openai").mkdir()
    with pytest.raises(EvalError, match="lambada_openai/lambada_test.jsonl"):
        write_local_tasks(tmp_path, tmp_path / "out", ["lambada_openai"])


# -----------------------------------------------------------------------------
# Bad input


def write_bad_checkpoint(kind: str, tmp_path: Path) -> Path:
    path = tmp_path / f"{kind}.pt"
    if kind == "directory":
        path.mkdir()
    elif kind == "foreign":
        torch.save({"state_dict": {}}, path)
    elif kind == "text":
        path.write_text("not a checkpoint")
    elif kind == "char":
        torch.save({**checkpoint_state(tiny_gpt()), "data_meta": {"tokenizer": "char"}}, path)
    return path


@pytest.mark.parametrize(
    "kind, message",
    [
        ("missing", "does not exist"),
        ("directory", "has no ckpt.pt, ckpt.dcp or ckpt.safetensors"),
        ("foreign", "not a spheretnorm checkpoint"),
        ("text", "not a PyTorch checkpoint"),
        ("char", "'char' tokenizer"),
    ],
)
def test_bad_checkpoints_raise_one_clear_error(kind: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(EvalError, match=message):
        load_eval_model(write_bad_checkpoint(kind, tmp_path))


def test_unknown_model_argument_is_refused(sphere_ckpt: Path) -> None:
    with pytest.raises(EvalError, match="pretrained"):
        NanoGPTLM(ckpt=sphere_ckpt, pretrained="gpt2")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_lm_eval_cli_default_cuda_device_falls_back_without_cuda(sphere_ckpt: Path) -> None:
    with pytest.warns(UserWarning, match="CUDA is not available"):
        lm = NanoGPTLM(ckpt=sphere_ckpt, device="cuda:0")  # what lm-eval's CLI passes by default
    assert lm.device.type == "cpu"


def test_unknown_task_suggests_close_names(task_manager: TaskManager) -> None:
    with pytest.raises(EvalError, match=r"Unknown task 'piqaa' \(did you mean piqa\?\)"):
        check_tasks_known(["piqa", "piqaa"], task_manager.all_tasks)


def test_unreachable_hub_dataset_gives_lm_eval_error_and_offline_hint(tmp_path: Path, pre_ln: GPT) -> None:
    task = {
        "task": "hub_only",
        "dataset_path": "spheretnorm-tests/never-downloaded",
        "output_type": "loglikelihood",
        "test_split": "test",
        "doc_to_text": "{{text}}",
        "doc_to_target": " x",
    }
    (tmp_path / "hub_only.yaml").write_text(json.dumps(task))  # JSON is YAML
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    with pytest.raises(EvalError, match=r"Couldn't reach.*--local_data.*--include_path"):
        run_lm_eval(NanoGPTLM(model=pre_ln), ["hub_only"], manager)


# -----------------------------------------------------------------------------
# The command line


def test_paper_columns_are_those_of_the_reference_tables() -> None:
    reference = SHARED / "reference" / "paper_results.json"
    if not reference.is_file():
        pytest.skip(f"{reference} not found")
    tables = json.loads(reference.read_text())
    for table in ("table4_zero_shot_fineweb_edu_L", "table5_zero_shot_openwebtext_L"):
        assert [c.key for c in PAPER_COLUMNS] == tables[table]["columns"]


def test_zero_shot_cli_writes_results_and_prints_the_paper_table(
    evaldata: Path, sphere_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    out = tmp_path / "results.json"
    argv = ["--ckpt", str(sphere_ckpt), "--tasks", "lambada_openai,wikitext,piqa", "--local_data", str(evaldata)]
    argv += ["--limit", "2", "--batch_size", "8", "--bootstrap_iters", "0", "--out", str(out), "--wandb"]
    assert main(argv) == 0
    assert not out.exists()  # --limit results are partial: never under the final name
    results = json.loads((tmp_path / "results_limit2.json").read_text())
    assert results["limited"]["limit"] == 2 and results["limited"]["examples"] == {"lambada_openai": 2, "wikitext": 2, "piqa": 2}
    assert set(results["results"]) == {"lambada_openai", "wikitext", "piqa"}
    table = results["paper_table"]
    assert table["piqa/acc_norm"] == pytest.approx(100 * results["results"]["piqa"]["acc_norm,none"])
    assert table["wikitext/word_perplexity"] == results["results"]["wikitext"]["word_perplexity,none"]
    assert table["arc_easy/acc_norm"] is None  # not run
    printed = capsys.readouterr().out
    assert "| ARC-C | ARC-E | BoolQ |" in printed and "p_spheret:0.5 (limit 2)" in printed
    assert "LIMITED: at most 2 examples per task" in printed
    assert list((tmp_path / "wandb").glob("offline-run-*")), "no offline W&B run was written"


def test_zero_shot_script_reports_bad_input_in_one_line_and_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "eval/zero_shot.py", "--ckpt", str(tmp_path / "missing.pt")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: No checkpoint to evaluate:") and "Traceback" not in proc.stderr


def no_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    """lm-eval's task index, the first slow step of an evaluation, stops the command instead."""
    def refuse(include_paths: list[str]) -> None:
        raise EvalError("the evaluation started")

    monkeypatch.setattr(zero_shot, "make_task_manager", refuse)


@pytest.mark.parametrize("where", ["a file in its path", "a read-only folder"])
def test_an_unwritable_results_file_is_refused_before_the_evaluation(
    where: str, sphere_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "blocker").write_text("")
    folder = tmp_path / ("blocker" if where == "a file in its path" else "run")
    if where == "a read-only folder":
        folder.mkdir()
        folder.chmod(0o555)
        if os.geteuid() == 0:  # root writes there all the same: the refusal a read-only mount gives it
            def refused(**_: object) -> None:
                raise PermissionError(errno.EACCES, "Permission denied")

            monkeypatch.setattr(zero_shot.tempfile, "TemporaryFile", refused)
    no_evaluation(monkeypatch)
    assert main(["--ckpt", str(sphere_ckpt), "--tasks", "piqa", "--out", str(folder / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: Cannot write the results file {str(folder / 'r.json')!r}") and err.count("\n") == 1


def test_an_earlier_results_file_is_said_to_be_replaced_before_the_evaluation(
    sphere_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "r.json"
    out.write_text("{}")
    no_evaluation(monkeypatch)
    assert main(["--ckpt", str(sphere_ckpt), "--tasks", "piqa", "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"NOTE: {out} holds earlier results; this evaluation replaces them when it ends.", "error: the evaluation started"]
    (tmp_path / "d.json").mkdir()
    assert main(["--ckpt", str(sphere_ckpt), "--tasks", "piqa", "--out", str(tmp_path / "d.json")]) == 2
    assert "is a folder; give --out a file name" in capsys.readouterr().err


# -----------------------------------------------------------------------------
# --limit results: written apart, marked, never final


def test_limited_results_never_take_the_final_file_name() -> None:
    assert results_path("out/run/ckpt.pt", None, None) == Path("out/run/ckpt_zero_shot.json")
    assert results_path("out/run/ckpt.pt", None, 200) == Path("out/run/ckpt_zero_shot_limit200.json")
    assert results_path("out/run/ckpt.pt", None, 0.1) == Path("out/run/ckpt_zero_shot_limit0.1.json")
    # launch.py passes --out=<run>/ckpt_zero_shot.json; a --limit in --eval_args must not fill it.
    assert results_path("ckpt.pt", "out/run/ckpt_zero_shot.json", 5) == Path("out/run/ckpt_zero_shot_limit5.json")
    assert results_path("ckpt.pt", "quick_limit5.json", 5) == Path("quick_limit5.json")


def test_results_limit_reads_the_marker_and_older_files() -> None:
    assert results_limit({"limited": {"limit": 100}, "config": {"limit": 100}}) == 100
    assert results_limit({"config": {"limit": 0.5}}) == 0.5  # written before the marker existed
    assert results_limit({"config": {"limit": None}}) is None
    assert results_limit({"results": {}, "paper_table": {}}) is None


def write_finished_run(root: Path) -> Path:
    """openwebtext_s/pre_ln under root, trained to the paper's max_iters, with a checkpoint."""
    from spheretnorm.experiments import grid as runs

    run = root / "openwebtext_s" / method_dirname("pre_ln")
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "iter": 50_000, "val_loss": 3.0}) + "\n")
    torch.save({**checkpoint_state(tiny_gpt()), "iter_num": 50_000, "data_meta": {"tokenizer": "gpt2"}}, run / "ckpt.pt")
    return run


def test_launcher_does_not_count_a_limited_evaluation_as_done(
    evaldata: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from spheretnorm.cluster import launcher as launch
    from spheretnorm.experiments import grid as runs

    run = write_finished_run(tmp_path)
    final = run / runs.ZERO_SHOT_NAME
    # Only PIQA's local task is indexed: lm-eval's full task index takes long.
    monkeypatch.setattr(zero_shot, "make_task_manager", lambda paths: TaskManager(include_path=paths, include_defaults=False))
    # The command launch.py --stage zero_shot runs, with --eval_args "--limit 2".
    argv = ["--ckpt", str(run / "ckpt.pt"), "--tasks", "piqa", f"--out={final}", "--local_data", str(evaldata)]
    assert main([*argv, "--limit", "2", "--bootstrap_iters", "0"]) == 0
    assert not final.exists() and (run / "ckpt_zero_shot_limit2.json").is_file()
    assert not runs.is_evaluated(run)
    filters = ["--stage", "zero_shot", "--runs_root", str(tmp_path), "--methods", "pre_ln", "--scales", "S", "--datasets", "openwebtext"]
    capsys.readouterr()
    assert launch.main(["--dry_run", *filters]) == 0
    planned = [line for line in capsys.readouterr().out.splitlines() if "eval/zero_shot.py" in line and not line.startswith("#")]
    assert len(planned) == 1 and f"--out={final}" in planned[0]


def test_is_evaluated_only_for_full_results(tmp_path: Path) -> None:
    from spheretnorm.experiments import grid as runs

    final = tmp_path / runs.ZERO_SHOT_NAME
    assert not runs.is_evaluated(tmp_path)
    final.write_text(json.dumps({"config": {"limit": None}, "paper_table": {"piqa/acc_norm": 60.0}}))
    assert runs.is_evaluated(tmp_path)
    final.write_text(json.dumps({"config": {"limit": 100}, "paper_table": {"piqa/acc_norm": 60.0}}))  # an older limited file
    assert not runs.is_evaluated(tmp_path)
    final.write_text(json.dumps({"limited": {"limit": 0.1}, "paper_table": {}}))
    assert not runs.is_evaluated(tmp_path)
    final.write_text('{"paper_table": {"piqa')  # cut short
    assert not runs.is_evaluated(tmp_path)


def test_tables_mark_limited_zero_shot_results_and_do_not_rank_them(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from spheretnorm.experiments import grid as runs
    from spheretnorm.experiments import tabulate as tables

    for method, piqa, limit in (("pre_ln", 60.0, None), ("geonorm", 55.0, None), ("p_spheret:0.5", 90.0, 100)):
        out = tmp_path / "openwebtext_l" / method_dirname(method)
        out.mkdir(parents=True)
        shape = {"n_layer": 36, "n_head": 20, "n_embd": 1280}  # the paper's L
        config = {"dataset": "openwebtext", "max_iters": 100, "method": method, **shape}
        (out / "config.json").write_text(json.dumps(config))
        (out / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "iter": 100, "val_loss": 3.0}) + "\n")
        results = {"config": {"limit": limit}, "paper_table": {"piqa/acc_norm": piqa}}
        (out / runs.ZERO_SHOT_NAME).write_text(json.dumps(results))
    assert tables.main(["--runs_root", str(tmp_path), "--tables", "5"]) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "| 0.5-SpheretNorm |" in text and "90.00†" in text and "**90.00" not in text
    assert "**60.00**" in text and "<u>55.00</u>" in text  # ranked among the full results only
    assert "† LIMITED: from a --limit evaluation (at most 100 examples per task)" in text
    assert "not final" in captured.err


# -----------------------------------------------------------------------------
# --help, and where the local-data layout is documented


HELP_COMMANDS = [[f"eval/{p.name}"] for p in sorted((REPO_ROOT / "eval").glob("*.py"))] + [
    ["-m", "eval.lm_eval_cli"],
    ["-m", "eval.lm_eval_cli", "run"],
]


@pytest.mark.parametrize("command", HELP_COMMANDS, ids=" ".join)
def test_help_of_every_eval_command_exits_0_without_side_effects(command: list[str], tmp_path: Path) -> None:
    # Every place a command could write to: a fresh home, caches and temp folder, and eval/ itself.
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "hf"), "TMPDIR": str(tmp_path / "tmp"), "PYTHONDONTWRITEBYTECODE": "1"}
    (tmp_path / "tmp").mkdir()
    before = sorted((REPO_ROOT / "eval").rglob("*"))
    proc = subprocess.run([sys.executable, *command, "--help"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert sorted(tmp_path.rglob("*")) == [tmp_path / "tmp"], "a --help wrote files"
    assert sorted((REPO_ROOT / "eval").rglob("*")) == before


def test_local_data_layout_is_documented_in_eval_readme(capsys: pytest.CaptureFixture) -> None:
    from spheretnorm.zeroshot import lm_eval_entry as lm_eval_cli
    from spheretnorm.zeroshot.local_tasks import LAYOUT_DOC, LOCAL_TASK_SPECS

    assert LAYOUT_DOC == "eval/README.md"
    readme = (REPO_ROOT / LAYOUT_DOC).read_text()
    section = readme.split("### 2. The benchmarks' original release files")[1].split("\n### ")[0]
    for spec in LOCAL_TASK_SPECS:  # every file a local task reads is in the README's table, on the task's row
        row = next(line for line in section.splitlines() if line.startswith(f"| {spec.name} |"))
        assert all(f"`{f}`" in row for f in (*spec.files, *spec.optional)), row
    with pytest.raises(SystemExit):
        zero_shot.parse_args(["--help"])
    for text in (capsys.readouterr().out, lm_eval_cli.own_options().format_help()):
        assert "(layout in eval/README.md)" in " ".join(text.split())  # --help wraps lines anywhere


def test_incomplete_reason_names_limits_and_skipped_tasks() -> None:
    assert zero_shot.incomplete_reason({"paper_table": {}}) is None
    assert zero_shot.incomplete_reason({"limited": {"limit": 0.1}}) == "partial results of a --limit 0.1 evaluation"
    assert zero_shot.incomplete_reason({"skipped": {"wikitext": "files absent", "piqa": "files absent"}}) == "tasks skipped for lack of their files: wikitext, piqa"


def test_is_evaluated_not_for_results_with_skipped_tasks(tmp_path: Path) -> None:
    from spheretnorm.experiments import grid as runs

    results = {"paper_table": {"piqa/acc_norm": 60.0, "wikitext/word_perplexity": None}, "skipped": {"wikitext": "files absent"}}
    (tmp_path / runs.ZERO_SHOT_NAME).write_text(json.dumps(results))
    assert not runs.is_evaluated(tmp_path)
