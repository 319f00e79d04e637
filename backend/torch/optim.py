"""AdamW and gradient clipping on the torch backend: torch.optim.AdamW itself behind the portable contract.

Same public names as `mmrun.backend.mindspore.optim`. The contract (both backends):
- `AdamW(named_params, lr, betas, eps, weight_decay, no_decay=None)`: `named_params` is
  `model.named_parameters()` (or plain parameters, then named `param.<i>`); `no_decay(name, param)`
  selects parameters without weight decay (`megatron_no_decay`: biases and 1-D parameters).
  `set_lr(lr)`, `lr`, `step(grads=None)` (grads aligned with `params`; torch also takes them from
  `.grad`), `state_dict()` / `load_state_dict()` with framework-neutral names.
- `clip_grad_norm(grads, max_norm) -> (grads, total_norm)`: torch's clip_grad_norm_ (coefficient
  max_norm / (norm + 1e-6), capped at 1); max_norm <= 0 only measures.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import torch

from mmrun.backend.optimizer_params import (  # noqa: F401 - megatron_no_decay is part of this API
    STATE_KEYS, NoDecay, check_optimizer_state, megatron_no_decay, named_params)


class AdamW:
    """torch.optim.AdamW (decoupled weight decay, bias-corrected) with the portable contract above."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, no_decay: NoDecay | None = None) -> None:
        pairs = named_params(params)
        self.names = [name for name, _ in pairs]
        self.params = [param for _, param in pairs]
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay
        decay = [p for n, p in pairs if no_decay is None or not no_decay(n, p)]
        keep = [p for n, p in pairs if no_decay is not None and no_decay(n, p)]
        groups = [{"params": decay, "weight_decay": weight_decay}]
        if keep:
            groups.append({"params": keep, "weight_decay": 0.0})
        self._opt = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.step_count = 0

    @property
    def lr(self) -> float:
        return float(self._opt.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        for group in self._opt.param_groups:
            group["lr"] = lr

    def zero_grad(self) -> None:
        self._opt.zero_grad(set_to_none=True)

    @torch.no_grad()
    def step(self, grads: Sequence[torch.Tensor] | None = None) -> None:
        """One AdamW update; `grads` aligned with `params`, else each parameter's `.grad`."""
        if grads is not None:
            for param, grad in zip(self.params, grads):
                param.grad = grad
        self._opt.step()
        self.step_count += 1

    def state_dict(self) -> dict[str, Any]:
        """{"step", "lr", "tensors": {"<param>.exp_avg" | "<param>.exp_avg_sq": tensor}}; zeros before step 1."""
        tensors = {}
        for name, param in zip(self.names, self.params):
            state = self._opt.state.get(param, {})
            for key in STATE_KEYS:
                tensors[f"{name}.{key}"] = state[key] if key in state else torch.zeros_like(param)
        return {"step": self.step_count, "lr": self.lr, "tensors": tensors}

    @torch.no_grad()
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_optimizer_state(state, self.names, [tuple(p.shape) for p in self.params])
        step = int(state["step"])
        for name, param in zip(self.names, self.params):
            slot = self._opt.state[param]
            for key in STATE_KEYS:
                value = state["tensors"][f"{name}.{key}"]
                slot[key] = torch.as_tensor(value, dtype=param.dtype).to(param.device).clone()
            # torch keeps the step per parameter as a float tensor (non-capturable AdamW).
            slot["step"] = torch.tensor(float(step))
        self.step_count = step
        if "lr" in state:
            self.set_lr(float(state["lr"]))


def global_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """L2 norm over all gradients, computed as torch.nn.utils.clip_grad_norm_ does."""
    return torch.nn.utils.get_total_norm([g for g in grads if g is not None], 2.0)


@torch.no_grad()
def clip_grad_norm(grads: Sequence[torch.Tensor], max_norm: float) -> tuple[Sequence[torch.Tensor], torch.Tensor]:
    """Scale `grads` in place so their global L2 norm is at most `max_norm`; returns (grads, norm before clipping)."""
    present = [g for g in grads if g is not None]
    total = global_norm(present)
    if max_norm > 0:
        # torch's clip_grad_norm_: always multiply by the capped coefficient (no host sync on the norm).
        torch._foreach_mul_(present, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return grads, total
