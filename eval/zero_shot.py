"""Zero-shot evaluation of a checkpoint: python eval/zero_shot.py --ckpt PATH --tasks paper (see eval/README.md).

The code lives in `spheretnorm.zeroshot.driver`; this file is the command.
"""

import sys

from spheretnorm.zeroshot.driver import main

if __name__ == "__main__":
    sys.exit(main())
