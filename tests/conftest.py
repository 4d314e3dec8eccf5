"""Shared pytest set-up."""

import os
from collections.abc import Iterator

import pytest
import torch

# The variables a cluster user has set change what a run does (W&B's mode and names, the hub's
# offline switches, SLURM's job, torchrun's rank, the thread count). The tests set what they need
# themselves, so none of the user's may reach them or the processes they start: cleared here,
# before any test module is imported (several copy os.environ for their subprocesses then).
# .ci/run runs the tests that read such variables once more with them set.
USER_ENVIRONMENT_PREFIXES = ("WANDB_", "HF_", "TRANSFORMERS_", "SLURM_", "SBATCH_", "TORCH_", "TORCHELASTIC_")
USER_ENVIRONMENT_NAMES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                          "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")
for _name in [n for n in os.environ if n.startswith(USER_ENVIRONMENT_PREFIXES) or n in USER_ENVIRONMENT_NAMES]:
    del os.environ[_name]

if not torch.cuda.is_available():
    # The Triton kernels run on CPU tensors under the interpreter. Set before anything imports
    # triton: triton.language's own helpers (tl.maximum, ...) are decorated at that import.
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--imports", default="", metavar="MODULE[,MODULE]",
        help="spheretnorm: import these modules (train.py's imports key) before the tests are collected, so that "
             "the tests generated from the registries (CONNECTIONS, ...) cover the connections they register",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "compiled_kernels: runs the fused sphere kernels as compiled code (inductor), which takes seconds to build",
    )
    # Before collection: a test module reads the registries as it is imported (its parametrize lists).
    from spheretnorm.runtime.imports import comma_list, import_modules  # after TRITON_INTERPRET is set

    import_modules(comma_list(config.getoption("imports")), "--imports", pytest.UsageError)


@pytest.fixture(autouse=True)
def _sphere_kernels_in_eager_ops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside tests marked `compiled_kernels`, the fused sphere update runs its maths in eager ops.

    Compiling a kernel variant costs seconds on two cores and most tests build many small
    models; tests/test_sphere_kernels.py checks the compiled kernels themselves. The
    variable also reaches the train.py subprocesses that tests start.
    """
    if request.node.get_closest_marker("compiled_kernels") is None:
        monkeypatch.setenv("SPHERETNORM_EAGER_KERNELS", "1")


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Tiny matmuls on a shared two-core machine run many times faster on one thread
    (a module uses it with pytestmark = pytest.mark.usefixtures("one_thread"))."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _loss_terms_as_before() -> Iterator[None]:
    """A loss term registered during a test is unregistered after it, its module forgotten too (so
    that the next --imports of it registers it again). Every registered term's keys join every run's
    loss_params, which the checkpoint records: a term left registered by one test file (the chunked
    loss's --imports=zloss_term) made a later file's train.py subprocess, in the same xdist worker,
    refuse the checkpoint its in-process run had written ("records loss_params ['fixture_z_loss']")."""
    import sys

    from spheretnorm.runtime.loss_terms import LOSS_TERMS

    before = dict(LOSS_TERMS)
    yield
    for name in [n for n in LOSS_TERMS if n not in before]:
        module = getattr(LOSS_TERMS.pop(name), "__module__", "")
        if not module.startswith(("test_", "conftest")):  # a helper module of its own (tests/zloss_term.py), not a test file
            sys.modules.pop(module, None)
    LOSS_TERMS.update(before)
