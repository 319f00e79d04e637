"""AdamW and gradient clipping on the mindspore backend, with torch.optim.AdamW's exact update.

Same public names and contract as `mmrun.backend.torch.optim` (see there). MindSpore's
`nn.AdamWeightDecay` is not torch's AdamW (no bias correction, weight decay scaled differently), and
`mindspore.experimental.optim.AdamW`, which is, costs about 40 % more per step under jit than the
fused kernel. So `AdamW(fused=True)` runs the fused `AdamWeightDecay` kernel with torch's bias
correction folded into per-step scalars, which is algebraically torch's update:

    torch:  p <- p * (1 - lr*wd) - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
    kernel: p <- p - lr' * (m / (sqrt(v) + eps') + wd' * p)
    with    lr' = lr * sqrt(bc2) / bc1,  eps' = eps * sqrt(bc2),  wd' = wd * bc1 / sqrt(bc2)

(bc1 = 1 - beta1^t, bc2 = 1 - beta2^t). Rounding differs from torch by float32 ulps per step.
`fused=False` replays torch's own operation order instead (closest to torch, slower); `fused=None`
(the default) is the fused kernel.

fp16/bf16 parameters are updated through fp32 copies (`main_params`), as on torch (see there): the
update runs on the copies and then assigns each model parameter its rounded copy, in the same graph.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import mindspore as ms
from mindspore import Tensor, mint
from mindspore import ops as _ops
from mindspore.ops import composite as C
from mindspore.ops import functional as F

from mmrun.backend.optimizer_params import (  # noqa: F401 - megatron_no_decay is part of this API
    MAIN_PARAM_KEY, STATE_KEYS, NoDecay, check_optimizer_state, megatron_no_decay, named_params)

_fused_adamw = C.MultitypeFuncGraph("mmrun_fused_adamw")
_exact_adamw = C.MultitypeFuncGraph("mmrun_exact_adamw")
_copy_to_model = C.MultitypeFuncGraph("mmrun_copy_to_model")


@_fused_adamw.register("Function", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor",
                       "Tensor", "Tensor", "Tensor", "Tensor", "Bool")
def _fused_update(kernel, beta1, beta2, lr, eps, decay, zero, param, m, v, grad, decays):
    return kernel(param, m, v, lr, beta1, beta2, eps, decay if decays else zero, grad)


@_exact_adamw.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor",
                       "Tensor", "Tensor", "Tensor", "Tensor", "Bool")
def _exact_update(beta1, beta2, step_size, bc2_sqrt, eps, decay_factor, param, m, v, grad, decays):
    new_param, new_m, new_v = _adamw_values(beta1, beta2, step_size, bc2_sqrt, eps, decay_factor, param, m, v,
                                            grad, decays)
    out = F.depend(new_param, F.assign(param, new_param))
    out = F.depend(out, F.assign(m, new_m))
    return F.depend(out, F.assign(v, new_v))


@_copy_to_model.register("Tensor", "Tensor")
def _copy_main_to_model(param, main):
    return F.assign(param, F.cast(main, F.dtype(param)))


def _main_copy(param: ms.Parameter) -> ms.Parameter:
    """The parameter itself when fp32, else an fp32 copy (a half-precision update rounds AdamW's steps away)."""
    if param.dtype == ms.float32:
        return param
    return ms.Parameter(F.cast(param, ms.float32), name=f"{MAIN_PARAM_KEY}.{param.name}", requires_grad=False)


def _f32(x: float) -> Tensor:
    return Tensor(x, ms.float32)


class AdamW(ms.nn.Cell):
    """torch.optim.AdamW semantics (decoupled weight decay, bias correction); see the module docstring."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, no_decay: NoDecay | None = None,
                 fused: bool | None = None) -> None:
        super().__init__(auto_prefix=False)
        pairs = named_params(params)
        self.names = [name for name, _ in pairs]
        self.params = ms.ParameterTuple([param for _, param in pairs])
        self.main_params = ms.ParameterTuple([_main_copy(param) for param in self.params])
        # The model parameters that take a rounded copy after each update (a compile-time constant).
        self.half_params = ms.ParameterTuple([p for p, m in zip(self.params, self.main_params) if m is not p])
        self.half_mains = ms.ParameterTuple([m for p, m in zip(self.params, self.main_params) if m is not p])
        self.exp_avg = self.main_params.clone(prefix="exp_avg", init="zeros")
        self.exp_avg_sq = self.main_params.clone(prefix="exp_avg_sq", init="zeros")
        self.decay_flags = tuple(weight_decay > 0 and not (no_decay is not None and no_decay(n, p)) for n, p in pairs)
        # None: the fused kernel, MindSpore's fastest on every device (the torch backend picks per device).
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay
        self.fused = True if fused is None else bool(fused)
        self._beta1, self._beta2, self._zero = _f32(betas[0]), _f32(betas[1]), _f32(0.0)
        self._kernel = _ops.AdamWeightDecay()
        self._hyper_map = C.HyperMap()
        self._lr = float(lr)
        self.step_count = 0

    @property
    def lr(self) -> float:
        return self._lr

    def set_lr(self, lr: float) -> None:
        self._lr = float(lr)

    def zero_grad(self) -> None:
        """Nothing to clear: MindSpore gradients are values returned by value_and_grad, not stored state."""

    def _next_scalars(self) -> tuple[Tensor, Tensor, Tensor]:
        """Advance the step count and return the per-step scalars the update (`self(grads, scalars)`) takes,
        computed in float64 on the host as torch does."""
        self.step_count += 1
        t, (b1, b2), lr, wd = self.step_count, self.betas, self._lr, self.weight_decay
        bc1, bc2_sqrt = 1.0 - b1 ** t, math.sqrt(1.0 - b2 ** t)
        if self.fused:
            scalars = (_f32(lr * bc2_sqrt / bc1), _f32(self.eps * bc2_sqrt), _f32(wd * bc1 / bc2_sqrt))
        else:
            scalars = (_f32(lr / bc1), _f32(bc2_sqrt), _f32(1.0 - lr * wd))
        # mutable: tensors inside a tuple argument are otherwise jit constants, recompiled on every new value.
        return ms.mutable(scalars)

    @ms.jit
    def construct(self, grads, scalars):
        """The update itself (jit-compiled; also traced into a jit-compiled TrainStep)."""
        s0, s1, s2 = scalars
        if self.fused:
            done = self._hyper_map(F.partial(_fused_adamw, self._kernel, self._beta1, self._beta2, s0, s1, s2,
                                             self._zero),
                                   self.main_params, self.exp_avg, self.exp_avg_sq, grads, self.decay_flags)
        else:
            done = self._hyper_map(F.partial(_exact_adamw, self._beta1, self._beta2, s0, s1, _f32(self.eps), s2),
                                   self.main_params, self.exp_avg, self.exp_avg_sq, grads, self.decay_flags)
        if self.half_params:
            done = F.depend(done, self._hyper_map(_copy_to_model, self.half_params, self.half_mains))
        return done

    def step(self, grads: Sequence[Tensor]) -> None:
        """One AdamW update with `grads` aligned with `params` (fp16/bf16 gradients are used in fp32)."""
        grads = [g if g.dtype == ms.float32 else F.cast(g, ms.float32) for g in grads]
        self(ms.mutable(tuple(grads)), self._next_scalars())

    def reload_model_params(self) -> None:
        """Refresh the fp32 copies from the model's (just loaded) fp16/bf16 parameters."""
        for param, main in zip(self.half_params, self.half_mains):
            main.set_data(F.cast(param, ms.float32))

    def state_dict(self) -> dict[str, Any]:
        """{"step", "lr", "tensors": {"<param>.exp_avg" | "<param>.exp_avg_sq" [| "<param>.main_param"]: tensor}}."""
        tensors = {}
        for name, param, main, m, v in zip(self.names, self.params, self.main_params, self.exp_avg, self.exp_avg_sq):
            tensors[f"{name}.exp_avg"], tensors[f"{name}.exp_avg_sq"] = m, v
            if main is not param:
                tensors[f"{name}.{MAIN_PARAM_KEY}"] = main
        return {"step": self.step_count, "lr": self._lr, "tensors": tensors}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_optimizer_state(state, self.names, [tuple(p.shape) for p in self.params])
        for name, param, main, m, v in zip(self.names, self.params, self.main_params, self.exp_avg, self.exp_avg_sq):
            for slot, key in ((m, "exp_avg"), (v, "exp_avg_sq"), (main, MAIN_PARAM_KEY)):
                value = state["tensors"].get(f"{name}.{key}")
                if value is not None:
                    # A saved main param (an fp16/bf16 run's exact fp32 weights) wins over the rounded model copy.
                    slot.set_data(Tensor(value.asnumpy() if isinstance(value, Tensor) else value, slot.dtype))
            if main is not param:
                param.set_data(F.cast(main, param.dtype))
        self.step_count = int(state["step"])
        if "lr" in state:
            self._lr = float(state["lr"])


def _adamw_values(beta1, beta2, step_size, bc2_sqrt, eps, decay_factor, param, m, v, grad, decays):
    """One parameter's AdamW update as new values (parameter, exp_avg, exp_avg_sq), nothing assigned: torch's
    single-tensor AdamW, op for op (mul_, lerp_, mul_().addcmul_(), sqrt()/bc2_sqrt + eps, addcdiv_); the exact
    update here and the distributed optimizer's shard update (parallel/zero.py) both assign them."""
    new_param = param * decay_factor if decays else param
    new_m = m + (1 - beta1) * (grad - m)
    new_v = v * beta2 + (1 - beta2) * grad * grad
    denom = mint.sqrt(new_v) / bc2_sqrt + eps
    return new_param + (-step_size) * (new_m / denom), new_m, new_v


def global_norm(grads: Sequence[Tensor]) -> Tensor:
    """L2 norm over all gradients: per-tensor norms, then the norm of those, as torch computes it."""
    # mint.norm and mint.stack have no CPU kernel: each norm is sqrt(sum(g*g)), combined the same way.
    norms = [mint.sqrt(mint.sum(g * g)) for g in grads]
    return mint.sqrt(_ops.addn([n * n for n in norms]))


def clip_grad_norm(grads: Sequence[Tensor], max_norm: float,
                   total: Tensor | None = None) -> tuple[tuple[Tensor, ...], Tensor]:
    """Gradients scaled so their global L2 norm is at most `max_norm`, and the norm before clipping
    (`total`: that norm, when the caller measured it already).

    Returns new tensors (MindSpore gradients are values; torch's version scales in place).
    """
    if total is None:
        total = global_norm(grads)
    if max_norm <= 0:
        return tuple(grads), total
    coef = mint.clamp(max_norm / (total + 1e-6), max=1.0)
    return tuple(g * coef for g in grads), total
