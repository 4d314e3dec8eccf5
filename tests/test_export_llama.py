"""Tests of the Hugging Face export and import of LLaMA's block (spheretnorm/hf/llama.py) and nGPT.

A pre_ln model with block=llama is a plain transformers LlamaForCausalLM; nGPT (both blocks) and
every other connection with LLaMA's block carry their code, RoPE and SwiGLU included. Every
(connection, block) pair's logits and greedy generation are checked in tests/test_export_hf.py
(its VARIANTS); this file checks what is the Llama's own: the plain folder against transformers'
Llama built by hand, cached generation with padding (RoPE's positions), nGPT's untied head,
Llama folders read back and the ones refused. Char-level models keep it fast.
"""

from __future__ import annotations

import builtins
import json
import shutil
import symtable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import train
from spheretnorm.runtime.config import ConfigError
from spheretnorm.hf import folder as hf_folder
from spheretnorm.hf.release import model_card
from spheretnorm.hf.folder import HFFolderError, export_hf, folder_model_config, load_folder_model
from spheretnorm.model import GPT
from spheretnorm.runtime.checkpoint import read_safetensors
from spheretnorm.runtime.checkpoint import load_model
from test_export_hf import (  # noqa: F401 - char_data is a fixture
    BLOCK,
    CHARS,
    char_checkpoint,
    char_data,
    load_hf,
    logits_of,
    tiny_model,
    train_args,
    trained_like,
)

MODELS: dict[str, dict[str, Any]] = {
    "llama": {"block": "llama"},
    "llama-bias": {"block": "llama", "bias": True},
    "llama-mup": {"block": "llama", "mup_base_width": 8},  # μP's logit multiplier folded into the final RMSNorm
    "llama-ngpt": {"block": "llama", "connection": "ngpt"},
    "gpt2-ngpt": {"connection": "ngpt"},
    "llama-p_spheret": {"block": "llama", "connection": "p_spheret"},
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[GPT, Path]]:
    """{name: (our char-level model, its exported folder)} of MODELS."""
    root = tmp_path_factory.mktemp("exported")
    models = {name: tiny_model(vocab_size=len(CHARS), **keys) for name, keys in MODELS.items()}
    return {name: (model, export_hf(char_checkpoint(model), root / name)) for name, model in models.items()}


def random_batch(seed: int, rows: int = 3, length: int = BLOCK) -> torch.Tensor:
    return torch.randint(0, len(CHARS), (rows, length), generator=torch.Generator().manual_seed(seed))


# -----------------------------------------------------------------------------
# pre_ln with LLaMA's block is transformers' Llama


@pytest.mark.parametrize("name", ["llama", "llama-bias", "llama-mup"])
def test_llama_pre_ln_loads_as_a_plain_llama_with_our_logits(exported: dict[str, tuple[GPT, Path]], name: str) -> None:
    ours, folder = exported[name]
    hf = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()  # no custom code
    assert not list(folder.glob("*.py"))
    idx = random_batch(1)
    torch.testing.assert_close(logits_of(hf, idx), logits_of(ours, idx), atol=1e-5, rtol=0)


def test_llama_config_json_says_what_our_block_computes(exported: dict[str, tuple[GPT, Path]]) -> None:
    ours, folder = exported["llama"]
    config = json.loads((folder / "config.json").read_text())
    expected = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": ours.config.mlp_hidden,
        "hidden_act": "silu", "max_position_embeddings": BLOCK, "vocab_size": len(CHARS), "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": True, "bos_token_id": None, "eos_token_id": None,
    }  # fmt: skip
    assert {k: config.get(k) for k in expected} == expected
    assert ours.config.mlp_hidden == 128  # 8/3 * 32 rounded up to a multiple of 64
    _, tensors = read_safetensors(folder / "model.safetensors", shapes_only=True)
    assert "lm_head.weight" not in tensors and tuple(tensors["model.layers.0.mlp.gate_proj.weight"].shape) == (128, 32)


def test_the_model_card_says_llama_and_no_custom_code(exported: dict[str, tuple[GPT, Path]]) -> None:
    card = model_card(char_checkpoint(exported["llama"][0]), Path("out/ckpt.pt"))
    assert "A LLaMA-style language model" in card and "so this is a plain `LlamaForCausalLM`." in card
    assert "trust_remote_code" not in card


def hand_copied_llama(ours: GPT) -> LlamaForCausalLM:
    """transformers' Llama with our weights copied in here, module by module (not by the export's mapping)."""
    cfg = ours.config
    hf = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.mlp_hidden,
            num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head,
            max_position_embeddings=cfg.block_size, rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
    ).eval()  # fmt: skip
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(ours.transformer.wte.weight)
        hf.model.norm.weight.copy_(ours.transformer.ln_f.weight)
        for theirs, block in zip(hf.model.layers, ours.transformer.h, strict=True):
            q, k, v = block.attn.c_attn.weight.split(cfg.n_embd)
            gate, up = block.mlp.c_fc.weight.split(cfg.mlp_hidden)
            copies = {
                theirs.self_attn.q_proj: q, theirs.self_attn.k_proj: k, theirs.self_attn.v_proj: v,
                theirs.self_attn.o_proj: block.attn.c_proj.weight, theirs.mlp.gate_proj: gate, theirs.mlp.up_proj: up,
                theirs.mlp.down_proj: block.mlp.c_proj.weight, theirs.input_layernorm: block.conn_attn.ln.weight,
                theirs.post_attention_layernorm: block.conn_mlp.ln.weight,
            }  # fmt: skip
            for module, weight in copies.items():
                module.weight.copy_(weight)
    return hf


