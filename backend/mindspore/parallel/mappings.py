"""Megatron's tensor- and sequence-parallel regions (megatron/core/tensor_parallel/mappings.py) as MindSpore
cells with a custom `bprop`.

A collective inside a forward pass needs its own backward rule: MindSpore differentiates a raw `AllReduce`
into another all-reduce, which multiplies gradients by the group size (measured, docs/parallelism-mindspore.md).
So, as Megatron's autograd Functions do, each region states its backward explicitly:

    region                                  forward                      backward
    CopyToTensorParallelRegion   (f)        identity                     all-reduce
    ReduceFromTensorParallelRegion (g)      all-reduce                   identity
    ScatterToTensorParallelRegion           keep own slice, last dim     all-gather, last dim
    GatherFromTensorParallelRegion          all-gather, last dim         keep own slice
    ScatterToSequenceParallelRegion         keep own slice, dim 0        all-gather, dim 0
    GatherFromSequenceParallelRegion        all-gather, dim 0            reduce-scatter, dim 0 (or own slice)
    ReduceScatterToSequenceParallelRegion   reduce-scatter, dim 0        all-gather, dim 0

Collectives on MindSpore 2.10 CPU (mccl, measured): `AllReduce` (sum only) works on any group; `AllGather`
works only on the world group ("AllGather only support mccl_world_group on CPU"); `ReduceScatter` has no
kernel. On CPU an all-gather is therefore an all-reduce of a buffer in which each rank fills its own slot with
its tensor and the others with zeros (adding zeros is exact: the same values), and a reduce-scatter is an
all-reduce followed by keeping this rank's slice (the same values, tp times the traffic of a reduce-scatter).
Ascend and GPU use `AllGather` and `ReduceScatter` themselves.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import mint
from mindspore import ops as _ops

from mmrun.backend.mindspore import device
from mmrun.backend.mindspore.parallel.groups import Group

# MindSpore's device is process-wide: a module constant that compiled graphs read as a constant.
EMULATED_COLLECTIVES = device.detect().kind == "cpu"


def _take(x, dim: int, size: int, rank: int):
    """This rank's slice of `x` along `dim`. mint.narrow: ops.split inside a bprop fails to compile under jit
    ("The func graph is empty", MindSpore 2.10); a view is safe here, no gradient flows through a region's ops."""
    chunk = x.shape[dim] // size
    return mint.narrow(x, dim, rank * chunk, chunk)


def _gather_all(all_reduce, all_gather, x, dim: int, size: int, rank: int):
    """Every rank's `x`, concatenated along `dim` in rank order."""
    if EMULATED_COLLECTIVES:
        zeros = _ops.zeros_like(x)  # mint.zeros_like has no CPU kernel (ZerosLikeExt)
        return all_reduce(mint.cat([x if i == rank else zeros for i in range(size)], dim))
    stacked = all_gather(_ops.expand_dims(x, 0))  # AllGather concatenates on dim 0: (size, *x.shape)
    return mint.cat([stacked[i] for i in range(size)], dim)


def _reduce_scatter_all(all_reduce, reduce_scatter, x, size: int, rank: int):
    """The sum over ranks of `x`, of which this rank keeps its slice along dim 0."""
    if EMULATED_COLLECTIVES:
        return _take(all_reduce(x), 0, size, rank)
    return reduce_scatter(x)


class _Region(ms.nn.Cell):
    """A region over one group; in a group of one it is the identity both ways."""

    def __init__(self, group: Group) -> None:
        super().__init__()
        self.size, self.rank = group.size, group.rank
        name = group.name
        self.all_reduce = _ops.AllReduce(_ops.ReduceOp.SUM, name) if name else None
        self.all_gather = _ops.AllGather(name) if name and not EMULATED_COLLECTIVES else None
        self.reduce_scatter = (_ops.ReduceScatter(_ops.ReduceOp.SUM, name)
                               if name and not EMULATED_COLLECTIVES else None)

    # Not named like the module functions: under jit a method's body resolves such a name to the method.
    def _gather(self, x, dim):
        return _gather_all(self.all_reduce, self.all_gather, x, dim, self.size, self.rank)

    def _reduce_scatter(self, x):
        return _reduce_scatter_all(self.all_reduce, self.reduce_scatter, x, self.size, self.rank)


class CopyToTensorParallelRegion(_Region):
    """Megatron's f: the input of a column-parallel layer; its gradient is summed over the TP group."""

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        return (self.all_reduce(dout),)


class ReduceFromTensorParallelRegion(_Region):
    """Megatron's g: the output of a row-parallel layer, summed over the TP group; the gradient passes through."""

    def construct(self, x):
        return self.all_reduce(x)

    def bprop(self, x, out, dout):
        return (dout,)


class ScatterToTensorParallelRegion(_Region):
    """Keep this rank's slice of the last dim; the backward gathers the gradient's slices."""

    def construct(self, x):
        return _take(x, x.ndim - 1, self.size, self.rank)

    def bprop(self, x, out, dout):
        return (self._gather(dout, dout.ndim - 1),)


class GatherFromTensorParallelRegion(_Region):
    """Concatenate the ranks' slices on the last dim (gather_output=True); the backward keeps this rank's slice."""

    def construct(self, x):
        return self._gather(x, x.ndim - 1)

    def bprop(self, x, out, dout):
        return (_take(dout, dout.ndim - 1, self.size, self.rank),)


class ScatterToSequenceParallelRegion(_Region):
    """Sequence parallelism: keep this rank's part of the sequence (dim 0 of [s, b, h])."""

    def construct(self, x):
        return _take(x, 0, self.size, self.rank)

    def bprop(self, x, out, dout):
        return (self._gather(dout, 0),)


class GatherFromSequenceParallelRegion(_Region):
    """The whole sequence from every rank's part, before a column-parallel layer. Its backward is a
    reduce-scatter when the consumer is tensor-parallel (each rank holds a partial gradient), else a split."""

    def __init__(self, group: Group, tensor_parallel_output_grad: bool = True) -> None:
        super().__init__(group)
        self.tensor_parallel_output_grad = tensor_parallel_output_grad

    def construct(self, x):
        return self._gather(x, 0)

    def bprop(self, x, out, dout):
        if self.tensor_parallel_output_grad:
            return (self._reduce_scatter(dout),)
        return (_take(dout, 0, self.size, self.rank),)


class ReduceScatterToSequenceParallelRegion(_Region):
    """Sequence parallelism: the output of a row-parallel layer, summed over ranks, each keeping its part of
    the sequence; the backward gathers the gradient."""

    def construct(self, x):
        return self._reduce_scatter(x)

    def bprop(self, x, out, dout):
        return (self._gather(dout, 0),)
