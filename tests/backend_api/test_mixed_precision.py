"""fp16/bf16 through the portable API: half-precision models, fp32 main params, loss scaling, on both frameworks.

The same GPT and batches as the fp32 parity tests (scripts/parity_report.py), the model cast with
`model.to(dtype)` before its optimizer is built.
"""
from __future__ import annotations

import numpy as np
import pytest

from mmrun.backend.grad_scaler import ConstantGradScaler, DynamicGradScaler

STEPS = 20
# 2^20 overflows fp16 gradients of this model for the first few steps: the scaler must back off.
INITIAL_SCALE = 2.0 ** 20


@pytest.fixture(scope="module")
def state(parity):
    return parity.initial_state()


@pytest.fixture(scope="module")
def fp16_runs(parity, state):
    batches = parity.make_batches(STEPS)
    return {fw: parity.train(fw, state, batches, STEPS, precision="fp16",
                             grad_scaler=DynamicGradScaler(initial_scale=INITIAL_SCALE))
            for fw in parity.FRAMEWORKS}


def test_half_model_computes_in_half_and_gives_an_fp32_loss(parity, state, backends):
    batch = parity.make_batches(1)[0]
    reference = parity.eval_loss("pytorch", parity.build_model("pytorch", state), batch)
    cases = [("pytorch", "fp16"), ("pytorch", "bf16"), ("mindspore", "fp16")]
    for fw, precision in cases:
        be, gpt = backends[fw], parity.gpt_module(fw)
        model = parity.build_model(fw, state).to(be.tensors.dtype(precision))
        assert {str(p.dtype) for p in model.parameters()} == {str(be.tensors.dtype(precision))}
        x = be.tensors.from_numpy(np.random.default_rng(0).standard_normal((2, 8, 16)).astype(np.float32))
        half = be.tensors.cast(x, be.tensors.dtype(precision))
        # softmax and layer_norm compute in fp32 inside, and hand back the input's dtype
        assert be.ops.softmax(half).dtype == half.dtype
        assert be.ops.layer_norm(half, (16,)).dtype == half.dtype
        with be.autograd.no_grad():
            loss = gpt.gpt_loss(model, *parity.to_framework(fw, batch))
        assert str(loss.dtype) == str(be.tensors.float32), (fw, precision)  # cross entropy on fp32 logits
        assert abs(float(loss) - reference) < (2e-3 if precision == "fp16" else 2e-2), (fw, precision)


def test_fp16_training_agrees_across_frameworks_with_the_same_overflow_steps(fp16_runs):
    torch_run, ms_run = fp16_runs["pytorch"], fp16_runs["mindspore"]
    assert torch_run["skipped"] == ms_run["skipped"]
    assert 0 < sum(torch_run["skipped"]) < STEPS // 2, torch_run["skipped"]  # the scaler backed off, then trained
    losses_t, losses_m = np.array(torch_run["losses"]), np.array(ms_run["losses"])
    assert np.isfinite(losses_t).all()
    assert np.abs(losses_t - losses_m).max() <= 1e-4  # measured 2.3e-5
    assert losses_t[-1] < losses_t[0] - 0.1
    for run in (torch_run, ms_run):
        for name, main in run["state"].items():
            assert main.dtype == np.float32
            # the model holds the fp16 rounding of the fp32 main params, nothing else
            np.testing.assert_array_equal(run["model"][name], main.astype(np.float16))


