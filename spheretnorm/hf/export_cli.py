"""Export a training checkpoint as a Hugging Face model folder, or as weights-only safetensors.

    python scripts/export_hf.py --ckpt out/openwebtext_s/geonorm/ckpt.pt --out hf/geonorm-s
    python scripts/export_hf.py --ckpt out/openwebtext_s/geonorm/ckpt.pt --out st/geonorm-s --format safetensors

--format hf (the default) writes config.json, model.safetensors, generation_config.json, the
tokenizer files (GPT-2 BPE built offline, or the dataset's characters) and a README model card.
A pre_ln model loads as a plain GPT-2 (block gpt2) or Llama (block llama); the others, nGPT
included, carry their own code:

    AutoModelForCausalLM.from_pretrained("hf/geonorm-s", trust_remote_code=True)

--format safetensors writes OUT/ckpt.safetensors: the weights and model config only (no pickle,
no optimizer), which runtime.checkpoint.load_model, sample.py and eval/ read like a ckpt.pt. The hf folder
can start a fine-tune: python train.py ... --init_from=hf:hf/geonorm-s

In every format OUT must be a new or empty folder (an earlier export is never replaced), and the
files get the permissions the umask gives any new file. The export is written into a temporary
folder beside OUT and renamed to OUT when complete: a failure mid-export (a full disk) removes
everything the export wrote and is one error line. A damaged or foreign checkpoint is one
error line and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spheretnorm.runtime.checkpoint import checkpoint_for
from spheretnorm.runtime.cli import HelpFormatter
from spheretnorm.runtime.imports import add_import_options, use_import_options
from spheretnorm.runtime.device import set_cpu_threads
from spheretnorm.zeroshot.errors import EvalError
from spheretnorm.hf.release import FORMATS, export
from spheretnorm.hf.folder import HFFolderError


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--ckpt", required=True, help="a checkpoint written by train.py (ckpt.pt or ckpt.dcp), or its run folder (the newer of the two)")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--format", default="hf", choices=FORMATS, help="hf: a transformers model folder; safetensors: weights and config only")
    add_import_options(parser)
    args = parser.parse_args(argv)
    try:
        use_import_options(args, ValueError)  # before the checkpoint names a connection of the user's
        set_cpu_threads("cpu")  # as train.py would on this load; copies, no compute worth a line of its own
        written = export(checkpoint_for(args.ckpt, "export_hf", "export", "exporting", ValueError), Path(args.out), args.format)
    except (HFFolderError, EvalError, FileNotFoundError, ValueError) as e:  # EvalError: no GPT-2 BPE files
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {written}")
