"""Communication and the collectives training needs, on mindspore.communication.

Same signatures as mmrun.backend.torch.distributed: collectives return a new tensor and leave their
input alone, and in a single process they are the identity. Only collectives measured to work on
MindSpore CPU (mccl) are used: mint.distributed all_reduce, all_gather to a list, broadcast and
barrier (all_gather_into_tensor, reduce_scatter and send/recv fail there, and one failed collective
desynchronises the ranks for the rest of the job).
"""
from __future__ import annotations

import sys
from typing import Any

import mindspore
import mindspore.communication as comm
import mindspore.mint.distributed as mdist
import numpy as np
from mindspore.communication import GlobalComm

from mmrun.backend import checks, object_codec, rank_env
from mmrun.backend.errors import DistributedNotInitializedError, warn_once
from mmrun.backend.mindspore import device


_released = False  # communication.release() leaves GlobalComm.INITED set; remember it here


def _initialized() -> bool:
    # mint.distributed.is_initialized() stays False after communication.init(), which is the call
    # that works on CPU (mint's init_process_group does not), so ask the communication module.
    return bool(GlobalComm.INITED) and not _released


def init_distributed(backend: str | None = None, *, single_process_group: bool = False) -> None:
    """Start communication under msrun (any world size) or 2+ processes; in msrun's scheduler, be the scheduler.

    msrun runs the script once more than there are workers, in a scheduler process (MS_ROLE=MS_SCHED).
    There `communication.init()` serves the workers until the job ends and does not return; the exit
    below makes sure the training body after this call can never run in the scheduler. The scheduler
    always serves, even for one worker: the worker's script may call `communication.init()` itself
    (MindSpeed-style code does), and it would wait forever for a scheduler that left. So every msrun
    worker registers too, even alone (mmrun's bootstrap also registers workers whose script never did).
    Idempotent, also after destroy_distributed(): a second init() would wait for a scheduler that is gone.
    """
    info = rank_env.read_rank_info()
    if info.is_scheduler:
        comm.init()
        sys.exit(0)
    if GlobalComm.INITED:
        return
    if info.world_size <= 1 and info.scheme != "msrun":
        # A lone process without msrun must not call init(): it raises RuntimeError.
        if single_process_group:
            warn_once("single_process_group is ignored with mindspore: communication needs msrun and 2+ workers")
        return
    # For the notice only: init() picks hccl, nccl or mccl from the device itself.
    checks.dist_backend("mindspore", device.detect().kind, backend)
    comm.init()
    device._bind_cores_after_init()
    if device.detect().kind == "cpu" and get_world_size() > 1:
        # mccl sets its collectives up on the first one, and a rank that gets there before the others polls
        # every 3 s (mindspore 2.10: waits of 0 to 6 s seen): do it here, at start-up, not in the first step.
        barrier()


def destroy_distributed() -> None:
    global _released
    if _initialized():
        comm.release()
        _released = True


def is_initialized() -> bool:
    return _initialized()


def backend_name() -> str:
    # Not mdist.get_backend(): after init() on CPU it wrongly reports hccl (measured, mindspore 2.10).
    return device.detect().dist_backend


def get_rank() -> int:
    return int(comm.get_rank()) if _initialized() else rank_env.read_rank_info().rank


def get_world_size() -> int:
    return int(comm.get_group_size()) if _initialized() else rank_env.read_rank_info().world_size


def _grouped() -> bool:
    """True when collectives must talk to other ranks; an error if they should but cannot."""
    if _initialized():
        return True
    info = rank_env.read_rank_info()
    if info.world_size > 1:
        raise DistributedNotInitializedError(
            f"a collective was called on rank {info.rank} of {info.world_size} before communication was "
            "initialised; call mmrun.backend.init_distributed() first"
        )
    return False


def all_reduce(x: mindspore.Tensor, op: str = "sum") -> mindspore.Tensor:
    """Sum or mean over ranks, as a new tensor (mean is always floating point, even in one process)."""
    checks.reduce_op(op)
    out = x.copy()  # mint.clone has no CPU kernel; Tensor.copy does
    world = 1
    if _grouped():
        mdist.all_reduce(out, op="sum")
        world = get_world_size()
    # mean = sum / world: one code path on every backend and both frameworks.
    return out / world if op == "mean" else out


def broadcast(x: mindspore.Tensor, src: int = 0) -> mindspore.Tensor:
    """Rank `src`'s value on every rank, as a new tensor."""
    out = x.copy()
    if _grouped():
        mdist.broadcast(out, src)
    return out


