"""The names mmrun uses for frameworks and devices: one definition, one way to read a user's spelling.

Every room of the house (the launcher, the backend, the feature table, translate, the training
arguments) uses these; nothing else defines a framework or device list. Framework-free.

Devices are named as torch names them, on both frameworks: "npu", "cuda", "cpu". MindSpore's own
names for the same devices ("Ascend", "GPU", "CPU") appear only where MindSpore is called
(`MINDSPORE_TARGETS`, used by backend/mindspore/device.py).
"""
from __future__ import annotations

from mmrun.backend.errors import FrameworkChoiceError, UsageError

FRAMEWORKS: tuple[str, ...] = ("pytorch", "mindspore")
DEFAULT_FRAMEWORK = "pytorch"
# lower-case spelling -> framework
FRAMEWORK_ALIASES: dict[str, str] = {"pytorch": "pytorch", "torch": "pytorch", "mindspore": "mindspore"}

# how a command line names the framework: mmrun's option, which MindSpeed-style training scripts also take
FRAMEWORK_FLAGS: tuple[str, ...] = ("--ai-framework", "--ai_framework")

DEVICES: tuple[str, ...] = ("npu", "cuda", "cpu")
# lower-case spelling (torch's or MindSpore's) -> device kind
DEVICE_ALIASES: dict[str, str] = {"npu": "npu", "ascend": "npu", "cuda": "cuda", "gpu": "cuda", "cpu": "cpu"}
# device kind -> MindSpore's device target
MINDSPORE_TARGETS: dict[str, str] = {"npu": "Ascend", "cuda": "GPU", "cpu": "CPU"}


def framework_name(name: str, source: str | None = None) -> str:
    """"pytorch" or "mindspore" for any accepted spelling (any case, "torch"); else FrameworkChoiceError.

    `source` says where the value came from, for the message ("MMRUN_AI_FRAMEWORK=...").
    """
    found = FRAMEWORK_ALIASES.get(str(name).strip().lower())
    if found is None:
        where = f" from {source}" if source else ""
        raise FrameworkChoiceError(f"Unknown AI framework {name!r}{where}. Choose one of: {', '.join(FRAMEWORKS)}")
    return found


def device_kind(name: str) -> str:
    """"npu", "cuda" or "cpu" from torch's names or MindSpore's (Ascend/GPU/CPU); an index (npu:0) is dropped."""
    found = DEVICE_ALIASES.get(str(name).split(":")[0].strip().lower())
    if found is None:
        raise UsageError(f"Unknown device {name!r}. Choose one of: {', '.join(DEVICES)} (or Ascend, GPU)")
    return found
