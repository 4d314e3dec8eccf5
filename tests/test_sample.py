"""sample.py on tiny checkpoints: a character-level one written by train.py itself, and a GPT-2
vocabulary one built from the model's own checkpoint_state (train.py's format, minus the
optimizer). Both live in tmp dirs; nothing needs network or a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

import sample
import train
from spheretnorm.runtime.checkpoint import atomic_torch_save, checkpoint_state
from spheretnorm.runtime.checkpoint import load_model
from spheretnorm.data.preparation import prepare
from spheretnorm.data.tokenizer import get_gpt2_encoding
from spheretnorm.model import GPT, GPTConfig
from spheretnorm.runtime.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "SPHERETNORM_TOKENIZER_OFFLINE": "1"}
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 60


@pytest.fixture(scope="module")
def char_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """out_dir of a 2-iteration train.py run on a char-level dataset made by data/prepare.py."""
    root = tmp_path_factory.mktemp("char_run")
    corpus = root / "input.txt"
    corpus.write_text(TEXT)
    data_dir, out_dir = root / "data", root / "out"
    prepare("shakespeare_char", input=[str(corpus)], out_dir=str(data_dir), progress=False)
    train.main([
        f"--data_dir={data_dir}", f"--out_dir={out_dir}", "--dataset=shakespeare_char",
        "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16",
        "--batch_size=4", "--global_batch_size=4", "--max_iters=2", "--eval_interval=2",
        "--eval_iters=1", "--log_interval=1", "--warmup_iters=1", "--lr_decay_iters=2",
        "--device=cpu", "--dtype=float32", "--wandb_log=false", "--connection=pre_ln",
    ])  # fmt: skip
    assert (out_dir / "ckpt.pt").is_file()
    return out_dir


@pytest.fixture(scope="module")
def gpt2_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GPT-2-vocabulary checkpoint (padded embedding, 50304 rows) in train.py's layout."""
    path = tmp_path_factory.mktemp("gpt2_run") / "ckpt.pt"
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=50304, connection="pre_ln"))
    meta = {"dataset": "openwebtext", "tokenizer": "gpt2", "vocab_size": 50257, "eot_token": 50256}
    state = {**checkpoint_state(model), "train_config": asdict(TrainConfig()), "iter_num": 0, "data_meta": meta}
    atomic_torch_save(state, path)
    return path


def run(*argv: str) -> list[str]:
    return sample.main(list(argv))


def without_meta(ckpt: Path, dest: Path, **train_config: str) -> Path:
    """A copy of `ckpt` as an older run would have written it: no data_meta."""
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    state.pop("data_meta")
    state["train_config"].update(train_config)
    atomic_torch_save(state, dest)
    return dest


# -----------------------------------------------------------------------------
# Character-level


def test_char_samples_decode_to_the_training_alphabet(char_run: Path, capsys: pytest.CaptureFixture) -> None:
    samples = run(str(char_run), "--start=All:", "--num_samples=2", "--max_new_tokens=20", "--device=cpu")
    assert len(samples) == 2
    alphabet = set(TEXT)
    for text in samples:
        assert text.startswith("All:") and len(text) == len("All:") + 20
        assert set(text) <= alphabet
    out = capsys.readouterr().out
    assert out == "".join(f"{text}\n{sample.SEPARATOR}\n" for text in samples)


def test_same_seed_same_samples_other_seed_other_samples(char_run: Path) -> None:
    args = [str(char_run / "ckpt.pt"), "--max_new_tokens=30", "--temperature=1.5", "--top_k=0", "--device=cpu"]
    first = run(*args, "--seed=7")
    assert run(*args, "--seed=7") == first
    assert run(*args, "--seed=8") != first
    assert len(set(first)) > 1  # the samples of one call differ from one another


