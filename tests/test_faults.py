"""Faults on the real path: damaged checkpoints, safetensors files, meta.json files, token files
and Hugging Face folders, given to sample.py, scripts/export_hf.py and train.py
(--init_from=resume, --init_from=hf:DIR, a new run on a damaged dataset).

Every case must end as a user's error, never as a crash: a non-zero exit status, a last stderr
line that names the damaged file, and no traceback anywhere in the output.

The cases run as scripts, `python SCRIPT ARGS` as a user types it, but not one process each:
one subprocess (DRIVER) executes every case's script as __main__ in turn, so the ~3 s of
imports are paid once instead of ~200 times. test_the_driver_runs_a_script_as_python_does
checks, on one case, that the driver's exit status and output are those of a real process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import train
from markov_data import VOCAB, write_markov_data
from safetensors.torch import save_file
from spheretnorm.hf.folder import write_remote_model
from spheretnorm.model import GPT
from spheretnorm.runtime.checkpoint import CheckpointError, save_safetensors_checkpoint
from spheretnorm.runtime.checkpoint import load_checkpoint, load_model
from test_train import tiny_args

REPO = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "WANDB_MODE": "disabled",
    "SPHERETNORM_EAGER_KERNELS": "1",
    "SPHERETNORM_TOKENIZER_OFFLINE": "1",
    "HF_HUB_OFFLINE": "1",
}

# Runs each case of the JSON list on stdin, [script, argv], as `python script *argv` would:
# the script's own __main__ code, exit status from SystemExit, and an uncaught exception
# printed as the interpreter prints it. Prints one JSON list of results. A fault that makes a
# script allocate what a damaged file claims (10^9 layers, say) must fail that case, not take
# the machine's memory or the suite's time: memory is capped and each case has CASE_SECONDS.
CASE_SECONDS = 60
DRIVER = r"""
import contextlib, io, json, resource, runpy, signal, sys, traceback

resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
seconds = int(sys.argv[1])


def too_slow(signum, frame):
    raise TimeoutError(f"the case ran for more than {seconds} s")


