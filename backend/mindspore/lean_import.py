"""`import mindspore` without the modules it imports for accelerators this host does not have.

Measured (benchmarks/ms_memory_knobs.py's notes, docs/precision-and-performance.md "Memory"; mindspore 2.10, x86_64):
`import mindspore` imports triton whenever triton is installed (PyTorch installs it), only to register MindSpore's
dtype names for triton kernels (mindspore/common/__init__.py), which run on a GPU or an NPU only. On a CPU-only host
that import is 71 MB of every MindSpore process's resident memory (peak RSS after `import mindspore`: 471 MB with
triton, 400 without). So on a host with neither a CUDA driver nor CANN, triton is hidden while mindspore imports and
made importable again right after (a PyTorch in the same process still finds it). MMRUN_MS_IMPORT_TRITON=1 lets
mindspore import it anyway. This module must not import mindspore itself: the package imports it first.
"""
from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from mmrun.backend import cann
from mmrun.backend.errors import UsageError

TRITON_VAR = "MMRUN_MS_IMPORT_TRITON"
TRITON_VALUES: dict[str, bool] = {"1": True, "0": False}
HIDDEN = "triton"


def _accelerator_runtime() -> bool:
    """A CUDA driver or CANN on this host (the same cheap look as device.py's, without asking mindspore)."""
    return os.path.exists("/dev/nvidiactl") or cann.cann_location() is not None


def skip_triton() -> bool:
    """Whether `import mindspore` goes without triton here: a CPU-only host, triton not imported yet, and
    MMRUN_MS_IMPORT_TRITON not 1."""
    value = os.environ.get(TRITON_VAR, "0").strip()
    if value not in TRITON_VALUES:
        raise UsageError(f"{TRITON_VAR} must be 1 (mindspore imports triton, as it does by itself) or 0 (the "
                         f"default: not on a CPU-only host). Received: {TRITON_VAR}={value!r}")
    return not TRITON_VALUES[value] and HIDDEN not in sys.modules and not _accelerator_runtime()


def import_mindspore() -> ModuleType:
    """`import mindspore`, without triton where `skip_triton()` says so."""
    if not skip_triton():
        return importlib.import_module("mindspore")
    sys.modules[HIDDEN] = None  # type: ignore[assignment] - `import triton` raises ImportError meanwhile
    try:
        return importlib.import_module("mindspore")
    finally:
        if sys.modules.get(HIDDEN, 0) is None:
            del sys.modules[HIDDEN]
