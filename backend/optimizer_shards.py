"""Framework-neutral shard arithmetic of the distributed optimizer (ZeRO-1): which part of the flat fp32
buffer of all trained parameters each data-parallel rank updates.

As megatron-core's DistributedOptimizer lays it out: the parameters, flattened in the optimizer's order, make one
buffer of `total` elements, padded at the end to a multiple of the data-parallel size; rank r owns the
contiguous range [r * shard, (r + 1) * shard) of it, and keeps Adam's moments (and an fp32 main copy) for that
range only. A parameter may straddle two ranks; the padding belongs to the last rank(s) and is never updated.

    layout = ShardLayout.build([3, 5, 4], dp=2)    # 12 elements -> shard 6
    layout.segments(0)   # (Segment(param=0, start=0, stop=3, offset=0), Segment(param=1, start=0, stop=3, offset=3))
    layout.segments(1)   # (Segment(param=1, start=3, stop=5, offset=0), Segment(param=2, start=0, stop=4, offset=2))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Segment:
    """Elements [start, stop) of parameter `param` (flattened), at `offset` in the rank's shard."""
    param: int
    start: int
    stop: int
    offset: int

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class ShardLayout:
    sizes: tuple[int, ...]  # elements per parameter, in the optimizer's order
    dp: int  # data-parallel ranks

    @classmethod
    def build(cls, sizes: Sequence[int], dp: int) -> "ShardLayout":
        if dp < 1:
            raise ValueError(f"the data-parallel size must be 1 or more. Received: {dp}")
        if any(int(s) < 0 for s in sizes):
            raise ValueError(f"parameter sizes must be 0 or more. Received: {list(sizes)}")
        return cls(tuple(int(s) for s in sizes), int(dp))

    @property
    def total(self) -> int:
        """Elements of every parameter together (the unpadded flat buffer)."""
        return sum(self.sizes)

    @property
    def shard(self) -> int:
        """Elements per rank: total rounded up to a multiple of dp, divided by dp (at least 1)."""
        return max(1, -(-self.total // self.dp))

    @property
    def padded(self) -> int:
        """The flat buffer's length with its padding: shard x dp."""
        return self.shard * self.dp

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where each parameter starts in the flat buffer."""
        out, at = [], 0
        for size in self.sizes:
            out.append(at)
            at += size
        return tuple(out)

    def owned(self, rank: int) -> tuple[int, int]:
        """[begin, end) of the flat buffer rank `rank` owns (padding included)."""
        if not 0 <= rank < self.dp:
            raise ValueError(f"rank must be in [0, {self.dp}). Received: {rank}")
        return rank * self.shard, (rank + 1) * self.shard

    def segments(self, rank: int) -> tuple[Segment, ...]:
        """The pieces of parameters in rank `rank`'s shard, in order; they tile [0, used(rank)) of the shard."""
        begin, end = self.owned(rank)
        out = []
        for i, (offset, size) in enumerate(zip(self.offsets, self.sizes)):
            lo, hi = max(offset, begin), min(offset + size, end)
            if lo < hi:
                out.append(Segment(i, lo - offset, hi - offset, lo - begin))
        return tuple(out)

    def used(self, rank: int) -> int:
        """Elements of rank `rank`'s shard that hold parameters (the rest is padding)."""
        return sum(s.size for s in self.segments(rank))
