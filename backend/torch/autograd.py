"""Gradients on the torch backend, behind the contract shared with the mindspore backend.

`value_and_grad(fn, params, has_aux=False)` returns a function that calls `fn(*args, **kwargs)` and
returns `(value, grads)`, or `((value, aux), grads)` when `fn` returns `(value, aux)`; `grads` is a
tuple aligned with `params` (zeros for a parameter `fn` does not use). It does not touch `.grad`.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import torch


def value_and_grad(fn: Callable[..., Any], params: Iterable[torch.Tensor], has_aux: bool = False) -> Callable[..., Any]:
    params = tuple(params)

    def value_and_grad_fn(*args: Any, **kwargs: Any) -> tuple[Any, tuple[torch.Tensor, ...]]:
        out = fn(*args, **kwargs)
        value = out[0] if has_aux else out
        grads = torch.autograd.grad(value, params, allow_unused=True)
        grads = tuple(torch.zeros_like(p) if g is None else g for p, g in zip(params, grads))
        value = value.detach()
        return ((value, out[1]) if has_aux else value), grads

    return value_and_grad_fn


def no_grad() -> torch.autograd.grad_mode.no_grad:
    """Context manager: run without recording for backward (evaluation)."""
    return torch.no_grad()
