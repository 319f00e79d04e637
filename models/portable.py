"""Load a model file for a named framework, so one process can hold the same model on both.

Model files are written once with `from mmrun.backend import nn, ops`, which resolves to the
framework chosen for the process. Parity tests and benchmarks need the torch AND the mindspore build
of the same source side by side; `load(module_name, framework)` executes the model file again into a
separate module whose `from mmrun.backend import ...` statements bind `mmrun.backend.<framework>`.
The file itself is not changed or copied, so the model stays plain, nanoGPT-readable code.
"""
from __future__ import annotations

import builtins
import importlib
import importlib.util
import sys
from types import ModuleType

_PACKAGES = {"pytorch": "mmrun.backend.torch", "torch": "mmrun.backend.torch", "mindspore": "mmrun.backend.mindspore"}


def backend_package(framework: str) -> ModuleType:
    """`mmrun.backend.torch` or `mmrun.backend.mindspore` for "pytorch"/"torch" or "mindspore"."""
    try:
        return importlib.import_module(_PACKAGES[framework])
    except KeyError:
        raise ValueError(f"unknown framework {framework!r}; use one of: pytorch, mindspore") from None


def load(module_name: str, framework: str) -> ModuleType:
    """`module_name` (e.g. "mmrun.models.gpt") built against `framework`'s backend; cached per pair."""
    package = backend_package(framework)
    name = f"{module_name}[{package.__name__.rsplit('.', 1)[1]}]"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        raise ValueError(f"cannot find model module {module_name!r}; pass a dotted name such as mmrun.models.gpt")

    def bound_import(target, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002 - __import__'s names
        if target == "mmrun.backend" and level == 0 and fromlist:
            for sub in fromlist:
                importlib.import_module(f"{package.__name__}.{sub}")
            return package
        return builtins.__import__(target, globals, locals, fromlist, level)

    module = ModuleType(name)
    module.__file__ = spec.origin
    module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": bound_import}
    # Registered before executing: MindSpore's jit and dataclasses look classes up through sys.modules.
    sys.modules[name] = module
    try:
        with open(spec.origin, encoding="utf-8") as f:
            code = compile(f.read(), spec.origin, "exec")
        exec(code, module.__dict__)  # noqa: S102 - our own model source, found by import spec
    except BaseException:
        del sys.modules[name]
        raise
    return module
