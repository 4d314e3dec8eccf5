"""lm-eval's own command line, with this project's `nanogpt` model registered.

lm-eval's CLI only knows the models it ships; ours is registered when eval.harness is imported,
so run lm-eval through this module (from the repository root):

    python -m eval.lm_eval_cli run --model nanogpt --model_args ckpt=out/ckpt.pt \
        --tasks piqa,lambada_openai --batch_size 16
    python -m eval.lm_eval_cli ls tasks

Every lm-eval option works as documented by lm-eval. For the paper's table, use eval/zero_shot.py.
"""

from __future__ import annotations

import sys


import spheretnorm.eval.harness  # noqa: F401,E402  (registers "nanogpt")
from spheretnorm.eval.errors import EvalError


def main() -> int:
    from lm_eval.__main__ import cli_evaluate

    try:
        cli_evaluate()  # reads sys.argv, exactly like the `lm_eval` command
    except EvalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
