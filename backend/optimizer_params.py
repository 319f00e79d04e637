"""Framework-neutral optimizer helpers shared by both backends' `optim`: parameter names, Megatron's
weight-decay rule, and the check that a saved optimizer state fits a model.

Optimizer state is named after the parameters (`<param>.exp_avg`, `<param>.exp_avg_sq`), so it moves
between frameworks with the model's state dict.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

NoDecay = Callable[[str, Any], bool]
STATE_KEYS = ("exp_avg", "exp_avg_sq")
# fp32 copy of a parameter that trains in fp16/bf16 (Megatron's "main param"); present only for those.
MAIN_PARAM_KEY = "main_param"


def megatron_no_decay(name: str, param: Any) -> bool:
    """Megatron's rule: no weight decay on biases and 1-D parameters (LayerNorm weights)."""
    return name.endswith(".bias") or len(param.shape) == 1


def named_params(params: Iterable[Any]) -> list[tuple[str, Any]]:
    """(name, param) pairs from `named_parameters()`, or from plain parameters (then named `param.<i>`, i
    counting every parameter given). Frozen parameters (requires_grad False: nn.freeze, torch's
    requires_grad_(False), MindSpore's `requires_grad = False`) are left out: the optimizer keeps no state
    for them and the train steps, which take gradients of `optimizer.params` only, never differentiate them."""
    pairs = [item if isinstance(item, tuple) else (f"param.{i}", item) for i, item in enumerate(params)]
    return [(name, param) for name, param in pairs if getattr(param, "requires_grad", True)]


def check_optimizer_state(state: Mapping[str, Any], names: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> None:
    """Raise one clear error unless `state` holds a step count and exactly these parameters' moments."""
    tensors = state.get("tensors", {})
    expected = {f"{n}.{k}": tuple(s) for n, s in zip(names, shapes) for k in STATE_KEYS}
    optional = {f"{n}.{MAIN_PARAM_KEY}": tuple(s) for n, s in zip(names, shapes)}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected) - set(optional))
    expected.update(optional)
    mismatched = sorted(f"{k} (saved {tuple(tensors[k].shape)}, model {expected[k]})"
                        for k in set(expected) & set(tensors) if tuple(tensors[k].shape) != expected[k])
    problems = [f"{label}: {', '.join(keys)}" for label, keys in
                (("missing", missing), ("unexpected", unexpected), ("size mismatch", mismatched)) if keys]
    if "step" not in state:
        problems.append("no step count")
    if problems:
        raise RuntimeError(f"optimizer state does not fit this model ({'; '.join(problems)}); "
                           "load the optimizer state saved with this model's parameters")
