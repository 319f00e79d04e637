"""MSAdapter: run user `import torch` code on MindSpore by putting MSAdapter's tree first on sys.path.

MSAdapter is distributed as source. MindSpeed-Core-MS lays it out as `<root>/msadapter/` (holding
its own `torch/`, `torch_npu/`, ...) and `<root>/msadapter/msa_thirdparty/` (apex and friends), and
puts both first on PYTHONPATH. This module does the same in-process for a root given by
`--msadapter-path` or MSADAPTER_PATH, then checks that `import torch` now finds MSAdapter's torch: a
real torch found first would run the user's code on the wrong framework without a word.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from mmrun.backend.errors import MSAdapterError
from mmrun.backend.selection import msadapter_request

TREE = "msadapter"
THIRD_PARTY = "msa_thirdparty"


def _tree(root: Path, source: str) -> Path:
    """`<root>/msadapter`, or root itself when the user pointed at the msadapter folder."""
    if (root / TREE).is_dir():
        return root / TREE
    if root.name == TREE and root.is_dir():
        return root
    raise MSAdapterError(f"MSAdapter tree not found: {root} has no {TREE}/ folder (from {source}); "
                         f"pass the folder that contains {TREE}/ and {TREE}/{THIRD_PARTY}/")


def _inside(path: str | None, folder: Path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(folder)


def activate(root: str, source: str = "code") -> list[str]:
    """Put MSAdapter first on sys.path (and PYTHONPATH for child processes); return the folders added."""
    tree = _tree(Path(root).expanduser().resolve(), source)
    folders = [str(tree)] + ([str(tree / THIRD_PARTY)] if (tree / THIRD_PARTY).is_dir() else [])
    loaded = sys.modules.get("torch")
    if loaded is not None and not _inside(getattr(loaded, "__file__", None), tree):
        raise MSAdapterError(
            f"torch was already imported from {loaded.__file__} before MSAdapter ({source}) was put on sys.path; "
            "load the backend (mmrun.backend.load()) before anything imports torch"
        )
    sys.path[:] = folders + [p for p in sys.path if p not in folders]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        folders + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in folders]
    )
    importlib.invalidate_caches()
    spec = importlib.util.find_spec("torch")
    found = spec.origin if spec is not None else None
    if not _inside(found, tree):
        raise MSAdapterError(
            f"MSAdapter from {source} is on sys.path, but `import torch` resolves to {found or 'nothing'}, "
            f"not into {tree}; check that {tree}/torch/__init__.py exists"
        )
    return folders


def activate_if_requested() -> list[str] | None:
    request = msadapter_request()
    return None if request is None else activate(*request)
