"""The process group: joining it under torchrun, rank-0 printing, and the few collectives the
loop, the validation loss and the checkpoints share."""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist

from spheretnorm.runtime.run_folder import RunStopped


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_master(self) -> bool:
        return self.rank == 0


def init_distributed(backend: str | None = None, timeout_s: float | None = None) -> DistInfo:
    """Join the process group when launched by torchrun (RANK set), else single process; timeout_s
    bounds every collective (and NCCL's watchdog) instead of torch's default 30 minutes."""
    if int(os.environ.get("RANK", -1)) == -1:
        return DistInfo()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    timeout = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s else {}
    torch.distributed.init_process_group(backend=backend, **timeout)
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size)


def leave_process_group(error: BaseException | None) -> None:
    """Leave the process group (if joined); after a run's end or a stop that every rank took
    together, all at once: at a barrier bounded by dist_timeout.

    A launcher that sees one worker leave with an error ends the others (torchrun's SIGTERM), so
    rank 0 could be killed while it says why a shared stop (RunStopped.shared) happened. After a
    finished run, so that no rank tears its connections down while rank 0 still works: one 4-rank
    gloo run in about fifty died in the teardown after "Done" (SIGABRT; this narrows a window, it is
    not a proven cure). A rank's own failure leaves at once: its peers may never reach the barrier.
    """
    if not torch_dist.is_initialized():
        return
    together = error is None or (isinstance(error, RunStopped) and error.shared)
    if together and torch_dist.get_world_size() > 1:
        with contextlib.suppress(RuntimeError):  # a peer gone since: the stop is said all the same
            torch_dist.barrier()
    torch_dist.destroy_process_group()


def report_stop(error: RunStopped, rank: int | None = None) -> int:
    """Print a stopped run's one `error:` line and return its exit status: a shared stop by rank 0
    alone (the others lack the diagnostics rank 0 words it with), a rank's own failure by that rank."""
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank  # set by torchrun
    if rank == 0 or not error.shared:
        print(f"error: {error}", file=sys.stderr, flush=True)
    return error.exit_code


def print0(*args, **kwargs) -> None:
    """print on rank 0 only."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(*args, **kwargs)


def all_reduce_sum(t: torch.Tensor, dist: DistInfo) -> torch.Tensor:
    """`t` summed over the ranks, in place (no-op on one process)."""
    if dist.enabled:
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.SUM)
    return t


def every_rank(value: Any) -> list[Any]:
    """`value` of every rank, by rank (a collective: every rank calls it); [value] alone (no process
    group, or one rank)."""
    if not (torch_dist.is_initialized() and torch_dist.get_world_size() > 1):
        return [value]
    gathered: list[Any] = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(gathered, value)
    return gathered


def any_rank(flag: bool, dist: DistInfo, device: str) -> bool:
    """Whether `flag` holds on any rank (every rank must call this together)."""
    if not dist.enabled:
        return flag
    return all_reduce_sum(torch.tensor(float(flag), device=device), dist).item() > 0
