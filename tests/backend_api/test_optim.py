"""AdamW, clipping and value_and_grad: one contract, torch's numbers, on both frameworks."""
from __future__ import annotations

import numpy as np
import pytest

RNG = np.random.default_rng(0)
SHAPES = {"layer.weight": (16, 8), "layer.bias": (16,), "norm.weight": (8,)}
INITIAL = {name: RNG.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}
GRADS = [{name: 0.1 * RNG.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}
         for _ in range(10)]


def params(be, framework):
    if framework == "pytorch":
        return [(name, be.nn.Parameter(be.tensors.from_numpy(a))) for name, a in INITIAL.items()]
    import mindspore as ms
    return [(name, ms.Parameter(be.tensors.from_numpy(a), name=name)) for name, a in INITIAL.items()]


def run_adamw(be, framework, steps=10, lrs=None, **options):
    named = params(be, framework)
    opt = be.optim.AdamW(named, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                         no_decay=be.optim.megatron_no_decay, **options)
    for i, grads in enumerate(GRADS[:steps]):
        if lrs is not None:
            opt.set_lr(lrs[i])
        opt.step([be.tensors.from_numpy(grads[name]) for name, _ in named])
    return {name: be.tensors.to_numpy(p) for name, p in named}, opt


@pytest.mark.parametrize("fused", [True, False])
def test_mindspore_adamw_matches_torch_adamw(bt, bm, fused):
    lrs = [1e-2 * (i + 1) / 10 for i in range(10)]  # a warmup: lr changes every step
    expected, _ = run_adamw(bt, "pytorch", lrs=lrs)
    got, _ = run_adamw(bm, "mindspore", lrs=lrs, fused=fused)
    for name in SHAPES:
        moved = np.abs(expected[name] - INITIAL[name]).max()
        assert moved > 1e-2  # the update did something
        # float32 rounding only: fused folds bias correction into the kernel's scalars, torch-order replays torch.
        np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=2e-6 if fused else 5e-7)


def test_no_decay_parameters_get_no_weight_decay(bt, bm):
    # zero gradients: only weight decay moves a parameter
    for be, fw in ((bt, "pytorch"), (bm, "mindspore")):
        named = params(be, fw)
        opt = be.optim.AdamW(named, lr=0.1, weight_decay=0.5, no_decay=be.optim.megatron_no_decay)
        opt.step([be.tensors.from_numpy(np.zeros(SHAPES[n], np.float32)) for n, _ in named])
        values = {n: be.tensors.to_numpy(p) for n, p in named}
        np.testing.assert_allclose(values["layer.weight"], INITIAL["layer.weight"] * (1 - 0.1 * 0.5), rtol=1e-6)
        np.testing.assert_array_equal(values["layer.bias"], INITIAL["layer.bias"])
        np.testing.assert_array_equal(values["norm.weight"], INITIAL["norm.weight"])


def test_optimizer_state_moves_between_frameworks(bt, bm):
    """4 steps on torch, then 4 more either on torch or on mindspore from torch's saved state: same result."""
    params_t, opt_t = run_adamw(bt, "pytorch", steps=4)
    state = opt_t.state_dict()
    assert state["step"] == 4 and sorted(state["tensors"]) == sorted(
        f"{n}.{k}" for n in SHAPES for k in ("exp_avg", "exp_avg_sq"))
    saved = {**state, "tensors": bt.tensors.state_dict_to_numpy(state["tensors"])}
    import mindspore as ms
    named_m = [(n, ms.Parameter(bm.tensors.from_numpy(params_t[n]), name=n)) for n in SHAPES]
    opt_m = bm.optim.AdamW(named_m, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                           no_decay=bm.optim.megatron_no_decay)
    opt_m.load_state_dict(saved)
    for grads in GRADS[4:8]:
        opt_m.step([bm.tensors.from_numpy(grads[n]) for n, _ in named_m])
    expected, _ = run_adamw(bt, "pytorch", steps=8)
    for name, p in named_m:
        np.testing.assert_allclose(bm.tensors.to_numpy(p), expected[name], atol=2e-6)
    assert opt_m.state_dict()["step"] == 8


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_optimizer_state_mismatch_is_one_clear_error(backends, framework):
    be = backends[framework]
    _, opt = run_adamw(be, framework, steps=1)
    state = opt.state_dict()
    tensors = be.tensors.state_dict_to_numpy(state["tensors"])
    tensors.pop("layer.bias.exp_avg")
    tensors["layer.weight.exp_avg"] = np.zeros((3, 3), np.float32)
    with pytest.raises(RuntimeError, match=r"missing: layer.bias.exp_avg; size mismatch: layer.weight.exp_avg "
                                           r"\(saved \(3, 3\), model \(16, 8\)\)"):
        opt.load_state_dict({"step": 1, "tensors": tensors})


@pytest.mark.parametrize("max_norm", [0.5, 100.0, 0.0])
def test_clip_grad_norm_matches_torch(bt, bm, max_norm):
    import torch
    grads = [RNG.standard_normal(s).astype(np.float32) for s in ((5, 4), (7,), (2, 3, 4))]
    reference = [torch.tensor(g, requires_grad=True) for g in grads]
    for r, g in zip(reference, grads):
        r.grad = torch.tensor(g)
    expected_norm = float(torch.nn.utils.clip_grad_norm_(reference, max_norm)) if max_norm > 0 else \
        float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads)))
    expected = [r.grad.numpy() for r in reference] if max_norm > 0 else grads
    for be in (bt, bm):
        clipped, norm = be.optim.clip_grad_norm([be.tensors.from_numpy(g) for g in grads], max_norm)
        assert float(norm) == pytest.approx(expected_norm, rel=1e-6)
        for c, e in zip(clipped, expected):
            np.testing.assert_allclose(be.tensors.to_numpy(c), e, rtol=1e-6, atol=1e-7)
    if max_norm == 0.5:
        assert np.sqrt(sum((e ** 2).sum() for e in expected)) == pytest.approx(0.5, rel=1e-5)


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
@pytest.mark.parametrize("has_aux", [False, True])
def test_value_and_grad_contract(backends, framework, has_aux):
    be = backends[framework]
    named = params(be, framework)
    weight, bias, unused = (p for _, p in named)
    x = be.tensors.from_numpy(np.ones((3, 8), np.float32))

    def fn(inputs):
        loss = be.ops.sum(be.ops.linear(inputs, weight, bias) ** 2)
        return (loss, loss * 2) if has_aux else loss

    out, grads = be.autograd.value_and_grad(fn, [weight, bias, unused], has_aux=has_aux)(x)
    value = out[0] if has_aux else out
    y = np.ones((3, 8), np.float32) @ INITIAL["layer.weight"].T + INITIAL["layer.bias"]
    assert float(be.tensors.to_numpy(value)) == pytest.approx(float((y ** 2).sum()), rel=1e-5)
    if has_aux:
        assert float(be.tensors.to_numpy(out[1])) == pytest.approx(2 * float((y ** 2).sum()), rel=1e-5)
    assert len(grads) == 3
    np.testing.assert_allclose(be.tensors.to_numpy(grads[1]), (2 * y).sum(0), rtol=1e-5)
    np.testing.assert_allclose(be.tensors.to_numpy(grads[0]), (2 * y).T @ np.ones((3, 8)), rtol=1e-5)
    np.testing.assert_array_equal(be.tensors.to_numpy(grads[2]), 0.0)  # unused parameter: zeros
