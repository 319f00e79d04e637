"""The ops and layers a Qwen2-style transformer adds: same values and gradients on torch and mindspore
(fp32), Hugging Face's RMSNorm rounding, grouped-query and variable-length attention, freezing."""
from __future__ import annotations

import numpy as np
import pytest

from mmrun.backend import varlen

RNG = np.random.default_rng(7)


def _x(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _y(*shape: int, rng=np.random.default_rng(11)) -> np.ndarray:
    """Inputs of the fused-kernel ops, drawn apart so that the other tests keep their inputs."""
    return rng.standard_normal(shape).astype(np.float32)


def _reference_attention(q, k, v, scale, causal=False):
    """numpy softmax(q k^T * scale) v over (heads, seq, d), k/v heads repeated for GQA."""
    groups = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, groups, axis=0), np.repeat(v, groups, axis=0)
    att = q @ k.transpose(0, 2, 1) * scale
    if causal:
        att = np.where(np.triu(np.ones(att.shape[-2:], bool), 1), -np.inf, att)
    att = np.exp(att - att.max(-1, keepdims=True))
    return (att / att.sum(-1, keepdims=True)) @ v


CU = [0, 4, 8, 12, 18, 20]  # runs: 3 x 4 tokens, then 6, then 2
GROUPS = [3, 0, 5, 2]  # rows per expert, in expert order

CASES = {
    "rms_norm": (lambda o, x, w: o.rms_norm(x, w, 1e-6), [3 * _x(2, 5, 8) + 1, _x(8)]),
    "silu_sigmoid": (lambda o, x: o.silu(x) + o.sigmoid(1.702 * x), [_x(4, 9)]),
    "cos_sin": (lambda o, x: o.cos(x) * o.sin(2 * x), [_x(3, 7)]),
    "swiglu": (lambda o, g, u: o.swiglu(g, u), [_y(2, 3, 6), _y(2, 3, 6)]),
    "rotary_mul": (lambda o, x, c, s: o.rotary_mul(x, c, s), [_y(2, 3, 5, 8), _y(2, 1, 5, 8), _y(2, 1, 5, 8)]),
    "gqa_causal_attention": (lambda o, q, k, v: o.scaled_dot_product_attention(q, k, v, causal=True, scale=0.3),
                             [_x(2, 4, 6, 8), _x(2, 2, 6, 8), _x(2, 2, 6, 8)]),
    "varlen_attention": (lambda o, q, k, v: o.varlen_attention(q, k, v, CU, scale=0.4),
                         [_x(20, 2, 8), _x(20, 2, 8), _x(20, 2, 8)]),
    # MoE experts (an empty group among them): torch's grouped GEMM where rows are 16-byte multiples, else per expert
    "grouped_linear": (lambda o, x, w: o.grouped_linear(x, w, GROUPS), [_x(10, 8), _x(4, 16, 8)]),
    "grouped_linear_unaligned": (lambda o, x, w: o.grouped_linear(x, w, GROUPS), [_x(10, 6), _x(4, 6, 6)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_between_frameworks(bt, bm, op_grads, name):
    fn, arrays = CASES[name]
    out_t, grads_t = op_grads(bt, fn, arrays)
    out_m, grads_m = op_grads(bm, fn, arrays)
    np.testing.assert_allclose(out_m, out_t, rtol=1e-5, atol=2e-6)
    for g_t, g_m in zip(grads_t, grads_m):
        np.testing.assert_allclose(g_m, g_t, rtol=1e-5, atol=2e-6)


def test_rms_norm_is_hugging_faces_formula(backends, framework="pytorch"):
    x, w = 3 * _x(4, 16) + 0.5, _x(16)
    expected = w * (x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)).astype(np.float32)
    for be in backends.values():
        got = be.tensors.to_numpy(be.ops.rms_norm(be.tensors.from_numpy(x), be.tensors.from_numpy(w), 1e-6))
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)
        layer = be.nn.RMSNorm(16, eps=1e-6)
        assert [n for n, _ in layer.named_parameters()] == ["weight"]
        np.testing.assert_array_equal(be.tensors.to_numpy(layer.weight), np.ones(16, np.float32))


def test_gqa_attention_repeats_each_kv_head_for_consecutive_query_heads(backends):
    q, k, v = _x(1, 6, 5, 4), _x(1, 2, 5, 4), _x(1, 2, 5, 4)
    expected = _reference_attention(q[0], k[0], v[0], 0.5, causal=True)
    for be in backends.values():
        t = be.tensors.from_numpy
        got = be.tensors.to_numpy(be.ops.scaled_dot_product_attention(t(q), t(k), t(v), causal=True, scale=0.5))
        np.testing.assert_allclose(got[0], expected, rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match="q has 6, k 4, v 4; k and v need the same count, one that divides"):
            be.ops.scaled_dot_product_attention(t(q), t(_x(1, 4, 5, 4)), t(_x(1, 4, 5, 4)))


def test_varlen_attention_never_crosses_segments(backends):
    q, k, v = _x(20, 2, 8), _x(20, 2, 8), _x(20, 2, 8)
    expected = np.concatenate([
        _reference_attention(q[a:b].transpose(1, 0, 2), k[a:b].transpose(1, 0, 2), v[a:b].transpose(1, 0, 2), 0.4)
        .transpose(1, 0, 2) for a, b in zip(CU[:-1], CU[1:])])
    for be in backends.values():
        t = be.tensors.from_numpy
        got = be.tensors.to_numpy(be.ops.varlen_attention(t(q), t(k), t(v), np.array(CU), scale=0.4))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match=r"cu_seqlens \[0, 4, 19\] do not split a packed sequence of 20 tokens"):
            be.ops.varlen_attention(t(q), t(k), t(v), [0, 4, 19])


