"""Experiment tooling: the paper's grid and its run folders (grid), the CPU studies (study),
tables (tabulate) and figures (figures). It sits on top: it imports the runtime and the
integrations, and nothing below imports it."""
