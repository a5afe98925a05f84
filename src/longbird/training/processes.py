"""Which process this is in a multi-process run (`torchrun` / `accelerate launch`): only the first writes outputs."""

from __future__ import annotations

import atexit
import os

import torch


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def is_main_process() -> bool:
    """False in every process but the first of a `torchrun` / `accelerate launch` run: only the first writes the
    outputs (all of them train; Trainer saves checkpoints from the first only). Before Trainer has set up the process
    group (checkpoints are prepared before), the launcher's RANK says which process this is."""
    if _distributed():
        return torch.distributed.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"


def world_size() -> int:
    """Processes training together (1 without torchrun / accelerate launch); recorded in the run's summary. Before
    Trainer has set up the process group (the memorisation check runs before), the launcher's WORLD_SIZE says (set
    with LOCAL_RANK by torchrun and accelerate launch; alone, as some job schedulers export it, it is not trusted)."""
    if _distributed():
        return torch.distributed.get_world_size()
    launched = os.environ.get("LOCAL_RANK") is not None and os.environ.get("WORLD_SIZE", "").isdigit()
    return int(os.environ["WORLD_SIZE"]) if launched else 1


def agreed_across_processes(value: float) -> float:
    """The largest `value` of all processes of a `torch.distributed` run (each calls this at the same point); `value`
    itself in a single process."""
    if not _distributed() or world_size() == 1:
        return value
    dist = torch.distributed
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    largest = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    return float(largest.item())


def leave_the_group_at_exit() -> None:
    """Under torchrun: end the process group when the process exits, before the interpreter tears down the objects
    that hold its threads (a process left to that once aborted at exit in C++, "terminate called without an active
    exception", after a run that had saved its model: torchrun then reported the run as failed). Registered once
    however many runs the process finishes."""
    if _distributed():
        atexit.unregister(_leave_the_group)
        atexit.register(_leave_the_group)


def _leave_the_group() -> None:
    if _distributed():
        torch.distributed.destroy_process_group()
