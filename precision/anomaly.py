"""Anomaly rules (the NPU's 特征值检测 / feature value detection, on any device): non-finite values and spikes.

A value is anomalous when it is NaN or Inf, or when it exceeds `factor` x the median of its last `window`
finite values (once `min_history` of them exist): Megatron's spiky-loss check uses the same kind of
factor (10). Each series is tracked by name ("lm loss", "grad norm", "Module.h.1.mlp.MLP.backward"), so
a module's gradient norm is judged against its own history.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

LEVELS = ("off", "log", "stop")  # as the NPU feature: detect nothing / log and go on / stop the job


@dataclass(frozen=True)
class SpikeRule:
    factor: float = 10.0  # 0 turns spike detection off (non-finite values are still found)
    window: int = 50
    min_history: int = 5


@dataclass
class Finding:
    iteration: int
    series: str  # what was checked: "lm loss", "grad norm" or a module's record name
    value: float
    kind: str  # "non-finite" or "spike"
    detail: str = ""

    def describe(self) -> str:
        if self.kind == "non-finite":
            return f"iteration {self.iteration}: {self.series} is {self.value}{self.detail}"
        return f"iteration {self.iteration}: {self.series} spiked to {self.value:.6g}{self.detail}"


@dataclass
class History:
    rule: SpikeRule = field(default_factory=SpikeRule)
    _values: dict[str, deque] = field(default_factory=dict)

    def check(self, iteration: int, series: str, value: float, detail: str = "") -> Finding | None:
        """Judge one value, then add it to its series' history (non-finite values and spikes are not added)."""
        if not math.isfinite(value):
            return Finding(iteration, series, value, "non-finite", detail)
        past = self._values.setdefault(series, deque(maxlen=self.rule.window))
        if self.rule.factor > 0 and len(past) >= self.rule.min_history:
            median = statistics.median(past)
            if median > 0 and abs(value) > self.rule.factor * median:
                return Finding(iteration, series, value, "spike",
                               f"{detail}, {abs(value) / median:.1f} x the median {median:.6g} of the last "
                               f"{len(past)} iterations (factor {self.rule.factor:g})")
        past.append(abs(value))
        return None
