"""The MindSpore backend (CPU, GPU or Ascend; PyNative mode, MindSpore's default).

Importing this package imports mindspore, puts MSAdapter on sys.path when one was given
(`--msadapter-path` / MSADAPTER_PATH) and sets the device: MindSpore fixes the device at the first
kernel it runs, so it is set here, before any user tensor exists. Its submodules have the same names
and public functions as `mmrun.backend.torch`'s.
"""
from __future__ import annotations

from mmrun.backend import selection
from mmrun.backend.errors import FrameworkNotInstalledError

NAME = "mindspore"
# Subpackages with no PyTorch twin: not part of the portable face (tests/backend_api/test_backend_face.py).
# `parallel`: Megatron's TP/PP built from MindSpore's collectives (PyTorch's engine is megatron-core itself).
# lean_import: how mindspore itself is imported (triton hidden on a CPU-only host); torch has no such step.
FRAMEWORK_ONLY = frozenset({"parallel", "lean_import"})

try:
    # Without triton on a CPU-only host: 71 MB less per process (lean_import.py, measured there).
    from mmrun.backend.mindspore.lean_import import import_mindspore
    mindspore = import_mindspore()
except ModuleNotFoundError as exc:
    if exc.name != "mindspore":
        raise
    raise FrameworkNotInstalledError(NAME, "mindspore", selection.choice().source) from None


def version() -> str:
    return mindspore.__version__


from mmrun.backend.mindspore import device, distributed, msadapter, seeding  # noqa: E402  (needs mindspore above)

__all__ = ["NAME", "version", "device", "distributed", "msadapter", "seeding"]

msadapter.activate_if_requested()
device.detect()
