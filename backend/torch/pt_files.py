"""Read a torch.save file of tensors (MindSpeed-MM's per-sample feature `.pt`) as numpy, without running pickle
code: torch.load(weights_only=True) admits tensors, containers and plain values only, nothing executable."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch


def _to_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        # numpy has no bfloat16: an exact upcast to float32, as the checkpoints do
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()
        return tensor.numpy()
    if isinstance(value, dict):
        return {key: _to_numpy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_numpy(item) for item in value)
    return value


def load_tensors(path: str | os.PathLike) -> Any:
    """The object saved in `path` with every tensor turned into a numpy array (bf16 as float32)."""
    return _to_numpy(torch.load(os.fspath(path), map_location="cpu", weights_only=True))


def save_tensors(obj: Any, path: str | os.PathLike) -> None:
    """torch.save of numpy arrays as tensors, for tests and tools that must write MindSpeed-MM's format."""
    def to_torch(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(value))
        if isinstance(value, dict):
            return {key: to_torch(item) for key, item in value.items()}
        return value
    torch.save(to_torch(obj), os.fspath(path))
