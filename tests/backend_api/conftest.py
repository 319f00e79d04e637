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
