"""A checkpoint as a Hugging Face folder or safetensors: python scripts/export_hf.py --ckpt CKPT --out DIR [--format hf|safetensors].

The code lives in `spheretnorm.hf.export_cli`; this file is the command.
"""

from spheretnorm.hf.export_cli import main

if __name__ == "__main__":
    main()
