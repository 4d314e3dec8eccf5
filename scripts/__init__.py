"""Experiment tooling: launch the paper's grid, make its tables and figures, run CPU studies."""
