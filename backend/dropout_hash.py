"""The dropout mask both backends draw, bit for bit: a counter-based hash of (seed, call, element index).

Framework-neutral (numpy only) so that `backend.torch.ops.dropout` and `backend.mindspore.ops.dropout`
share one definition and the tests have a reference to compare both against.

How a mask is drawn, all arithmetic modulo 2**32:

1. The dropout generator steps once per dropout call (p strictly between 0 and 1, training), returning
   (seed, call): the seed it was given and the number of calls before this one. This is what
   `mindspore.Generator._step(1)` returns after `manual_seed(seed)` (measured on MindSpore 2.10: state
   (seed, 0), then (seed, 0), (seed, 1), ...; `get_state()` is those two int64 as 16 little-endian
   bytes); `CounterGenerator` below is the same thing in Python for torch.
2. key = H(H(H(call_lo ^ call_hi) ^ seed_lo) ^ seed_hi), with *_lo, *_hi the low and high 32 bits;
   multiplier = H(key ^ SALTS[0]) | 1, offset = H(key ^ SALTS[1]).
3. word[i] = H(i * multiplier + offset) for the row-major element index i; element i is kept when
   word[i] >= threshold(p), so it is dropped with probability threshold(p) / 2**32.

H is `hash32`. An odd multiplier makes i -> i * multiplier + offset a bijection, so within a call no
two elements hash the same word; hence at most 2**32 elements per call.

Which dropout a run uses (`--dropout-impl`, `DROPOUT_IMPLS`): "hash" draws every mask from this hash
(attention dropout then runs in the explicit attention, since no fused attention kernel takes an
external mask), "native" uses the framework's own dropout and fused attention with its own RNG, and
"auto" picks per device (`AUTO_DROPOUT_IMPL`): the hash where it costs nothing, native elsewhere.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mmrun.backend.errors import UsageError
from mmrun.backend.vocabulary import device_kind

MASK32 = 0xFFFFFFFF
MAX_ELEMENTS = 1 << 32
# hash32 is the best two-round xorshift-multiply hash of Wellons' hash-prospector (bias 0.108):
# xorshift by XORSHIFTS[0], multiply by MULTIPLIERS[0], xorshift by XORSHIFTS[1], multiply by
# MULTIPLIERS[1], xorshift by XORSHIFTS[2].
XORSHIFTS = (16, 15, 15)
MULTIPLIERS = (0x21F0AAAD, 0x735A2D97)
SALTS = (0x9E3779B9, 0x85EBCA6B)


DROPOUT_IMPLS = ("auto", "hash", "native")
# device kind -> what "auto" means there, on both frameworks. CPU: the hash runs as fast as the framework's
# dropout (chunked on torch, measured) and attention kernels are no faster than the explicit path, so the
# cross-framework masks come free. Accelerators: fused attention draws its dropout from the framework's RNG,
# and a hash mask would force the explicit attention (2.3x slower in bf16 and twice the memory on an H100);
# the hash stays an explicit choice there (cheap on CUDA with Triton, see backend/torch/kernels.py).
AUTO_DROPOUT_IMPL = {"cpu": "hash", "cuda": "native", "npu": "native"}


def resolve_impl(impl: str, device: str) -> str:
    """"hash" or "native" for a `--dropout-impl` value on a device (any spelling: cuda, GPU, Ascend, npu:0)."""
    if impl not in DROPOUT_IMPLS:
        raise UsageError(f"dropout implementation must be one of {', '.join(DROPOUT_IMPLS)}. Received: {impl!r}")
    return AUTO_DROPOUT_IMPL[device_kind(device)] if impl == "auto" else impl


def native_impls(device: str) -> tuple[str, ...]:
    """The `--dropout-impl` values that mean the framework's own dropout on this device: a constant that
    code compiled by mindspore.jit can test with `in` (it cannot call resolve_impl)."""
    return tuple(impl for impl in DROPOUT_IMPLS if resolve_impl(impl, device) == "native")


def check_probability(p: float) -> float:
    """torch's check and message, so both backends reject the same values the same way."""
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    return p


def check_size(numel: int, shape: Sequence[int]) -> int:
    if numel > MAX_ELEMENTS:
        raise ValueError(f"dropout draws at most 2**32 elements per call; got shape {tuple(shape)}")
    return numel


def threshold(p: float) -> int:
    """The smallest kept word: round(p * 2**32), capped so that p just below 1 still keeps something."""
    return min(round(p * MAX_ELEMENTS), MAX_ELEMENTS - 1)


def hash32(value: int) -> int:
    """A bijection of [0, 2**32) onto itself that mixes every input bit into every output bit."""
    h = value & MASK32
    for shift, multiplier in zip(XORSHIFTS, MULTIPLIERS + (1,)):
        h ^= h >> shift
        h = (h * multiplier) & MASK32
    return h


def call_key(seed: int, call: int) -> tuple[int, int]:
    """(multiplier, offset) of one dropout call: step 2 of the module docstring."""
    key = hash32(hash32(hash32((call & MASK32) ^ ((call >> 32) & MASK32)) ^ (seed & MASK32))
                 ^ ((seed >> 32) & MASK32))
    return hash32(key ^ SALTS[0]) | 1, hash32(key ^ SALTS[1])


def hash32_numpy(h: np.ndarray) -> np.ndarray:
    """`hash32` of every element, in numpy's uint32 arithmetic (which wraps modulo 2**32)."""
    h = np.array(h, dtype=np.uint32, ndmin=1)  # a copy: arrays wrap silently, numpy scalars warn on overflow
    for shift, multiplier in zip(XORSHIFTS, MULTIPLIERS + (1,)):
        h ^= h >> np.uint32(shift)
        h *= np.uint32(multiplier)
    return h


def random_words(seed: int, call: int, shape: Sequence[int]) -> np.ndarray:
    """The uint32 words of one call (step 3), shaped like the dropout input: the reference implementation."""
    numel = check_size(int(np.prod(shape, dtype=np.int64)), shape)
    multiplier, offset = call_key(seed, call)
    index = np.arange(numel, dtype=np.uint32)  # numel == 2**32 wraps to 0 here: never drawn in tests
    return hash32_numpy(index * np.uint32(multiplier) + np.uint32(offset)).reshape(tuple(shape))


def keep_mask(seed: int, call: int, shape: Sequence[int], p: float) -> np.ndarray:
    """Bool mask, True where dropout with probability p keeps the element (0 < p < 1)."""
    return random_words(seed, call, shape) >= np.uint32(threshold(p))


class CounterGenerator:
    """mindspore.Generator's (seed, offset) bookkeeping in Python: what torch's dropout draws from.

    `step()` returns (seed, offset) and then counts one call, as `mindspore.Generator._step(1)` does.
    Its state is two integers, so it goes into a JSON checkpoint as they are.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.offset = 0

    def manual_seed(self, seed: int) -> None:
        self.seed, self.offset = seed, 0

    def step(self) -> tuple[int, int]:
        drawn = (self.seed, self.offset)
        self.offset += 1
        return drawn

    def get_state(self) -> dict[str, int]:
        return {"seed": self.seed, "offset": self.offset}

    def set_state(self, state: dict[str, int]) -> None:
        self.seed, self.offset = int(state["seed"]), int(state["offset"])
