"""Which samples each data-parallel rank reads, and stacking them into micro-batches.

Megatron's rule (`MegatronPretrainingSampler`): the dataset order is global and fixed; samples are
consumed in groups of `micro_batch_size * data_parallel_size`, and rank r takes the r-th
`micro_batch_size` slice of each group. A global batch (`global_batch_size` consecutive samples)
is therefore the same set, in the same order, for every data-parallel size, which is what makes a
DP=2 run's losses equal a DP=1 run's with the same global batch. Resuming passes the checkpoint's
`consumed_samples`; nothing else needs saving.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from mmrun.data.gpt_dataset import DatasetConfigError


class MegatronPretrainingSampler:
    """Yields, for one data-parallel rank, the sample indices of each of its micro-batches."""

    def __init__(
        self,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        drop_last: bool = True,
    ) -> None:
        problems = [
            (total_samples <= 0, f"the dataset has no samples to consume (total_samples={total_samples})"),
            (not 0 <= consumed_samples < total_samples,
             f"consumed_samples={consumed_samples} leaves nothing of the {total_samples} samples; "
             "train for fewer iterations or use more data"),
            (micro_batch_size <= 0, f"--micro-batch-size must be positive. Received: {micro_batch_size}"),
            (data_parallel_size <= 0, f"the data-parallel size must be positive. Received: {data_parallel_size}"),
            (not 0 <= data_parallel_rank < max(data_parallel_size, 1),
             f"data-parallel rank {data_parallel_rank} is outside a data-parallel size of {data_parallel_size}"),
        ]
        for bad, message in problems:
            if bad:
                raise DatasetConfigError(message + ".")
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.drop_last = drop_last

    def __len__(self) -> int:
        return self.total_samples

    def __iter__(self) -> Iterator[list[int]]:
        group = self.micro_batch_size * self.data_parallel_size
        lo = self.data_parallel_rank * self.micro_batch_size
        start = self.consumed_samples
        while start + group <= self.total_samples:
            yield list(range(start + lo, start + lo + self.micro_batch_size))
            start += group
        if start < self.total_samples and not self.drop_last:
            tail = list(range(start, self.total_samples))[lo : lo + self.micro_batch_size]
            if tail:  # Megatron would yield an empty batch to the ranks past the tail
                yield tail


def collate(samples: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Stack per-sample arrays into `[micro_batch, seq]` arrays, key by key."""
    if not samples:
        raise ValueError("cannot collate an empty micro-batch")
    return {key: np.stack([s[key] for s in samples]) for key in samples[0]}


class PretrainingDataLoader:
    """Iterates collated micro-batches (numpy) of `dataset` in the sampler's order.

    Framework-free on purpose: the training loop converts each array with the backend's
    `tensors.from_numpy`, so both frameworks see the same bytes.
    """

    def __init__(self, dataset, sampler: MegatronPretrainingSampler, num_workers: int = 0) -> None:
        self.dataset = dataset
        self.batch_sampler = sampler
        # A dataset whose samples differ in shape (images, variable lengths) brings its own `collate`.
        self.collate = getattr(dataset, "collate", collate)
        # Worker processes only for datasets that say they can be pickled to them (decoding images is worth
        # it; Megatron's memory-mapped token datasets read faster in place).
        self.num_workers = num_workers if getattr(dataset, "worker_safe", False) else 0

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self.num_workers:
            from mmrun.data.workers import build_dataloader

            yield from build_dataloader(self.dataset, self.batch_sampler, self.collate, self.num_workers)
            return
        for indices in self.batch_sampler:
            yield self.collate([self.dataset[i] for i in indices])

    def __len__(self) -> int:
        s = self.batch_sampler
        return (s.total_samples - s.consumed_samples) // (s.micro_batch_size * s.data_parallel_size)


def build_pretraining_data_loader(
    dataset,
    consumed_samples: int,
    micro_batch_size: int,
    data_parallel_rank: int = 0,
    data_parallel_size: int = 1,
    num_workers: int = 0,
) -> PretrainingDataLoader | None:
    """Megatron's `build_pretraining_data_loader` for the 'single' loader type (None for no dataset);
    `num_workers` decoding processes for a dataset marked `worker_safe` (data/workers.py)."""
    if dataset is None:
        return None
    sampler = MegatronPretrainingSampler(
        total_samples=len(dataset),
        consumed_samples=consumed_samples,
        micro_batch_size=micro_batch_size,
        data_parallel_rank=data_parallel_rank,
        data_parallel_size=data_parallel_size,
    )
    return PretrainingDataLoader(dataset, sampler, num_workers)
