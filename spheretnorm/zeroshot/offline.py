"""Keeping the evaluation commands off the network, and what the Hugging Face cache holds.

The hub is off for a command when HF_DATASETS_OFFLINE or HF_HUB_OFFLINE is set (either one
means both), when it reads the benchmarks from --local_data DIR, or when the hub's endpoint
gives no answer within HUB_PROBE_TIMEOUT_S. ``offline_mode`` then sets both variables before
lm-eval, datasets and huggingface_hub are imported (they read them once, at import), so nothing
tries the network: datasets fails at once instead of retrying the hub for about 45 s, and the
GPT-2 tokenizer is built from local files (spheretnorm.data.tokenizer honours HF_HUB_OFFLINE).
eval/README.md ("No network") says what the commands do then.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

OFFLINE_VARS = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
_TRUE = ("1", "ON", "YES", "TRUE")


def _is_true(value: str | None) -> bool:
    return (value or "").strip().upper() in _TRUE


def offline_flags() -> list[str]:
    """The offline variables set in the environment, e.g. ['HF_DATASETS_OFFLINE']."""
    return [v for v in OFFLINE_VARS if _is_true(os.environ.get(v))]


def hub_off_reason(local_data: str | Path | None) -> str | None:
    """Why this command must not use the hub ('--local_data', 'HF_DATASETS_OFFLINE=1', both), or None when it may."""
    reasons = (["--local_data"] if local_data else []) + [f"{v}={os.environ[v]}" for v in offline_flags()]
    return " and ".join(reasons) or None


DEFAULT_HUB_ENDPOINT = "https://huggingface.co"
# Long enough for a slow answer from a reachable hub, short enough that an unreachable one
# costs a few seconds rather than the libraries' retries.
HUB_PROBE_TIMEOUT_S = 3.0


def _ask_hub(url: str, timeout_s: float, answer: dict[str, str | None]) -> None:
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s).close()
        answer["why"] = None
    except urllib.error.HTTPError:  # any HTTP status is an answer: the hub is there
        answer["why"] = None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        answer["why"] = str(getattr(exc, "reason", None) or exc)


def hub_unreachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """Why the hub's endpoint gave no answer within timeout_s ('http://127.0.0.1:9 did not answer: [Errno 111] Connection refused'), None when it answered."""
    url, answer = (os.environ.get("HF_ENDPOINT") or DEFAULT_HUB_ENDPOINT).rstrip("/"), {}  # as huggingface_hub reads it
    # A thread bounds the whole probe: urlopen's timeout does not cover the DNS look-up.
    worker = threading.Thread(target=_ask_hub, args=(url, timeout_s, answer), name="hub-probe", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if "why" not in answer:
        return f"{url} did not answer within {timeout_s:g} s"
    return None if answer["why"] is None else f"{url} did not answer: {answer['why']}"


def _sync_imported_modules() -> None:
    """Make datasets and huggingface_hub, if imported already, read the offline variables again."""
    hub_constants = sys.modules.get("huggingface_hub.constants")
    if hub_constants is not None:
        hub_constants.HF_HUB_OFFLINE = _is_true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:
        flag = os.environ.get("HF_DATASETS_OFFLINE")
        hub = _is_true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))
        value = hub if flag is None else _is_true(flag)
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
            if hasattr(datasets_config, name):
                setattr(datasets_config, name, value)


@contextlib.contextmanager
def offline_mode(local_data: str | Path | None, probe_hub: bool = False) -> Iterator[str | None]:
    """Within it, when the hub is off (hub_off_reason), both offline variables are set; yields the reason (None: hub on).

    With probe_hub, a hub that is on but does not answer (hub_unreachable) is turned off too, so
    that the libraries fail at once instead of retrying it. Enter it before lm-eval or datasets
    is imported. On exit the variables are as they were (for callers in one process, such as the tests).
    """
    reason = hub_off_reason(local_data) or (hub_unreachable() if probe_hub else None)
    if reason is None:
        yield None
        return
    saved = {v: os.environ.get(v) for v in OFFLINE_VARS}
    os.environ.update({v: "1" for v in OFFLINE_VARS})
    _sync_imported_modules()
    try:
        yield reason
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        _sync_imported_modules()


# -----------------------------------------------------------------------------
# The Hugging Face cache


def cache_dirs() -> tuple[Path, Path]:
    """(datasets' cache of prepared datasets, huggingface_hub's cache of downloaded files)."""
    import datasets.config
    from huggingface_hub import constants

    return Path(datasets.config.HF_DATASETS_CACHE), Path(constants.HF_HUB_CACHE)


def is_hub_path(dataset_path: str) -> bool:
    """Whether datasets would fetch dataset_path from the hub: not a packaged loader (json, csv, ...) nor a local folder or file."""
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    return dataset_path not in _PACKAGED_DATASETS_MODULES and not Path(dataset_path).expanduser().exists()


def hub_dataset_cached(dataset_path: str) -> bool:
    """Whether the HF cache holds folders of the hub dataset dataset_path (e.g. 'allenai/sciq')."""
    try:
        from datasets.naming import camelcase_to_snakecase
    except ImportError:  # pragma: no cover - older datasets
        camelcase_to_snakecase = str  # type: ignore[assignment]
    datasets_cache, hub_cache = cache_dirs()
    *namespace, name = dataset_path.split("/")
    prepared = ["___".join([*namespace, n]) for n in dict.fromkeys((camelcase_to_snakecase(name), name))]
    candidates = [datasets_cache / p for p in prepared] + [hub_cache / ("datasets--" + dataset_path.replace("/", "--"))]
    return any(c.is_dir() for c in candidates)


def uncached_hub_dataset(config: dict[str, Any]) -> str | None:
    """The dataset of a task config (its YAML, includes merged) when it comes from the hub and the
    cache lacks it, as errors name it ('allenai/ai2_arc (ARC-Easy)'), else None (a local loader or
    folder, a cached dataset, or no dataset_path)."""
    path, name = config.get("dataset_path"), config.get("dataset_name")
    kwargs = config.get("dataset_kwargs") or {}
    if not isinstance(path, str) or not is_hub_path(path) or (isinstance(kwargs, dict) and kwargs.get("cache_dir")):
        return None  # a cache_dir of the task's own is not ours to look into: datasets will say
    return None if hub_dataset_cached(path) else path + (f" ({name})" if name else "")
