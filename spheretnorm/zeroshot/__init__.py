"""Zero-shot evaluation of this project's checkpoints with lm-eval (see eval/README.md)."""