signal.signal(signal.SIGALRM, too_slow)
results = []
for script, argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        sys.argv = [script, *argv]
        signal.alarm(seconds)
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if not isinstance(stop.code, (int, type(None))):
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        signal.alarm(0)
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(results))
"""


# -----------------------------------------------------------------------------
# What is damaged, and how


@dataclass
class Workspace:
    """The valid inputs the faults are made from."""

    root: Path
    data: Path  # a char-level dataset (tests/markov_data.py), with its characters
    ckpt: dict[str, Any]  # a checkpoint train.py wrote on it, as torch.load reads it
    ckpt_bytes: bytes

    def fresh(self, *parts: str) -> Path:
        path = self.root.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def state(self) -> dict[str, torch.Tensor]:
        return dict(self.ckpt["model"])


def with_config(**changes: Any) -> Callable[[Workspace], dict[str, Any]]:
    return lambda ws: {**ws.ckpt, "model_config": {**ws.ckpt["model_config"], **changes}}


def with_state(change: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Workspace], dict[str, Any]]:
    def build(ws: Workspace) -> dict[str, Any]:
        state = ws.state()
        change(state)
        return {**ws.ckpt, "model": state}

    return build


def without(key: str) -> Callable[[Workspace], dict[str, Any]]:
    return lambda ws: {k: v for k, v in ws.ckpt.items() if k != key}


def with_keys(**changes: Any) -> Callable[[Workspace], dict[str, Any]]:
    return lambda ws: {**ws.ckpt, **changes}


# ckpt.pt files saved from a damaged checkpoint dict.
CKPT_CONTENTS: dict[str, Callable[[Workspace], Any]] = {
    "nanogpt-format": lambda ws: {"model": ws.state(), "model_args": {}},
    "wrong-format-tag": with_keys(format="spheretnorm-ckpt-v0"),
    "a-list": lambda ws: [1, 2, 3],
    "no-model": without("model"),
    "no-model_config": without("model_config"),
    "model-a-tensor": with_keys(model=torch.zeros(3)),
    "model_config-a-list": with_keys(model_config=[2, 2, 32]),
    "model_config-unknown-key": with_config(n_layers=2),
    "n_layer-a-string": with_config(n_layer="2"),
    "n_layer-negative": with_config(n_layer=-1),
    "n_layer-a-float": with_config(n_layer=2.5),
    "n_layer-huge": with_config(n_layer=10**9),
    "n_embd-zero": with_config(n_embd=0),
    "n_head-not-dividing": with_config(n_head=3),
    "vocab_size-huge": with_config(vocab_size=10**9),
    "dropout-a-string": with_config(dropout="high"),
    "bias-a-string": with_config(bias="yes"),
    "angle_max-nan": with_config(angle_max=float("nan")),
    "connection-unknown": with_config(connection="nope"),
    "connection-a-number": with_config(connection=3),
    "connection_params-a-list": with_config(connection_params=[1]),
    "config-wider-than-weights": with_config(n_embd=64),
    "weight-missing": with_state(lambda s: s.pop("transformer.h.0.mlp.c_fc.weight")),
    "weight-extra": with_state(lambda s: s.update({"transformer.h.7.mlp.c_fc.weight": torch.zeros(2, 2)})),
    "weight-not-a-tensor": with_state(lambda s: s.update({"transformer.wpe.weight": "abc"})),
    "data_meta-a-string": with_keys(data_meta="char"),
    # A fault only for the readers of the vocabulary: sample.py and the hf export (USES_VOCABULARY).
    "data_meta-without-itos": with_keys(data_meta={"tokenizer": "char", "vocab_size": VOCAB}),
    "disallowed-global": with_keys(hook=os.system),  # refused before unpickling runs anything
}


def cut(fraction: float) -> Callable[[Workspace], bytes]:
    return lambda ws: ws.ckpt_bytes[: int(len(ws.ckpt_bytes) * fraction)]


def foreign_zip(ws: Workspace) -> bytes:
    path = ws.fresh("scratch", "foreign.zip")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "not a checkpoint")
    return path.read_bytes()


# ckpt.pt files whose bytes are damaged.
CKPT_BYTES: dict[str, Callable[[Workspace], bytes]] = {
    "truncated-header": lambda ws: ws.ckpt_bytes[:64],
    "truncated-middle": cut(0.5),
    "truncated-end": lambda ws: ws.ckpt_bytes[:-16],
    "empty": lambda ws: b"",
    "text": lambda ws: b"model = 'my model'\nn_layer = 2\n",
    "foreign-zip": foreign_zip,
}


def write_ckpt(ws: Workspace, fault: str) -> Path:
    """The damaged ckpt.pt of `fault`, alone in a folder of its own (an out_dir to resume)."""
    path = ws.fresh("ckpt", fault, "ckpt.pt")
    if fault in CKPT_BYTES:
        path.write_bytes(CKPT_BYTES[fault](ws))
    else:
        torch.save(CKPT_CONTENTS[fault](ws), path)
    return path


def safetensors_metadata(ws: Workspace, path: Path) -> dict[str, str]:
    save_safetensors_checkpoint(ws.ckpt, path)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata())


def st_file(metadata: dict[str, str] | None = None, drop: str | None = None, config: dict[str, Any] | None = None) -> Callable[[Workspace, Path], None]:
    """A ckpt.safetensors with changed metadata, a tensor left out, or a changed model_config."""

    def write(ws: Workspace, path: Path) -> None:
        meta = safetensors_metadata(ws, path)
        if config is not None:
            meta["model_config"] = json.dumps({**ws.ckpt["model_config"], **config})
        meta.update(metadata or {})
        state = {k: v.contiguous() for k, v in ws.state().items() if k not in ("lm_head.weight", drop)}
        save_file(state, str(path), metadata=meta)

    return write


def st_bytes(damage: Callable[[bytes], bytes]) -> Callable[[Workspace, Path], None]:
    def write(ws: Workspace, path: Path) -> None:
        save_safetensors_checkpoint(ws.ckpt, path)
        path.write_bytes(damage(path.read_bytes()))

    return write


SAFETENSORS: dict[str, Callable[[Workspace, Path], None]] = {
    "st-truncated-header": st_bytes(lambda b: b[:6]),
    "st-truncated-middle": st_bytes(lambda b: b[: len(b) // 2]),
    "st-empty": st_bytes(lambda b: b""),
    "st-text": st_bytes(lambda b: b"weights: none\n"),
    "st-no-format": st_file(metadata={"format": "pt"}),
    "st-model_config-not-json": st_file(metadata={"model_config": "{n_layer: 2"}),
    "st-iter_num-text": st_file(metadata={"iter_num": "seven"}),
    "st-data_meta-not-json": st_file(metadata={"data_meta": "{'tokenizer': 'char'}"}),
    "st-n_layer-text": st_file(config={"n_layer": "two"}),
    "st-vocab_size-huge": st_file(config={"vocab_size": 10**9}),
    "st-n_embd-huge": st_file(config={"n_embd": 2**20, "n_head": 1}),
    "st-no-embedding": st_file(drop="transformer.wte.weight"),
    "st-no-block-weight": st_file(drop="transformer.h.1.attn.c_attn.weight"),
}


def write_safetensors(ws: Workspace, fault: str) -> Path:
    path = ws.fresh("st", fault, "ckpt.safetensors")
    SAFETENSORS[fault](ws, path)
    return path


# meta.json files that sample.py reads (--meta, or the one in an older checkpoint's data_dir).
BAD_META: dict[str, str] = {
    "meta-not-json": "{'tokenizer': 'char'",
    "meta-a-list": json.dumps(["char"]),
    "meta-char-without-itos": json.dumps({"tokenizer": "char", "vocab_size": VOCAB}),
    "meta-itos-not-strings": json.dumps({"tokenizer": "char", "vocab_size": 3, "itos": [1, 2, 3]}),
}


def meta_file(ws: Workspace, fault: str) -> Path:
    path = ws.fresh("meta", fault, "meta.json")
    path.write_text(BAD_META[fault])
    return path


def ckpt_beside_meta(ws: Workspace, fault: str) -> tuple[Path, Path]:
    """An older checkpoint (no data_meta) whose data_dir holds the damaged meta.json."""
    meta = meta_file(ws, fault)
    state = {k: v for k, v in ws.ckpt.items() if k != "data_meta"}
    state["train_config"] = {**ws.ckpt["train_config"], "data_dir": str(meta.parent)}
    path = ws.fresh("beside", fault, "ckpt.pt")
    torch.save(state, path)
    return path, meta


# Datasets whose meta.json or token files are damaged (train.py opens them).
def damaged_data(ws: Workspace, fault: str) -> tuple[Path, Path]:
    """(the data_dir, the damaged file in it)."""
    data = write_markov_data(ws.fresh("data", fault, "x").parent)
    meta_path = data / "meta.json"
    meta = json.loads(meta_path.read_text())
    if fault == "data-meta-not-json":
        meta_path.write_text(meta_path.read_text()[:-5])
        return data, meta_path
    if fault == "data-meta-a-list":
        meta_path.write_text("[]")
        return data, meta_path
    if fault == "data-meta-without-token-count":
        meta_path.write_text(json.dumps({k: v for k, v in meta.items() if k != "train_tokens"}))
        return data, meta_path
    if fault == "data-meta-vocab_size-text":
        meta_path.write_text(json.dumps({**meta, "vocab_size": "many"}))
        return data, meta_path
    split = "val" if fault.endswith("-val") else "train"
    ids = np.fromfile(data / f"{split}.bin", dtype=np.uint16)
    ids[len(ids) // 2] = VOCAB + 5  # one id beyond the vocabulary, deep inside the file
    ids.tofile(data / f"{split}.bin")
    if fault == "data-recorded-max-beyond-vocab":
        meta_path.write_text(json.dumps({**meta, "train_max_token": VOCAB + 5, "val_max_token": 3}))
    return data, data / f"{split}.bin"


DATA_FAULTS = (
    "data-meta-not-json",
    "data-meta-a-list",
    "data-meta-without-token-count",
    "data-meta-vocab_size-text",
    "data-token-beyond-vocab",
    "data-token-beyond-vocab-val",
    "data-recorded-max-beyond-vocab",
)


# Hugging Face folders for --init_from=hf:DIR.
def spheretnorm_folder(ws: Workspace, fault: str) -> Path:
    folder = ws.fresh("hf", fault, "x").parent
    model = load_model(ws.ckpt)
    write_remote_model(model, folder, {})
    return folder


def gpt2_config(n_embd: Any = 32) -> dict[str, Any]:
    return {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": n_embd, "n_positions": 16, "vocab_size": VOCAB,
            "activation_function": "gelu"}  # fmt: skip


def hf_folder(ws: Workspace, fault: str) -> tuple[Path, Path]:
    """(the folder, the damaged file in it: the folder itself when a file is missing)."""
    folder = spheretnorm_folder(ws, fault)
    config, weights, legacy = folder / "config.json", folder / "model.safetensors", folder / "pytorch_model.bin"
    ours = json.loads(config.read_text())
    if fault.startswith("hf-bin-"):  # a GPT-2 folder that keeps its weights in a pickle
        weights.unlink()
        config.write_text(json.dumps(gpt2_config()))
        if fault == "hf-bin-pickle-payload":
            torch.save({"h.0.attn.c_attn.weight": torch.zeros(2), "payload": os.system}, legacy)
        elif fault == "hf-bin-a-list":
            torch.save([1, 2], legacy)
        elif fault == "hf-bin-truncated":
            torch.save({"wte.weight": torch.zeros(VOCAB, 32)}, legacy)
            legacy.write_bytes(legacy.read_bytes()[:100])
        elif fault == "hf-bin-text":
            legacy.write_text("weights\n")
        return folder, legacy
    if fault == "hf-config-not-json":
        config.write_text(config.read_text()[:-10])
    elif fault == "hf-config-a-list":
        config.write_text("[1, 2]")
    elif fault == "hf-config-n_layer-text":
        config.write_text(json.dumps({**ours, "n_layer": "2"}))
    elif fault == "hf-config-n_layer-huge":
        config.write_text(json.dumps({**ours, "n_layer": 10**9}))
    elif fault == "hf-config-vocab_size-huge":
        config.write_text(json.dumps({**ours, "vocab_size": 10**9}))
    elif fault == "hf-config-wider-than-weights":
        config.write_text(json.dumps({**ours, "n_embd": 64}))
    elif fault == "hf-gpt2-config-n_embd-text":
        config.write_text(json.dumps(gpt2_config(n_embd="32")))
    elif fault == "hf-gpt2-config-n_embd-huge":  # 2^20 x 2^20 weights, were they allocated
        config.write_text(json.dumps({**gpt2_config(n_embd=2**20), "n_head": 1}))
    elif fault == "hf-no-weights":
        weights.unlink()
        return folder, folder
    elif fault == "hf-weights-truncated":
        weights.write_bytes(weights.read_bytes()[:200])
        return folder, weights
    elif fault == "hf-weights-missing-tensor":
        state = {k: v.contiguous() for k, v in load_model(ws.ckpt).state_dict().items()
                 if k not in ("lm_head.weight", "transformer.h.1.mlp.c_proj.weight")}  # fmt: skip
        save_file(state, str(weights), metadata={"format": "pt"})
        return folder, weights
    return folder, config


HF_FAULTS = (
    "hf-bin-pickle-payload",
    "hf-bin-a-list",
    "hf-bin-truncated",
    "hf-bin-text",
    "hf-config-not-json",
    "hf-config-a-list",
    "hf-config-n_layer-text",
    "hf-config-n_layer-huge",
    "hf-config-vocab_size-huge",
    "hf-config-wider-than-weights",
    "hf-gpt2-config-n_embd-text",
    "hf-gpt2-config-n_embd-huge",
    "hf-no-weights",
    "hf-weights-truncated",
    "hf-weights-missing-tensor",
)


# -----------------------------------------------------------------------------
# The cases: an entry point and a fault, as (script, argv, the file the error must name)

SAMPLE_ARGS = ("--device=cpu", "--num_samples=1", "--max_new_tokens=2", "--start=A")  # A: in the data's vocabulary
MODEL_KEYS = ("--n_layer=", "--n_head=", "--n_embd=", "--block_size=")
CKPT_FAULTS = (*CKPT_CONTENTS, *CKPT_BYTES)
USES_VOCABULARY = ("data_meta-without-itos",)  # a resume or a weights-only export needs no tokenizer
# Only a resume needs the training state, so only train.py can tell that it is missing (it asks
# load_checkpoint for those keys with require=).
RESUME_ONLY = ("no-optimizer",)
CaseBuilder = Callable[[Workspace], tuple[str, list[str], Path]]


def sample_ckpt(fault: str) -> CaseBuilder:
    def build(ws: Workspace) -> tuple[str, list[str], Path]:
        path = write_ckpt(ws, fault) if fault in CKPT_FAULTS else write_safetensors(ws, fault)
        return "sample.py", [str(path), *SAMPLE_ARGS], path

    return build


def export_ckpt(fault: str, fmt: str) -> CaseBuilder:
    def build(ws: Workspace) -> tuple[str, list[str], Path]:
        path = write_ckpt(ws, fault) if fault in CKPT_FAULTS else write_safetensors(ws, fault)
        out = ws.root / "exports" / fmt / fault
        return "scripts/export_hf.py", ["--ckpt", str(path), "--out", str(out), "--format", fmt], path

    return build


def saved_model_args(data: Path, out_dir: Path, init_from: str) -> list[str]:
    """tiny_args without the model keys: the model is the one saved, whatever it claims to be."""
    return [a for a in tiny_args(data, out_dir, "--max_iters=1", init_from) if not a.startswith(MODEL_KEYS)]


def resume(fault: str) -> CaseBuilder:
    def build(ws: Workspace) -> tuple[str, list[str], Path]:
        if fault in RESUME_ONLY:
            path = ws.fresh("ckpt", fault, "ckpt.pt")
            torch.save(without("optimizer")(ws), path)
        else:
            path = write_ckpt(ws, fault)
        return "train.py", saved_model_args(ws.data, path.parent, "--init_from=resume"), path

    return build


def sample_meta(fault: str, beside: bool) -> CaseBuilder:
    def build(ws: Workspace) -> tuple[str, list[str], Path]:
        if beside:
            ckpt, meta = ckpt_beside_meta(ws, fault)
            return "sample.py", [str(ckpt), *SAMPLE_ARGS], meta
        meta = meta_file(ws, fault)
        return "sample.py", [str(ws.root / "good" / "ckpt.pt"), f"--meta={meta}", *SAMPLE_ARGS], meta

    return build


def sample_meta_dir(ws: Workspace) -> tuple[str, list[str], Path]:
    meta = meta_file(ws, "meta-not-json")
    return "sample.py", [str(ws.root / "good" / "ckpt.pt"), f"--meta={meta.parent}", *SAMPLE_ARGS], meta


def new_run(fault: str) -> CaseBuilder:
    def build(ws: Workspace) -> tuple[str, list[str], Path]:
        data, damaged = damaged_data(ws, fault)
        return "train.py", tiny_args(data, ws.root / "runs" / fault, "--max_iters=1"), damaged

    return build


def hf_init(fault: str) -> CaseBuilder:
    def build(ws: Workspace) -> tuple[str, list[str], Path]:
        folder, damaged = hf_folder(ws, fault)
        return "train.py", saved_model_args(ws.data, ws.root / "hf-runs" / fault, f"--init_from=hf:{folder}"), damaged

    return build


def export_into(fmt: str, make: str) -> CaseBuilder:
    """An export into a folder that holds files (or is a file): refused, whatever the format."""

    def build(ws: Workspace) -> tuple[str, list[str], Path]:
        out = ws.fresh("exports", "used", f"{fmt}-{make}")
        if make == "file":
            out.write_text("an older file")
        else:
            out.mkdir()
            (out / "ckpt.safetensors").write_text("an earlier export")
        return "scripts/export_hf.py", ["--ckpt", str(ws.root / "good" / "ckpt.pt"), "--out", str(out), "--format", fmt], out

    return build


CASES: dict[str, CaseBuilder] = {
    **{f"sample:{f}": sample_ckpt(f) for f in (*CKPT_FAULTS, *SAFETENSORS)},
    **{f"export-safetensors:{f}": export_ckpt(f, "safetensors") for f in (*CKPT_FAULTS, *SAFETENSORS) if f not in USES_VOCABULARY},
    **{f"export-hf:{f}": export_ckpt(f, "hf") for f in (*CKPT_FAULTS, *SAFETENSORS)},
    **{f"resume:{f}": resume(f) for f in (*CKPT_FAULTS, *RESUME_ONLY) if f not in USES_VOCABULARY},
    **{f"sample-meta:{f}": sample_meta(f, beside=False) for f in BAD_META},
    **{f"sample-meta-beside-data:{f}": sample_meta(f, beside=True) for f in BAD_META},
    "sample-meta-dir:meta-not-json": sample_meta_dir,
    **{f"train:{f}": new_run(f) for f in DATA_FAULTS},
    **{f"init-from-hf:{f}": hf_init(f) for f in HF_FAULTS},
    **{f"export-{fmt}:out-{make}": export_into(fmt, make) for fmt in ("safetensors", "hf") for make in ("used", "file")},
}


# -----------------------------------------------------------------------------
# Running them


def run_driver(cases: list[tuple[str, list[str]]]) -> list[dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, str(CASE_SECONDS)], input=json.dumps(cases), cwd=REPO, env=ENV,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("faults")
    data = write_markov_data(root / "good-data", with_vocabulary=True)
    train.main(tiny_args(data, root / "good", "--max_iters=1", "--connection=p_spheret"))
    path = root / "good" / "ckpt.pt"
    return Workspace(root, data, torch.load(path, map_location="cpu", weights_only=False), path.read_bytes())


@pytest.fixture(scope="module")
def outcomes(workspace: Workspace) -> dict[str, tuple[Path, dict[str, Any]]]:
    """{case: (the file its error must name, what running it gave)}, all run by one driver."""
    built = {name: build(workspace) for name, build in CASES.items()}
    results = run_driver([(script, argv) for script, argv, _ in built.values()])
    return {name: (damaged, result) for (name, (_, _, damaged)), result in zip(built.items(), results)}


def case_params() -> list[Any]:
    return list(CASES)


@pytest.mark.parametrize("case", case_params())
def test_a_fault_is_one_line_naming_the_file(outcomes: dict[str, tuple[Path, dict[str, Any]]], case: str) -> None:
    damaged, result = outcomes[case]
    output = result["stdout"] + result["stderr"]
    assert "Traceback" not in output, output[-3000:]
    assert result["code"] != 0, output[-3000:]
    lines = result["stderr"].strip().splitlines()
    assert lines and str(damaged) in lines[-1], output[-3000:]
    assert lines[-1].startswith("error: "), lines[-1]


def test_the_driver_runs_a_script_as_python_does(workspace: Workspace) -> None:
    """One case both ways: the driver's exit status and output are those of a real process."""
    script, argv, _ = sample_ckpt("truncated-middle")(workspace)
    real = subprocess.run([sys.executable, script, *argv], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    [driven] = run_driver([(script, argv)])
    assert (driven["code"], driven["stdout"], driven["stderr"]) == (real.returncode, real.stdout, real.stderr)


# -----------------------------------------------------------------------------
# The library's side: one error type for every checkpoint that cannot give its model


def test_load_model_of_a_dict_refuses_what_load_checkpoint_refuses(workspace: Workspace) -> None:
    for fault in ("config-wider-than-weights", "weight-missing", "n_layer-a-string", "vocab_size-huge"):
        with pytest.raises(CheckpointError, match=r"^The checkpoint (does not hold|has an invalid|holds the weights)"):
            load_model(CKPT_CONTENTS[fault](workspace))


def test_load_checkpoint_asks_for_the_keys_its_caller_needs(workspace: Workspace) -> None:
    path = workspace.root / "good" / "ckpt.pt"
    assert load_checkpoint(path, require=("optimizer", "rng"))["iter_num"] == 1
    partial = workspace.fresh("partial", "ckpt.pt")
    torch.save(without("optimizer")(workspace), partial)
    with pytest.raises(CheckpointError, match=rf"^Checkpoint {re.escape(repr(str(partial)))} lacks optimizer, which train.py writes"):
        load_checkpoint(partial, require=("optimizer", "rng"))
