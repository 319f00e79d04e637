"""One training step on the torch backend: forward, backward, all-reduce, clip, update (eager).

Same public names and contract as `mmrun.backend.mindspore.train_step`:

    step = TrainStep(model, optimizer, loss_fn=gpt_loss, lr_scheduler=schedule, clip_grad=1.0)
    result = step([(tokens, labels, loss_mask), ...])   # one tuple per micro-batch
    result.loss, result.grad_norm, result.lr             # floats

Each micro-batch's loss is `loss_fn(model, *micro_batch)` (default: `model(*micro_batch)`), a scalar;
gradients are accumulated as the mean over micro-batches (Megatron divides each micro-batch loss by
their number), averaged over data-parallel ranks when there are several (before clipping, as Megatron
does, so every rank clips the same gradients), clipped to `clip_grad` (<= 0: not clipped, norm still
measured), and applied with the learning rate the scheduler gives for this step; the scheduler then
advances by `increment` (Megatron counts in samples: pass the global batch size).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import torch

from mmrun.backend.torch import optim


class StepResult(NamedTuple):
    loss: float  # mean micro-batch loss, averaged over data-parallel ranks
    grad_norm: float  # global L2 norm before clipping
    lr: float  # learning rate this update used


def _call_model(model: Any, *batch: Any) -> Any:
    return model(*batch)


def _world_size() -> int:
    # Imported here so that importing this module does not start the distributed machinery.
    from mmrun.backend.torch import distributed
    return distributed.get_world_size()


def _all_reduce_mean(tensors: Sequence[torch.Tensor]) -> None:
    """Average tensors in place over ranks with one collective on a flat buffer."""
    from mmrun.backend.torch import distributed
    flat = distributed.all_reduce(torch.cat([t.reshape(-1) for t in tensors]), op="mean")
    for t, reduced in zip(tensors, torch.split(flat, [t.numel() for t in tensors])):
        t.copy_(reduced.view_as(t))


class TrainStep:
    def __init__(self, model: torch.nn.Module, optimizer: optim.AdamW, loss_fn: Callable[..., Any] | None = None,
                 lr_scheduler: Any = None, clip_grad: float = 1.0, increment: int = 1, jit: bool | None = None) -> None:
        if jit:
            raise NotImplementedError(
                "TrainStep(jit=True) is not supported with the pytorch backend. Received: jit=True; "
                "torch runs the step eagerly, leave jit unset")
        self.model, self.optimizer = model, optimizer
        self.loss_fn = loss_fn or _call_model
        self.lr_scheduler, self.clip_grad, self.increment = lr_scheduler, clip_grad, increment
        self.world_size: int | None = None  # asked on the first step, after the launcher set up ranks

    def __call__(self, micro_batches: Sequence[Sequence[Any]]) -> StepResult:
        if not micro_batches:
            raise ValueError("TrainStep got no micro-batches; pass a list with one tuple of tensors per micro-batch")
        if self.world_size is None:
            self.world_size = _world_size()
        lr = self.lr_scheduler.get_lr() if self.lr_scheduler is not None else self.optimizer.lr
        self.optimizer.set_lr(lr)
        self.optimizer.zero_grad()
        num_micro = len(micro_batches)
        total = None
        for batch in micro_batches:
            loss = self.loss_fn(self.model, *batch)
            (loss / num_micro).backward()
            total = loss.detach() if total is None else total + loss.detach()
        params = self.optimizer.params
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        loss = total / num_micro
        if self.world_size > 1:
            _all_reduce_mean(grads + [loss])
        grads, norm = optim.clip_grad_norm(grads, self.clip_grad)
        self.optimizer.step(grads)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step(self.increment)
        return StepResult(float(loss), float(norm), float(lr))
