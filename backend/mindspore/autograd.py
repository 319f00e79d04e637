"""Gradients on the mindspore backend, behind the contract shared with the torch backend.

`value_and_grad(fn, params, has_aux=False)` returns a function that calls `fn(*args, **kwargs)` and
returns `(value, grads)`, or `((value, aux), grads)` when `fn` returns `(value, aux)`; `grads` is a
tuple aligned with `params` (zeros for a parameter `fn` does not use). Works in PyNative and inside
`mindspore.jit`.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable

import mindspore as ms


def value_and_grad(fn: Callable[..., Any], params: Iterable[ms.Parameter], has_aux: bool = False) -> Callable[..., Any]:
    # grad_position=None: gradients with respect to the parameters only, not the inputs.
    return ms.value_and_grad(fn, None, ms.ParameterTuple(list(params)), has_aux=has_aux)


def no_grad() -> contextlib.AbstractContextManager:
    """Context manager: run without recording for backward (evaluation)."""
    # MindSpore records a backward graph only inside value_and_grad / grad, so plain calls need nothing.
    return contextlib.nullcontext()
