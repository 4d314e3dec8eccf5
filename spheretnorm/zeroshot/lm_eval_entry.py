"""lm-eval's own command line, with this project's `nanogpt` model registered.

lm-eval's CLI only knows the models it ships; ours is registered when spheretnorm.zeroshot.harness
is imported, so run lm-eval through this module (from the repository root):

    python -m eval.lm_eval_cli run --model nanogpt --model_args ckpt=out/ckpt.pt \
        --tasks piqa,lambada_openai --batch_size 16
    python -m eval.lm_eval_cli run --model nanogpt --model_args ckpt=out/ckpt.pt \
        --tasks piqa,lambada_openai --local_data ../shared/evaldata          # offline
    python -m eval.lm_eval_cli ls tasks

Every lm-eval option works as documented by lm-eval. --local_data DIR and --skip_missing are this
module's own and mean what they mean for eval/zero_shot.py, the hub kept off as there (see
eval/README.md, "lm-eval's own CLI"). For the paper's table, use eval/zero_shot.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from typing import Any

from spheretnorm.zeroshot.errors import EvalError
from spheretnorm.zeroshot.local_tasks import check_skip_missing
from spheretnorm.zeroshot.offline import offline_mode


def own_options() -> argparse.ArgumentParser:
    """The options this module adds to lm-eval's; they are taken out before lm-eval parses the rest."""
    # allow_abbrev=False: a prefix of one of lm-eval's options must stay lm-eval's.
    p = argparse.ArgumentParser(prog="python -m eval.lm_eval_cli", add_help=False, allow_abbrev=False)
    group = p.add_argument_group("spheretnorm options (besides lm-eval's, below)")
    group.add_argument("--local_data", default=None, metavar="DIR", help="folder with the benchmarks' original release files, read instead of the hub (layout in eval/README.md)")
    group.add_argument("--skip_missing", action="store_true", help="with --local_data: leave out the requested tasks whose files are absent there")
    return p


def use_local_data(args: argparse.Namespace, data_dir: str, skip_missing: bool, out_dir: str) -> str:
    """Point lm-eval's parsed arguments at local task YAMLs written into out_dir; returns the source note.

    The YAMLs go on lm-eval's include path beside any --include_path of the user (lm-eval's
    TaskManager takes a list), and --skip_missing takes the skipped tasks out of --tasks.
    """
    from spheretnorm.zeroshot.local_tasks import LOCAL_TASKS, prepare_local_tasks

    if not hasattr(args, "include_path"):
        raise EvalError(f"--local_data works with lm-eval's run, validate and ls commands, not with {getattr(args, 'command', None)!r}.")
    # ls has no --tasks: then every benchmark found under data_dir is written (ls loads no dataset).
    tasks = list(getattr(args, "tasks", None) or LOCAL_TASKS)
    plan = prepare_local_tasks(data_dir, out_dir, tasks, skip_missing, require_files=bool(getattr(args, "tasks", None)))
    for task, reason in plan.skipped.items():
        print(f"skipped: {task} ({reason})", file=sys.stderr)
    if getattr(args, "tasks", None):
        args.tasks = [t for t in tasks if t not in plan.skipped]
    args.include_path = [p for p in (args.include_path, out_dir) if p]
    return plan.source_note


def run_lm_eval_cli(argv: list[str], local_data: str | None, skip_missing: bool, hub_off: str | None = None) -> None:
    """What lm-eval's `cli_evaluate` does, with the local task YAMLs put on the include path.

    hub_off: why the hub is off (the caller has entered offline.offline_mode), None when it is on.
    """
    import spheretnorm.zeroshot.harness  # noqa: F401  (registers "nanogpt"; imported after the offline variables are set)
    from lm_eval._cli import HarnessCLI  # what lm_eval.__main__.cli_evaluate runs, in 0.4.10 to 0.4.x
    from lm_eval.utils import setup_logging

    from spheretnorm.zeroshot.driver import hub_errors_as_eval_error

    setup_logging()
    parser = HarnessCLI()
    args = _parse(parser, argv)
    with tempfile.TemporaryDirectory(prefix="spheretnorm-local-tasks-") as out_dir:
        source_note = use_local_data(args, local_data, skip_missing, out_dir) if local_data else ""
        with hub_errors_as_eval_error(source_note, hub_off):
            parser.execute(args)


def _parse(parser: Any, argv: list[str]) -> argparse.Namespace:
    """lm-eval's parse of argv: its parser reads sys.argv (and inserts `run` when no command is given)."""
    saved = sys.argv
    sys.argv = [saved[0] if saved else "lm_eval_cli", *argv]
    try:
        return parser.parse_args()
    finally:
        sys.argv = saved


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, rest = own_options().parse_known_args(argv)
    if "-h" in argv or "--help" in argv:
        print(own_options().format_help())  # then lm-eval's own help, which exits
    try:
        check_skip_missing(ours.local_data, ours.skip_missing)
        with offline_mode(ours.local_data, probe_hub=True) as hub_off:
            run_lm_eval_cli(rest, ours.local_data, ours.skip_missing, hub_off)
    except EvalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
