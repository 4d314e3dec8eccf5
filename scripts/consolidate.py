"""A sharded checkpoint (train.py --parallel=fsdp) as one ckpt.pt: python scripts/consolidate.py out/RUN/ckpt.dcp [--out out/RUN/ckpt.pt].

The code lives in `spheretnorm.runtime.sharded_checkpoint`; this file is the command.
"""

from spheretnorm.runtime.sharded_checkpoint import main

if __name__ == "__main__":
    main()