def test_temperature_zero_is_greedy_and_ignores_the_seed(char_run: Path) -> None:
    args = ["--out_dir", str(char_run), "--start=All", "--temperature=0", "--max_new_tokens=12", "--num_samples=2", "--device=cpu"]
    a, b = run(*args, "--seed=1"), run(*args, "--seed=2")
    assert a == b and a[0] == a[1]
    # Greedy means argmax of the model's own next-token distribution at every step (15 < block_size).
    model = load_model(char_run / "ckpt.pt").eval()
    meta = json.loads((char_run.parent / "data" / "meta.json").read_text())
    stoi = {ch: i for i, ch in enumerate(meta["itos"])}
    ids = torch.tensor([[stoi[ch] for ch in a[0]]])
    with torch.no_grad():
        logits, _ = model(ids[:, :-1])
    prompt = len("All")
    assert torch.equal(logits[0, prompt - 1 :].argmax(-1), ids[0, prompt:])


def test_start_from_a_file(char_run: Path, tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Speak,\nspeak")
    text = run(str(char_run), f"--start=FILE:{prompt}", "--num_samples=1", "--max_new_tokens=5", "--device=cpu")[0]
    assert text.startswith("Speak,\nspeak") and len(text) == len("Speak,\nspeak") + 5


def test_start_with_characters_outside_the_vocabulary(char_run: Path) -> None:
    with pytest.raises(sample.SampleError) as info:
        run(str(char_run), "--start=Zebra 42", "--device=cpu")
    message = str(info.value)
    assert "outside the model's" in message and "'2'" in message and "'Z'" in message and "\n" not in message


def test_old_checkpoint_takes_the_meta_of_its_data_dir(char_run: Path, tmp_path: Path) -> None:
    data_dir = char_run.parent / "data"
    ckpt = without_meta(char_run / "ckpt.pt", tmp_path / "ckpt.pt", data_dir=str(data_dir))
    assert set(run(str(ckpt), "--max_new_tokens=10", "--num_samples=1", "--device=cpu")[0]) <= set(TEXT)


def test_checkpoint_without_any_meta_asks_for_meta(char_run: Path, tmp_path: Path) -> None:
    ckpt = without_meta(char_run / "ckpt.pt", tmp_path / "ckpt.pt", data_dir=str(tmp_path / "gone"))
    with pytest.raises(sample.SampleError, match="pass --meta=path/to/meta.json"):
        run(str(ckpt), "--device=cpu")
    meta_dir = char_run.parent / "data"
    assert len(run(str(ckpt), f"--meta={meta_dir}", "--max_new_tokens=3", "--num_samples=1", "--device=cpu")[0]) == 4


def test_unknown_tokenizer_is_one_clear_error(char_run: Path, tmp_path: Path) -> None:
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"tokenizer": "sentencepiece", "vocab_size": 10}))
    with pytest.raises(sample.SampleError) as info:
        run(str(char_run), f"--meta={meta}", "--device=cpu")
    assert str(info.value) == f"Unknown tokenizer 'sentencepiece' in the meta.json from {meta}; valid ones are: gpt2, char."


# -----------------------------------------------------------------------------
# GPT-2 vocabulary


def test_gpt2_samples_decode_and_never_use_padding_ids(gpt2_ckpt: Path) -> None:
    start = "The meaning of life is"
    samples = run(str(gpt2_ckpt), f"--start={start}", "--num_samples=2", "--max_new_tokens=12",
                  "--temperature=1.0", "--top_k=0", "--device=cpu")  # fmt: skip
    enc = get_gpt2_encoding()
    for text in samples:
        assert text.startswith(start)
        assert len(enc.encode(text[len(start) :], allowed_special="all")) >= 1


def test_padding_ids_are_masked_even_when_the_model_prefers_them(gpt2_ckpt: Path, tmp_path: Path) -> None:
    """Rows 50257-50303 of the output layer have no text; greedy must still pick a real token."""
    enc = get_gpt2_encoding()
    prompt = torch.tensor([enc.encode("Hello")])
    state = torch.load(gpt2_ckpt, map_location="cpu", weights_only=False)
    with torch.no_grad():
        logits, _ = load_model(state).eval()(prompt, last_only=True)
    best = int(logits[0, -1, :50257].argmax())
    assert logits[0, -1, best] > 0
    for key in ("lm_head.weight", "transformer.wte.weight"):  # tied: make every padding row outscore `best`
        state["model"][key][50257:] = 3 * state["model"][key][best]
    with torch.no_grad():
        unmasked = load_model(state).eval().generate(prompt, 1, temperature=0)
    assert int(unmasked[0, -1]) >= 50257  # without sample.py's mask, greedy picks a padding id
    boosted = tmp_path / "ckpt.pt"
    atomic_torch_save(state, boosted)
    text = run(str(boosted), "--start=Hello", "--temperature=0", "--num_samples=1", "--max_new_tokens=1", "--device=cpu")[0]
    assert text == "Hello" + enc.decode([best])


