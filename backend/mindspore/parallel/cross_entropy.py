"""Megatron's vocab-parallel cross entropy (megatron/core/tensor_parallel/cross_entropy.py) on MindSpore.

Each TP rank holds the logits of its slice of the vocabulary. As in Megatron:

    max      = max over ranks of the local max           (no gradient: the loss does not depend on it)
    shifted  = logits - max
    target   = shifted[label] on the rank whose range holds the label, 0 elsewhere, summed over ranks
    loss     = log(sum over ranks of sum(exp(shifted))) - target

The two sums are Megatron's g region (all-reduce forward, identity backward), so each rank's gradient is
softmax - one_hot for its own slice, which is what Megatron's hand-written backward computes. The max over
ranks is an all-gather of the local maxima (MindSpore 2.10's AllReduce on CPU has no MAX: "AllReduce only
support reduce sum on CPU").
"""
from __future__ import annotations

import mindspore as ms
from mindspore import mint
from mindspore import ops as _ops

from mmrun.backend.mindspore import ops
from mmrun.backend.mindspore.parallel import mappings
from mmrun.backend.mindspore.parallel.groups import ParallelState
from mmrun.backend.mindspore.parallel.layers import divide


class VocabParallelCrossEntropy(ms.nn.Cell):
    """Per-token loss from vocab-parallel logits [s, b, v / tp] and labels [s, b] (any leading shape)."""

    def __init__(self, vocab_size: int, state: ParallelState) -> None:
        super().__init__()
        tp = state.group("tp")
        self.partition_vocab_size = divide(vocab_size, tp.size, "vocabulary size")
        self.vocab_start_index = tp.rank * self.partition_vocab_size
        self.vocab_end_index = self.vocab_start_index + self.partition_vocab_size
        self.parallel = tp.size > 1
        if self.parallel:
            self.reduce = mappings.ReduceFromTensorParallelRegion(tp)
            self.gather = mappings.GatherFromTensorParallelRegion(tp)

    def construct(self, logits, target):
        logits = _ops.cast(logits, ms.float32)
        local_max = mint.max(logits, dim=-1)[0]
        if self.parallel:
            local_max = mint.max(self.gather(mint.unsqueeze(local_max, -1)), dim=-1)[0]
        shifted = logits - mint.unsqueeze(_ops.stop_gradient(local_max), -1)
        if self.parallel:
            outside = mint.logical_or(target < self.vocab_start_index, target >= self.vocab_end_index)
            local_target = ops.masked_fill(target - self.vocab_start_index, outside, 0)
        else:
            local_target = target
        predicted = mint.squeeze(mint.gather(shifted, -1, mint.unsqueeze(local_target, -1)), -1)
        sum_exp = mint.sum(mint.exp(shifted), -1)
        if self.parallel:
            predicted = self.reduce(ops.masked_fill(predicted, outside, 0.0))
            sum_exp = self.reduce(sum_exp)
        return mint.log(sum_exp) - predicted
