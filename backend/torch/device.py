"""Which device this torch process runs on: NPU, else CUDA, else CPU.

NPU is checked before CUDA because torch_npu's `transfer_to_npu` patches `torch.cuda` so that CUDA
looks available on an NPU host. A torch_npu that is installed but unusable (no CANN, no NPU) costs a
one-time warning, never the run: torch carries on on CPU.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import threading
from typing import Any

import torch

from mmrun.backend import checks, rank_env
from mmrun.backend.errors import UsageError, warn_once
from mmrun.backend.info import DeviceInfo
from mmrun.backend.torch import NPU_AUTOLOAD_DISABLED

# Opt-in automatic migration of CUDA code to the NPU (torch_npu.contrib.transfer_to_npu): it patches
# torch globally (torch.cuda -> torch.npu, nccl -> hccl, torch.jit.script -> no-op), so it is off by default.
TRANSFER_TO_NPU_VAR = "MMRUN_TRANSFER_TO_NPU"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}

_lock = threading.Lock()
_detected: DeviceInfo | None = None


def _drop_torch_npu_modules() -> None:
    # A failed `import torch_npu` leaves half-initialised submodules behind; a later import (by user
    # code, by a library probing for NPUs) would then see them instead of a clean ImportError.
    for name in [m for m in sys.modules if m == "torch_npu" or m.startswith("torch_npu.")]:
        del sys.modules[name]


def _npu_usable() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except Exception as exc:  # noqa: BLE001  torch_npu raises ImportError, OSError or RuntimeError without CANN
        _drop_torch_npu_modules()
        first_line = (str(exc).splitlines() or [""])[0]
        why = f"; {NPU_AUTOLOAD_DISABLED}" if NPU_AUTOLOAD_DISABLED else ""
        warn_once(
            f"torch_npu is installed but cannot be used ({type(exc).__name__}: {first_line}){why}. "
            "Running on CPU; to use the NPU, install CANN and source its set_env.sh"
        )
        return False
    if not torch.npu.is_available():
        warn_once("torch_npu is installed but torch.npu.is_available() is False (no NPU visible). Running without NPU")
        return False
    return True


def _flag(name: str) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise UsageError(f"{name} must be 1 or 0. Received: {name}={os.environ[name]!r}")


def _detect() -> DeviceInfo:
    local_rank = rank_env.read_rank_info().local_rank
    if _npu_usable():
        kind, count = "npu", torch.npu.device_count()
    elif torch.cuda.is_available():
        kind, count = "cuda", torch.cuda.device_count()
    else:
        return DeviceInfo("cpu", 0, checks.dist_backend("pytorch", "cpu"))
    # Modulo: launchers that show each rank a single device (ASCEND_RT_VISIBLE_DEVICES or
    # CUDA_VISIBLE_DEVICES per rank) give local ranks above the visible count.
    return DeviceInfo(kind, local_rank % max(count, 1), checks.dist_backend("pytorch", kind))


def _apply(info: DeviceInfo) -> None:
    if info.kind == "npu":
        torch.npu.set_device(info.index)
    elif info.kind == "cuda":
        torch.cuda.set_device(info.index)
    if _flag(TRANSFER_TO_NPU_VAR):
        if info.kind == "npu":
            import torch_npu.contrib.transfer_to_npu  # noqa: F401  (patches torch on import)
        else:
            warn_once(f"{TRANSFER_TO_NPU_VAR}=1 is ignored: this process runs on {info.kind}, not on an NPU")


def detect() -> DeviceInfo:
    """The device kind ("npu" | "cuda" | "cpu"), its local index and its distributed backend.

    Detected once per process, and made current (set_device, optional transfer_to_npu) at that time.
    """
    global _detected
    with _lock:
        if _detected is None:
            info = _detect()
            _apply(info)
            _detected = info
        return _detected


def default_device() -> "torch.device":
    """Where new tensors and models should go."""
    info = detect()
    return torch.device("cpu") if info.kind == "cpu" else torch.device(info.kind, info.index)


def to_device(obj: Any) -> Any:
    """A module (moved in place, returned) or tensor on this process's device; already there: unchanged.

    For what a user built on the host (a model from `model_provider`): the trainer calls it once, so
    that every parameter, gradient and optimizer state lives on the device."""
    where = default_device()
    if isinstance(obj, torch.nn.Module):
        return obj.to(where)
    return obj if obj.device == where else obj.to(where, non_blocking=True)


def peak_memory_mb() -> float | None:
    """Peak memory allocated by tensors on this process's accelerator (MB, torch's max_memory_allocated);
    None on CPU, where the process's peak resident set size says it instead."""
    kind = detect().kind
    if kind == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    if kind == "npu":
        return torch.npu.max_memory_allocated() / 2**20
    return None


def compile_cache(directory: str) -> str | None:
    """None: the PyTorch step runs eagerly, there is no compiled graph to keep (MindSpore's twin saves its graphs)."""
    return None
