"""One model source built against both frameworks in one process (parity tests, benchmarks, reports).

Model files are written once with `from mmrun.backend import nn, ops`, which gives the framework chosen
for the process. To hold the torch AND the mindspore build of the same file side by side,
`load_module("mmrun.models.gpt", "mindspore")` executes the file as a fresh module through the standard
import machinery, while `sys.modules["mmrun.backend"]` briefly names a stand-in whose `nn`, `ops`, ...
are that framework's modules. Only the `from mmrun.backend import ...` statements run during that moment
see it; the file itself is neither changed nor copied. Not for training jobs: they import models normally.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType

from mmrun.backend.vocabulary import framework_name

_PACKAGES = {"pytorch": "mmrun.backend.torch", "mindspore": "mmrun.backend.mindspore"}
_lock = threading.Lock()


def backend_package(framework: str) -> ModuleType:
    """`mmrun.backend.torch` or `mmrun.backend.mindspore` for "pytorch"/"torch" or "mindspore"."""
    try:
        name = framework_name(framework)
    except ValueError:
        raise ValueError(f"unknown framework {framework!r}; use one of: pytorch, mindspore") from None
    return importlib.import_module(_PACKAGES[name])


def _bound_backend(package: ModuleType) -> ModuleType:
    """A stand-in for `mmrun.backend` whose submodule attributes are `package`'s."""
    real = importlib.import_module("mmrun.backend")
    stand_in = ModuleType("mmrun.backend")
    stand_in.__dict__.update({k: v for k, v in real.__dict__.items() if k != "__getattr__"})
    stand_in.__path__ = list(real.__path__)

    def framework_submodule(name: str) -> ModuleType:
        if name not in real.LAZY_SUBMODULES:
            raise AttributeError(f"module 'mmrun.backend' has no attribute {name!r}")
        return importlib.import_module(f"{package.__name__}.{name}")

    stand_in.__getattr__ = framework_submodule  # type: ignore[attr-defined]
    return stand_in


def load_module(module_name: str, framework: str) -> ModuleType:
    """`module_name` (e.g. "mmrun.models.gpt") built against `framework`'s backend; cached per pair as
    `sys.modules["<module_name>[torch|mindspore]"]` (MindSpore's jit finds classes through sys.modules)."""
    package = backend_package(framework)
    name = f"{module_name}[{package.__name__.rsplit('.', 1)[1]}]"
    with _lock:
        if name in sys.modules:
            return sys.modules[name]
        found = importlib.util.find_spec(module_name)
        if found is None or found.origin is None:
            raise ValueError(f"cannot find model module {module_name!r}; pass a dotted name such as mmrun.models.gpt")
        spec = importlib.util.spec_from_file_location(name, found.origin)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        real = sys.modules["mmrun.backend"]
        sys.modules["mmrun.backend"] = _bound_backend(package)
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        finally:
            sys.modules["mmrun.backend"] = real
        return module
