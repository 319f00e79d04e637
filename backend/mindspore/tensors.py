"""Tensors and dtypes on the mindspore backend: numpy conversion, dtype names, what each device computes in.

Same public names as `mmrun.backend.torch.tensors`.
"""
from __future__ import annotations

from typing import Any, Mapping

import mindspore as ms
import numpy as np

from mmrun.backend.vocabulary import device_kind as device_kind_name

float32 = ms.float32
float16 = ms.float16
bfloat16 = ms.bfloat16
int32 = ms.int32
int64 = ms.int64

# Megatron's spellings (--fp16/--bf16) and numpy's.
_DTYPES: dict[str, Any] = {
    "fp32": float32, "float32": float32,
    "fp16": float16, "float16": float16, "half": float16,
    "bf16": bfloat16, "bfloat16": bfloat16,
    "int32": int32, "int64": int64,
}

# Which matmul dtypes have a kernel per device kind. Measured on MindSpore 2.10 CPU: bf16 MatMul has
# no CPU kernel (fp16 does). Ascend has all three (MindSpore's documentation; not run here); GPU is
# listed without bf16, as the feature table (features/trainer.yaml) does, until someone verifies it.
_COMPUTE_DTYPES: dict[str, frozenset[str]] = {
    "cpu": frozenset({"fp32", "fp16"}),
    "cuda": frozenset({"fp32", "fp16"}),
    "npu": frozenset({"fp32", "fp16", "bf16"}),
}

_CANONICAL = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}


def dtype(name: str) -> Any:
    """The framework dtype for a name: fp32/float32, fp16/float16, bf16/bfloat16, int32, int64."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(_DTYPES)}") from None


def supports_compute_dtype(name: str, device_kind: str) -> bool:
    """Whether matmul in dtype `name` has a kernel on `device_kind` (any spelling: "npu"/"Ascend", "cuda"/"GPU", "cpu")."""
    return _CANONICAL.get(name, name) in _COMPUTE_DTYPES.get(device_kind_name(device_kind), frozenset())


def to_numpy(x: Any) -> np.ndarray:
    """A host numpy copy; bf16 becomes float32 (numpy has no bf16, the upcast is exact)."""
    if isinstance(x, np.ndarray):
        return x
    if x.dtype == ms.bfloat16:
        x = x.astype(ms.float32)
    return x.asnumpy().copy()


def from_numpy(a: Any, dtype: Any = None) -> ms.Tensor:
    """A tensor holding a copy of `a` (array or nested lists), optionally cast to `dtype`."""
    t = ms.Tensor(np.array(a, copy=True))
    if dtype is not None:
        t = t.astype(_DTYPES[dtype] if isinstance(dtype, str) else dtype)
    return t


def cast(x: ms.Tensor, dtype: Any) -> ms.Tensor:
    return x.astype(_DTYPES[dtype] if isinstance(dtype, str) else dtype)


def state_dict_to_numpy(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """name -> numpy copy, for framework-neutral checkpoints."""
    return {name: to_numpy(value) for name, value in state.items()}


def state_dict_from_numpy(arrays: Mapping[str, np.ndarray]) -> dict[str, ms.Tensor]:
    """name -> tensor, ready for `load_state_dict` (which casts to each parameter's dtype)."""
    return {name: from_numpy(value) for name, value in arrays.items()}
