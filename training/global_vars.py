"""Megatron's global accessors for the entry's callbacks: `get_args()`, `get_tokenizer()`, `print_rank_0()`.

Megatron's pretrain_gpt.py reads its settings through these instead of taking them as parameters, so
the five callbacks keep Megatron's signatures. `pretrain()` sets them once, before calling any callback.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

_ARGS: argparse.Namespace | None = None
_TOKENIZER: Any = None


def set_global_variables(args: argparse.Namespace, tokenizer: Any) -> None:
    global _ARGS, _TOKENIZER
    _ARGS, _TOKENIZER = args, tokenizer


def get_args() -> argparse.Namespace:
    if _ARGS is None:
        raise RuntimeError("get_args() was called before pretrain() parsed the arguments; call it from a callback")
    return _ARGS


def get_tokenizer() -> Any:
    if _TOKENIZER is None:
        raise RuntimeError("get_tokenizer() was called before pretrain() built the tokenizer; call it from a callback")
    return _TOKENIZER


def print_rank_0(message: str) -> None:
    """Print on rank 0 only (every rank when called before the arguments exist)."""
    if _ARGS is None or getattr(_ARGS, "rank", 0) == 0:
        print(message, file=sys.stdout, flush=True)
