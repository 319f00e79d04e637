"""Framework RNG state (`seeding.get_rng_state` / `set_rng_state`): plain JSON, and restoring it replays
the same dropout masks, on torch and on MindSpore (PyNative and under mindspore.jit). This is what makes a
run resumed from a checkpoint draw the masks the uninterrupted run drew. Every call names the hash dropout
(`impl="hash"`): the cross-framework masks are its promise; "auto" means it on CPU only."""
from __future__ import annotations

import base64
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
    return [be.tensors.to_numpy(be.ops.dropout(x, p, training=True, impl="hash")) != 0 for _ in range(count)]


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


@pytest.mark.parametrize("source, target", [("pytorch", "mindspore"), ("mindspore", "pytorch")])
def test_the_dropout_state_of_one_framework_restores_on_the_other(backends, source, target):
    src, dst = backends[source], backends[target]
    _seeding(src).seed_everything(7)
    _seeding(dst).seed_everything(99)
    _masks(src, 2)
    state = _json_state(src)
    assert state["dropout"] == {"seed": 7, "offset": 2}  # one format on both frameworks
    before = {k: v for k, v in _json_state(dst).items() if k != "dropout"}
    _seeding(dst).set_rng_state({"dropout": state["dropout"]})  # what a cross-framework resume restores
    assert all(np.array_equal(a, b) for a, b in zip(_masks(src, 3), _masks(dst, 3)))
    assert {k: v for k, v in _json_state(dst).items() if k != "dropout"} == before  # nothing else touched


def test_mindspore_reads_the_base64_dropout_state_of_earlier_checkpoints(bm):
    seeding = _seeding(bm)
    seeding.seed_everything(5)
    _masks(bm, 1)
    legacy = base64.b64encode(seeding.DROPOUT_GENERATOR.get_state().asnumpy().tobytes()).decode("ascii")
    expected = _masks(bm, 2)
    seeding.set_rng_state({"dropout": legacy})
    assert all(np.array_equal(a, b) for a, b in zip(expected, _masks(bm, 2)))


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
    first, second = (be.tensors.to_numpy(be.ops.dropout(x, p, training=True, impl="hash")) for _ in range(2))
    kept, kept2 = first != 0, second != 0
    assert abs((~kept).mean() - p) < 0.005  # 100k draws: 5 standard deviations
    assert abs((~kept & ~kept2).mean() - p * p) < 0.002  # consecutive masks are independent
    # survivors scaled as torch does: x * (1 / (1 - p)), the factor rounded to float32 first
    np.testing.assert_array_equal(first[kept], (x_np * (np.float32(1) / np.float32(1 - p)))[kept])
    np.testing.assert_array_equal(be.tensors.to_numpy(be.ops.dropout(x, p, training=False)), x_np)
    np.testing.assert_array_equal(be.tensors.to_numpy(be.ops.dropout(x, 0.0, training=True)), x_np)
    np.testing.assert_array_equal(be.tensors.to_numpy(be.ops.dropout(x, 1.0, training=True, impl="hash")), 0.0)
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
        be.ops.dropout(x, 1.5, training=True)


# ------------------------------------------------------------------ MindSpore under jit

def _compiled_dropout(bm):
    import mindspore as ms

    @ms.jit
    def drop(x):
        return bm.ops.dropout(x, 0.5, True, "hash")
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
        out = bm.ops.dropout(t, p, True, "hash")
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


def _generator_position(be) -> tuple[int, int]:
    """(seed, call number) the dropout generator hands the next dropout call."""
    generator = _seeding(be).DROPOUT_GENERATOR
    if hasattr(generator, "step"):  # torch: dropout_hash.CounterGenerator
        state = generator.get_state()
        return state["seed"], state["offset"]
    # mindspore.Generator: two little-endian int64, what _step(1) returns next
    seed, call = (int(v) for v in generator.get_state().asnumpy().view(np.int64))
    return seed, call


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_mask_is_the_counter_based_hash_of_seed_call_and_index(backends, framework):
    """numpy's uint32 arithmetic with the constants written out: pins the masks of both backends (and
    of dropout_hash's reference), so a change to the shared constants cannot pass unnoticed.
    MindSpore's uint32 kernels and torch's int64-masked ones must wrap modulo 2**32 the same way."""
    from mmrun.backend import dropout_hash

    be = backends[framework]
    _seeding(be).seed_everything(2**32 - 1)
    _masks(be, 2)
    seed, call = _generator_position(be)
    assert (seed, call) == (2**32 - 1, 2)
    words = [np.array([v & 0xFFFFFFFF, v >> 32], np.uint32) for v in (seed, call)]
    key = _hash32(_hash32(_hash32(words[1][0] ^ words[1][1]) ^ words[0][0]) ^ words[0][1])
    multiplier = _hash32(key ^ np.uint32(0x9E3779B9)) | np.uint32(1)
    offset = _hash32(key ^ np.uint32(0x85EBCA6B))
    expected = _hash32(np.arange(np.prod(SHAPE), dtype=np.uint32) * multiplier + offset) >= round(0.3 * 2**32)
    got = _masks(be, 1, p=0.3)[0]
    np.testing.assert_array_equal(got.ravel(), expected)
    np.testing.assert_array_equal(dropout_hash.keep_mask(seed, call, SHAPE, 0.3).ravel(), expected)


