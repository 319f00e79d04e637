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

Mixed precision (a model cast to fp16/bf16 before its optimizer was built, see `optim`): gradients
are summed over micro-batches and reduced in fp32, and the optimizer updates fp32 main params. With a
`grad_scaler` (`mmrun.backend.grad_scaler`, fp16) the loss is multiplied by the scale before backward
and the gradients by its inverse after; a step whose gradients are not finite is skipped (no update,
no scheduler advance, `result.skipped`), and the scaler adjusts, exactly as Megatron's fp16 optimizer.

On an accelerator the step never waits for the device until its end: gradients, norm, clipping and the
update are queued back to back (multi-tensor kernels, a fused AdamW), and the loss and gradient norm are
read back together, once (with a loss scaler, before the update: the host must know about an overflow).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

from mmrun.backend.grad_scaler import ConstantGradScaler
from mmrun.precision.timers import NO_TIMERS
from mmrun.backend.torch import optim
from mmrun.backend.train_step_shared import (  # noqa: F401 - StepResult is part of this module's API
    LocalGradients, StepResult, advance_schedule, call_model, check_micro_batches, local_indices, set_step_lr,
    world_size)


def _read_back(loss: torch.Tensor, norm: torch.Tensor) -> tuple[float, float]:
    """Loss and gradient norm as floats with one device-to-host copy (one synchronisation)."""
    loss_value, norm_value = torch.stack([loss.float(), norm.float()]).tolist()
    return loss_value, norm_value


def _all_reduce_mean(tensors: Sequence[torch.Tensor]) -> None:
    """Average tensors in place over ranks with one collective on a flat buffer."""
    from mmrun.backend.torch import distributed
    flat = distributed.all_reduce(torch.cat([t.reshape(-1) for t in tensors]), op="mean")
    for t, reduced in zip(tensors, torch.split(flat, [t.numel() for t in tensors])):
        t.copy_(reduced.view_as(t))


class TrainStep:
    def __init__(self, model: torch.nn.Module, optimizer: optim.AdamW, loss_fn: Callable[..., Any] | None = None,
                 lr_scheduler: Any = None, clip_grad: float = 1.0, increment: int = 1, jit: bool | None = None,
                 grad_scaler: ConstantGradScaler | None = None, local_grads: LocalGradients | None = None) -> None:
        if jit:
            raise NotImplementedError(
                "TrainStep(jit=True) is not supported with the pytorch backend. Received: jit=True; "
                "torch runs the step eagerly, leave jit unset")
        self.model, self.optimizer = model, optimizer
        self.loss_fn = loss_fn or call_model
        self.lr_scheduler, self.clip_grad, self.increment = lr_scheduler, clip_grad, increment
        self.grad_scaler = grad_scaler
        self.local_grads = local_grads  # expert parallelism's experts (train_step_shared.LocalGradients)
        self.world_size: int | None = None  # asked on the first step, after the launcher set up ranks
        self._fp32_sums = any(p.dtype != torch.float32 for p in optimizer.params)
        self.timers = NO_TIMERS  # per-phase timers (mmrun.precision.timers), set by the engine when asked for

    def __call__(self, micro_batches: Sequence[Sequence[Any]]) -> StepResult:
        check_micro_batches(micro_batches)
        if self.world_size is None:
            self.world_size = world_size("mmrun.backend.torch")
        lr = set_step_lr(self.lr_scheduler, self.optimizer)
        scale = self.grad_scaler.scale if self.grad_scaler is not None else 1.0
        timers = self.timers
        with timers.phase("forward-backward"):
            loss, grads = self._backward(micro_batches, scale)
        if self.world_size > 1:
            with timers.phase("grads-all-reduce"):
                if self.local_grads is None:
                    _all_reduce_mean(grads + [loss])
                else:
                    self._reduce_with_local(grads, loss)
        with timers.phase("optimizer"):
            if scale != 1.0:
                torch._foreach_mul_(grads, 1.0 / scale)
            total = None if self.local_grads is None or self.world_size == 1 else self._norm_with_local(grads)
            grads, norm = optim.clip_grad_norm(grads, self.clip_grad, total=total)
            skipped = False
            if self.grad_scaler is not None:
                loss_value, norm_value = _read_back(loss, norm)
                skipped = not math.isfinite(norm_value)  # one inf/nan anywhere makes the global norm non-finite
                self.grad_scaler.update(skipped)
            if not skipped:
                self.optimizer.step(grads)
        if self.grad_scaler is None:
            loss_value, norm_value = _read_back(loss, norm)  # after the update is queued: one wait per step
        advance_schedule(self.lr_scheduler, self.increment, skipped)
        self.optimizer.zero_grad()
        return StepResult(loss_value, norm_value, lr, skipped, None if self.grad_scaler is None else scale)

    def _reduce_with_local(self, grads: list[torch.Tensor], loss: torch.Tensor) -> None:
        """Replicated gradients (and the loss) averaged over every rank; the local ones (LocalGradients) summed
        over their group and divided by the world size. In place."""
        from mmrun.backend.torch import distributed

        replicated, local = local_indices(self.optimizer.names, self.local_grads)
        _all_reduce_mean([grads[i] for i in replicated] + [loss])
        if local:
            held = [grads[i] for i in local]
            flat = distributed.group_all_reduce(torch.cat([t.reshape(-1) for t in held]), self.local_grads.group)
            for t, reduced in zip(held, torch.split(flat / self.world_size, [t.numel() for t in held])):
                t.copy_(reduced.view_as(t))

    def _norm_with_local(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The global L2 norm when some parameters are local: each expert's squares counted once over the world."""
        from mmrun.backend.torch import distributed

        replicated, local = local_indices(self.optimizer.names, self.local_grads)
        squares = [sum((grads[i].float() ** 2).sum() for i in indices) + torch.zeros((), device=grads[0].device)
                   for indices in (replicated, local)]
        held = distributed.all_reduce(squares[1].reshape(1), op="sum")[0] / self.local_grads.replicas
        return torch.sqrt(squares[0] + held)

    def _backward(self, micro_batches: Sequence[Sequence[Any]], scale: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Forward and backward of every micro-batch: (mean loss, gradients of scale x mean loss), fp32."""
        self.optimizer.zero_grad()
        params = self.optimizer.params
        num_micro = len(micro_batches)
        total, sums = None, None
        for batch in micro_batches:
            with self.timers.phase("forward-compute"):
                loss = self.loss_fn(self.model, *batch)
            # Megatron's order: each micro-batch loss divided by their number, then the loss scale applied.
            # The MindSpore step multiplies by the same fp32 factor, so both overflow at the same scale.
            with self.timers.phase("backward-compute"):
                (loss * (scale / num_micro)).backward()
            total = loss.detach() if total is None else total + loss.detach()
            if self._fp32_sums:
                # fp16/bf16 gradients are summed in fp32 (Megatron's main grads), not in the parameter dtype.
                grads = [torch.zeros_like(p, dtype=torch.float32) if p.grad is None else p.grad.float() for p in params]
                sums = grads if sums is None else torch._foreach_add(sums, grads)
                self.optimizer.zero_grad()
        if sums is None:
            sums = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        return (total / num_micro).float(), sums