def test_llama_pre_ln_logits_equal_transformers_llama(exported: dict[str, tuple[GPT, Path]]) -> None:
    ours = exported["llama"][0]
    idx = random_batch(2)
    torch.testing.assert_close(logits_of(hand_copied_llama(ours), idx), logits_of(ours, idx), atol=1e-5, rtol=0)


# -----------------------------------------------------------------------------
# Generation with the key/value cache: RoPE's positions come from the cache and the padding


@pytest.mark.parametrize("name", ["llama", "llama-ngpt", "gpt2-ngpt", "llama-p_spheret"])
def test_cached_generation_with_left_padding_equals_each_prompt_alone(exported: dict[str, tuple[GPT, Path]], name: str) -> None:
    """Greedy tokens, and the logits of every step, as our model computes them on each prompt alone."""
    ours, folder = exported[name]
    hf = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval() if name == "llama" else load_hf(folder)
    long, short = [11, 22, 33, 44, 5, 6, 7], [5, 6, 7, 8]
    pad = len(long) - len(short)
    ids = torch.tensor([long, [0] * pad + short])
    mask = torch.tensor([[1] * len(long), [0] * pad + [1] * len(short)])
    tokens_per_call: list[int] = []
    hf.get_input_embeddings().register_forward_hook(lambda module, args, out: tokens_per_call.append(args[0].size(1)))
    out = hf.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0,
                      return_dict_in_generate=True, output_logits=True)
    assert tokens_per_call == [len(long)] + [1] * 9  # the prompt once, then one token a step: the cache is used
    for row, prompt in enumerate((long, short)):
        want = ours.generate(torch.tensor([prompt]), max_new_tokens=10, temperature=0)
        assert out.sequences[row, len(long) :].tolist() == want[0, len(prompt) :].tolist()
        # Greedy tokens could agree by luck; each step's logits (a position off would change them) cannot.
        step_logits = torch.stack([step[row] for step in out.logits])
        torch.testing.assert_close(step_logits, logits_of(ours, want[:, :-1])[0, len(prompt) - 1 :], atol=1e-4, rtol=0)


# -----------------------------------------------------------------------------
# nGPT's head is its own matrix


@pytest.mark.parametrize("name", ["llama-ngpt", "gpt2-ngpt"])
def test_ngpt_exports_its_untied_scaled_head(exported: dict[str, tuple[GPT, Path]], name: str) -> None:
    ours, folder = exported[name]
    assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is False
    _, tensors = read_safetensors(folder / "model.safetensors")
    torch.testing.assert_close(tensors["lm_head.weight"], ours.lm_head.weight, atol=0, rtol=0)
    assert {"lm_head.s_z", "transformer.h.0.attn.qk_norm.s_qk", "transformer.h.0.mlp.scale.s_uv", "transformer.h.1.conn_mlp.alpha"} <= set(tensors)
    hf = load_hf(folder)
    assert hf.lm_head.weight.data_ptr() != hf.transformer.wte.weight.data_ptr()
    torch.testing.assert_close(hf.lm_head.weight, ours.lm_head.weight, atol=0, rtol=0)


# -----------------------------------------------------------------------------
# The exported code defines every name it uses


