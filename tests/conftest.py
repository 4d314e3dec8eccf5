"""Shared pytest set-up."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "inductor: runs the fused sphere kernels compiled by torch.compile (seconds per kernel variant)",
    )


@pytest.fixture(autouse=True)
def _sphere_kernels_in_eager_ops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside tests marked `inductor`, the fused sphere update runs its maths in eager ops.

    Compiling a kernel variant costs seconds on two cores and most tests build many small
    models; tests/test_sphere_kernels.py checks the compiled kernels themselves. The
    variable also reaches the train.py subprocesses that tests start.
    """
    if request.node.get_closest_marker("inductor") is None:
        monkeypatch.setenv("SPHERETNORM_NO_INDUCTOR", "1")
