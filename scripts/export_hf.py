"""Export a training checkpoint as a Hugging Face model folder, or as weights-only safetensors.

    python scripts/export_hf.py --ckpt out/openwebtext_s/geonorm/ckpt.pt --out hf/geonorm-s
    python scripts/export_hf.py --ckpt out/openwebtext_s/geonorm/ckpt.pt --out st/geonorm-s --format safetensors

--format hf (the default) writes config.json, model.safetensors, generation_config.json, the
tokenizer files (GPT-2 BPE built offline, or the dataset's characters) and a README model card.
A pre_ln model loads as a plain GPT-2; the others carry their own code:

    AutoModelForCausalLM.from_pretrained("hf/geonorm-s", trust_remote_code=True)

--format safetensors writes OUT/ckpt.safetensors: the weights and model config only (no pickle,
no optimizer), which GPT.from_checkpoint, sample.py and eval/ read like a ckpt.pt. The hf folder
can start a fine-tune: python train.py ... --init_from=hf:hf/geonorm-s
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from common import HelpFormatter  # noqa: E402
from eval.errors import EvalError  # noqa: E402
from hf_folder import HFFolderError, export_hf  # noqa: E402
from model import GPT, config_from_dict, load_checkpoint, save_safetensors_checkpoint  # noqa: E402
from scripts.runs import display_name, read_metrics, scale_of  # noqa: E402
from train import METRICS_NAME  # noqa: E402
from trainconfig import method_key  # noqa: E402

FORMATS = ("hf", "safetensors")
NATIVE_NAME = "ckpt.safetensors"


def final_val_loss(ckpt_path: Path) -> float | None:
    """val_loss of the last eval row of the metrics.jsonl beside the checkpoint, if any."""
    path = ckpt_path.with_name(METRICS_NAME)
    evals = [r for r in read_metrics(path) if r.get("kind") == "eval"] if path.is_file() else []
    return evals[-1]["val_loss"] if evals else None


def model_card(ckpt: dict[str, Any], ckpt_path: Path) -> str:
    """README.md of the exported folder: what the model is and how it was trained."""
    cfg = config_from_dict(ckpt["model_config"])
    train = ckpt.get("train_config") or {}
    method = method_key(cfg)
    val_loss = final_val_loss(ckpt_path)
    n_params = GPT.from_checkpoint(ckpt).get_num_params()
    remote = cfg.connection != "pre_ln"
    load_args = ', trust_remote_code=True' if remote else ''
    rows = {
        "connection": f"{display_name(method)} (`{method}`)",
        "scale": f"{scale_of(ckpt['model_config'])}: {cfg.n_layer} layers, {cfg.n_head} heads, width {cfg.n_embd}, {n_params / 1e6:.1f}M parameters",
        "context": f"{cfg.block_size} tokens",
        "dataset": train.get("dataset", "not recorded"),
        "iterations": ckpt.get("iter_num", "not recorded"),
        "final val loss": f"{val_loss:.4f}" if val_loss is not None else f"not recorded (no {METRICS_NAME} beside the checkpoint)",
    }
    table = "\n".join(f"| {k} | {v} |" for k, v in rows.items())
    return f"""---
library_name: transformers
tags:
- spheretnorm
- {cfg.connection}
---

# {display_name(method)} GPT ({rows['scale'].split(':')[0]}, {rows['dataset']})

A GPT-2-style language model trained with the spheretnorm codebase (paper: "Sphere Retraction
Normalizations", arXiv 2608.02668), exported from `{ckpt_path.name}`.

| | |
|---|---|
{table}

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("PATH/TO/THIS/FOLDER"{load_args})
tokenizer = AutoTokenizer.from_pretrained("PATH/TO/THIS/FOLDER"{load_args})
```
{"This connection is not part of transformers: the folder carries its code (`modeling_spheretnorm.py`), which needs only torch and transformers." if remote else "Pre-LN is GPT-2's own block, so this is a plain `GPT2LMHeadModel`."}
"""


def export(ckpt_path: Path, out: Path, fmt: str) -> Path:
    """Write the export; returns the folder or file written."""
    ckpt = load_checkpoint(ckpt_path)
    if fmt == "safetensors":
        out.mkdir(parents=True, exist_ok=True)
        return save_safetensors_checkpoint(ckpt, out / NATIVE_NAME)
    export_hf(ckpt, out)
    (out / "README.md").write_text(model_card(ckpt, ckpt_path), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--ckpt", required=True, help="a checkpoint written by train.py (ckpt.pt)")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--format", default="hf", choices=FORMATS, help="hf: a transformers model folder; safetensors: weights and config only")
    args = parser.parse_args(argv)
    try:
        written = export(Path(args.ckpt), Path(args.out), args.format)
    except (HFFolderError, EvalError, FileNotFoundError, ValueError) as e:  # EvalError: no GPT-2 BPE files
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {written}")


if __name__ == "__main__":
    main()
