"""Loss scaling for fp16 training, framework-neutral: Megatron's ConstantGradScaler and DynamicGradScaler.

The scale is a host float, not a device tensor: TrainStep multiplies the loss by it before backward and
the gradients by its inverse after, and it only changes between steps, so keeping it on the host costs
nothing and makes the state plain JSON in checkpoints. Scales are powers of two in practice, so scaling
and unscaling are exact in binary floating point.

Megatron's rule for which scaler a run gets (`grad_scaler_for`): `--loss-scale S` gives a constant S
(fp16 or bf16); otherwise fp16 gets the dynamic scaler and bf16 and fp32 get none.
"""
from __future__ import annotations

import math
from typing import Any, Mapping


class ConstantGradScaler:
    """A fixed loss scale; overflowing steps are still skipped, the scale never moves."""

    def __init__(self, scale: float) -> None:
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError(f"the loss scale must be a positive finite number. Received: {scale}")
        self.scale = float(scale)

    @property
    def inv_scale(self) -> float:
        return 1.0 / self.scale

    def update(self, found_inf: bool) -> None:
        """Nothing changes: the scale is fixed."""

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "constant", "scale": self.scale}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """A constant scale is an argument, not state: the saved one is not restored."""


class DynamicGradScaler(ConstantGradScaler):
    """Megatron's dynamic loss scale: after `hysteresis` overflowing steps (not necessarily consecutive:
    only a clean growth interval resets the count) the scale is multiplied by `backoff_factor`, never
    below `min_scale`; after `growth_interval` consecutive clean steps it is multiplied by
    `growth_factor` and the hysteresis count is reset."""

    def __init__(self, initial_scale: float = 2.0 ** 32, min_scale: float = 1.0, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 1000, hysteresis: int = 2) -> None:
        super().__init__(initial_scale)
        checks = {
            "min_scale must be positive and at most initial_scale": 0.0 < min_scale <= initial_scale,
            "growth_factor must be above 1": growth_factor > 1.0,
            "backoff_factor must be between 0 and 1": 0.0 < backoff_factor < 1.0,
            "growth_interval must be at least 1": growth_interval >= 1,
            "hysteresis must be at least 1": hysteresis >= 1,
        }
        for message, ok in checks.items():
            if not ok:
                raise ValueError(f"{message}. Received: initial_scale={initial_scale}, min_scale={min_scale}, "
                                 f"growth_factor={growth_factor}, backoff_factor={backoff_factor}, "
                                 f"growth_interval={growth_interval}, hysteresis={hysteresis}")
        self.min_scale, self.growth_factor, self.backoff_factor = float(min_scale), growth_factor, backoff_factor
        self.growth_interval, self.hysteresis = int(growth_interval), int(hysteresis)
        self.growth_tracker = 0
        self.hysteresis_tracker = self.hysteresis

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.growth_tracker = 0
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker <= 0:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.growth_tracker = 0
                self.hysteresis_tracker = self.hysteresis
                self.scale = self.scale * self.growth_factor

    def state_dict(self) -> dict[str, Any]:
        # Megatron's keys, so the numbers read the same in both projects' checkpoints.
        return {"kind": "dynamic", "scale": self.scale, "growth_tracker": self.growth_tracker,
                "hysteresis_tracker": self.hysteresis_tracker}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("kind") != "dynamic":
            return  # saved by a run without dynamic scaling: keep this run's initial scale
        self.scale = float(state["scale"])
        self.growth_tracker = int(state["growth_tracker"])
        self.hysteresis_tracker = int(state["hysteresis_tracker"])


def grad_scaler_for(precision: str, loss_scale: float | None = None, initial_loss_scale: float = 2.0 ** 32,
                    min_loss_scale: float = 1.0, loss_scale_window: int = 1000,
                    hysteresis: int = 2) -> ConstantGradScaler | None:
    """Megatron's choice of scaler for a precision ("fp32", "fp16", "bf16") and its loss-scale arguments."""
    if precision not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"unknown precision {precision!r}; use fp32, fp16 or bf16")
    if precision == "fp32":
        return None
    if loss_scale:
        return ConstantGradScaler(loss_scale)
    if precision == "fp16":
        return DynamicGradScaler(initial_scale=initial_loss_scale, min_scale=min_loss_scale,
                                 growth_interval=loss_scale_window, hysteresis=hysteresis)
    return None
