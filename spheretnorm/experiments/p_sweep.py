"""Val loss against p for p-SpheretNorm, p in {0.25, 0.5, 1, 2, 4}, two seeds: a study that is only its spec.

    python -m spheretnorm.experiments.p_sweep                          # 10 runs of the CPU model, 400 iterations
    python -m spheretnorm.experiments.p_sweep --axis spheret_p=0.5,2 --axis seed=1337
    python -m spheretnorm.experiments.p_sweep --table_only             # the table of the runs already there

Runs go to OUT_DIR/p<P>/seed<S>/ (a finished or stopped run is reused). Writes OUT_DIR/p_sweep.md
(one row per run: val loss, its gap to the same seed's p = 1 run, final cosine, status; then the
seeds' summary) and OUT_DIR/p_sweep.json. Any other --key=value goes to every train.py run.
"""

from __future__ import annotations

import sys

from spheretnorm.experiments.study import CPU_MODEL, Axis, Column, Sweep, sweep_main

# The spec, as docs/EXPERIMENTS.md shows it (tests/test_sweep_engine.py checks that they agree).
P_SWEEP = Sweep(
    name="p_sweep",
    base={**CPU_MODEL, "connection": "p_spheret", "learning_rate": 1e-3, "min_lr": 1e-4, "warmup_iters": 100,
          "max_iters": 400, "lr_decay_iters": 400, "eval_interval": 50},
    axes=(Axis("spheret_p", (0.25, 0.5, 1.0, 2.0, 4.0)), Axis("seed", (1337, 1338))),
    folder=lambda p: f"p{p['spheret_p']:g}/seed{p['seed']}",
    baseline=lambda p: p.but(spheret_p=1.0),
    columns=(Column("run", "name", align=":--"), Column("seed", "seed"), Column("val loss", "val_loss", ".3f"),
             Column("minus p=1", "gap", "+.3f"), Column("final cosine", "final_cosine", ".3f"), Column("status", "status", align=":--")),
)


def main(argv: list[str] | None = None) -> int:
    return sweep_main(P_SWEEP, argv, __doc__, "p = 1")


if __name__ == "__main__":
    sys.exit(main())
