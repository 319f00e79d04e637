"""Module hooks for the layer-wise dump and the anomaly checks (mmrun.precision), on the mindspore backend.

Same public names and contract as `mmrun.backend.torch.probe` (see there). Cell hooks run in PyNative
only, not inside mindspore.jit: the trainer runs the train step in PyNative while a probe is attached
(mmrun.precision.training_probe). The L2 norm is sqrt(sum(x * x)): mint.norm has no CPU kernel in
MindSpore 2.10.
"""
from __future__ import annotations

from typing import Any, Callable

import mindspore as ms
import numpy as np
from mindspore import mint

_ForwardHook = Callable[[str, str, tuple, Any], None]
_BackwardHook = Callable[[str, str, tuple, tuple], None]


def _modules(model: Any) -> list[tuple[str, ms.nn.Cell]]:
    chunks = model if isinstance(model, (list, tuple)) else [model]
    named = []
    for index, chunk in enumerate(chunks):
        prefix = f"{index}." if len(chunks) > 1 else ""
        named += [(prefix + name, cell) for name, cell in chunk.cells_and_names() if name]
    return named


def attach(model: Any, on_forward: _ForwardHook | None, on_backward: _BackwardHook | None) -> Callable[[], None]:
    """Hook every named sub-cell of `model` (a cell or a list of model chunks); returns remove()."""
    handles = []
    for path, cell in _modules(model):
        cls = type(cell).__name__
        if on_forward is not None:
            handles.append(cell.register_forward_hook(
                lambda _c, inputs, output, path=path, cls=cls: on_forward(path, cls, inputs, output)))
        if on_backward is not None:
            handles.append(cell.register_backward_hook(
                lambda _c, grad_in, grad_out, path=path, cls=cls: on_backward(path, cls, grad_out, grad_in)))

    def remove() -> None:
        for handle in handles:
            handle.remove()
    return remove


def is_tensor(value: Any) -> bool:
    return isinstance(value, ms.Tensor)


def summary(value: Any) -> dict[str, Any] | None:
    """msprobe's statistics of one tensor (Max, Min, Mean, Norm: the L2 norm), or None for a non-tensor."""
    if not isinstance(value, ms.Tensor):
        return None
    record = {"type": "mindspore.Tensor", "dtype": str(value.dtype), "shape": list(value.shape)}
    if value.size == 0:
        return {**record, "Max": None, "Min": None, "Mean": None, "Norm": None}
    x = ms.ops.stop_gradient(value).astype(ms.float32)  # outside the step's gradient
    # One read-back for the four (mint.cat of 1-element tensors: mint.stack has no CPU kernel).
    parts = [mint.reshape(t, (1,)) for t in (x.max(), x.min(), x.mean(), mint.sqrt(mint.sum(x * x)))]
    stats = mint.cat(parts).asnumpy().tolist()
    return {**record, "Max": stats[0], "Min": stats[1], "Mean": stats[2], "Norm": stats[3]}


def to_numpy(value: Any) -> np.ndarray:
    if value.dtype == ms.bfloat16:
        value = value.astype(ms.float32)  # numpy has no bfloat16
    return value.asnumpy()
