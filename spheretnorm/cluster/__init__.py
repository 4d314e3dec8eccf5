"""The paper's grid on a machine or a SLURM cluster: scripts/launch.py (launcher.py, the command),
the grid's runs and their commands (grid_runs.py), the plan of what to run or skip (grid_plan.py),
sbatch's command lines and options (sbatch.py), and what SLURM already has, the run folders'
locks and records, and submission (slurm.py).
"""
