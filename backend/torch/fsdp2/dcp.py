"""--ckpt-format torch_dcp: torch.distributed.checkpoint, nothing of mmrun's own in the files.

    save(directory, model, optimizer)   every rank writes its shards (`__<rank>_0.distcp`) and rank 0 `.metadata`
    load(directory, model, optimizer)   every rank reads what its current shards need: another world size
                                        or sharding_size than at save time works (DCP reshards by metadata)
    read_whole(directory)               the whole state as torch tensors in one process, no process group
                                        (the converters: DCP -> Hugging Face directory, DCP -> mmrun safetensors)

The state is torch's own `get_state_dict(model, optimizer)`: model under "model" by the model's own
parameter names (DTensor shards under FSDP2), optimizer under "optim" by the same names
(`optim.state.<name>.exp_avg`, `.exp_avg_sq`, `.step`, and `optim.param_groups.<name>.lr`, ...).
The loop writes into a temporary directory and swaps it in (training/checkpoint_dcp.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return {"model": get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def save(directory: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    dcp.save(_state(model, optimizer), checkpoint_id=str(directory))


def has_optimizer(directory: str | Path) -> bool:
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(directory)).read_metadata()
    return any(key.startswith("optim.") for key in metadata.state_dict_metadata)


def load(directory: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    state = _state(model, optimizer)
    dcp.load(state, checkpoint_id=str(directory))
    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(model, state["model"])
        return
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def read_whole(directory: str | Path) -> dict[str, Any]:
    """{"model": {name: tensor}, "optim": {...}} of a DCP directory, whole, in this process (no process
    group: torch's _load_state_dict_from_keys reads every key without one)."""
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():  # "no process group: loading in one process" is what is wanted here
        warnings.simplefilter("ignore", UserWarning)
        return _load_state_dict_from_keys(checkpoint_id=str(directory))
