"""Collated batches from worker processes, in the sampler's order (Megatron's --num-workers).

The training loop chooses which sample indices each data-parallel rank reads (Megatron's sampler in
`data/samplers.py`, whose loader hands them here when --num-workers > 0 and the dataset can be sent to
workers); this only decodes them. Each worker receives the dataset and the collate function once
(pickled, so the `spawn` start method works in a process that has already started torch or MindSpore
threads), builds whole batches, and the batches are yielded in submission order, at most
`num_workers * prefetch` ahead of the consumer. Worker errors (a bad sample) are raised here, unchanged.
"""
from __future__ import annotations

import multiprocessing
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Sequence

_worker_state: dict[str, Any] = {}


def _init_worker(dataset: Any, collate: Callable) -> None:
    _worker_state["dataset"], _worker_state["collate"] = dataset, collate


def _load_batch(indices: Sequence[int]) -> dict:
    dataset = _worker_state["dataset"]
    return _worker_state["collate"]([dataset[i] for i in indices])


def build_dataloader(dataset: Any, sampler_indices_iterable: Iterable[Sequence[int]], collate: Callable,
                     num_workers: int = 0, prefetch: int = 2, start_method: str = "spawn") -> Iterator[dict]:
    """Yield `collate([dataset[i] for i in indices])` for each `indices` of the iterable, in order.

    `num_workers=0` decodes in this process. `collate` must be picklable for workers (a module-level
    function or a functools.partial of one, such as `MultimodalDataset.collate_fn`).
    """
    if num_workers < 0 or prefetch < 1:
        raise ValueError(f"num_workers must be >= 0 and prefetch >= 1. Received: {num_workers}, {prefetch}")
    if num_workers == 0:
        for indices in sampler_indices_iterable:
            yield collate([dataset[i] for i in indices])
        return
    context = multiprocessing.get_context(start_method)
    pool = context.Pool(num_workers, initializer=_init_worker, initargs=(dataset, collate))
    try:
        pending: deque = deque()
        batches = iter(sampler_indices_iterable)
        for indices in batches:
            pending.append(pool.apply_async(_load_batch, (list(indices),)))
            if len(pending) >= num_workers * prefetch:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
    finally:
        pool.terminate()
        pool.join()
