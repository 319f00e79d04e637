"""Shared fixtures: both backends in one process, and the parity script's measuring functions."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def parity():
    """scripts/parity_report.py as a module: the tests assert on the same measurements the report prints."""
    spec = importlib.util.spec_from_file_location("mmrun_parity_report", REPO / "scripts" / "parity_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def bt():
    """The torch backend package, submodules imported."""
    from mmrun.backend.torch import autograd, nn, ops, optim, tensors, train_step  # noqa: F401
    import mmrun.backend.torch as package
    return package


@pytest.fixture(scope="session")
def bm():
    """The mindspore backend package, submodules imported."""
    from mmrun.backend.mindspore import autograd, nn, ops, optim, tensors, train_step  # noqa: F401
    import mmrun.backend.mindspore as package
    return package


@pytest.fixture(scope="session")
def backends(bt, bm):
    return {"pytorch": bt, "mindspore": bm}


def _output_and_grads(be, fn, arrays, grad=True):
    """fn(ops, *tensors) -> tensor on backend `be`; returns (output, gradients of sum(output * w)) as numpy."""
    import numpy as np

    tensors = [be.tensors.from_numpy(a) for a in arrays]
    out = fn(be.ops, *tensors)
    if not grad:
        return be.tensors.to_numpy(out), []
    weights = be.tensors.from_numpy(np.random.default_rng(1).standard_normal(tuple(out.shape)).astype(np.float32))
    if be.__name__.endswith("torch"):
        for t in tensors:
            t.requires_grad_(True)
        out = fn(be.ops, *tensors)
        (out * weights).sum().backward()
        return be.tensors.to_numpy(out), [be.tensors.to_numpy(t.grad) for t in tensors]
    import mindspore as ms
    grads = ms.grad(lambda *ts: be.ops.sum(fn(be.ops, *ts) * weights), tuple(range(len(tensors))))(*tensors)
    grads = grads if isinstance(grads, tuple) else (grads,)
    return be.tensors.to_numpy(out), [be.tensors.to_numpy(g) for g in grads]


@pytest.fixture(scope="session")
def op_grads():
    """op_grads(backend, fn, arrays, grad=True) -> (output, gradients of sum(output * w)), numpy, on one backend."""
    return _output_and_grads
