"""Fill the Hugging Face cache for offline evaluation: python eval/prefetch.py --tasks paper.

The code lives in `spheretnorm.zeroshot.hub_prefetch`; this file is the command.
"""

import sys

from spheretnorm.zeroshot.hub_prefetch import main

if __name__ == "__main__":
    sys.exit(main())