def test_gpt2_empty_start_begins_after_end_of_text(gpt2_ckpt: Path) -> None:
    text = run(str(gpt2_ckpt), "--start=", "--temperature=0", "--num_samples=1", "--max_new_tokens=5", "--device=cpu")[0]
    with torch.no_grad():
        ids = load_model(gpt2_ckpt).eval().generate(torch.tensor([[50256]]), 5, temperature=0)
    assert text == get_gpt2_encoding().decode(ids[0, 1:].tolist())  # the end-of-text prompt is not printed


# -----------------------------------------------------------------------------
# Command line


def test_missing_checkpoint_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(sample.SampleError, match=r"the out_dir .* has no ckpt.pt"):
        run(str(tmp_path))
    with pytest.raises(sample.SampleError, match=r"'.*nope.pt' does not exist"):
        run(str(tmp_path / "nope.pt"))


def test_a_file_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    bogus = tmp_path / "ckpt.pt"
    torch.save({"weights": torch.zeros(2)}, bogus)
    with pytest.raises(sample.SampleError, match="is not a spheretnorm checkpoint"):
        run(str(bogus))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num_samples=0"], "--num_samples must be a positive integer, got 0."),
        (["--temperature=-1"], "--temperature must be >= 0 (0 is greedy), got -1.0."),
        (["--top_k=-5"], "--top_k must be >= 0 (0 keeps every token), got -5."),
        (["--dtype=fp8"], "--dtype='fp8' is not valid; choose one of: auto, float32, bfloat16, float16."),
        (["--start=FILE:/no/such/prompt.txt"], "--start='FILE:/no/such/prompt.txt': the file '/no/such/prompt.txt' does not exist."),
        (["--sphere_impl=fast"], "--sphere_impl='fast' is not valid; choose one of: auto, reference, fused, triton."),
    ],
)
def test_bad_arguments_are_one_sentence(argv: list[str], message: str, tmp_path: Path) -> None:
    with pytest.raises(sample.SampleError) as info:
        sample.parse_args([str(tmp_path), *argv])
    assert str(info.value) == message


def test_checkpoint_given_twice_or_not_at_all(tmp_path: Path) -> None:
    for argv in ([], [str(tmp_path), f"--out_dir={tmp_path}"]):
        with pytest.raises(sample.SampleError, match="Give the checkpoint once"):
            sample.parse_args(argv)


