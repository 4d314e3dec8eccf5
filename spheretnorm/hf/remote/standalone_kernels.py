"""What model.py's classes import from spheretnorm.kernels, for the exported standalone model.

The exported model runs the reference sphere updates (model.py's SphereConnection.reference_update
and NGPT.reference_update, the spec in code), so the fused dispatch is replaced by a resolver that
always answers 'reference'. spheretnorm/hf/folder.py writes this file's functions, kernels.py's ScaleNorm
helper and compute_dtype, and the retraction table into the exported modeling file.
"""

from __future__ import annotations

import torch


def resolve_impl(impl: str, device_type: str) -> str:
    """Every sphere update of the exported model takes the reference path."""
    return "reference"


def sphere_update(*args: object, **kwargs: object) -> torch.Tensor:
    # Unreachable: resolve_impl above never selects a fused kernel.
    raise RuntimeError("The exported spheretnorm model has no fused sphere kernels; it runs the reference update.")


def ngpt_update(*args: object, **kwargs: object) -> torch.Tensor:
    # Unreachable too: nGPT's connection asks resolve_impl as the sphere connections do.
    raise RuntimeError("The exported spheretnorm model has no fused nGPT update; it runs the reference update.")