def test_fp16_with_gradient_accumulation_scales_alike_on_both(parity, state):
    batches = parity.make_batches(2 * 8)
    runs = {fw: parity.train(fw, state, batches, 8, micro_batches=2, precision="fp16",
                             grad_scaler=DynamicGradScaler(initial_scale=INITIAL_SCALE))
            for fw in parity.FRAMEWORKS}
    assert runs["pytorch"]["skipped"] == runs["mindspore"]["skipped"] and any(runs["pytorch"]["skipped"])
    assert np.abs(np.array(runs["pytorch"]["losses"]) - np.array(runs["mindspore"]["losses"])).max() <= 1e-4


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_an_overflowing_step_changes_no_weight_no_moment_and_no_schedule(parity, state, backends, framework):
    be = backends[framework]
    model = parity.build_model(framework, state)
    step = parity.make_step(framework, model, STEPS, precision="fp16", grad_scaler=ConstantGradScaler(2.0 ** 40))
    before = {k: v.copy() for k, v in be.tensors.state_dict_to_numpy(model.state_dict()).items()}
    for batch in parity.make_batches(2):
        result = step([parity.to_framework(framework, batch)])
        assert result.skipped and result.loss_scale == 2.0 ** 40 and np.isfinite(result.loss)
        assert not np.isfinite(result.grad_norm)
    after = be.tensors.state_dict_to_numpy(model.state_dict())
    assert all(np.array_equal(before[k], after[k]) for k in before)
    opt_state = step.optimizer.state_dict()
    assert opt_state["step"] == 0 and step.lr_scheduler.num_steps == 0
    moments = [be.tensors.to_numpy(v) for k, v in opt_state["tensors"].items() if not k.endswith(".main_param")]
    assert all(not m.any() for m in moments)


def test_bf16_trains_on_torch_close_to_fp32(parity, state):
    batches = parity.make_batches(STEPS)
    fp32 = parity.train("pytorch", state, batches, STEPS)
    bf16 = parity.train("pytorch", state, batches, STEPS, precision="bf16")
    assert not any(bf16["skipped"])  # no loss scaling for bf16 (Megatron's rule): nothing to skip
    assert np.abs(np.array(bf16["losses"]) - np.array(fp32["losses"])).max() < 2e-2
    assert bf16["losses"][-1] < bf16["losses"][0] - 0.1
    assert all(main.dtype == np.float32 for main in bf16["state"].values())


def test_optimizer_state_carries_the_fp32_main_params_to_any_precision_and_framework(parity, state, backends):
    bt = backends["pytorch"]
    batches = parity.make_batches(3)
    model = parity.build_model("pytorch", state)
    step = parity.make_step("pytorch", model, 3, precision="fp16", grad_scaler=ConstantGradScaler(1024.0))
    for batch in batches:
        assert not step([parity.to_framework("pytorch", batch)]).skipped
    saved_model = bt.tensors.state_dict_to_numpy(model.state_dict())
    saved_opt = step.optimizer.state_dict()
    mains = {k[: -len(".main_param")]: bt.tensors.to_numpy(v) for k, v in saved_opt["tensors"].items()
             if k.endswith(".main_param")}
    assert set(mains) == set(step.optimizer.names)
    saved_opt = {**saved_opt, "tensors": bt.tensors.state_dict_to_numpy(saved_opt["tensors"])}

    for fw, precision in (("mindspore", "fp32"), ("mindspore", "fp16"), ("pytorch", "fp32")):
        be = backends[fw]
        target = parity.build_model(fw, state)
        if precision != "fp32":
            target.to(be.tensors.dtype(precision))
        opt = be.optim.AdamW(target.named_parameters(), no_decay=be.optim.megatron_no_decay, **parity.OPTIMIZER)
        target.load_state_dict(be.tensors.state_dict_from_numpy(saved_model))
        opt.reload_model_params()
        opt.load_state_dict({**saved_opt, "tensors": be.tensors.state_dict_from_numpy(saved_opt["tensors"])})
        for name, main in zip(opt.names, opt.main_params):
            # the exact fp32 weights, not the fp16 model copy, whatever this run's precision
            np.testing.assert_array_equal(be.tensors.to_numpy(main), mains[name], err_msg=f"{fw} {precision} {name}")
        weights = be.tensors.state_dict_to_numpy(target.state_dict())
        expected_dtype = np.float16 if precision == "fp16" else np.float32
        assert all(np.array_equal(weights[n], mains[n].astype(expected_dtype)) for n in mains)


def test_mindspore_module_to_takes_dtypes_only(backends):
    bm = backends["mindspore"]
    layer = bm.nn.Linear(4, 3)
    with pytest.raises(NotImplementedError, match="Module.to is not supported with the mindspore backend. "
                                                  "Received: 'cuda'"):
        layer.to("cuda")
    assert layer.to(bm.tensors.dtype("fp16")) is layer and str(layer.weight.dtype) == "Float16"
