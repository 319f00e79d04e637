"""AdamW and gradient clipping on the torch backend: torch.optim.AdamW itself behind the portable contract.

Same public names as `mmrun.backend.mindspore.optim`. The contract (both backends):
- `AdamW(named_params, lr, betas, eps, weight_decay, no_decay=None, fused=None)`: `named_params` is
  `model.named_parameters()` (or plain parameters, then named `param.<i>`); `no_decay(name, param)`
  selects parameters without weight decay (`megatron_no_decay`: biases and 1-D parameters). `fused`:
  the framework's fused kernel (float32 ulps from torch's reference order); None picks per device:
  on torch fused on CUDA and NPU (torch_npu's aclnnApplyAdamWV2 where it registers `_fused_adamw_`),
  multi-tensor (foreach) elsewhere (on CPU bitwise equal to torch's single-tensor default); on MindSpore the
  fused AdamWeightDecay kernel. `fused=False` is torch's own operation order on both frameworks.
  `set_lr(lr)`, `lr`, `step(grads)` (grads aligned with `params`), `state_dict()` /
  `load_state_dict()` with framework-neutral names.
- Mixed precision (Megatron's Float16Optimizer): parameters that are fp16/bf16 when the optimizer is
  built (cast the model first) are updated through fp32 copies, `main_params`; after each update the
  model parameter gets the rounded copy. Their state adds `<param>.main_param`, and
  `reload_model_params()` re-reads the copies from the model after its weights were loaded.
- `clip_grad_norm(grads, max_norm, total=None) -> (grads, total_norm)`: torch's clip_grad_norm_
  (coefficient max_norm / (norm + 1e-6), capped at 1; `total`: the norm when already measured);
  max_norm <= 0 only measures. One multi-tensor norm and one multi-tensor scale, no host sync.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import torch

from mmrun.backend.errors import warn_once
from mmrun.backend.optimizer_params import (  # noqa: F401 - megatron_no_decay is part of this API
    MAIN_PARAM_KEY, STATE_KEYS, NoDecay, check_optimizer_state, megatron_no_decay, named_params)


class AdamW:
    """torch.optim.AdamW (decoupled weight decay, bias-corrected) with the portable contract above."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, no_decay: NoDecay | None = None,
                 fused: bool | None = None) -> None:
        pairs = named_params(params)
        self.names = [name for name, _ in pairs]
        self.params = [param for _, param in pairs]
        # An fp16/bf16 update would round most of AdamW's small steps away: update fp32 copies instead.
        self.main_params = [p if p.dtype == torch.float32 else p.detach().float().clone() for p in self.params]
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay
        decay = [m for (n, p), m in zip(pairs, self.main_params) if no_decay is None or not no_decay(n, p)]
        keep = [m for (n, p), m in zip(pairs, self.main_params) if no_decay is not None and no_decay(n, p)]
        groups = [{"params": decay, "weight_decay": weight_decay}]
        if keep:
            groups.append({"params": keep, "weight_decay": 0.0})
        self._opt, self.fused = _torch_adamw(groups, fused, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.step_count = 0

    @property
    def lr(self) -> float:
        return float(self._opt.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        for group in self._opt.param_groups:
            group["lr"] = lr

    def zero_grad(self) -> None:
        """Clear the gradients of the model's parameters (and of their fp32 copies)."""
        self._opt.zero_grad(set_to_none=True)
        for param, _ in self._half_pairs():
            param.grad = None

    @torch.no_grad()
    def step(self, grads: Sequence[torch.Tensor]) -> None:
        """One AdamW update with `grads` aligned with `params` (fp16/bf16 gradients are used in fp32)."""
        for main, grad in zip(self.main_params, grads):
            main.grad = grad if grad is None or grad.dtype == main.dtype else grad.float()
        self._opt.step()
        pairs = self._half_pairs()
        if pairs:
            torch._foreach_copy_([p for p, _ in pairs], [m for _, m in pairs])  # one multi-tensor launch
        self.step_count += 1

    def _half_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(p, m) for p, m in zip(self.params, self.main_params) if m is not p]

    @torch.no_grad()
    def reload_model_params(self) -> None:
        """Refresh the fp32 copies from the model's (just loaded) fp16/bf16 parameters."""
        for param, main in self._half_pairs():
            main.copy_(param)

    def state_dict(self) -> dict[str, Any]:
        """{"step", "lr", "tensors": {"<param>.exp_avg" | "<param>.exp_avg_sq" [| "<param>.main_param"]: tensor}};
        moments are zeros before step 1."""
        tensors = {}
        for name, param, main in zip(self.names, self.params, self.main_params):
            state = self._opt.state.get(main, {})
            for key in STATE_KEYS:
                tensors[f"{name}.{key}"] = state[key] if key in state else torch.zeros_like(main)
            if main is not param:
                tensors[f"{name}.{MAIN_PARAM_KEY}"] = main
        return {"step": self.step_count, "lr": self.lr, "tensors": tensors}

    @torch.no_grad()
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_optimizer_state(state, self.names, [tuple(p.shape) for p in self.params])
        step = int(state["step"])
        for name, param, main in zip(self.names, self.params, self.main_params):
            slot = self._opt.state[main]
            for key in STATE_KEYS:
                value = state["tensors"][f"{name}.{key}"]
                slot[key] = torch.as_tensor(value, dtype=main.dtype).to(main.device).clone()
            # torch keeps the step per parameter as a float tensor: on the host for the single-tensor and
            # foreach kernels, on the parameter's device for the fused one (as torch's own _init_group).
            slot["step"] = torch.tensor(float(step), device=main.device if self.fused else "cpu")
            saved_main = state["tensors"].get(f"{name}.{MAIN_PARAM_KEY}")
            if saved_main is not None:
                # The fp32 weights of an fp16/bf16 run are the exact ones: they win over the rounded model copy,
                # in this precision or any other.
                main.copy_(torch.as_tensor(saved_main, dtype=main.dtype).to(main.device))
                if main is not param:
                    param.copy_(main)
        self.step_count = step
        if "lr" in state:
            self.set_lr(float(state["lr"]))


def global_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """L2 norm over all gradients, computed as torch.nn.utils.clip_grad_norm_ does."""
    return torch.nn.utils.get_total_norm([g for g in grads if g is not None], 2.0)


@torch.no_grad()
def clip_grad_norm(grads: Sequence[torch.Tensor], max_norm: float,
                   total: torch.Tensor | None = None) -> tuple[Sequence[torch.Tensor], torch.Tensor]:
    """Scale `grads` in place so their global L2 norm is at most `max_norm`; returns (grads, norm before
    clipping). `total`: that norm, when the caller measured it already."""
    present = [g for g in grads if g is not None]
    if total is None:
        total = global_norm(present)
    if max_norm > 0:
        # torch's clip_grad_norm_: always multiply by the capped coefficient (no host sync on the norm).
        torch._foreach_mul_(present, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return grads, total


def _torch_adamw(groups: list[dict[str, Any]], fused: bool | None,
                 options: dict[str, Any]) -> tuple[torch.optim.AdamW, bool]:
    """torch.optim.AdamW with the kernel `fused` asks for (see the module docstring); (optimizer, fused)."""
    where = groups[0]["params"][0].device.type if groups[0]["params"] else "cpu"
    if fused is None:
        fused = where in ("cuda", "npu")
    if not fused:
        # foreach (a few multi-tensor calls instead of ~7 operations per parameter from Python): on CPU it runs
        # the single-tensor loop's kernels in its order, bitwise equal to it (tests/backend_api/
        # test_fused_adamw.py), and took a tiny Wan DiT's step from 10.7 to 9.6 ms of CPU time
        # (benchmarks/wan_step.py --size tiny).
        return torch.optim.AdamW(groups, foreach=True, **options), False
    try:
        return torch.optim.AdamW(groups, fused=True, **options), True
    except RuntimeError as exc:  # torch checks the device when the optimizer is built
        warn_once(f"the fused AdamW kernel is not available on {where} ({str(exc).splitlines()[0]}); "
                  "using the multi-tensor (foreach) AdamW")
        return torch.optim.AdamW(groups, foreach=True, **options), False
