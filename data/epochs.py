"""Epochs over a finite dataset: as many samples as the run consumes, in a reproducible order.

Megatron's sampler reads samples 0, 1, 2, ... of one global order, as far as --train-iters x
--global-batch-size reaches. A dataset of whole samples (images and conversations, not a token stream)
is smaller than that: this view repeats it epoch after epoch, each epoch in its own order drawn from
the seed (MindSpeed-MM's `shuffle: true`) or in file order (`shuffle: false`). The order depends on
nothing but (seed, epoch), so every data-parallel size and both frameworks read the same global order,
and a resumed run continues where it stopped.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np


class EpochView:
    """`num_samples` indices over `dataset`, epoch by epoch; `collate` is passed through to the loader."""

    def __init__(self, dataset: Any, num_samples: int, seed: int, shuffle: bool,
                 collate: Callable[[Sequence[Any]], Any] | None = None) -> None:
        if len(dataset) == 0:
            raise ValueError("the dataset has no samples; check the dataset files and max_samples")
        self.dataset = dataset
        self.num_samples = max(int(num_samples), len(dataset))
        self.seed, self.shuffle = seed, shuffle
        if collate is not None:
            self.collate = collate
        self.worker_safe = bool(getattr(dataset, "worker_safe", False))
        self._orders: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self.num_samples

    def epoch_order(self, epoch: int) -> np.ndarray:
        order = self._orders.get(epoch)
        if order is None:
            n = len(self.dataset)
            order = (np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle
                     else np.arange(n))
            self._orders = {epoch: order}  # the loader reads forward: one epoch's order is enough to keep
        return order

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} is outside the {self.num_samples} samples of this run")
        epoch, position = divmod(int(index), len(self.dataset))
        return self.dataset[int(self.epoch_order(epoch)[position])]
