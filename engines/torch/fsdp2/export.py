"""A torch_dcp checkpoint read whole for mmrun.checkpoint.dcp, which stays framework-free: the tensors
come back as numpy (bf16 widened to float32, as numpy has no bfloat16), or go straight into a Hugging Face
directory written by transformers itself. One process, no process group (backend/torch/fsdp2/dcp.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mmrun.backend.torch.fsdp2.dcp import read_whole
from mmrun.engines.torch.transformers_models import save_hf_directory


def _numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    if isinstance(value, dict):
        return {k: _numpy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_numpy(v) for v in value)
    return value


def read_numpy(source: str | Path) -> dict[str, Any]:
    """The checkpoint's state ({"model": ..., "optim": ...}) with every tensor as a numpy array."""
    return _numpy(read_whole(source))


def save_hf(hf_config: dict[str, Any], source: str | Path, out: str | Path) -> Path:
    """The checkpoint's model as a Hugging Face directory at `out` (config.json + model.safetensors)."""
    return save_hf_directory(hf_config, read_whole(source)["model"], out)
