"""The training objective against MindSpeed-MM's wan_flow_match_scheduler, re-derived here in torch exactly as
its `_set_timesteps(training=True)`, `q_sample`, `training_losses` and `_training_weight` compute (read at commit
57069cd5), not by calling mmrun's code."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mmrun.models.wan.flow_match import FlowMatchConfig, FlowMatchTraining, flow_match_loss

PRETRAIN_MODEL_JSON = {"model_id": "wan_flow_match_scheduler", "num_train_timesteps": 1000, "shift": 5,
                       "sigma_min": 0.0, "extra_one_step": True}


def mindspeed_tables(num_train_timesteps=1000, shift=3.0, sigma_max=1.0, sigma_min=0.003 / 1.002,
                     inverse_timesteps=False, extra_one_step=False, reverse_sigmas=False, **_):
    num_steps = num_train_timesteps
    sigma_start = sigma_min + (sigma_max - sigma_min)
    if extra_one_step:
        sigmas = torch.linspace(sigma_start, sigma_min, num_steps + 1)[:-1]
    else:
        sigmas = torch.linspace(sigma_start, sigma_min, num_steps)
    if inverse_timesteps:
        sigmas = torch.flip(sigmas, dims=[0])
    sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    if reverse_sigmas:
        sigmas = 1 - sigmas
    timesteps = sigmas * num_train_timesteps
    y = torch.exp(-2 * ((timesteps - num_steps / 2) / num_steps) ** 2)
    y_shifted = y - y.min()
    weights = y_shifted * (num_steps / y_shifted.sum())
    return sigmas, timesteps, weights


@pytest.mark.parametrize("keys", [PRETRAIN_MODEL_JSON, {"shift": 3.0},
                                  {"num_train_timesteps": 50, "shift": 1.0, "inverse_timesteps": True,
                                   "reverse_sigmas": True, "extra_one_step": True}])
def test_tables_equal_mindspeed(keys):
    ours = FlowMatchTraining(FlowMatchConfig.from_mindspeed(keys))
    sigmas, timesteps, weights = mindspeed_tables(**keys)
    np.testing.assert_allclose(ours.sigmas, sigmas.numpy(), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(ours.timesteps, timesteps.numpy(), rtol=2e-6, atol=1e-4)
    np.testing.assert_allclose(ours.weights, weights.numpy(), rtol=1e-5, atol=1e-6)
    # bell-shaped: zero at the ends of the range, largest near the middle timestep, mean 1
    assert ours.weights.min() == 0 and abs(float(ours.weights.mean()) - 1) < 1e-5
    peak = ours.timesteps[int(np.argmax(ours.weights))]
    assert abs(peak - ours.config.num_train_timesteps / 2) < 2 * ours.config.num_train_timesteps / len(ours.weights)


def test_one_step_equals_mindspeed_q_sample_and_loss():
    config = FlowMatchConfig.from_mindspeed(PRETRAIN_MODEL_JSON)
    ours = FlowMatchTraining(config)
    latents = np.random.default_rng(1).standard_normal((2, 4, 3, 4, 6)).astype(np.float32)
    batch = ours.training_batch(latents, seed=1234, positions=[6, 7])
    sigmas, timesteps, weights = mindspeed_tables(**PRETRAIN_MODEL_JSON)
    # MindSpeed-MM's q_sample with the same draw (index and noise given): timestep = timesteps[idx]
    idx = int(np.argmin(np.abs(timesteps.numpy() - batch["timestep"][0])))
    assert 0 <= idx < 1000
    np.testing.assert_allclose(batch["timestep"], timesteps[idx].item(), rtol=2e-6)  # float32 ulps
    x0 = torch.from_numpy(latents)
    noise = torch.from_numpy(batch["target"]) + x0  # target = noise - x0
    sigma = sigmas[idx]
    np.testing.assert_allclose(batch["hidden_states"], ((1 - sigma) * x0 + sigma * noise).numpy(), atol=1e-6)
    # training_losses: mse_loss(out.float(), (noise - x0).float()) * _training_weight(t)
    out = torch.randn_like(x0)
    t = torch.tensor([batch["timestep"][0]])
    weight = weights[torch.argmin((timesteps - t).abs())]
    expected = torch.nn.functional.mse_loss(out.float(), (noise - x0).float()) * weight
    got = flow_match_loss(out, torch.from_numpy(batch["target"]), float(batch["loss_weight"]))
    assert abs(float(got) - float(expected)) <= 1e-5 * float(expected)


def test_draws_are_seeded_uniform_and_per_sample():
    ours = FlowMatchTraining(FlowMatchConfig.from_mindspeed({**PRETRAIN_MODEL_JSON, "min_timestep_boundary": 0.2,
                                                              "max_timestep_boundary": 0.6}))
    draws = [ours.draw_index(7, position) for position in range(2000)]
    assert min(draws) >= 200 and max(draws) <= 599 and len(set(draws)) > 300  # randint(200, 600)
    assert draws == [ours.draw_index(7, position) for position in range(2000)]
    latents = np.zeros((2, 1, 1, 2, 2), np.float32)
    one = ours.training_batch(latents, 7, [4, 5])["target"]
    # a data-parallel rank holding the second sample draws what one process draws for it
    second = ours.training_batch(latents[1:], 7, [5])["target"]
    np.testing.assert_array_equal(one[1], second[0])
    assert not np.array_equal(one[0], one[1])


def test_refuses_other_schedulers_and_bad_boundaries():
    with pytest.raises(ValueError, match="diffusion.model_id 'UniPCMultistepScheduler' is not trainable"):
        FlowMatchConfig.from_mindspeed({"model_id": "UniPCMultistepScheduler"})
    with pytest.raises(ValueError, match="0 <= min < max <= 1"):
        FlowMatchConfig.from_mindspeed({"min_timestep_boundary": 0.5, "max_timestep_boundary": 0.5})
