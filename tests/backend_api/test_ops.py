"""Functional ops: same forward values and gradients on torch and mindspore (fp32)."""
from __future__ import annotations

import numpy as np
import pytest

RNG = np.random.default_rng(0)


def _x(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def attention_heads(ops, qkv):
    """split -> reshape -> transpose, as in the GPT attention: the path where mint.split views got wrong grads."""
    q, k, v = ops.split(qkv, 8, dim=2)
    q = ops.transpose(ops.reshape(q, (2, 6, 2, 4)), 1, 2)
    k = ops.transpose(ops.reshape(k, (2, 6, 2, 4)), 1, 2)
    v = ops.transpose(ops.reshape(v, (2, 6, 2, 4)), 1, 2)
    att = ops.masked_fill(ops.matmul(q, ops.transpose(k, -2, -1)), ops.causal_mask(6, like=qkv), float("-inf"))
    return ops.matmul(ops.softmax(att, dim=-1), v)


CASES = {
    "matmul": (lambda o, a, b: o.matmul(a, b), [_x(2, 3, 4), _x(2, 4, 5)]),
    "linear": (lambda o, x, w, b: o.linear(x, w, b), [_x(2, 3, 4), _x(5, 4), _x(5)]),
    "softmax": (lambda o, x: o.softmax(x, dim=-1), [_x(2, 3, 7)]),
    "log_softmax": (lambda o, x: o.log_softmax(x, dim=-1), [_x(2, 3, 7)]),
    "gelu_exact": (lambda o, x: o.gelu(x), [_x(4, 9)]),
    "gelu_tanh": (lambda o, x: o.gelu(x, approximate="tanh"), [_x(4, 9)]),
    "layer_norm": (lambda o, x, w, b: o.layer_norm(x, (8,), w, b, 1e-5), [3 * _x(2, 5, 8) + 1, _x(8), _x(8)]),
    "embedding": (lambda o, w: o.embedding(o.reshape(o.arange(6, like=w), (2, 3)), w), [_x(10, 4)]),
    "conv2d": (lambda o, x, w, b: o.conv2d(x, w, b, stride=2), [_x(2, 3, 8, 8), _x(5, 3, 2, 2), _x(5)]),
    "conv2d_padded": (lambda o, x, w: o.conv2d(x, w, None, stride=1, padding=1), [_x(1, 2, 5, 5), _x(3, 2, 3, 3)]),
    "conv3d_causal_video": (lambda o, x, w, b: o.conv3d(o.pad(x, (1, 1, 1, 1, 2, 0)), w, b),
                            [_x(1, 2, 3, 4, 5), _x(3, 2, 3, 3, 3), _x(3)]),
    "conv3d_strided": (lambda o, x, w: o.conv3d(x, w, None, stride=(2, 1, 1), padding=(0, 1, 1)),
                       [_x(2, 2, 5, 3, 4), _x(3, 2, 3, 1, 3)]),
    "exp_clamp": (lambda o, x: o.exp(o.clamp(x, -0.5, 0.7)) + o.clamp(x, min=0.1), [_x(3, 5)]),
    "cat_split": (lambda o, a, b: o.cat(o.split(o.cat([a, b], dim=1), 2, dim=1)[::-1], dim=1),
                  [_x(2, 2, 3), _x(2, 4, 3)]),
    "permute_flatten": (lambda o, x: o.flatten(o.permute(x, (0, 2, 1, 3)), 1), [_x(2, 3, 4, 5)]),
    "attention_heads": (attention_heads, [_x(2, 6, 24)]),
    "mean_sum_sqrt_tanh": (lambda o, x: o.sqrt(o.mean(x * x, dim=1) + o.sum(x, dim=1) ** 2) + o.tanh(x[:, 0]),
                           [_x(3, 4)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_torch(bt, bm, op_grads, name):
    fn, arrays = CASES[name]
    out_t, grads_t = op_grads(bt, fn, arrays)
    out_m, grads_m = op_grads(bm, fn, arrays)
    assert out_t.shape == out_m.shape
    np.testing.assert_allclose(out_m, out_t, rtol=1e-5, atol=2e-6)
    for g_t, g_m in zip(grads_t, grads_m):
        np.testing.assert_allclose(g_m, g_t, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_ignore_index(bt, bm, reduction):
    logits = _x(6, 11)
    target = np.array([1, 2, -100, 3, 10, 0], dtype=np.int64)
    outs = []
    for be in (bt, bm):
        out = be.ops.cross_entropy(be.tensors.from_numpy(logits), be.tensors.from_numpy(target), reduction=reduction)
        outs.append(be.tensors.to_numpy(out))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-6, atol=1e-6)
    if reduction == "none":
        assert outs[1][2] == 0.0  # the ignored position contributes nothing


def test_causal_mask_hides_the_future(bt, bm):
    for be in (bt, bm):
        mask = be.tensors.to_numpy(be.ops.causal_mask(4))
        assert mask.dtype == np.bool_
        np.testing.assert_array_equal(mask, np.triu(np.ones((4, 4), dtype=bool), 1))


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_dropout_scales_kept_values_and_is_identity_in_eval(backends, framework):
    be = backends[framework]
    x = be.tensors.from_numpy(np.ones((200, 50), dtype=np.float32))
    out = be.tensors.to_numpy(be.ops.dropout(x, 0.25, training=True))
    kept = out != 0
    assert 0.70 < kept.mean() < 0.80
    np.testing.assert_allclose(out[kept], 1 / 0.75, rtol=1e-6)
    np.testing.assert_array_equal(be.tensors.to_numpy(be.ops.dropout(x, 0.25, training=False)), 1.0)
