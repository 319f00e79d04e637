"""Sampling schedulers in numpy, step for step equal to diffusers' (the reference, not needed here):
`UniPCMultistepScheduler` with flow sigmas (what Wan2.1 and MindSpeed-MM's inference_model.json use) and
`FlowMatchEulerDiscreteScheduler`.

Both take the keys of MindSpeed-MM's `diffusion` block as they are (`model_id` picks the class; keys that only
matter for the DDPM betas, which flow sigmas never read, are accepted and ignored). Scalars are float32, as
diffusers keeps its sigmas, and samples keep their dtype, so the same model outputs give the same samples
to float32 rounding. The denoising loop calls `step(model_output, sample)` once per entry of `timesteps`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

F32 = np.float32


class SchedulerConfigError(ValueError):
    """A `diffusion` block this module cannot run (one line, says what to change)."""


# diffusers' keys that only shape the DDPM beta schedule or are read by other solvers: with use_flow_sigmas the
# UniPC steps never look at them, so they are taken and ignored.
UNUSED_WITH_FLOW_SIGMAS = {
    "beta_start", "beta_end", "beta_schedule", "trained_betas", "rescale_betas_zero_snr", "dynamic_thresholding_ratio",
    "sample_max_value", "timestep_spacing", "steps_offset", "use_karras_sigmas", "use_exponential_sigmas",
    "use_beta_sigmas", "solver_p",
}
# keys of the `diffusion` block that belong to the pipeline, not the scheduler
PIPELINE_KEYS = {"model_id", "num_inference_steps", "guidance_scale", "guidance_scale_2", "boundary_ratio"}
# MindSpeed-MM's spelling -> diffusers'
ALIASES = {"num_train_steps": "num_train_timesteps"}


def _scheduler_kwargs(cls: type, block: dict[str, Any], ignored: set[str]) -> dict[str, Any]:
    known = {f.name for f in fields(cls)}
    kwargs = {}
    for key, value in block.items():
        key = ALIASES.get(key, key)
        if key in known:
            kwargs[key] = value
        elif key not in ignored | PIPELINE_KEYS:
            raise SchedulerConfigError(f"diffusion.{key}: {cls.__name__} does not take it; "
                                       f"it takes {sorted(known)}")
    return kwargs


@dataclass
class UniPCMultistepScheduler:
    """UniPC (predictor UniP-B(h), corrector UniC) on flow sigmas; data prediction (predict_x0)."""

    num_train_timesteps: int = 1000
    solver_order: int = 2
    prediction_type: str = "flow_prediction"
    thresholding: bool = False
    predict_x0: bool = True
    solver_type: str = "bh2"
    lower_order_final: bool = True
    disable_corrector: list = field(default_factory=list)
    use_flow_sigmas: bool = True
    flow_shift: float = 1.0
    final_sigmas_type: str = "zero"

    def __post_init__(self) -> None:
        rules = {
            "use_flow_sigmas": (self.use_flow_sigmas, True),
            "prediction_type": (self.prediction_type, "flow_prediction"),
            "predict_x0": (self.predict_x0, True),
            "thresholding": (self.thresholding, False),
        }
        for key, (value, wanted) in rules.items():
            if value != wanted:
                raise SchedulerConfigError(f"diffusion.{key} = {value!r}: mmrun's UniPC runs Wan's flow setting "
                                           f"({key} = {wanted!r})")
        if self.solver_type not in ("bh1", "bh2"):
            raise SchedulerConfigError(f"diffusion.solver_type = {self.solver_type!r}: choose bh1 or bh2")
        if self.final_sigmas_type not in ("zero", "sigma_min"):
            raise SchedulerConfigError(f"diffusion.final_sigmas_type = {self.final_sigmas_type!r}: "
                                       "choose zero or sigma_min")
        if self.solver_order < 1:
            raise SchedulerConfigError(f"diffusion.solver_order = {self.solver_order}: must be >= 1")

    @classmethod
    def from_config(cls, block: dict[str, Any]) -> "UniPCMultistepScheduler":
        return cls(**_scheduler_kwargs(cls, block, UNUSED_WITH_FLOW_SIGMAS))

    def set_timesteps(self, num_inference_steps: int) -> None:
        sigmas = np.linspace(1, 1 / self.num_train_timesteps, num_inference_steps + 1)[:-1]
        sigmas = self.flow_shift * sigmas / (1 + (self.flow_shift - 1) * sigmas)
        if abs(sigmas[0] - 1) < 1e-6:
            sigmas[0] -= 1e-6  # diffusers: keeps log(alpha) finite in the first updates
        self.timesteps = (sigmas * self.num_train_timesteps).astype(np.int64)
        last = sigmas[-1] if self.final_sigmas_type == "sigma_min" else 0.0
        self.sigmas = np.concatenate([sigmas, [last]]).astype(F32)
        self.model_outputs: list[np.ndarray | None] = [None] * self.solver_order
        self.lower_order_nums = 0
        self.last_sample: np.ndarray | None = None
        self.step_index = 0
        self.this_order = 1

    def _lambda(self, index: int) -> tuple[np.float32, np.float32, np.float32]:
        """(alpha, sigma, log(alpha) - log(sigma)) of the flow sigma at `index`, in float32."""
        sigma = self.sigmas[index]
        alpha = F32(1) - sigma
        with np.errstate(divide="ignore"):  # the final sigma 0 gives lambda = inf, as in diffusers
            return alpha, sigma, F32(np.log(alpha) - np.log(sigma))

    def _coefficients(self, rks: list, hh: np.float32, order: int) -> tuple[np.ndarray, np.ndarray, np.float32]:
        """R (powers of the step ratios), b (the phi-function weights) and B(h) of UniPC's linear system."""
        with np.errstate(divide="ignore", invalid="ignore"):
            h_phi_1 = F32(np.expm1(hh))
            h_phi_k = F32(h_phi_1 / hh - 1)
        b_h = hh if self.solver_type == "bh1" else h_phi_1
        rks = np.asarray(rks + [F32(1)], dtype=F32)
        r_rows, b = [], []
        factorial = 1
        for i in range(1, order + 1):
            r_rows.append(rks ** (i - 1))
            b.append(F32(h_phi_k * factorial / b_h))
            factorial *= i + 1
            h_phi_k = F32(h_phi_k / hh - F32(1) / factorial)
        return np.stack(r_rows).astype(F32), np.asarray(b, dtype=F32), F32(b_h)

    def _differences(self, first: int, order: int, lambda_s0: np.float32, h: np.float32, m0: np.ndarray):
        rks, d1s = [], []
        for i in range(1, order):
            mi = self.model_outputs[-(i + 1)]
            with np.errstate(divide="ignore"):  # two equal sigmas (sigma_min twice) give h = 0, as in diffusers
                rk = F32((self._lambda(first - i)[2] - lambda_s0) / h)
            rks.append(rk)
            d1s.append((mi - m0) / rk)
        return rks, d1s

    def _predict(self, sample: np.ndarray, order: int) -> np.ndarray:
        """UniP-B(h): from the sample at step_index to the next sigma."""
        m0 = self.model_outputs[-1]
        alpha_t, sigma_t, lambda_t = self._lambda(self.step_index + 1)
        _, sigma_s0, lambda_s0 = self._lambda(self.step_index)
        h = F32(lambda_t - lambda_s0)
        rks, d1s = self._differences(self.step_index, order, lambda_s0, h, m0)
        hh = F32(-h)
        r, b, b_h = self._coefficients(rks, hh, order)
        h_phi_1 = F32(np.expm1(hh))
        x_t = (sigma_t / sigma_s0) * sample - (alpha_t * h_phi_1) * m0
        if d1s:
            rhos = np.asarray([0.5], F32) if order == 2 else np.linalg.solve(r[:-1, :-1], b[:-1]).astype(F32)
            x_t = x_t - (alpha_t * b_h) * sum(rho * d for rho, d in zip(rhos, d1s))
        return x_t.astype(sample.dtype)

    def _correct(self, model_t: np.ndarray, last_sample: np.ndarray, this_sample: np.ndarray, order: int):
        """UniC: corrects this step's sample with the model output just computed at it."""
        m0 = self.model_outputs[-1]
        alpha_t, sigma_t, lambda_t = self._lambda(self.step_index)
        _, sigma_s0, lambda_s0 = self._lambda(self.step_index - 1)
        h = F32(lambda_t - lambda_s0)
        rks, d1s = self._differences(self.step_index - 1, order, lambda_s0, h, m0)
        hh = F32(-h)
        r, b, b_h = self._coefficients(rks, hh, order)
        h_phi_1 = F32(np.expm1(hh))
        rhos = np.asarray([0.5], F32) if order == 1 else np.linalg.solve(r, b).astype(F32)
        x_t = (sigma_t / sigma_s0) * last_sample - (alpha_t * h_phi_1) * m0
        correction = sum((rho * d for rho, d in zip(rhos[:-1], d1s)), np.zeros((), F32)) + rhos[-1] * (model_t - m0)
        return (x_t - (alpha_t * b_h) * correction).astype(this_sample.dtype)

    def step(self, model_output: np.ndarray, sample: np.ndarray) -> np.ndarray:
        """The sample at the next sigma, given the model's flow prediction at the current one."""
        x0 = sample - self.sigmas[self.step_index] * model_output  # flow_prediction -> data prediction
        if self.step_index > 0 and self.step_index - 1 not in self.disable_corrector and self.last_sample is not None:
            sample = self._correct(x0, self.last_sample, sample, self.this_order)
        self.model_outputs = self.model_outputs[1:] + [x0]
        order = min(self.solver_order, len(self.timesteps) - self.step_index) if self.lower_order_final \
            else self.solver_order
        self.this_order = min(order, self.lower_order_nums + 1)  # warm-up: lower orders first
        self.last_sample = sample
        prev = self._predict(sample, self.this_order)
        self.lower_order_nums = min(self.lower_order_nums + 1, self.solver_order)
        self.step_index += 1
        return prev


