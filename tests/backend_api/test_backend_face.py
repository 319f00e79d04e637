"""The public faces of mmrun.backend.torch and mmrun.backend.mindspore are the same: the same module
names, and in each module the same public functions and classes with the same signatures (parameter
names, kinds and plain-value defaults), and the same public methods on the classes mmrun defines.

Framework-specific constants (UPPER_CASE: device variables, chunk sizes) and the framework's own
protocol methods (`forward`, `construct`) are allowed to differ; everything a model or the trainer
calls is not. A backend package may declare subpackages that are its own alone in `FRAMEWORK_ONLY`
(torch: `megatron_core`); those are left out of the comparison.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import pytest

PROTOCOL_METHODS = {"forward", "construct"}
PLAIN = (type(None), bool, int, float, str, tuple)


def _modules(package_name: str) -> set[str]:
    """The package's public modules, less the framework-only subpackages it declares (FRAMEWORK_ONLY:
    megatron-core's engine on torch, say), which have no twin and are no part of the portable face."""
    package = importlib.import_module(package_name)
    own = set(getattr(package, "FRAMEWORK_ONLY", ()))
    return {m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_") and m.name not in own}


def _defined(module: types.ModuleType) -> dict[str, object]:
    """Public functions and classes this module defines itself (not what it imports to use)."""
    return {name: value for name, value in vars(module).items()
            if not name.startswith("_") and not name.isupper() and (inspect.isfunction(value) or inspect.isclass(value))
            and value.__module__ == module.__name__}


def _signature(fn: object) -> list[tuple]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [(p.name, p.kind, p.default if isinstance(p.default, PLAIN) else "<object>")
            for p in sig.parameters.values()]


def _own_methods(cls: type) -> set[str]:
    """Public methods defined by mmrun classes in this class's hierarchy (not torch's or MindSpore's)."""
    names = set()
    for klass in cls.__mro__:
        if klass.__module__.startswith("mmrun."):
            names |= {n for n, v in vars(klass).items() if not n.startswith("_") and callable(v)
                      and n not in PROTOCOL_METHODS}
    return names


def _ours(value: object) -> bool:
    return (getattr(value, "__module__", "") or "").startswith("mmrun.")


def test_both_backends_have_the_same_modules():
    assert _modules("mmrun.backend.torch") == _modules("mmrun.backend.mindspore")


@pytest.mark.parametrize("module", sorted(_modules("mmrun.backend.torch")))
def test_module_faces_match(bt, bm, module):
    torch_mod = importlib.import_module(f"mmrun.backend.torch.{module}")
    ms_mod = importlib.import_module(f"mmrun.backend.mindspore.{module}")
    torch_face, ms_face = _defined(torch_mod), _defined(ms_mod)
    # Defined on one side, it must exist on the other (there it may be the framework's own object:
    # torch's nn.Module is torch.nn.Module itself, MindSpore's a Cell written here).
    missing = sorted({f"{n} (missing on mindspore)" for n in torch_face if not hasattr(ms_mod, n)}
                     | {f"{n} (missing on torch)" for n in ms_face if not hasattr(torch_mod, n)})
    assert not missing, missing
    shared = {n: (getattr(torch_mod, n), getattr(ms_mod, n)) for n in set(torch_face) | set(ms_face)}
    differences = []
    for name in sorted(shared):
        a, b = shared[name]
        if not (_ours(a) and _ours(b)):
            continue  # a framework's own object under a shared name (Tensor, Module): presence is the contract
        if inspect.isclass(a) and inspect.isclass(b):
            if _signature(a.__init__) != _signature(b.__init__):
                differences.append(f"{name}.__init__: {_signature(a.__init__)} vs {_signature(b.__init__)}")
            methods_a, methods_b = _own_methods(a), _own_methods(b)
            lacking = sorted({f"{m} (not on mindspore)" for m in methods_a if not hasattr(b, m)}
                             | {f"{m} (not on torch)" for m in methods_b if not hasattr(a, m)})
            if lacking:
                differences.append(f"{name} methods: {lacking}")
            for method in sorted(methods_a & methods_b):
                sa, sb = _signature(getattr(a, method)), _signature(getattr(b, method))
                if sa != sb:
                    differences.append(f"{name}.{method}: {sa} vs {sb}")
        elif callable(a) and callable(b):
            if _signature(a) != _signature(b):
                differences.append(f"{name}: {_signature(a)} vs {_signature(b)}")
    assert not differences, "\n".join(differences)
