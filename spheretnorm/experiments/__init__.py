"""Experiment tooling: the paper's grid and its run folders (grid), the CPU studies (study, their
front, and the engine beside it: sweep_plan, sweep_runner, sweep_record, sweep_report), tables
(tabulate) and figures (figures). It sits on top: it imports the runtime and the integrations,
and nothing below imports it.

The code of the experiment commands in scripts/ lives here too, one module each, and the command
is a few lines that call its main: launcher (scripts/launch.py), stability_sweep (lr_sweep.py),
cpu_pipeline (reproduce_cpu.py), depth (depth_study.py), block_variants (block_study.py),
conditioning (jacobian.py), lr_transfer (mup_transfer.py), coordinates (coord_check.py)."""
