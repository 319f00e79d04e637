"""Megatron's tensor-parallel layers (megatron/core/tensor_parallel/layers.py) on MindSpore, with megatron-core's
partitioning and parameter names.

    ColumnParallelLinear(in, out)   weight (out / tp, in), bias (out / tp): each rank computes a slice of the outputs
    RowParallelLinear(in, out)      weight (out, in / tp), bias (out) whole: partial sums, added over the TP group
    VocabParallelEmbedding(v, h)    weight (v / tp, h): each rank looks up the ids in its vocabulary range

Both linear layers return `(output, bias)` as megatron-core's do: the bias is None when it was added, or the
bias itself with `skip_bias_add=True` (the caller adds it, fused with the next op in Megatron). Parameters are
created as zeros: the caller loads its shard (see models/mcore_layout.py for the initial weights).

With `state.sequence_parallel` the activations between layers hold 1/tp of the sequence (dim 0 of [s, b, h]):
a column-parallel layer gathers the sequence first and a row-parallel layer reduce-scatters its output,
as megatron-core does.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import mint
from mindspore.common.initializer import Zero, initializer

from mmrun.backend.mindspore import nn, ops
from mmrun.backend.mindspore.parallel import mappings
from mmrun.backend.mindspore.parallel.groups import ParallelState
from mmrun.backend.errors import UsageError


def divide(value: int, parts: int, what: str) -> int:
    """value / parts, which must be whole (megatron's utils.divide, with the error saying which size)."""
    if value % parts:
        raise UsageError(f"the {what} ({value}) must be divisible by the tensor-model-parallel size ({parts})")
    return value // parts


def _zeros(*shape: int) -> ms.Parameter:
    return nn.Parameter(initializer(Zero(), shape, ms.float32).init_data())


class ColumnParallelLinear(nn.Module):
    """Y = X A^T + b with A split by rows (the outputs) over the TP group."""

    def __init__(self, input_size: int, output_size: int, state: ParallelState, bias: bool = True,
                 gather_output: bool = False, skip_bias_add: bool = False,
                 skip_weight_param_allocation: bool = False) -> None:
        super().__init__()
        tp = state.group("tp")
        self.input_size, self.output_size = input_size, output_size
        self.output_size_per_partition = divide(output_size, tp.size, "output size")
        self.weight = (None if skip_weight_param_allocation
                       else _zeros(self.output_size_per_partition, input_size))
        self.bias = _zeros(self.output_size_per_partition) if bias else None
        self.skip_bias_add = skip_bias_add
        self.gather_output = gather_output and tp.size > 1
        self.sequence_parallel = state.sequence_parallel
        self.parallel = tp.size > 1
        if self.parallel:
            self.copy_to = mappings.CopyToTensorParallelRegion(tp)
            self.gather_sequence = mappings.GatherFromSequenceParallelRegion(tp)
            self.gather = mappings.GatherFromTensorParallelRegion(tp)

    def forward(self, x, weight=None):
        """x [s, b, in] (with sequence parallelism [s / tp, b, in]) -> ([s, b, out / tp] or gathered, bias).
        `weight`: the shared word embeddings, for an output layer built with skip_weight_param_allocation."""
        if weight is None:
            weight = self.weight
        if self.parallel:
            x = self.gather_sequence(x) if self.sequence_parallel else self.copy_to(x)
        bias = None if self.skip_bias_add else self.bias
        y = ops.linear(x, weight, bias)
        if self.gather_output:
            y = self.gather(y)
        return y, (self.bias if self.skip_bias_add else None)


class RowParallelLinear(nn.Module):
    """Y = X A^T + b with A split by columns (the inputs) over the TP group; X arrives split on its last dim."""

    def __init__(self, input_size: int, output_size: int, state: ParallelState, bias: bool = True,
                 input_is_parallel: bool = True, skip_bias_add: bool = False) -> None:
        super().__init__()
        tp = state.group("tp")
        self.input_size, self.output_size = input_size, output_size
        self.input_size_per_partition = divide(input_size, tp.size, "input size")
        self.weight = _zeros(output_size, self.input_size_per_partition)
        self.bias = _zeros(output_size) if bias else None
        self.skip_bias_add = skip_bias_add
        self.input_is_parallel = input_is_parallel
        self.sequence_parallel = state.sequence_parallel
        self.parallel = tp.size > 1
        if self.parallel:
            self.scatter = mappings.ScatterToTensorParallelRegion(tp)
            self.reduce = mappings.ReduceFromTensorParallelRegion(tp)
            self.reduce_scatter = mappings.ReduceScatterToSequenceParallelRegion(tp)

    def forward(self, x):
        """x [s, b, in / tp] -> ([s, b, out] (with sequence parallelism [s / tp, b, out]), bias)."""
        if self.parallel and not self.input_is_parallel:
            x = self.scatter(x)
        y = ops.linear(x, self.weight)
        if self.parallel:
            y = self.reduce_scatter(y) if self.sequence_parallel else self.reduce(y)
        if self.skip_bias_add or self.bias is None:
            return y, self.bias
        return y + self.bias, None


class VocabParallelEmbedding(nn.Module):
    """Word embeddings split by vocabulary over the TP group: ids outside this rank's range give zero rows,
    and the sum over ranks is the lookup of the whole table."""

    def __init__(self, num_embeddings: int, embedding_dim: int, state: ParallelState) -> None:
        super().__init__()
        tp = state.group("tp")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.num_embeddings_per_partition = divide(num_embeddings, tp.size, "vocabulary size")
        self.vocab_start_index = tp.rank * self.num_embeddings_per_partition
        self.vocab_end_index = self.vocab_start_index + self.num_embeddings_per_partition
        self.weight = _zeros(self.num_embeddings_per_partition, embedding_dim)
        self.parallel = tp.size > 1
        if self.parallel:
            self.reduce = mappings.ReduceFromTensorParallelRegion(tp)

    def forward(self, ids):
        """ids [b, s] -> [b, s, h], summed over the TP group."""
        if not self.parallel:
            return ops.embedding(ids, self.weight)
        outside = mint.logical_or(ids < self.vocab_start_index, ids >= self.vocab_end_index)
        local_ids = ops.masked_fill(ids - self.vocab_start_index, outside, 0)
        rows = ops.embedding(local_ids, self.weight)
        rows = ops.masked_fill(rows, mint.unsqueeze(outside, -1), 0.0)
        return self.reduce(rows)


class ShardedDropout(nn.Module):
    """Dropout of a tensor split over the TP group on `dim` (attention heads, or the sequence with sequence
    parallelism) that draws the masks of the whole tensor and applies this rank's slice of them.

    Every rank then uses exactly the masks one process would draw for the unsplit model, so a model trains the
    same for any TP size (Megatron instead draws such masks from a per-rank stream, its model-parallel RNG
    tracker). The cost is drawing tp times the elements; with `--dropout-impl hash` the masks are a hash of
    (seed, call, element), no bigger a cost than the dropout itself.
    """

    def __init__(self, p: float, impl: str, state: ParallelState, dim: int) -> None:
        super().__init__()
        tp = state.group("tp")
        self.p, self.impl, self.dim = p, impl, dim
        self.size, self.rank = tp.size, tp.rank

    def forward(self, x):
        if self.size == 1 or not self.training or self.p == 0.0:
            return ops.dropout(x, self.p, self.training, self.impl)
        shape = list(x.shape)
        chunk = shape[self.dim]
        shape[self.dim] = chunk * self.size
        # ops.dropout of ones is keep * 1/(1-p): the factor ops.dropout multiplies x by, bit for bit.
        scale = ops.dropout(mint.ones(tuple(shape), dtype=x.dtype), self.p, True, self.impl)
        return x * mint.narrow(scale, self.dim, self.rank * chunk, chunk)
