"""MindSpeed-MM's `wan_flow_match_scheduler` for training: the flow-matching objective Wan2.1 is trained with.

Read from mindspeed_mm/models/diffusion/wan_flow_match_scheduler.py (`_set_timesteps(training=True)`, `q_sample`,
`training_losses`, `_training_weight`):

    sigmas    = linspace(sigma_max, sigma_min, N + 1)[:-1] with extra_one_step, else linspace(..., N); flipped with
                inverse_timesteps; then shift * s / (1 + (shift - 1) * s); 1 - sigmas with reverse_sigmas
    timesteps = sigmas * num_train_timesteps
    weights   = y - min(y), scaled to sum to N, with y = exp(-2 * ((timesteps - N/2) / N) ** 2)   (bell-shaped)
    one step  : i ~ U{int(min_boundary * N), int(max_boundary * N) - 1} (one index for the whole micro-batch),
                x_t = (1 - sigma_i) * x0 + sigma_i * noise,  target = noise - x0,
                loss = mean((model(x_t, timesteps[i]) in fp32 - target) ** 2) * weights[i]

Everything but the model's output and the loss is numpy, drawn from the seed: both frameworks see the same
timestep and the same noise, bit for bit (MindSpeed-MM draws them with torch's generator; the distribution is
the same, the numbers are mmrun's). The noise of a sample depends on the seed and the sample's place in the run's
sample stream only, so a data-parallel run draws what one process draws, and a resumed run what an uninterrupted
one draws.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

import numpy as np

from mmrun.backend import ops, tensors  # at the top: mindspore.jit compiles this loss and no import inside it

MODEL_ID = "wan_flow_match_scheduler"


@dataclass(frozen=True)
class FlowMatchConfig:
    """The scheduler's keys as MindSpeed-MM's pretrain_model.json `diffusion` gives them (its defaults)."""

    num_train_timesteps: int = 1000
    shift: float = 3.0
    sigma_max: float = 1.0
    sigma_min: float = 0.003 / 1.002
    inverse_timesteps: bool = False
    extra_one_step: bool = False
    reverse_sigmas: bool = False
    max_timestep_boundary: float = 1.0
    min_timestep_boundary: float = 0.0

    @classmethod
    def from_mindspeed(cls, diffusion: Mapping[str, Any]) -> FlowMatchConfig:
        """From pretrain_model.json's `diffusion`; keys MindSpeed-MM's scheduler ignores are ignored here too
        (its **kwargs), a model_id other than wan_flow_match_scheduler is refused."""
        model_id = diffusion.get("model_id", MODEL_ID)
        if model_id != MODEL_ID:
            raise ValueError(f"diffusion.model_id {model_id!r} is not trainable here; pretrain_sora.py trains with "
                             f"{MODEL_ID!r} (MindSpeed-MM's Wan2.1 scheduler)")
        known = {f.name for f in fields(cls)}
        config = cls(**{key: value for key, value in diffusion.items() if key in known})
        if not 0 <= config.min_timestep_boundary < config.max_timestep_boundary <= 1:
            raise ValueError("diffusion.min_timestep_boundary and max_timestep_boundary must satisfy 0 <= min < max "
                             f"<= 1; received {config.min_timestep_boundary} and {config.max_timestep_boundary}")
        return config


class FlowMatchTraining:
    """The training half of WanFlowMatchScheduler: sigmas, timesteps, weights, and one step's noisy input."""

    def __init__(self, config: FlowMatchConfig) -> None:
        self.config = c = config
        n = c.num_train_timesteps
        # float64 for the arithmetic, float32 for the tables, as MindSpeed-MM keeps them (torch.linspace's default)
        start = c.sigma_min + (c.sigma_max - c.sigma_min)
        sigmas = np.linspace(start, c.sigma_min, n + 1)[:-1] if c.extra_one_step else np.linspace(start, c.sigma_min, n)
        if c.inverse_timesteps:
            sigmas = sigmas[::-1]
        sigmas = c.shift * sigmas / (1 + (c.shift - 1) * sigmas)
        if c.reverse_sigmas:
            sigmas = 1 - sigmas
        timesteps = sigmas * n
        bell = np.exp(-2 * ((timesteps - n / 2) / n) ** 2)
        shifted = bell - bell.min()
        self.sigmas = sigmas.astype(np.float32)
        self.timesteps = timesteps.astype(np.float32)
        self.weights = (shifted * (n / shifted.sum())).astype(np.float32)
        self.low = int(c.min_timestep_boundary * n)
        self.high = int(c.max_timestep_boundary * n)

    def draw_index(self, seed: int, position: int) -> int:
        """One timestep index per micro-batch (MindSpeed-MM: torch.randint(min, max, (1,)) per forward), drawn
        from the seed and the place of the micro-batch's first sample in the run's sample stream."""
        rng = np.random.default_rng([seed, 0, position])
        return int(rng.integers(self.low, self.high))

    @staticmethod
    def draw_noise(shape: tuple[int, ...], seed: int, position: int) -> np.ndarray:
        """Standard normal noise of one sample, float32, from the seed and the sample's place in the stream."""
        rng = np.random.default_rng([seed, 1, position])
        return rng.standard_normal(shape, dtype=np.float32)

    def noisy_input(self, x0: np.ndarray, noise: np.ndarray, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(x_t, target) = ((1 - sigma) * x0 + sigma * noise, noise - x0), in float32."""
        sigma = self.sigmas[index]
        x0 = x0.astype(np.float32, copy=False)
        return (np.float32(1) - sigma) * x0 + sigma * noise, noise - x0

    def training_batch(self, latents: np.ndarray, seed: int, positions: Sequence[int]) -> dict[str, np.ndarray]:
        """What one micro-batch of latents [B, C, F, H, W] trains on: the noisy input, the timestep (one for the
        batch, repeated per sample as diffusers' model takes it), the target and the loss weight. `positions`:
        each sample's place in the run's sample stream (consumed samples before it), which keys its noise; the
        first keys the timestep. A data-parallel rank thus draws what one process draws for the same samples,
        and a resumed run what the uninterrupted one drew."""
        if len(positions) != latents.shape[0]:
            raise ValueError(f"{len(positions)} positions for a micro-batch of {latents.shape[0]} samples")
        index = self.draw_index(seed, positions[0])
        noise = np.stack([self.draw_noise(latents.shape[1:], seed, p) for p in positions])
        x_t, target = self.noisy_input(latents, noise, index)
        return {"hidden_states": x_t, "timestep": np.full((latents.shape[0],), self.timesteps[index], np.float32),
                "target": target, "loss_weight": np.float32(self.weights[index])}


def flow_match_loss(output: Any, target: Any, weight: Any) -> Any:
    """mse_loss(output.float(), target.float()) * weight, MindSpeed-MM's training_losses (mean reduction)."""
    diff = tensors.cast(output, "fp32") - tensors.cast(target, "fp32")
    return ops.mean(diff * diff) * weight
