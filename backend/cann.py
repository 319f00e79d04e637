"""Whether Huawei's CANN toolkit (the Ascend runtime) is present, without importing a framework.

torch_npu and MindSpore's Ascend plugin both dlopen CANN's libraries (libhccl.so, libge_runner.so);
when they are missing, torch_npu breaks a plain `import torch` (see torch/__init__.py here) and
MindSpore logs plugin-load warnings. Both backends ask this module first so that a CPU machine with
an NPU package installed stays quiet and working.
"""
from __future__ import annotations

import ctypes.util
import importlib.util
import functools
import os
from typing import Mapping

# Set by CANN's set_env.sh; either one means the user sourced it.
CANN_HOME_VARS: tuple[str, ...] = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
HCCL_LIBRARY = "libhccl.so"


def _hccl_on_library_path(environ: Mapping[str, str]) -> str | None:
    for folder in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        candidate = os.path.join(folder, HCCL_LIBRARY)
        if folder and os.path.exists(candidate):
            return candidate
    return None


@functools.lru_cache(maxsize=1)
def _hccl_in_ld_cache() -> str | None:
    # ctypes.util.find_library runs `ldconfig -p`: a few milliseconds, so cached.
    return ctypes.util.find_library("hccl")


# Words for a warning: what was looked at and not found.
CANN_MISSING = f"{' and '.join(CANN_HOME_VARS)} are unset and {HCCL_LIBRARY} is not on the library path"


def cann_location(environ: Mapping[str, str] | None = None, use_ld_cache: bool = True) -> str | None:
    """Where CANN was found (a folder or library path), or None when it is absent."""
    env = os.environ if environ is None else environ
    for name in CANN_HOME_VARS:
        folder = env.get(name)
        if folder and os.path.isdir(folder):
            return folder
    return _hccl_on_library_path(env) or (_hccl_in_ld_cache() if use_ld_cache else None)


AUTOLOAD_VAR = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def guard_torch_npu_autoload(environ: dict[str, str] | None = None) -> str | None:
    """Set TORCH_DEVICE_BACKEND_AUTOLOAD=0 when torch_npu is installed but CANN is missing.

    torch (2.5+) imports every installed device extension during `import torch`; torch_npu then
    fails on libhccl.so and takes `import torch` down with it. The variable only works if it is set
    before the first `import torch` of the process, so call this before that import, or pass a
    child's environment (a launcher starting torchrun). An explicit user setting is left alone.
    Returns the reason when it disabled auto-loading, else None.
    """
    env = os.environ if environ is None else environ
    if AUTOLOAD_VAR in env or importlib.util.find_spec("torch_npu") is None:
        return None
    if cann_location(env) is not None:
        return None
    env[AUTOLOAD_VAR] = "0"
    return f"CANN was not found: {CANN_MISSING}; {AUTOLOAD_VAR}=0 was set so that import torch works"
