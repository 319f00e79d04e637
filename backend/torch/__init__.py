"""The PyTorch backend (torch, plus torch_npu on Ascend NPUs).

Importing this package imports torch, sets the device up (NPU, else CUDA, else CPU) and is what
`mmrun.backend.load()` returns when the framework is pytorch. Its submodules have the same names and
public functions as `mmrun.backend.mindspore`'s.
"""
from __future__ import annotations

import sys

from mmrun.backend import cann, selection
from mmrun.backend.errors import FrameworkNotInstalledError, TorchImportError

NAME = "pytorch"
# Modules and subpackages with no MindSpore twin: not part of the portable face
# (tests/backend_api/test_backend_face.py).
FRAMEWORK_ONLY = frozenset({"megatron_core", "process_group", "fsdp2", "pt_files"})

# Must run before the first `import torch` of the process: a torch_npu without CANN otherwise makes
# that import fail, and nothing can repair it afterwards (a second import trips over a duplicate
# TORCH_LIBRARY registration). device.py turns the reason into a warning.
NPU_AUTOLOAD_DISABLED: str | None = None if "torch" in sys.modules else cann.guard_torch_npu_autoload()

try:
    import torch
except ModuleNotFoundError as exc:
    if exc.name != "torch":
        raise
    raise FrameworkNotInstalledError(NAME, "torch", selection.choice().source) from None
except RuntimeError as exc:
    if "backend extension" not in str(exc):
        raise
    raise TorchImportError(
        f"import torch failed while loading a device extension ({str(exc).splitlines()[0]}). "
        f"If this machine has no NPU, set {cann.AUTOLOAD_VAR}=0; otherwise source CANN's set_env.sh"
    ) from exc


def version() -> str:
    return torch.__version__


from mmrun.backend.torch import device, distributed, msadapter, seeding  # noqa: E402  (needs torch above)

__all__ = ["NAME", "version", "device", "distributed", "msadapter", "seeding"]

msadapter.activate_if_requested()
device.detect()
