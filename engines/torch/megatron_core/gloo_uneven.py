"""megatron-core's uneven all-gather and reduce-scatter along the first dimension, on gloo: padded to the longest part.

megatron-core 0.16's alltoall token dispatcher, with the experts split over 2+ tensor-parallel ranks, gathers the
tokens it received over the tensor-parallel group with `output_split_sizes` (each rank's count; they differ as soon
as the ranks' routed tokens do) and, in the backward and the combine, reduce-scatters them with `input_split_sizes`.
Both go through `megatron.core.tensor_parallel.mappings._gather_along_first_dim` / `_reduce_scatter_along_first_dim`,
which call `torch.distributed.all_gather` / `reduce_scatter` with a list of unequal tensors. gloo takes equal sizes
only (all_gather: "invalid tensor size"; reduce_scatter with a list: not implemented), so the run stops.

`install()` replaces those two module functions, and only those (the autograd Functions that call them,
_GatherFromSequenceParallelRegion and _ReduceScatterToSequenceParallelRegion, stay megatron-core's own and find them
by module name at call time). A call goes to the padded form only when split sizes are given and the group's backend
is gloo (equal sizes then pad nothing); every other call (no sizes, NCCL / HCCL groups) is megatron-core's own.
The padded form: each rank pads its part with zero rows to the longest part, the equal-size collective runs
(all_gather_into_tensor / reduce_scatter_tensor, which gloo has), and the parts are sliced back to their lengths.
Zero rows add nothing to a sum and are cut before anything reads them, so the numbers are the unpadded ones.

The engine installs it at set-up when the default process group is gloo (engines/torch/megatron_core/engine.py);
it is idempotent and process-wide.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

_originals: dict[str, Any] = {}


def _split_on_gloo(group: Any, sizes: Sequence[int] | None) -> bool:
    return sizes is not None and dist.get_backend(group) == "gloo"


def gather_first_dim(input_: torch.Tensor, group: Any, sizes: Sequence[int]) -> torch.Tensor:
    """Every rank's `input_` (rank r holds sizes[r] rows) joined along dim 0, through equal-size parts."""
    longest = max(int(s) for s in sizes)
    if longest == 0:  # no rank holds a row (no collective needed: every rank knows the sizes)
        return input_.new_empty((0, *input_.shape[1:]))
    padded = input_.new_zeros((longest, *input_.shape[1:]))
    padded[: input_.shape[0]] = input_
    out = input_.new_empty((longest * len(sizes), *input_.shape[1:]))
    dist.all_gather_into_tensor(out, padded.contiguous(), group=group)
    return torch.cat([out[r * longest: r * longest + int(s)] for r, s in enumerate(sizes)], dim=0)


def reduce_scatter_first_dim(input_: torch.Tensor, group: Any, sizes: Sequence[int]) -> torch.Tensor:
    """The sum over ranks of `input_`'s rows sizes[r]-part, rank r keeping part r, through equal-size parts."""
    longest = max(int(s) for s in sizes)
    if longest == 0:
        return input_.new_empty((0, *input_.shape[1:]))
    padded = input_.new_zeros((longest * len(sizes), *input_.shape[1:]))
    for r, part in enumerate(torch.split(input_, [int(s) for s in sizes], dim=0)):
        padded[r * longest: r * longest + part.shape[0]] = part
    out = input_.new_empty((longest, *input_.shape[1:]))
    dist.reduce_scatter_tensor(out, padded, group=group)
    return out[: int(sizes[group.rank()])].clone()


def _gather_along_first_dim(input_, group, output_split_sizes=None, use_global_buffer=False):
    if _split_on_gloo(group, output_split_sizes):
        return gather_first_dim(input_, group, output_split_sizes)
    return _originals["_gather_along_first_dim"](input_, group, output_split_sizes, use_global_buffer)


def _reduce_scatter_along_first_dim(input_, group, input_split_sizes=None, use_global_buffer=False):
    if _split_on_gloo(group, input_split_sizes):
        return reduce_scatter_first_dim(input_, group, input_split_sizes)
    return _originals["_reduce_scatter_along_first_dim"](input_, group, input_split_sizes, use_global_buffer)


def install() -> bool:
    """Route megatron-core's uneven first-dim gather / reduce-scatter through the padded form on gloo groups
    (module docstring). Idempotent; True when this call installed it."""
    from megatron.core.tensor_parallel import mappings

    if _originals:
        return False
    for name, replacement in (("_gather_along_first_dim", _gather_along_first_dim),
                              ("_reduce_scatter_along_first_dim", _reduce_scatter_along_first_dim)):
        _originals[name] = getattr(mappings, name)
        setattr(mappings, name, replacement)
    return True
