"""spheretnorm: GPT models whose hidden states live on a hypersphere (arXiv 2608.02668).

The library behind the commands at the repository's top level (train.py, sample.py, bench.py,
data/prepare.py, eval/, scripts/). The model and its deep connections are in
``spheretnorm.model``; docs/ARCHITECTURE.md says where everything else lives.
"""
