"""MSAdapter on the PyTorch backend: not applicable (mirror of mindspore/msadapter.py).

MSAdapter is MindSpore's implementation of the torch API; with real torch there is nothing to put
on sys.path. An explicit `--msadapter-path` is a mistake worth stopping for; an inherited
MSADAPTER_PATH (set by an Ascend environment script) is only noted.
"""
from __future__ import annotations

from mmrun.backend.errors import UnsupportedError, warn_once
from mmrun.backend.selection import msadapter_request


def activate(root: str, source: str = "code") -> list[str]:
    """Refused: MSAdapter is MindSpore's torch; with real torch there is nothing to put on sys.path."""
    raise UnsupportedError("MSAdapter", "pytorch", f"{root} (from {source})",
                           hint="MSAdapter runs torch code on MindSpore: add --ai-framework mindspore")


def activate_if_requested() -> None:
    request = msadapter_request()
    if request is None:
        return
    path, source = request
    if source.startswith("--msadapter-path"):
        raise UnsupportedError(
            "MSAdapter (--msadapter-path)", "pytorch", path,
            hint="MSAdapter runs torch code on MindSpore: add --ai-framework mindspore, or drop --msadapter-path",
        )
    warn_once(f"{source} is ignored with the pytorch backend (MSAdapter needs --ai-framework mindspore)")