def undefined_globals(source: str) -> set[str]:
    """Module-level names that `source` reads (in any function or class) but neither defines nor
    imports, and that are no builtins: a class of model.py the export forgot to write in."""
    top = symtable.symtable(source, "exported", "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    used: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for symbol in table.get_symbols():
            if symbol.is_referenced() and (table is top or symbol.is_global()):
                used.add(symbol.get_name())
        for child in table.get_children():
            if "annotation" not in str(child.get_type()).lower():  # annotations are never evaluated
                walk(child)

    walk(top)
    return used - defined - set(dir(builtins))


def test_the_exported_code_defines_every_name_it_uses() -> None:
    files = hf_folder.remote_code_files("geonorm")
    assert {name: undefined_globals(text) for name, text in files.items()} == {name: set() for name in files}
    # The check sees a missing function: drop apply_rotary's definition from the shipped model.py.
    assert undefined_globals(files["model.py"].replace("def apply_rotary(", "def apply_rotary_gone(")) == {"apply_rotary"}


# -----------------------------------------------------------------------------
# Back in: a Llama folder as a pre_ln GPT with LLaMA's block


def test_plain_llama_folder_round_trips_through_init_from_hf(exported: dict[str, tuple[GPT, Path]], char_data: Path,
                                                              tmp_path: Path) -> None:
    ours, folder = exported["llama"]
    assert folder_model_config(folder) == {"connection": "pre_ln", "block": "llama", "bias": False, "dropout": 0.0, "n_layer": 2,
                                           "n_head": 2, "n_embd": 32, "block_size": BLOCK, "vocab_size": len(CHARS)}
    # block_size may shrink: LLaMA's block has no position table to crop
    train.main(train_args(char_data, tmp_path / "run", f"--init_from=hf:{folder}", "--block_size=16"))
    tuned = load_model(tmp_path / "run" / "ckpt.pt").eval()
    assert (tuned.config.connection, tuned.config.block, tuned.config.block_size) == ("pre_ln", "llama", 16)
    idx = random_batch(3, length=16)
    torch.testing.assert_close(logits_of(tuned, idx), logits_of(ours, idx), atol=1e-5, rtol=0)


def transformers_llama_folder(tmp_path: Path, legacy: bool) -> tuple[LlamaForCausalLM, Path]:
    """A Llama saved by transformers itself; legacy: as transformers 4 wrote it (rope_theta apart,
    rope_scaling null, pytorch_model.bin with the tied head and RoPE's frequencies in it)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(CHARS), hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=BLOCK, tie_word_embeddings=True)
    hf = trained_like(LlamaForCausalLM(config))
    folder = tmp_path / "llama"
    hf.save_pretrained(str(folder))
    if legacy:
        saved = json.loads((folder / "config.json").read_text())
        saved.pop("rope_parameters")
        (folder / "config.json").write_text(json.dumps({**saved, "rope_theta": 10000.0, "rope_scaling": None}))
        (folder / "model.safetensors").unlink()
        state = {**hf.state_dict(), **{f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.ones(8) for i in range(2)}}
        torch.save(state, folder / "pytorch_model.bin")
    return hf, folder


@pytest.mark.parametrize("legacy", [False, True], ids=["transformers-5", "transformers-4-bin"])
def test_a_transformers_llama_folder_loads_as_llama_pre_ln(tmp_path: Path, legacy: bool) -> None:
    hf, folder = transformers_llama_folder(tmp_path, legacy)
    ours = load_folder_model(folder).eval()
    assert (ours.config.block, ours.config.n_embd, ours.config.mlp_hidden) == ("llama", 64, 192)
    idx = random_batch(4)
    torch.testing.assert_close(logits_of(ours, idx), logits_of(hf, idx), atol=1e-5, rtol=0)


LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_key_value_heads": 1}, r"has num_key_value_heads=1; this project's LLaMA block computes num_key_value_heads=2 only \(one key/value head per query head\)\.$"),
        ({"rope_parameters": LLAMA3_ROPE}, r"has rope_parameters=\{'rope_type': 'llama3', 'rope_theta': 500000\.0, .*computes rope_parameters=\{'rope_type': 'default', 'rope_theta': 10000\.0\} only"),
        ({"rope_parameters": None, "rope_theta": 500000.0}, r"has rope_parameters=\{'rope_type': 'default', 'rope_theta': 500000\.0\}"),
        ({"rms_norm_eps": 1e-5}, r"has rms_norm_eps=1e-05; this project's LLaMA block computes rms_norm_eps=1e-06 only"),
        ({"tie_word_embeddings": None}, r"has tie_word_embeddings=False; .* \(the LM head is the token embedding\)"),
        ({"attention_bias": True}, r"has mlp_bias=False; this project's LLaMA block computes mlp_bias=True only \(biases in all Linear layers or in none"),
        ({"hidden_act": "gelu"}, r"has hidden_act='gelu'"),
        ({"head_dim": 8}, r"has head_dim=8; .*computes head_dim=16 only"),
        ({"intermediate_size": 100}, r"has intermediate_size=100; .*computes intermediate_size=128 only \(8/3 hidden_size rounded up"),
        ({"intermediate_size": None}, r"The Llama config\.json lacks intermediate_size; it needs num_hidden_layers, .*, intermediate_size\.$"),
    ],
)
def test_a_llama_our_block_does_not_compute_is_one_clear_error(exported: dict[str, tuple[GPT, Path]], tmp_path: Path,
                                                                change: dict[str, Any], message: str) -> None:
    folder = shutil.copytree(exported["llama"][1], tmp_path / "llama")
    config = {**json.loads((folder / "config.json").read_text()), **change}
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    with pytest.raises(HFFolderError, match=message):
        folder_model_config(folder)


def test_init_from_a_grouped_query_llama_is_refused_before_the_run(exported: dict[str, tuple[GPT, Path]], char_data: Path,
                                                                    tmp_path: Path) -> None:
    folder = shutil.copytree(exported["llama"][1], tmp_path / "gqa")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 1}))
    with pytest.raises(ConfigError, match=r"^The Llama config\.json has num_key_value_heads=1; .*num_key_value_heads=2 only"):
        train.main(train_args(char_data, tmp_path / "run", f"--init_from=hf:{folder}"))
    assert not (tmp_path / "run").exists()
