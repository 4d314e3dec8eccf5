"""scripts/consolidate.py: a sharded folder as one ckpt.pt of the usual format, in one process.

    python scripts/consolidate.py out/RUN/ckpt.dcp [--out out/RUN/ckpt.pt] [--overwrite]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spheretnorm.optim import build_optimizer
from spheretnorm.runtime.checkpoint import (
    CheckpointError, atomic_torch_save, checkpoint_iter, checkpoint_state, load_checkpoint, load_model, load_sharded,
)
from spheretnorm.runtime.cli import HelpFormatter
from spheretnorm.runtime.config import optimizer_settings
from spheretnorm.runtime.imports import add_import_options, use_import_options
from spheretnorm.runtime.run_folder import CKPT_NAME, SHARDED_STOP_CKPT_NAME, STOP_CKPT_NAME
from spheretnorm.runtime.device import set_cpu_threads


def check_consolidate_out(folder: Path, out: Path, overwrite: bool) -> None:
    """Refuse an output that is a folder, lies inside the folder being read (a file there is not one
    of its shards, and would be taken for damage), or exists (another checkpoint of the run, say)
    without overwrite."""
    if out.resolve() == folder.resolve() or out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a folder; give the file to write, e.g. {folder.resolve().parent / 'ckpt.pt'}.")
    if folder.resolve() in out.resolve().parents:
        raise ValueError(f"--out {str(out)!r} is inside the sharded folder {str(folder)!r} being read; write it beside the folder, e.g. {folder.resolve().parent / 'ckpt.pt'}.")
    if out.exists() and not overwrite:
        raise ValueError(f"{str(out)!r} already exists; pass --overwrite to replace it, or give another --out.")


def newer_output_text(folder: Path, out: Path, replace_newer: bool) -> str:
    """'' when `out` is absent or not newer than the folder; else, with replace_newer, the line that
    says what is replaced; without, a ValueError: --overwrite alone never puts an older state over a newer one."""
    if not out.is_file():
        return ""
    try:
        held = checkpoint_iter(out)
    except CheckpointError:
        return ""  # a damaged file: nothing newer is lost
    iteration = checkpoint_iter(folder)
    if held <= iteration:
        return ""
    if not replace_newer:
        raise ValueError(
            f"{str(out)!r} holds iter {held}, newer than the iter {iteration} of {str(folder)!r}; pass --replace_newer to replace it "
            "all the same, or give another --out."
        )
    return f"NOTE: replacing {out} (iter {held}) by the older iter {iteration} of {folder}, as --replace_newer asks."


def consolidate(folder: str | Path, out: str | Path, overwrite: bool = False, replace_newer: bool = False) -> Path:
    """Write a sharded folder as one ckpt.pt of today's format (model, optimizer, progress, RNG),
    in one process: train.py --parallel=ddp resumes it, and every reader of ckpt.pt reads it. An
    existing `out` is replaced only with overwrite (check_consolidate_out), and one holding a later
    iteration only with replace_newer too, saying so (newer_output_text)."""
    folder, out = Path(folder), Path(out)
    check_consolidate_out(folder, out, overwrite)
    note = newer_output_text(folder, out, replace_newer)
    ckpt = load_checkpoint(folder, require=("optimizer", "train_config"))  # checked once, the whole weights read
    model = load_model(ckpt)  # then the optimizer state by name into a whole optimizer
    optimizer = build_optimizer(model, optimizer_settings(ckpt["train_config"]))
    load_sharded(folder, model, optimizer)
    fields = {k: v for k, v in ckpt.items() if k not in ("format", "model_config", "model")}
    atomic_torch_save({**checkpoint_state(model), "optimizer": optimizer.state_dict(), **fields}, out)
    if note:
        print(note)
    return out


def main(argv: list[str] | None = None) -> None:
    """scripts/consolidate.py: FOLDER [--out FILE] [--overwrite], FILE by default beside FOLDER as ckpt.pt."""
    parser = argparse.ArgumentParser(
        description="A sharded checkpoint folder (train.py --parallel=fsdp) as one ckpt.pt of the usual format (model, "
        "optimizer, progress, RNG), which --parallel=ddp resumes:\n\n    python scripts/consolidate.py out/RUN/ckpt.dcp [--out FILE]",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("folder", help="the sharded checkpoint, e.g. out/RUN/ckpt.dcp")
    parser.add_argument("--out", default="", help="the file to write (default: ckpt.pt beside the folder; ckpt.stop.pt beside a ckpt.stop.dcp), never inside the folder")
    parser.add_argument("--overwrite", action="store_true", help="replace the file to write when it exists (refused otherwise)")
    parser.add_argument("--replace_newer", action="store_true", help="with --overwrite: replace it even when it holds a later iteration than the folder")
    add_import_options(parser)  # a checkpoint of the user's own connection, as every reader of checkpoints
    args = parser.parse_args(argv)
    set_cpu_threads("cpu")  # as train.py would on this load; reading and writing, no compute worth a line of its own
    folder = Path(args.folder)
    try:
        use_import_options(args, ValueError)  # before the checkpoint names a connection of the user's
        if not folder.is_dir():
            raise ValueError(f"{str(folder)!r} is not a folder; give the sharded checkpoint folder (e.g. out/RUN/ckpt.dcp) that --parallel=fsdp writes.")
        # resolve(): the folder's parent, also for `consolidate.py .` run inside it; ckpt.pt beside a ckpt.dcp, and a
        # stop's state (ckpt.stop.dcp) keeps a stop's name, ckpt.stop.pt, so that it never takes the healthy checkpoint's
        stop = folder.resolve().name == SHARDED_STOP_CKPT_NAME
        out = Path(args.out) if args.out else folder.resolve().parent / (STOP_CKPT_NAME if stop else CKPT_NAME)
        written = consolidate(folder, out, args.overwrite, args.replace_newer)
    except (ValueError, OSError) as e:  # CheckpointError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {written}")
