"""Framework RNG state (`seeding.get_rng_state` / `set_rng_state`): plain JSON, and restoring it replays
the same dropout masks, on torch and on MindSpore (PyNative and under mindspore.jit). This is what makes a
run resumed from a checkpoint draw the masks the uninterrupted run drew."""
from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

FRAMEWORKS = ["pytorch", "mindspore"]
SHAPE = (64, 256)


def _seeding(be):
    return importlib.import_module(f"{be.__name__}.seeding")


def _json_state(be):
    """The state as a checkpoint holds it: written as JSON text and read back."""
    return json.loads(json.dumps(_seeding(be).get_rng_state(), allow_nan=False))


def _masks(be, count: int, p: float = 0.5) -> list[np.ndarray]:
    x = be.tensors.from_numpy(np.ones(SHAPE, np.float32))
    return [be.tensors.to_numpy(be.ops.dropout(x, p, training=True)) != 0 for _ in range(count)]


def _assert_all_different(masks: list[np.ndarray]) -> None:
    assert all(not np.array_equal(a, b) for i, a in enumerate(masks) for b in masks[i + 1:])


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_restoring_the_json_state_replays_the_same_dropout_masks(backends, framework):
    be = backends[framework]
    _seeding(be).seed_everything(1234)
    _masks(be, 2)  # mid-stream, as at a checkpoint, not just after seeding
    state = _json_state(be)
    first = _masks(be, 3)
    after = _json_state(be)
    _assert_all_different(first)
    _seeding(be).set_rng_state(state)
    assert all(np.array_equal(a, b) for a, b in zip(first, _masks(be, 3)))
    assert _json_state(be) == after  # and the generators end where they ended the first time


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_seed_decides_the_masks(backends, framework):
    be = backends[framework]
    seeding = _seeding(be)
    seeding.seed_everything(1)
    one = _masks(be, 2)
    seeding.seed_everything(2)
    two = _masks(be, 2)
    seeding.seed_everything(1)
    assert all(np.array_equal(a, b) for a, b in zip(one, _masks(be, 2)))
    assert not np.array_equal(one[0], two[0])


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_dropout_semantics_match_torch(backends, framework):
    be = backends[framework]
    _seeding(be).seed_everything(5)
    x_np = np.random.default_rng(0).standard_normal((200, 500)).astype(np.float32)
    x = be.tensors.from_numpy(x_np)
    p = 0.1
    first, second = (be.tensors.to_numpy(be.ops.dropout(x, p, training=True)) for _ in range(2))
    kept, kept2 = first != 0, second != 0
    assert abs((~kept).mean() - p) < 0.005  # 100k draws: 5 standard deviations
    assert abs((~kept & ~kept2).mean() - p * p) < 0.002  # consecutive masks are independent
    # survivors scaled as torch does: x * (1 / (1 - p)), the factor rounded to float32 first
    np.testing.assert_array_equal(first[kept], (x_np * (np.float32(1) / np.float32(1 - p)))[kept])
    np.testing.assert_array_equal(be.tensors.to_numpy(be.ops.dropout(x, p, training=False)), x_np)
    np.testing.assert_array_equal(be.tensors.to_numpy(be.ops.dropout(x, 0.0, training=True)), x_np)
    np.testing.assert_array_equal(be.tensors.to_numpy(be.ops.dropout(x, 1.0, training=True)), 0.0)
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
        be.ops.dropout(x, 1.5, training=True)


# ------------------------------------------------------------------ MindSpore under jit

def _compiled_dropout(bm):
    import mindspore as ms

    @ms.jit
    def drop(x):
        return bm.ops.dropout(x, 0.5, True)
    return drop


def test_mindspore_jit_draws_a_new_mask_each_call_and_replays_after_a_restore(bm):
    seeding = _seeding(bm)
    seeding.seed_everything(7)
    state = _json_state(bm)  # taken before the graph is compiled
    drop = _compiled_dropout(bm)
    x = bm.tensors.from_numpy(np.ones(SHAPE, np.float32))
    compiled = [bm.tensors.to_numpy(drop(x)) != 0 for _ in range(3)]
    _assert_all_different(compiled)  # the generator is read at run time, not frozen into the graph
    seeding.set_rng_state(state)  # restored after compiling: the graph reads the restored generator
    assert all(np.array_equal(a, bm.tensors.to_numpy(drop(x)) != 0) for a in compiled)
    seeding.set_rng_state(state)
    assert all(np.array_equal(a, b) for a, b in zip(compiled, _masks(bm, 3)))  # PyNative draws the same masks
    seeding.seed_everything(7)  # seeding after compiling reaches the graph too
    assert np.array_equal(compiled[0], bm.tensors.to_numpy(drop(x)) != 0)


@pytest.mark.parametrize("jit", [False, True])
def test_mindspore_dropout_gradient_uses_the_forward_mask(bm, jit):
    import mindspore as ms

    seeding = _seeding(bm)
    p = 0.25
    x = bm.tensors.from_numpy(np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32))
    w = bm.tensors.from_numpy(np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32))

    def loss(t):
        out = bm.ops.dropout(t, p, True)
        return (out * w).sum(), out

    grad_fn = ms.value_and_grad(loss, has_aux=True)
    grad_fn = ms.jit(grad_fn) if jit else grad_fn
    seeding.seed_everything(3)
    (_, out), grad = grad_fn(x)
    kept = bm.tensors.to_numpy(out) != 0
    assert 0.7 < kept.mean() < 0.8
    expected = np.where(kept, bm.tensors.to_numpy(w) * (np.float32(1) / np.float32(1 - p)), 0.0)
    np.testing.assert_allclose(bm.tensors.to_numpy(grad), expected, rtol=1e-6)


def _hash32(h: np.ndarray) -> np.ndarray:
    h = np.atleast_1d(h).astype(np.uint32)  # arrays wrap silently; numpy scalars warn on overflow
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x21F0AAAD)
    h ^= h >> np.uint32(15)
    h *= np.uint32(0x735A2D97)
    return h ^ (h >> np.uint32(15))


def test_mindspore_mask_is_the_counter_based_hash_of_seed_call_and_index(bm):
    """numpy's uint32 arithmetic, written out: MindSpore's kernels must wrap modulo 2**32 the same way."""
    seeding = _seeding(bm)
    seeding.seed_everything(2**32 - 1)
    _masks(bm, 2)
    seed, call = (int(v) for v in seeding.DROPOUT_GENERATOR.get_state().asnumpy().view(np.int64))
    words = [np.array([v & 0xFFFFFFFF, v >> 32], np.uint32) for v in (seed, call)]
    key = _hash32(_hash32(_hash32(words[1][0] ^ words[1][1]) ^ words[0][0]) ^ words[0][1])
    multiplier = _hash32(key ^ np.uint32(0x9E3779B9)) | np.uint32(1)
    offset = _hash32(key ^ np.uint32(0x85EBCA6B))
    expected = _hash32(np.arange(np.prod(SHAPE), dtype=np.uint32) * multiplier + offset) >= round(0.3 * 2**32)
    got = _masks(bm, 1, p=0.3)[0]
    np.testing.assert_array_equal(got.ravel(), expected)