def test_help_lists_every_key_with_its_default(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        sample.main(["--help"])
    assert info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    for key, default in [("--start", "'\\n'"), ("--num_samples", "3"), ("--max_new_tokens", "500"),
                         ("--temperature", "0.8"), ("--top_k", "200"), ("--seed", "1337"),
                         ("--device", "auto"), ("--dtype", "auto"), ("--meta", "None"), ("--out_dir", "None")]:  # fmt: skip
        assert key in help_text and f"(default: {default})" in help_text, key


def test_cli_errors_are_one_line_and_exit_code_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "missing"
    assert sample.cli([str(missing)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: No checkpoint to sample from: {str(missing)!r} does not exist; give a ckpt.pt file, a ckpt.dcp folder or an out_dir that holds one."
    ]


def test_command_line_prints_samples(char_run: Path) -> None:
    result = subprocess.run(
        [sys.executable, "sample.py", str(char_run), "--num_samples=2", "--max_new_tokens=8", "--device=cpu", "--start=All"],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout.count(sample.SEPARATOR + "\n") == 2 and result.stdout.startswith("All")


# -----------------------------------------------------------------------------
# A safetensors export, and how the sphere update runs


@pytest.fixture(scope="module")
def sphere_run(char_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An out_dir holding a p_spheret ckpt.pt on char_run's vocabulary (random weights)."""
    out = tmp_path_factory.mktemp("sphere_run")
    meta = json.loads((char_run.parent / "data" / "meta.json").read_text())
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=meta["vocab_size"], connection="p_spheret"))
    state = {**checkpoint_state(model), "train_config": asdict(TrainConfig()), "iter_num": 0, "data_meta": meta}
    atomic_torch_save(state, out / "ckpt.pt")
    return out


def besides_threads(lines: list[str]) -> list[str]:
    """stderr's lines less the one saying how many CPU threads run (runtime/device.py)."""
    return [line for line in lines if not line.startswith("CPU: ")]


def test_an_out_dir_with_only_ckpt_safetensors_is_sampled_from_it(char_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from spheretnorm.runtime.checkpoint import save_safetensors_checkpoint
    from spheretnorm.runtime.checkpoint import load_checkpoint

    export = tmp_path / "export"
    export.mkdir()
    save_safetensors_checkpoint(load_checkpoint(char_run / "ckpt.pt"), export / "ckpt.safetensors")
    args = ["--start=All", "--temperature=0", "--max_new_tokens=10", "--num_samples=1", "--device=cpu"]
    expected = run(str(char_run), *args)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("CPU: ") and "torch thread(s)" in err[0]  # how many threads sample.py runs (issue 66)
    assert besides_threads(err) == []  # an out_dir with only ckpt.pt: nothing more to say
    assert run(str(export), *args) == expected
    assert besides_threads(capsys.readouterr().err.splitlines()) == [
        f"sample.py: {str(export)!r} has no ckpt.pt or ckpt.dcp; sampling from {export / 'ckpt.safetensors'}"]
    both = tmp_path / "both"
    both.mkdir()
    (both / "ckpt.pt").write_bytes((char_run / "ckpt.pt").read_bytes())
    (both / "ckpt.safetensors").write_bytes((export / "ckpt.safetensors").read_bytes())
    assert run(str(both), *args) == expected
    assert besides_threads(capsys.readouterr().err.splitlines()) == [
        f"sample.py: {str(both)!r} holds ckpt.pt and ckpt.safetensors; sampling from {both / 'ckpt.pt'}"
    ]
    with pytest.raises(sample.SampleError, match=r"the out_dir .* has no ckpt.pt, ckpt.dcp or ckpt.safetensors"):
        run(str(tmp_path))  # the exports are in its subfolders, not in it


def test_sphere_impl_changes_how_the_model_runs_not_the_samples(sphere_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[set[str]] = []
    real_load_model = sample.load_model

    def recording_load_model(ckpt):
        model = real_load_model(ckpt)
        built.append({m.impl for m in model.modules() if hasattr(m, "impl")})
        return model

    monkeypatch.setattr(sample, "load_model", recording_load_model)
    args = [str(sphere_run), "--start=All", "--temperature=0", "--max_new_tokens=12", "--num_samples=2", "--device=cpu"]
    samples = {impl: run(*args, f"--sphere_impl={impl}") for impl in ("reference", "fused", "auto")}
    default = run(*args)
    assert built == [{"reference"}, {"fused"}, {"auto"}, {"auto"}]  # no flag: the checkpoint's own
    assert samples["reference"] == samples["fused"] == samples["auto"] == default


@pytest.mark.compiled_kernels
def test_sampling_with_auto_on_a_cpu_compiles_nothing(sphere_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default (auto) on a CPU samples with the eager maths: no torch.compile at start-up,
    which costs seconds in every process and saves under a millisecond per token here.
    --sphere_impl=fused still compiles."""
    from spheretnorm import kernels

    asked: list[str] = []
    monkeypatch.setattr(kernels, "_compiled", lambda fn: asked.append(fn.__name__) or fn)  # runs eagerly, records
    monkeypatch.setattr(kernels, "_built", set(), raising=False)
    args = [str(sphere_run), "--max_new_tokens=4", "--num_samples=1", "--device=cpu"]
    run(*args)
    assert asked == []
    run(*args, "--sphere_impl=fused")
    assert set(asked) == {"sphere_forward"}