def barrier() -> None:
    if not _grouped():
        return
    if device.detect().kind == "cpu":
        # mint.distributed.barrier works on CPU but ends with runtime.synchronize(), which logs
        # "[ERROR] CPU device is not supported" on every call (mindspore 2.10). A blocking all_reduce
        # of one number is a barrier too: no rank leaves it before every rank has entered it.
        mdist.all_reduce(mindspore.Tensor(np.zeros(1, dtype=np.float32)), op="sum")
    else:
        mdist.barrier()


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj` (JSON values), in rank order.

    Built from two all_gathers to a list rather than mint.distributed.all_gather_object, which
    pickles: the same JSON encoding as the torch backend, and no unpickling of peer data.
    """
    payload = object_codec.encode(obj)
    if not _grouped():
        return [object_codec.decode(payload)]
    world = get_world_size()
    size = mindspore.Tensor(np.array([payload.size], dtype=np.int32))
    sizes = [mindspore.Tensor(np.zeros(1, dtype=np.int32)) for _ in range(world)]
    mdist.all_gather(sizes, size)
    lengths = [int(s.asnumpy()[0]) for s in sizes]
    padded = np.zeros(max(lengths), dtype=np.uint8)
    padded[: payload.size] = payload
    chunks = [mindspore.Tensor(np.zeros(max(lengths), dtype=np.uint8)) for _ in range(world)]
    mdist.all_gather(chunks, mindspore.Tensor(padded))
    return [object_codec.decode(c.asnumpy()[:n]) for c, n in zip(chunks, lengths)]


# ------------------------------------------------------------------------- groups of ranks (expert parallelism)
def subgroup(partition: Any) -> Any:
    """This rank's group among `partition` (lists of ranks covering the world, each rank in one), created on first
    use (MindSpore's create_group, by the members only), as parallel.groups.Group: ranks, rank, size, name."""
    from mmrun.backend.mindspore.parallel import groups

    rank = get_rank()
    mine = next([int(r) for r in ranks] for ranks in partition if rank in ranks)
    world_name = GlobalComm.WORLD_COMM_GROUP if _initialized() else "world"
    name = groups._group_name(mine, get_world_size(), world_name)
    if name is not None and name != world_name and name not in groups._created:
        comm.create_group(name, mine)
        groups._created.add(name)
    return groups.Group(tuple(mine), mine.index(rank), name)


def group_all_reduce(x: mindspore.Tensor, group: Any) -> mindspore.Tensor:
    """The sum of `x` over `group`, as a new tensor (not differentiable; the identity in a group of one)."""
    out = x.copy()
    if group.name is not None:
        mdist.all_reduce(out, op="sum", group=group.name)
    return out


_primitives: dict[tuple[str, str], Any] = {}


def _primitive(kind: str, group: Any) -> Any:
    """ops.AllReduce / AllGather / ReduceScatter over `group`, made once. Their own derivatives are what an
    expert dispatch needs (each rank's loss is its own, summed over ranks): AllReduce's is an all-reduce of the
    gradient, AllGather's a reduce-scatter, ReduceScatter's an all-gather; no custom bprop (a Cell with a bprop
    fails under MindSpore's recompute in PyNative: "Stack input_args_info_stack_ is empty", 2.10)."""
    from mindspore import ops as _ops

    key = (kind, group.name)
    if key not in _primitives:
        make = {"all_reduce": lambda: _ops.AllReduce(_ops.ReduceOp.SUM, group.name),
                "all_gather": lambda: _ops.AllGather(group.name),
                "reduce_scatter": lambda: _ops.ReduceScatter(_ops.ReduceOp.SUM, group.name)}[kind]
        _primitives[key] = make()
    return _primitives[key]


def _emulated() -> bool:
    # MindSpore 2.10's CPU collectives (mccl): AllGather on the world group only, no ReduceScatter kernel. There an
    # all-gather is an all-reduce of a buffer holding x in this rank's slot and zeros elsewhere (adding zeros is
    # exact), a reduce-scatter an all-reduce of which this rank keeps its slice (the same numbers).
    return device.detect().kind == "cpu"


def gather_rows(x: mindspore.Tensor, group: Any) -> mindspore.Tensor:
    """Every group member's `x` (the same shape on each), concatenated along dim 0 in group order; differentiable:
    the backward sums the gradient over the group and keeps this rank's rows (megatron-core's allgather dispatch)."""
    if group.size == 1:
        return x
    if _emulated():
        zeros = mindspore.ops.zeros_like(x)  # mint.zeros_like has no CPU kernel
        return _primitive("all_reduce", group)(mindspore.mint.cat([x if i == group.rank else zeros
                                                                   for i in range(group.size)]))
    return _primitive("all_gather", group)(x)


def reduce_scatter_rows(x: mindspore.Tensor, group: Any) -> mindspore.Tensor:
    """The sum of `x` over the group, of which this rank keeps its share of dim 0 (rank order); differentiable:
    the backward gathers the gradient."""
    if group.size == 1:
        return x
    if _emulated():
        rows = x.shape[0] // group.size
        return mindspore.mint.narrow(_primitive("all_reduce", group)(x), 0, group.rank * rows, rows)
    return _primitive("reduce_scatter", group)(x)
