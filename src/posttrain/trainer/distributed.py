"""The few data-parallel collectives the trainer needs, as no-ops when running alone.

The trainer does not wrap the model in DistributedDataParallel: it all-reduces gradients itself
once per optimizer step, after every micro-batch has been accumulated. That is what lets ranks
hold different numbers of rows and tokens (and hence different numbers of micro-batches) while
still producing the single-process gradient.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def collective_device() -> torch.device:
    """gloo reduces CPU tensors; nccl needs them on this rank's current GPU."""
    if is_distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_floats(values: Sequence[float], op: str = "sum") -> list[float]:
    """Reduce python scalars over ranks in float64 (so sums of weights stay exact integers)."""
    if not is_distributed():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=collective_device())
    ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    dist.all_reduce(t, op=ops[op])
    return t.cpu().tolist()


def all_reduce_grads_(params: Iterable[nn.Parameter]) -> None:
    """Sum every parameter's ``.grad`` over ranks, one flat buffer per (dtype, device)."""
    if not is_distributed():
        return
    groups: dict[tuple[torch.dtype, torch.device], list[Tensor]] = {}
    for p in params:
        assert p.grad is not None, "gradients must be materialised before the all-reduce"
        groups.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
    for grads in groups.values():
        flat = torch.cat([g.reshape(-1) for g in grads]).to(collective_device())
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n


@torch.no_grad()
def broadcast_module_(module: nn.Module, src: int = 0) -> None:
    """Make every rank start from rank ``src``'s parameters and buffers."""
    if not is_distributed():
        return
    dev = collective_device()
    for t in list(module.parameters()) + list(module.buffers()):
        moved = t.data.to(dev)
        dist.broadcast(moved, src=src)
        t.data.copy_(moved.to(t.device))