def test_equal_length_runs_group_consecutive_segments():
    assert varlen.equal_length_runs(np.array(CU)) == [(4, 3), (6, 1), (2, 1)]
    assert varlen.equal_length_runs(np.array([0, 3, 3, 6])) == [(3, 2)]  # an empty segment is skipped


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_frozen_parameters_get_no_optimizer_state_and_do_not_move(backends, framework):
    be = backends[framework]
    model = be.nn.Linear(4, 3)
    first = be.nn.Linear(3, 2)
    assert be.nn.freeze(model) == 2
    params = list(model.named_parameters()) + [("head." + n, p) for n, p in first.named_parameters()]
    optimizer = be.optim.AdamW(params, lr=0.1, weight_decay=0.1)
    assert optimizer.names == ["head.weight", "head.bias"]
    assert sorted(optimizer.state_dict()["tensors"]) == ["head.bias.exp_avg", "head.bias.exp_avg_sq",
                                                       "head.weight.exp_avg", "head.weight.exp_avg_sq"]
    before = {n: be.tensors.to_numpy(p) for n, p in params}
    x = be.tensors.from_numpy(_x(5, 4))
    grad_fn = be.autograd.value_and_grad(lambda: be.ops.sum(first(model(x)) ** 2), optimizer.params)
    _, grads = grad_fn()
    optimizer.step(grads)
    after = {n: be.tensors.to_numpy(p) for n, p in params}
    for name in ("weight", "bias"):
        np.testing.assert_array_equal(after[name], before[name])  # frozen
        assert np.abs(after["head." + name] - before["head." + name]).max() > 1e-3  # trained
    assert be.nn.unfreeze(model) == 2
    assert len(be.optim.AdamW(model.parameters()).params) == 2


def test_segment_attention_is_varlen_attention_with_its_padding_kept_apart(backends, op_grads):
    """The fixed-shape form of the ViT's attention (segment ids as a device tensor, MindSpore's compiled VLM step):
    varlen_attention's values and gradients on the real tokens whatever the padding (its own segment) holds."""
    q, k, v = (np.concatenate([_x(20, 2, 8), 10 * _x(4, 2, 8)]) for _ in range(3))  # 4 padded rows, large
    segments = np.array(np.repeat(np.arange(len(CU) - 1), np.diff(CU)).tolist() + [len(CU) - 1] * 4, np.int32)
    real = {}
    for name, be in backends.items():
        ids = be.tensors.from_numpy(segments)
        out, grads = op_grads(be, lambda o, *t: o.segment_attention(*t, ids, scale=0.4), [q, k, v])
        # the weights of sum(out * w) are drawn for the padded shape: the varlen reference takes the same ones
        expected, expected_grads = op_grads(be, lambda o, *t: o.varlen_attention(*t, CU + [24], scale=0.4),
                                            [q, k, v])
        real[name] = [out[:20]] + [g[:20] for g in grads]
        for got, want in zip(real[name], [expected[:20]] + [g[:20] for g in expected_grads]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for got_m, got_t in zip(real["mindspore"], real["pytorch"]):
        np.testing.assert_allclose(got_m, got_t, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("width", [8, 6])  # 8: torch's grouped GEMM; 6 (24-byte rows): one linear per expert
def test_grouped_linear_is_each_experts_linear_on_its_rows(backends, width):
    x, w = _x(10, width), _x(4, 2 * width, width)
    ends = np.cumsum([0] + GROUPS)
    expected = np.concatenate([x[ends[e]:ends[e + 1]] @ w[e].T for e in range(4)])
    for be in backends.values():
        got = be.tensors.to_numpy(be.ops.grouped_linear(be.tensors.from_numpy(x), be.tensors.from_numpy(w), GROUPS))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def test_the_fused_kernel_functions_equal_the_unfused_math_where_no_npu_runs(backends):
    """--use-fused-rmsnorm / -swiglu / -rotary-pos-emb switch on torch_npu's / MindSpore's Ascend kernels; on this
    CPU the kernels decline (None) and ops computes the documented formula, switched on or not."""
    x, w, g, u = 3 * _y(2, 4, 8) + 0.5, _y(8), _y(2, 4, 8), _y(2, 4, 8)
    q, c, s = _y(2, 3, 4, 8), _y(2, 1, 4, 8), _y(2, 1, 4, 8)
    sig = 1 / (1 + np.exp(-g.astype(np.float64)))
    expected = {"rms_norm": w * (x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)),
                "swiglu": g * sig * u, "rotary": q * c + _rotate_half(q) * s}
    for be in backends.values():
        t = be.tensors.from_numpy
        for on in (False, True):
            be.kernels.use_fused(rms_norm=on, swiglu=on, rotary=on)
            try:
                assert be.kernels.fused_rms_norm(t(x), t(w), 1e-6) is None and be.kernels.fused_swiglu(t(g), t(u)) is None
                got = {"rms_norm": be.ops.rms_norm(t(x), t(w), 1e-6), "swiglu": be.ops.swiglu(t(g), t(u)),
                       "rotary": be.ops.rotary_mul(t(q), t(c), t(s))}
            finally:
                be.kernels.use_fused(rms_norm=False, swiglu=False, rotary=False)
            for name, value in got.items():
                np.testing.assert_allclose(be.tensors.to_numpy(value), expected[name], rtol=2e-6, atol=2e-6)
    with pytest.raises(ValueError, match="unknown fused kernel"):
        backends["pytorch"].kernels.use_fused(layer_norm=True)
