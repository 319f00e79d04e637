"""What both backends' TrainStep share, framework-free: the result type, the default loss, and the
bookkeeping around a step (micro-batch check, learning rate in, world size).

`mmrun.backend.torch.train_step` and `mmrun.backend.mindspore.train_step` import these, so the contract
(see their docstrings) has one definition.
"""
from __future__ import annotations

import importlib
from typing import Any, NamedTuple, Sequence


class StepResult(NamedTuple):
    loss: float  # mean micro-batch loss, averaged over data-parallel ranks
    grad_norm: float  # global L2 norm before clipping
    lr: float  # learning rate this update used (or would have used, when skipped)
    skipped: bool = False  # the gradients overflowed under loss scaling: no update was made
    loss_scale: float | None = None  # the scale this step's loss was multiplied by; None without a scaler


def call_model(model: Any, *batch: Any) -> Any:
    """The default loss_fn: the model called on the micro-batch returns the scalar loss itself."""
    return model(*batch)


def world_size(backend_package: str) -> int:
    """Data-parallel ranks, asked of `<backend_package>.distributed` on first use: importing a train_step
    module must not start the distributed machinery."""
    return importlib.import_module(f"{backend_package}.distributed").get_world_size()


def check_micro_batches(micro_batches: Sequence[Sequence[Any]]) -> None:
    if not micro_batches:
        raise ValueError("TrainStep got no micro-batches; pass a list with one tuple of tensors per micro-batch")


def set_step_lr(lr_scheduler: Any, optimizer: Any) -> float:
    """The learning rate of this step (the scheduler's, else the optimizer's), given to the optimizer."""
    lr = lr_scheduler.get_lr() if lr_scheduler is not None else optimizer.lr
    optimizer.set_lr(lr)
    return float(lr)


def advance_schedule(lr_scheduler: Any, increment: int, skipped: bool) -> None:
    """After an update: the scheduler moves on by `increment` (Megatron counts samples); not after a skip."""
    if lr_scheduler is not None and not skipped:
        lr_scheduler.step(increment)


class LocalGradients(NamedTuple):
    """Parameters that are not replicated on every rank: expert parallelism's experts, each held by the ranks of
    one expert-parallel slot. Their gradients (already summed over the expert-parallel group by the dispatch's
    backward) are summed over `group` (the expert-data-parallel group: the ranks holding the same experts) and
    divided by the world size, not averaged over every rank (megatron-core's expert_gradient_scaling_factor);
    in the gradient norm their squares count once per expert: summed over the world, divided by the group's size."""

    names: frozenset  # the parameters' names (optimizer.names)
    group: Any  # backend distributed.subgroup's Group
    replicas: int  # ranks holding each of these parameters (the group's size)
    # joins / splits these tensors of a checkpoint's state (models/qwen3_vl/moe.py ExpertShards: gather(state),
    # take(state), whole_shape(name, shape)); None: the checkpoint holds this rank's own tensors
    shards: Any = None


def local_indices(names: Sequence[str], local: LocalGradients | None) -> tuple[list[int], list[int]]:
    """(replicated, local) parameter positions of `names`."""
    held = frozenset() if local is None else local.names
    return ([i for i, n in enumerate(names) if n not in held], [i for i, n in enumerate(names) if n in held])
