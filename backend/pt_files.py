"""MindSpeed-MM's `.pt` files (torch.save of tensors) for framework-free callers: torch reads them on either
framework (a MindSpore run needs torch installed only for this), tensors only (weights_only=True), as numpy."""
from __future__ import annotations

import importlib.util
import os
from typing import Any

from mmrun.backend.errors import UsageError


def load_tensors(path: str | os.PathLike) -> Any:
    """The object in a torch.save file, tensors as numpy arrays; one line (UsageError) when it is not a plain
    tensor file or torch is missing."""
    if importlib.util.find_spec("torch") is None:
        raise UsageError(f"{os.fspath(path)}: reading a .pt file needs torch, which is not installed; "
                         "pip install torch, or extract the features again as .safetensors")
    from mmrun.backend.torch import pt_files
    import pickle  # only for the error type: weights_only refuses anything but tensors and plain values

    try:
        return pt_files.load_tensors(path)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(f"{os.fspath(path)}: not a torch.save file of tensors that loads with "
                         f"weights_only=True ({first}); extract the features again") from None
