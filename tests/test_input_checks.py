"""Bad input on the newer surfaces: train.py's optimizer, seed and head-size keys, the Triton
sphere update on a machine without a GPU, data/prepare.py's inputs and full disks, token files
changed after prepare, and sample.py's --meta and --start=FILE:.

Every case runs as a user types it (`python SCRIPT ARGS`) and must end in the documented exit
status with one `error: ...` line that says what is wrong, no traceback, and, where a write
fails, no partial file. As in tests/test_faults.py, one subprocess (DRIVER) runs the cases of a
batch in turn, so the imports are paid once per batch; the full-disk batch runs under a
file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored: a write past it fails with EFBIG), and no batch
has TRITON_INTERPRET (tests/conftest.py sets it for this process).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import train
from markov_data import VOCAB, write_markov_data
from spheretnorm.runtime import token_files
from spheretnorm.runtime.config import ConfigError, TrainConfig
from spheretnorm.runtime.token_files import PrepareError, open_split
from test_faults import ENV as FAULTS_ENV
from test_train import tiny_args

REPO = Path(__file__).resolve().parents[1]
# test_faults.py's subprocess environment, without the Triton interpreter (a CPU has no GPU to run triton on).
ENV = {k: v for k, v in FAULTS_ENV.items() if k != "TRITON_INTERPRET"}
FULL_DISK_LIMIT = 1_000  # bytes a process under the limit may write to one file: less than any output here

# Runs each [script, argv] of the JSON list on stdin as `python script *argv` would (the
# script's __main__ code, the exit status of SystemExit, an uncaught exception printed as the
# interpreter prints it), under a file-size limit when argv[1] is not 0; prints the results.
DRIVER = r"""
import contextlib, io, json, resource, runpy, signal, sys, traceback

