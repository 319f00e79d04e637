"""Module hooks for the layer-wise dump and the anomaly checks (mmrun.precision), on the torch backend.

Same public names and contract as `mmrun.backend.mindspore.probe`:

    remove = attach(model, on_forward, on_backward)   # every named submodule (the root is left out)
    on_forward(path, class_name, inputs, output)      # after the module's forward, in execution order
    on_backward(path, class_name, grad_outputs, grad_inputs)   # as backward reaches the module's inputs
    summary(value) -> {"type", "dtype", "shape", "Max", "Min", "Mean", "Norm", ...} or None (not a tensor)
    to_numpy(value) -> numpy array (for the optional tensor dump)

Statistics are computed on the device in float32 and read back with one transfer per tensor.
"""
from __future__ import annotations

from typing import Any, Callable

import warnings

import numpy as np
import torch

_ForwardHook = Callable[[str, str, tuple, Any], None]
_BackwardHook = Callable[[str, str, tuple, tuple], None]


def _modules(model: Any) -> list[tuple[str, torch.nn.Module]]:
    chunks = model if isinstance(model, (list, tuple)) else [model]
    named = []
    for index, chunk in enumerate(chunks):
        prefix = f"{index}." if len(chunks) > 1 else ""  # megatron-core's model chunks (virtual pipeline stages)
        named += [(prefix + name, module) for name, module in chunk.named_modules() if name]
    return named


def attach(model: Any, on_forward: _ForwardHook | None, on_backward: _BackwardHook | None) -> Callable[[], None]:
    """Hook every named submodule of `model` (a module or a list of model chunks); returns remove()."""
    # An embedding's input (token ids) needs no gradient, so its full backward hook fires on the output
    # gradients alone: what the dump wants; torch warns about it on every step.
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with respect "
                            "to module outputs since no inputs require gradients")
    handles = []
    for path, module in _modules(model):
        cls = type(module).__name__
        if on_forward is not None:
            handles.append(module.register_forward_hook(
                lambda _m, inputs, output, path=path, cls=cls: on_forward(path, cls, inputs, output)))
        if on_backward is not None:
            handles.append(module.register_full_backward_hook(
                lambda _m, grad_in, grad_out, path=path, cls=cls: on_backward(path, cls, grad_out, grad_in)))

    def remove() -> None:
        for handle in handles:
            handle.remove()
    return remove


def is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def summary(value: Any) -> dict[str, Any] | None:
    """msprobe's statistics of one tensor (Max, Min, Mean, Norm: the L2 norm), or None for a non-tensor."""
    if not isinstance(value, torch.Tensor):
        return None
    record = {"type": "torch.Tensor", "dtype": str(value.dtype), "shape": list(value.shape),
              "requires_grad": bool(value.requires_grad)}
    if value.numel() == 0:
        return {**record, "Max": None, "Min": None, "Mean": None, "Norm": None}
    with torch.no_grad():
        x = value.detach().float()
        stats = torch.stack([x.max(), x.min(), x.mean(), torch.linalg.vector_norm(x)]).tolist()
    return {**record, "Max": stats[0], "Min": stats[1], "Mean": stats[2], "Norm": stats[3]}


def to_numpy(value: Any) -> np.ndarray:
    x = value.detach()
    if x.dtype == torch.bfloat16:
        x = x.float()  # numpy has no bfloat16
    return x.cpu().numpy()
