"""Bytes for all_gather_object: JSON, not pickle.

Both frameworks' own all_gather_object pickle the object and unpickle what the other ranks sent;
the house rule is no pickle loading, and JSON gives the same result on torch and MindSpore. The
price: only JSON values travel (dict with str keys, list, str, int, float, bool, None), and a tuple
comes back as a list.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from mmrun.backend.errors import UsageError


def encode(obj: Any) -> np.ndarray:
    """The object as a uint8 array, ready to become a tensor."""
    try:
        text = json.dumps(obj, allow_nan=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise UsageError(
            f"all_gather_object sends JSON values only (dict, list, str, int, float, bool, None). "
            f"Received: {type(obj).__name__} ({exc})"
        ) from None
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def decode(data: np.ndarray) -> Any:
    return json.loads(np.asarray(data, dtype=np.uint8).tobytes().decode("utf-8"))
