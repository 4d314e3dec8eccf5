"""lm-eval's command line with this project's `nanogpt` model: python -m eval.lm_eval_cli run --model nanogpt ...

The code lives in `spheretnorm.zeroshot.lm_eval_entry`; this file is the command.
"""

import sys

from spheretnorm.zeroshot.lm_eval_entry import main

if __name__ == "__main__":
    sys.exit(main())
