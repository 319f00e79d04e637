"""Process groups and the collectives training needs, on torch.distributed.

One signature on both frameworks: collectives return a new tensor and leave their input alone, and
in a single process (no group) they are the identity, so a script runs unchanged with or without a
launcher.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from mmrun.backend import checks, object_codec, rank_env
from mmrun.backend.errors import DistributedNotInitializedError
from mmrun.backend.torch import device, process_group


def init_distributed(backend: str | None = None, *, single_process_group: bool = False) -> None:
    """Create the default process group when the world size is above 1 (no-op when one exists).

    `single_process_group=True` also creates a one-rank group when there is no launcher, for
    libraries that insist on torch.distributed being initialised (megatron-core's parallel_state).
    torch's default wait bound; the trainer sets Megatron's --distributed-timeout-minutes through
    process_group.start() (torch only) before this runs.
    """
    process_group.start(backend, single_process_group=single_process_group)


def destroy_distributed() -> None:
    """Tear the process group down (torch warns at exit about groups left alive)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def is_initialized() -> bool:
    return dist.is_initialized()


def backend_name() -> str:
    """The process group's backend, or the one init_distributed() would pick on this device."""
    return str(dist.get_backend()) if dist.is_initialized() else device.detect().dist_backend


def get_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else rank_env.read_rank_info().rank


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else rank_env.read_rank_info().world_size


def _grouped() -> bool:
    """True when collectives must talk to other ranks; an error if they should but cannot."""
    if dist.is_initialized():
        return True
    info = rank_env.read_rank_info()
    if info.world_size > 1:
        raise DistributedNotInitializedError(
            f"a collective was called on rank {info.rank} of {info.world_size} before the process group "
            "exists; call mmrun.backend.init_distributed() first"
        )
    return False


def all_reduce(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Sum or mean over ranks, as a new tensor (mean is always floating point, even in one process)."""
    checks.reduce_op(op)
    out = x.clone()
    world = 1
    if _grouped():
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        world = dist.get_world_size()
    # mean = sum / world: ReduceOp.AVG exists only for NCCL, and one code path keeps ranks identical.
    return out / world if op == "mean" else out


def broadcast(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Rank `src`'s value on every rank, as a new tensor."""
    out = x.clone()
    if _grouped():
        dist.broadcast(out, src=src)
    return out


def barrier() -> None:
    if _grouped():
        dist.barrier()


def _comm_device() -> torch.device:
    # gloo moves CPU tensors; nccl and hccl only device tensors.
    return torch.device("cpu") if backend_name() == "gloo" else device.default_device()


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj` (JSON values), in rank order. Built from two tensor all_gathers, without pickle."""
    payload = object_codec.encode(obj)
    if not _grouped():
        return [object_codec.decode(payload)]
    where = _comm_device()
    world = dist.get_world_size()
    size = torch.tensor([payload.size], dtype=torch.int64, device=where)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    longest = int(max(int(s.item()) for s in sizes))
    padded = np.zeros(longest, dtype=np.uint8)
    padded[: payload.size] = payload
    chunks = [torch.zeros(longest, dtype=torch.uint8, device=where) for _ in range(world)]
    dist.all_gather(chunks, torch.from_numpy(padded).to(where))
    return [object_codec.decode(c.cpu().numpy()[: int(s.item())]) for c, s in zip(chunks, sizes)]


# ------------------------------------------------------------------------- groups of ranks (expert parallelism)
class _Group:  # private: the backends' faces match (MindSpore's twin is parallel.groups.Group)
    """One communication group as this rank sees it: its ranks, this process's index in them, torch's handle
    (None when the group is this rank alone). The MindSpore backend's twin is parallel.groups.Group."""

    def __init__(self, ranks: tuple[int, ...], rank: int, handle: Any) -> None:
        self.ranks, self.rank, self.handle = ranks, rank, handle

    @property
    def size(self) -> int:
        return len(self.ranks)


_subgroups: dict[tuple[int, ...], Any] = {}


def subgroup(partition: Any) -> _Group:
    """This rank's group among `partition` (lists of ranks covering the world, each rank in one), created on first
    use. Every rank calls it with the same partition: torch's new_group must be entered by every process."""
    rank = get_rank()
    for ranks in partition:
        key = tuple(int(r) for r in ranks)
        if len(key) > 1 and key not in _subgroups and _grouped():
            _subgroups[key] = None if len(key) == get_world_size() else dist.new_group(list(key))
    mine = next(tuple(int(r) for r in ranks) for ranks in partition if rank in ranks)
    return _Group(mine, mine.index(rank), _subgroups.get(mine))  # handle None: the world (torch's default) or alone


def group_all_reduce(x: torch.Tensor, group: _Group) -> torch.Tensor:
    """The sum of `x` over `group`, as a new tensor (not differentiable; the identity in a group of one)."""
    out = x.clone()
    if group.size > 1:
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group.handle)
    return out


def _gather(x: torch.Tensor, group: _Group) -> torch.Tensor:
    pieces = [torch.empty_like(x) for _ in range(group.size)]
    dist.all_gather(pieces, x.contiguous(), group=group.handle)
    return torch.cat(pieces, dim=0)


def _sum_own_rows(x: torch.Tensor, group: _Group) -> torch.Tensor:
    # gloo has no reduce-scatter: the sum over the group, of which this rank keeps its rows (the same numbers)
    if backend_name() != "gloo":
        out = torch.empty((x.shape[0] // group.size, *x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(out, x.contiguous(), group=group.handle)
        return out
    return group_all_reduce(x, group).chunk(group.size, dim=0)[group.rank].contiguous()


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        ctx.group = group
        return _gather(x, group)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _sum_own_rows(grad, ctx.group), None


class _ReduceScatterRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        ctx.group = group
        return _sum_own_rows(x, group)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _gather(grad, ctx.group), None


def gather_rows(x: torch.Tensor, group: _Group) -> torch.Tensor:
    """Every group member's `x` (the same shape on each), concatenated along dim 0 in group order; differentiable:
    the backward sums the gradient over the group and keeps this rank's rows (megatron-core's
    gather_from_sequence_parallel_region over the expert group: its allgather token dispatcher)."""
    return x if group.size == 1 else _GatherRows.apply(x, group)


def reduce_scatter_rows(x: torch.Tensor, group: _Group) -> torch.Tensor:
    """The sum of `x` over the group, of which this rank keeps its share of dim 0 (rank order); differentiable:
    the backward gathers the gradient (megatron-core's reduce_scatter_to_sequence_parallel_region)."""
    return x if group.size == 1 else _ReduceScatterRows.apply(x, group)