# ------------------------------------------------------------------ the same masks on both frameworks

# Consecutive calls of different shapes and probabilities, as a GPT's dropout layers make them; one
# above 2**18 elements, so torch's chunked CPU hash runs more than one chunk.
CALLS = [((4, 32, 64), 0.1), ((2, 4, 32, 32), 0.1), ((3, 1000, 100), 0.5), ((7,), 0.9), ((4, 32, 64), 0.1)]


def _call_masks(be, calls=CALLS, compiled=None) -> list[np.ndarray]:
    masks = []
    for shape, p in calls:
        x = be.tensors.from_numpy(np.ones(shape, np.float32))
        out = compiled[p](x) if compiled else be.ops.dropout(x, p, training=True, impl="hash")
        masks.append(be.tensors.to_numpy(out) != 0)
    return masks


def _reference(seed: int, first_call: int = 0, calls=CALLS) -> list[np.ndarray]:
    from mmrun.backend import dropout_hash
    return [dropout_hash.keep_mask(seed, first_call + i, shape, p) for i, (shape, p) in enumerate(calls)]


def _assert_same(got: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("seed", [0, 1234, 2**32 - 1])
def test_torch_and_mindspore_draw_the_same_masks(bt, bm, seed):
    outputs = {}
    for be in (bt, bm):
        _seeding(be).seed_everything(seed)
        outputs[be] = _call_masks(be)
        assert _generator_position(be) == (seed, len(CALLS))
    _assert_same(outputs[bt], outputs[bm])
    _assert_same(outputs[bt], _reference(seed))
    assert 0.08 < 1 - outputs[bt][0].mean() < 0.12  # p=0.1 drops about 10 % (6 standard deviations)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_torch_dropout_values_equal_mindspore_values(bt, bm, dtype):
    """Not only the masks: survivors scaled by the same factor (1/(1-p) in fp32, rounded once to the
    input's dtype, as torch does), so the outputs are bit-identical, in half precision too."""
    x_np = np.random.default_rng(4).standard_normal((8, 300)).astype(np.float32)
    outs = []
    for be in (bt, bm):
        _seeding(be).seed_everything(11)
        x = be.tensors.cast(be.tensors.from_numpy(x_np), be.tensors.dtype(dtype))
        outs.append([be.tensors.to_numpy(be.ops.dropout(x, p, True, "hash")) for p in (0.1, 0.3, 0.7)])
    _assert_same(outs[0], outs[1])


def test_torch_masks_equal_mindspore_jit_masks(bt, bm):
    import mindspore as ms

    def compiled(p):
        @ms.jit
        def drop(x):
            return bm.ops.dropout(x, p, True, "hash")
        return drop
    graphs = {p: compiled(p) for p in {p for _, p in CALLS}}
    _seeding(bm).seed_everything(21)
    _seeding(bt).seed_everything(21)
    _assert_same(_call_masks(bt), _call_masks(bm, compiled=graphs))


def test_torch_replays_the_shared_masks_after_set_rng_state(bt):
    seeding = _seeding(bt)
    seeding.seed_everything(5)
    _call_masks(bt, CALLS[:2])
    state = _json_state(bt)
    assert state["dropout"] == {"seed": 5, "offset": 2}
    first = _call_masks(bt)
    _assert_same(first, _reference(5, first_call=2))
    seeding.seed_everything(6)  # elsewhere in the stream, different seed
    _call_masks(bt, CALLS[:1])
    seeding.set_rng_state(state)
    _assert_same(_call_masks(bt), first)
