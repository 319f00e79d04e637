"""One seed for Python, numpy and MindSpore, the same on every rank; MindSpore's RNG state as JSON."""
from __future__ import annotations

import base64
import random
from typing import Any

import mindspore
import numpy as np

from mmrun.backend import checks

# What `ops.dropout` draws from. Its own Generator, not mindspore's default one: under mindspore.jit the
# default generator hands the graph a seed that ignores manual_seed and changes from process to process
# (measured on 2.10, CPU), while a Generator made here gives the graph the seed set with manual_seed.
DROPOUT_GENERATOR = mindspore.Generator()
# A compiled step recomputes a recomputed cell's primitives in backward, the generator's step among them: the
# replayed step read the offset the later draws had moved, so recomputed layers drew other masks. Not recomputed,
# its (seed, offset) is kept (two scalars) and the recomputed hash draws the first forward's masks.
DROPOUT_GENERATOR._generator.recompute(False)


def seed_everything(seed: int) -> int:
    """Seed every generator this process uses and return the seed.

    Three MindSpore calls, because they feed different generators: set_seed drives ops.* random
    functions, initializers and mindspore.dataset (and numpy); manual_seed drives the default
    Generator behind mint.* random functions; DROPOUT_GENERATOR drives the backend's dropout.
    """
    checks.seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    mindspore.set_seed(seed)
    mindspore.manual_seed(seed)
    DROPOUT_GENERATOR.manual_seed(seed)
    return seed


def _to_text(state: mindspore.Tensor) -> str:
    return base64.b64encode(state.asnumpy().tobytes()).decode("ascii")


def _from_text(text: str) -> mindspore.Tensor:
    return mindspore.Tensor(np.frombuffer(base64.b64decode(text), dtype=np.uint8).copy())


def _dropout_state() -> dict[str, int]:
    # A Generator's state tensor is (seed, offset) as two little-endian int64; as integers it is the same
    # JSON as the torch backend's dropout generator, so either framework restores the other's.
    seed, offset = np.frombuffer(DROPOUT_GENERATOR.get_state().asnumpy().tobytes(), dtype="<i8")
    return {"seed": int(seed), "offset": int(offset)}


def _set_dropout_state(state: dict[str, int] | str) -> None:
    if isinstance(state, str):  # base64 of the state tensor, as checkpoints written before 2026-11-22 hold it
        DROPOUT_GENERATOR.set_state(_from_text(state))
        return
    raw = np.array([state["seed"], state["offset"]], dtype="<i8").view(np.uint8)
    DROPOUT_GENERATOR.set_state(mindspore.Tensor(raw.copy()))


def get_rng_state() -> dict[str, Any]:
    """MindSpore's RNG state as JSON: the default Generator as base64 of its state tensor, and the
    dropout generator's {"seed", "offset"} (the torch backend's format).

    Covered: DROPOUT_GENERATOR (everything `ops.dropout` draws, in PyNative and under jit) and
    mindspore's default Generator (`mindspore.get_rng_state`, behind mint.* random functions, which
    have no CPU kernel in 2.10). Not covered: the primitive-based random ops (ops.uniform, the
    initializers, mindspore.dataset), which keep their generator inside each kernel with no API to read
    it; `seed_everything` seeds them, and the training loop draws none of them after the model is built.
    Python's and numpy's generators are not here (the checkpoint saves them itself).
    """
    return {"default": _to_text(mindspore.get_rng_state()), "dropout": _dropout_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore a state from `get_rng_state` (after a JSON round trip): dropout draws on as it would have,
    in PyNative and in graphs compiled before or after this call. Generators without an entry keep their
    state, so `{"dropout": ...}` from the torch backend restores just the dropout stream."""
    if "default" in state:
        mindspore.set_rng_state(_from_text(state["default"]))
    if "dropout" in state:
        _set_dropout_state(state["dropout"])


def set_deterministic() -> list[str]:
    """--deterministic-mode on MindSpore: its deterministic switch (deterministic kernels and reductions on
    Ascend/GPU); returns what was switched, for the run's notice."""
    mindspore.set_deterministic(True)
    return ["mindspore.set_deterministic(True)"]