limit = int(sys.argv[1])
if limit:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
results = []
for script, argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        sys.argv = [script, *argv]
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(results))
"""


def run_driver(cases: list[tuple[str, list[str]]], file_limit: int = 0, cwd: Path = REPO) -> list[dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, str(file_limit)], input=json.dumps(cases), cwd=cwd, env=ENV,
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


# -----------------------------------------------------------------------------
# The inputs the cases are made from


@dataclass
class Inputs:
    root: Path
    markov: Path  # tests/markov_data.py's char dataset (48 characters), with its vocabulary
    ckpt: Path  # a checkpoint train.py wrote on it (its meta.json recorded)
    text: Path  # a UTF-8 text of 10 characters, for prepare.py
    binary: Path  # random bytes, not UTF-8
    earlier_meta: dict[str, Any] | None = None  # what an earlier prepare wrote where a full disk stops the next

    def path(self, *parts: str) -> Path:
        path = self.root.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    root = tmp_path_factory.mktemp("input-checks")
    markov = write_markov_data(root / "markov", with_vocabulary=True)
    train.main(tiny_args(markov, root / "run", "--max_iters=1", "--connection=p_spheret"))  # a sphere update to dispatch
    rng = np.random.default_rng(0)
    text = root / "text.txt"
    text.write_text("".join(rng.choice(list("abcdefgh \n"), size=20_000)))
    binary = root / "random.bin"
    binary.write_bytes(b"\x00\xcc" + rng.integers(0, 256, size=4_000, dtype=np.uint8).tobytes())
    return Inputs(root, markov, root / "run" / "ckpt.pt", text, binary)


@dataclass(frozen=True)
class Case:
    """A script's arguments, built from the inputs; the exit status and what its last stderr
    line must hold (the bad value and what is valid); and a check of the files it leaves."""

    build: Callable[[Inputs], tuple[str, list[str]]]
    code: int
    says: tuple[str, ...]
    leaves: Callable[[Inputs], None] | None = None


def training(*keys: str) -> Callable[[Inputs], tuple[str, list[str]]]:
    def build(ws: Inputs) -> tuple[str, list[str]]:
        name = "-".join(k.strip("-").replace("=", "_") for k in keys)
        return "train.py", tiny_args(ws.markov, ws.root / "runs" / name, "--max_iters=1", *keys)

    return build


def preparing(name: str, make: Callable[[Inputs, Path], None], *extra: str) -> Callable[[Inputs], tuple[str, list[str]]]:
    """prepare.py on the file make(ws, path) writes, an --input of that name (its extension)."""

    def build(ws: Inputs) -> tuple[str, list[str]]:
        path = ws.path("inputs", name)
        make(ws, path)
        return "data/prepare.py", ["shakespeare_char", "--input", str(path), "--out_dir", str(ws.root / "prepared" / name), "--no_progress", *extra]

    return build


def binary_file(ws: Inputs, path: Path) -> None:
    path.write_bytes(ws.binary.read_bytes())


def sampling(*args: str, meta: Callable[[Inputs], dict[str, Any]] | None = None) -> Callable[[Inputs], tuple[str, list[str]]]:
    def build(ws: Inputs) -> tuple[str, list[str]]:
        argv = [str(ws.ckpt), "--device=cpu", "--num_samples=1", "--max_new_tokens=4", *args]
        if meta is not None:
            text = json.dumps(meta(ws))
            path = ws.path("metas", f"{hashlib.sha256(text.encode()).hexdigest()[:12]}.json")
            path.write_text(text)
            argv.append(f"--meta={path}")
        return "sample.py", argv

    return build


def char_meta(chars: str) -> Callable[[Inputs], dict[str, Any]]:
    return lambda ws: {"tokenizer": "char", "vocab_size": len(chars), "itos": list(chars), "stoi": {c: i for i, c in enumerate(chars)}}


def start_file(ws: Inputs) -> str:
    return f"--start=FILE:{ws.binary}"


def tampered_dataset(split: str) -> Callable[[Inputs], tuple[str, list[str]]]:
    """A dataset prepare.py wrote, then a token id past its vocabulary written into one bin at
    the same length: the recorded maximum no longer holds."""

    def build(ws: Inputs) -> tuple[str, list[str]]:
        data = ws.root / "tampered" / split
        from spheretnorm.data.preparation import prepare

        prepare("shakespeare_char", input=[str(ws.text)], out_dir=str(data), progress=False)
        path = data / f"{split}.bin"
        before = path.stat().st_mtime_ns
        ids = np.fromfile(path, dtype=np.uint16)
        ids[len(ids) // 2] = 40  # the vocabulary has 10 characters
        ids.tofile(path)
        while path.stat().st_mtime_ns == before:  # a write within the file system's clock tick
            time.sleep(0.01)
            ids.tofile(path)
        return "train.py", tiny_args(data, ws.root / "runs" / f"tampered-{split}", "--max_iters=1")

    return build


SEED_PAST_2_64 = 2**64 + 5
MANY_CHARS = "".join(map(chr, range(0x100, 0x100 + 60)))  # a 60-character vocabulary

REFUSED: dict[str, Case] = {
    # 1. optimizer and seed values out of range
    "beta1=2": Case(training("--beta1=2"), 2, ("beta1=2.0", "0 <= beta1 < 1")),
    "beta2=-0.5": Case(training("--beta2=-0.5"), 2, ("beta2=-0.5", "0 <= beta2 < 1")),
    "beta1=1": Case(training("--beta1=1"), 2, ("beta1=1.0", "0 <= beta1 < 1")),
    "beta2=nan": Case(training("--beta2=nan"), 2, ("beta2=nan", "0 <= beta2 < 1")),
    "seed=-1": Case(training("--seed=-1"), 2, ("seed=-1", "from 0 to 4294967295")),
    "seed=2**32": Case(training(f"--seed={2**32}"), 2, (f"seed={2**32}", "from 0 to 4294967295")),
    "seed>2**64": Case(training(f"--seed={SEED_PAST_2_64}"), 2, (f"seed={SEED_PAST_2_64}", "from 0 to 4294967295")),
    # 2. head sizes RoPE cannot take
    "llama-head-size-3": Case(training("--block=llama", "--n_embd=6", "--n_head=2"), 2, ("block='llama'", "even head size", "gives 3")),
    "llama-head-size-1": Case(training("--block=llama", "--n_embd=4", "--n_head=4"), 2, ("block='llama'", "even head size", "gives 1")),
    "ngpt-llama-head-size-5": Case(training("--block=llama", "--connection=ngpt", "--n_embd=10", "--n_head=2"), 2, ("even head size", "gives 5")),
    "n_head=0": Case(training("--n_head=0"), 2, ("n_head must be a positive integer, got 0",)),
    # 3. the Triton kernels with neither a GPU nor the interpreter
    "triton-on-cpu": Case(training("--connection=p_spheret", "--sphere_impl=triton"), 2, ("sphere_impl='triton'", "'cpu'", "'auto' or 'fused'")),
    # 4. prepare.py on a file that is not text
    "prepare-binary-txt": Case(preparing("binary.txt", binary_file), 2, ("binary.txt", "is not UTF-8 text", "offset 1")),
    "prepare-binary-jsonl": Case(preparing("binary.jsonl", binary_file), 2, ("binary.jsonl", "is not UTF-8 text")),
    "prepare-binary-parquet": Case(preparing("binary.parquet", binary_file), 2, ("binary.parquet", "is not a readable parquet file")),
    # 5. a token id past the vocabulary written in after prepare.py
    "tampered-train.bin": Case(tampered_dataset("train"), 2, ("train.bin", "holds token id 40", "0..9")),
    "tampered-val.bin": Case(tampered_dataset("val"), 2, ("val.bin", "holds token id 40", "0..9")),
    # 6. sample.py with another dataset's meta.json, or a prompt file that is not text
    # A prompt the other vocabulary can spell: before the check, samples in the wrong characters
    # (fewer) or an id past the embedding (more, gpt2).
    "sample-meta-fewer-chars": Case(sampling("--start=abc", meta=char_meta("abcdefghij")), 2, ("--meta=", "10 characters", "48-character")),
    "sample-meta-more-chars": Case(sampling(f"--start={MANY_CHARS[-3:]}", meta=char_meta(MANY_CHARS)), 2, ("--meta=", "60 tokens", "vocab_size 48")),
    "sample-meta-gpt2": Case(sampling("--start=abc", meta=lambda ws: {"tokenizer": "gpt2", "vocab_size": 50257}), 2, ("--meta=", "gpt2", "vocab_size 48")),
    "sample-start-binary": Case(lambda ws: sampling(start_file(ws))(ws), 2, ("random.bin", "is not UTF-8 text", "offset 1")),
}

# What the checks must still let through (a wrong check is worse than none).
ACCEPTED: dict[str, Callable[[Inputs], tuple[str, list[str]]]] = {
    "beta1=0": training("--beta1=0", "--beta2=0.999"),
    "seed=2**32-1": training(f"--seed={2**32 - 1}"),
    "llama-head-size-2": training("--block=llama", "--n_embd=4", "--n_head=2"),
    "ngpt-gpt2-head-size-1": training("--connection=ngpt", "--n_embd=4", "--n_head=4"),  # no RoPE: any head size
    "ngpt-gpt2-head-size-3": training("--connection=ngpt", "--n_embd=6", "--n_head=2"),
    "sample-own-meta": lambda ws: sampling(f"--meta={ws.markov / 'meta.json'}", "--start=ABC")(ws),
    "sample-triton-checkpoint-on-cpu": lambda ws: ("sample.py", [str(triton_checkpoint(ws)), "--device=cpu", "--num_samples=1", "--max_new_tokens=4", "--start=ABC"]),
}


def triton_checkpoint(ws: Inputs) -> Path:
    """The checkpoint as a run with sphere_impl=triton on a GPU saves it: sampled on a CPU with auto."""
    import torch

    ckpt = torch.load(ws.ckpt, map_location="cpu", weights_only=False)
    path = ws.path("triton-run", "ckpt.pt")
    torch.save({**ckpt, "model_config": {**ckpt["model_config"], "sphere_impl": "triton"}}, path)
    return path


def no_partial_files(folder: str) -> Callable[[Inputs], None]:
    def check(ws: Inputs) -> None:
        out = ws.root / folder
        assert not out.exists() or not list(out.iterdir()), sorted(p.name for p in out.iterdir())

    return check


def earlier_files_kept(ws: Inputs) -> None:
    out = ws.root / "full-disk" / "earlier"
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]
    assert json.loads((out / "meta.json").read_text()) == ws.earlier_meta


def prepare_into(folder: str, keep_earlier: bool = False) -> Callable[[Inputs], tuple[str, list[str]]]:
    def build(ws: Inputs) -> tuple[str, list[str]]:
        out = ws.root / "full-disk" / folder
        if keep_earlier:
            from spheretnorm.data.preparation import prepare

            ws.earlier_meta = prepare("shakespeare_char", input=[str(ws.text)], out_dir=str(out), progress=False)
        return "data/prepare.py", ["shakespeare_char", "--input", str(ws.text), "--out_dir", str(out), "--no_progress"]

    return build


# 4 and 7: a full disk (a file-size limit) while prepare.py or train.py writes
FULL_DISK: dict[str, Case] = {
    "prepare-fresh": Case(prepare_into("fresh"), 2, ("Could not write", "train.bin", "is the disk full?"), no_partial_files("full-disk/fresh")),
    "prepare-over-earlier": Case(prepare_into("earlier", keep_earlier=True), 2, ("Could not write", "untouched"), earlier_files_kept),
    "train-config.json": Case(lambda ws: ("train.py", tiny_args(ws.markov, ws.root / "full-disk" / "run", "--max_iters=1")), 1,
                              ("config.json", "File too large"), no_partial_files("full-disk/run")),
}


# -----------------------------------------------------------------------------
# Running them


def run_cases(ws: Inputs, cases: dict[str, Callable[[Inputs], tuple[str, list[str]]]], file_limit: int = 0) -> dict[str, dict[str, Any]]:
    built = [build(ws) for build in cases.values()]
    return dict(zip(cases, run_driver(built, file_limit)))


@pytest.fixture(scope="module")
def refused(inputs: Inputs) -> dict[str, dict[str, Any]]:
    return run_cases(inputs, {name: case.build for name, case in REFUSED.items()})


@pytest.fixture(scope="module")
def accepted(inputs: Inputs) -> dict[str, dict[str, Any]]:
    return run_cases(inputs, ACCEPTED)


@pytest.fixture(scope="module")
def full_disk(inputs: Inputs) -> dict[str, dict[str, Any]]:
    return run_cases(inputs, {name: case.build for name, case in FULL_DISK.items()}, FULL_DISK_LIMIT)


def assert_one_line(case: Case, result: dict[str, Any]) -> None:
    output = result["stdout"] + result["stderr"]
    assert "Traceback" not in output, output[-3000:]
    assert result["code"] == case.code, output[-3000:]
    lines = result["stderr"].strip().splitlines()
    assert lines and lines[-1].startswith("error: "), output[-3000:]
    for text in case.says:
        assert text in lines[-1], lines[-1]


@pytest.mark.parametrize("name", list(REFUSED))
def test_bad_input_is_one_line(refused: dict[str, dict[str, Any]], name: str) -> None:
    assert_one_line(REFUSED[name], refused[name])


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_good_input_still_runs(accepted: dict[str, dict[str, Any]], name: str) -> None:
    result = accepted[name]
    assert result["code"] == 0 and "Traceback" not in result["stderr"], (result["stdout"] + result["stderr"])[-3000:]
    if name == "sample-triton-checkpoint-on-cpu":
        assert "sampling with sphere_impl='auto' instead" in result["stderr"]


@pytest.mark.parametrize("name", list(FULL_DISK))
def test_a_full_disk_is_one_line_and_leaves_no_partial_file(inputs: Inputs, full_disk: dict[str, dict[str, Any]], name: str) -> None:
    case = FULL_DISK[name]
    assert_one_line(case, full_disk[name])
    if case.leaves is not None:
        case.leaves(inputs)


# -----------------------------------------------------------------------------
# The checks themselves, in process


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"beta1": 2.0}, "beta1=2.0 is not valid; AdamW needs 0 <= beta1 < 1."),
        ({"beta2": -0.5}, "beta2=-0.5 is not valid; AdamW needs 0 <= beta2 < 1."),
        ({"seed": -1}, "seed=-1 is not valid; use an integer from 0 to 4294967295 (2**32 - 1, numpy's seed range)."),
    ],
)
def test_train_config_names_the_value_and_the_range(keys: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        TrainConfig(**keys)
    assert str(raised.value) == message


def test_the_seed_range_is_numpys() -> None:
    """The largest seed TrainConfig takes is the largest that seed_everything can give numpy."""
    from spheretnorm.runtime.device import seed_everything

    seed_everything(TrainConfig(seed=2**32 - 1).seed)
    with pytest.raises(ValueError):
        np.random.seed(2**32)


def test_gpt_config_refuses_an_odd_head_size_only_with_rope() -> None:
    from spheretnorm.model import GPTConfig

    with pytest.raises(ValueError, match=r"^block='llama' needs an even head size for RoPE's rotate-half, but n_embd=6 / n_head=2 gives 3"):
        GPTConfig(block="llama", n_embd=6, n_head=2)
    GPTConfig(block="gpt2", n_embd=6, n_head=2)  # GPT-2's block has a position table, no RoPE
    GPTConfig(block="gpt2", connection="ngpt", n_embd=6, n_head=6)


def test_the_sphere_dispatch_says_why_triton_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from spheretnorm import kernels

    monkeypatch.setattr(kernels, "triton_interpreted", lambda: False)
    assert kernels.impl_unavailable("fused", "cpu") is None
    problem = kernels.impl_unavailable("triton", "cpu")
    if kernels.triton_available():
        assert problem == "sphere_impl='triton' runs on a CUDA device (a CPU only under TRITON_INTERPRET=1), not on device 'cpu'; use sphere_impl='auto' or 'fused'."
        assert kernels.impl_unavailable("triton", "cuda") is None
    else:
        assert problem is not None and "needs the triton package" in problem


def test_an_untouched_prepared_bin_is_not_scanned(inputs: Inputs, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cheap path stays cheap: a bin whose mtime is the recorded one is trusted, not read."""
    from spheretnorm.data.preparation import prepare

    data = inputs.root / "untouched"
    meta = prepare("shakespeare_char", input=[str(inputs.text)], out_dir=str(data), progress=False)
    assert meta["train_mtime_ns"] == (data / "train.bin").stat().st_mtime_ns
    scanned: dict[Any, int] = {}
    monkeypatch.setattr(token_files, "_SCANNED_MAX", scanned)
    open_split(data, "train")
    assert scanned == {}
    os.utime(data / "train.bin", ns=(0, meta["train_mtime_ns"] + 1))  # the same bytes, another mtime: scanned
    open_split(data, "train")
    assert list(scanned.values()) == [meta["train_max_token"]]


def test_a_copy_without_its_times_is_scanned_and_refused_when_damaged(inputs: Inputs) -> None:
    data = write_markov_data(inputs.root / "markov-copy")
    meta = json.loads((data / "meta.json").read_text())
    stamp = (data / "train.bin").stat().st_mtime_ns
    ids = np.fromfile(data / "train.bin", dtype=np.uint16)
    ids[-1] = VOCAB + 1
    ids.tofile(data / "train.bin")
    # meta.json says the maximum is fine and records the mtime the file had before the change
    (data / "meta.json").write_text(json.dumps({**meta, "train_max_token": VOCAB - 1, "train_mtime_ns": stamp - 1}))
    with pytest.raises(PrepareError, match=f"holds token id {VOCAB + 1}, beyond the {VOCAB} tokens"):
        open_split(data, "train")
