"""Tensors and dtypes on the torch backend: numpy conversion, dtype names, what each device computes in.

Same public names as `mmrun.backend.mindspore.tensors`. `from_numpy` puts its tensor on this process's
device (`device.default_device()`); on an accelerator the host copy goes through pinned memory and the
transfer is asynchronous (`non_blocking=True`), as Megatron's get_batch does with `.cuda(non_blocking=True)`.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from mmrun.backend.vocabulary import device_kind as device_kind_name

float32 = torch.float32
float16 = torch.float16
bfloat16 = torch.bfloat16
int32 = torch.int32
int64 = torch.int64

# Megatron's spellings (--fp16/--bf16) and numpy's, one table for both backends' lookups.
_DTYPES: dict[str, torch.dtype] = {
    "fp32": float32, "float32": float32,
    "fp16": float16, "float16": float16, "half": float16,
    "bf16": bfloat16, "bfloat16": bfloat16,
    "int32": int32, "int64": int64,
}

# (device kind, dtype name) pairs whose matmul has a kernel. torch has fp16 and bf16 matmul on CPU
# (slow but present), CUDA and NPU.
_COMPUTE_DTYPES: dict[str, frozenset[str]] = {
    "cpu": frozenset({"fp32", "fp16", "bf16"}),
    "cuda": frozenset({"fp32", "fp16", "bf16"}),
    "npu": frozenset({"fp32", "fp16", "bf16"}),
}

_CANONICAL = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}


def dtype(name: str) -> torch.dtype:
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
    t = x.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.cpu().numpy().copy()


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def from_numpy(a: Any, dtype: torch.dtype | str | None = None) -> torch.Tensor:
    """A tensor on this process's device holding a copy of `a` (array or nested lists), optionally cast to `dtype`."""
    from mmrun.backend.torch import device

    host = np.asarray(a)
    where = device.default_device()
    if where.type == "cpu":
        t = torch.from_numpy(np.array(host, copy=True))
    else:
        # One copy into pinned (page-locked) memory, then an asynchronous DMA: the host goes on preparing the
        # next batch. torch's caching host allocator keeps the pinned block alive until the copy has run.
        staging = torch.empty(host.shape, dtype=_torch_dtype(host.dtype), pin_memory=True)
        staging.numpy()[...] = host
        t = staging.to(where, non_blocking=True)
    if dtype is not None:
        t = t.to(_DTYPES[dtype] if isinstance(dtype, str) else dtype)
    return t


def cast(x: torch.Tensor, dtype: torch.dtype | str) -> torch.Tensor:
    return x.to(_DTYPES[dtype] if isinstance(dtype, str) else dtype)


def state_dict_to_numpy(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """name -> numpy copy, for framework-neutral checkpoints."""
    return {name: to_numpy(value) for name, value in state.items()}


def state_dict_from_numpy(arrays: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """name -> tensor, ready for `load_state_dict` (which casts to each parameter's dtype)."""
    return {name: from_numpy(value) for name, value in arrays.items()}
