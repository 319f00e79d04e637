"""mmrun.backend: the ground floor that imports torch, torch_npu or mindspore (with engines/<framework>/ above it).

The framework is chosen once per process (`--ai-framework` in sys.argv, else MMRUN_AI_FRAMEWORK,
else pytorch; see selection.py) and imported only when something needs it, so launcher commands
stay fast and work with neither framework installed. Each framework has a package with the same
module names (keras 3 style): `mmrun.backend.torch`, `mmrun.backend.mindspore`.

    from mmrun import backend
    backend.init_distributed()            # process group / msrun scheduler, when world size > 1
    backend.seeding.seed_everything(1234)
    y = backend.distributed.all_reduce(x, op="mean")
    print(backend.current())              # BackendInfo(framework='pytorch', device_kind='cpu', ...)
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from mmrun.backend import rank_env
from mmrun.backend.errors import BackendError
from mmrun.backend.info import BackendInfo, DeviceInfo
from mmrun.backend.selection import FRAMEWORKS, choice, framework, select

# The lazy submodules are left out on purpose: `from mmrun.backend import *` must not import a framework.
__all__ = [
    "BackendError", "BackendInfo", "DeviceInfo", "FRAMEWORKS", "choice", "current", "framework",
    "init_distributed", "load", "select",
]

# framework name -> its package under mmrun.backend
PACKAGES: dict[str, str] = {"pytorch": "mmrun.backend.torch", "mindspore": "mmrun.backend.mindspore"}
# Module attributes that resolve, on first use, to the chosen framework's submodule of that name.
LAZY_SUBMODULES: frozenset[str] = frozenset(
    {"nn", "ops", "optim", "autograd", "train_step", "tensors", "distributed", "device", "seeding", "kernels",
     "probe", "profiler"}
)


def load() -> ModuleType:
    """The chosen framework's package, imported (device set up) on first call."""
    return importlib.import_module(PACKAGES[framework()])


def init_distributed(backend: str | None = None, **options: Any) -> BackendInfo:
    """Start communication when the world size is above 1, and say where this process stands.

    `backend` is the script's `--distributed-backend`; one that cannot work on this device is
    replaced by the one that does (with a notice). Under msrun, the scheduler process (MS_ROLE=MS_SCHED)
    runs the scheduler here and exits 0: the training body after this call never runs there.
    """
    load().distributed.init_distributed(backend, **options)
    return current()


def current() -> BackendInfo:
    """Framework, version, device, distributed backend and ranks of this process."""
    package = load()
    dev = package.device.detect()
    dist = package.distributed
    return BackendInfo(
        framework=framework(),
        version=package.version(),
        device_kind=dev.kind,
        device_index=dev.index,
        dist_backend=dist.backend_name(),
        rank=dist.get_rank(),
        local_rank=rank_env.read_rank_info().local_rank,
        world_size=dist.get_world_size(),
    )


def __getattr__(name: str) -> ModuleType:
    if name not in LAZY_SUBMODULES:
        raise AttributeError(f"module 'mmrun.backend' has no attribute {name!r}")
    return importlib.import_module(f"{load().__name__}.{name}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | LAZY_SUBMODULES)