@dataclass
class FlowMatchEulerDiscreteScheduler:
    """Euler steps on shifted flow sigmas: x <- x + (sigma_next - sigma) * v."""

    num_train_timesteps: int = 1000
    shift: float = 1.0

    @classmethod
    def from_config(cls, block: dict[str, Any]) -> "FlowMatchEulerDiscreteScheduler":
        block = {k: v for k, v in block.items() if k not in ("use_dynamic_shifting", "invert_sigmas") or not v}
        return cls(**_scheduler_kwargs(cls, block, {"use_dynamic_shifting", "invert_sigmas"}))

    def set_timesteps(self, num_inference_steps: int) -> None:
        n = self.num_train_timesteps
        train = np.linspace(1, n, n, dtype=F32)[::-1] / F32(n)
        train = (F32(self.shift) * train / (1 + (F32(self.shift) - 1) * train)).astype(F32)
        sigma_max, sigma_min = float(train[0]), float(train[-1])
        sigmas = np.linspace(sigma_max * n, sigma_min * n, num_inference_steps) / n
        sigmas = (self.shift * sigmas / (1 + (self.shift - 1) * sigmas)).astype(F32)
        self.timesteps = sigmas * F32(n)
        self.sigmas = np.concatenate([sigmas, np.zeros(1, F32)])
        self.step_index = 0

    def step(self, model_output: np.ndarray, sample: np.ndarray) -> np.ndarray:
        dt = self.sigmas[self.step_index + 1] - self.sigmas[self.step_index]
        self.step_index += 1
        return (sample.astype(F32) + dt * model_output).astype(model_output.dtype)


SCHEDULERS = {
    "UniPCMultistepScheduler": UniPCMultistepScheduler,
    "FlowMatchEulerDiscreteScheduler": FlowMatchEulerDiscreteScheduler,
}


def build_scheduler(block: dict[str, Any]):
    """The scheduler a `diffusion` block names by `model_id`."""
    model_id = block.get("model_id")
    if model_id not in SCHEDULERS:
        raise SchedulerConfigError(f"diffusion.model_id {model_id!r}: mmrun samples with {sorted(SCHEDULERS)}")
    return SCHEDULERS[model_id].from_config(block)
