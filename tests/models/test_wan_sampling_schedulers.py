"""The numpy sampling schedulers equal diffusers' step for step (same model outputs fed to both)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mmrun.models.wan import scheduling_unipc as ours

# MindSpeed-MM's examples/wan2.1/1.3b/t2v/inference_model.json `diffusion` block, as it is
MINDSPEED_UNIPC = json.loads("""{
    "model_id": "UniPCMultistepScheduler", "num_train_steps": 1000, "num_inference_steps": 50,
    "guidance_scale": 5.0, "beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001,
    "disable_corrector": [], "dynamic_thresholding_ratio": 0.995, "final_sigmas_type": "zero", "flow_shift": 5.0,
    "lower_order_final": true, "predict_x0": true, "prediction_type": "flow_prediction",
    "rescale_betas_zero_snr": false, "sample_max_value": 1.0, "solver_order": 2, "solver_p": null,
    "solver_type": "bh2", "steps_offset": 0, "thresholding": false, "timestep_spacing": "linspace",
    "trained_betas": null, "use_beta_sigmas": false, "use_exponential_sigmas": false, "use_flow_sigmas": true,
    "use_karras_sigmas": false}""")


def run_both(reference, mine, steps: int, seed: int = 0):
    import torch

    reference.set_timesteps(steps)
    mine.set_timesteps(steps)
    assert np.array_equal(reference.timesteps.numpy(), mine.timesteps)
    assert np.allclose(reference.sigmas.numpy(), mine.sigmas, atol=1e-7)
    rng = np.random.default_rng(seed)
    sample = rng.standard_normal((1, 4, 3, 4, 6)).astype(np.float32)
    theirs_sample = torch.from_numpy(sample.copy())
    worst = 0.0
    for t in reference.timesteps:
        # a smooth "model": a fixed field plus a part that depends on the sample, so the multistep history matters
        output = (0.7 * sample + rng.standard_normal(sample.shape).astype(np.float32) * 0.3).astype(np.float32)
        theirs_sample = reference.step(torch.from_numpy(output), t, theirs_sample).prev_sample
        sample = mine.step(output, sample)
        assert np.isfinite(sample).all()
        worst = max(worst, float(np.abs(theirs_sample.numpy() - sample).max()))
    return worst


@pytest.mark.parametrize("overrides", [{}, {"solver_type": "bh1"}, {"solver_order": 3, "flow_shift": 3.0},
                                       {"disable_corrector": [0, 2]},
                                       {"lower_order_final": False, "final_sigmas_type": "sigma_min"}])
def test_unipc_equals_diffusers_every_step(overrides):
    from diffusers import UniPCMultistepScheduler

    block = {**MINDSPEED_UNIPC, **overrides}
    kwargs = {k: v for k, v in block.items() if k not in ("model_id", "num_inference_steps", "guidance_scale")}
    kwargs["num_train_timesteps"] = kwargs.pop("num_train_steps")
    assert run_both(UniPCMultistepScheduler(**kwargs), ours.build_scheduler(block), steps=12) < 1e-6


def test_flow_match_euler_equals_diffusers_every_step():
    from diffusers import FlowMatchEulerDiscreteScheduler

    block = {"model_id": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 5.0,
             "num_inference_steps": 10, "guidance_scale": 5.0}
    assert run_both(FlowMatchEulerDiscreteScheduler(shift=5.0), ours.build_scheduler(block), steps=10) < 1e-6


def test_scheduler_blocks_it_cannot_run_are_one_line():
    with pytest.raises(ours.SchedulerConfigError, match="model_id 'DDIMScheduler'"):
        ours.build_scheduler({"model_id": "DDIMScheduler"})
    with pytest.raises(ours.SchedulerConfigError, match="use_flow_sigmas = False"):
        ours.build_scheduler({**MINDSPEED_UNIPC, "use_flow_sigmas": False})
    with pytest.raises(ours.SchedulerConfigError, match="diffusion.karras"):
        ours.build_scheduler({**MINDSPEED_UNIPC, "karras": 1})
