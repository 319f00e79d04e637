"""Megatron's per-phase timers (--timing-log-level), framework-free.

    timers = Timers(level=1, sync=backend.device.synchronize)
    with timers.phase("forward-backward"): ...     # a no-op for a phase above the level
    timers.block(min_max)                           # Megatron's "(min, max) time across ranks (ms):" lines

The train step and the engine call `phase` (backend/<framework>/train_step.py, engines/portable.py);
`NO_TIMERS` is what they hold when timing is off: one attribute read and a shared null context per phase.
On an accelerator a phase ends with a device synchronisation (as Megatron's Timer.stop), so level 2 costs time.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

# name -> the lowest --timing-log-level that shows it (Megatron's names and levels), in report order.
PHASES: dict[str, int] = {
    "batch-generator": 1,
    "forward-backward": 1,
    "forward-compute": 2,
    "backward-compute": 2,
    "grads-all-reduce": 1,
    "optimizer": 1,
}
LEVELS = (0, 1, 2)
_NULL = contextlib.nullcontext()


class Timers:
    def __init__(self, level: int = 0, sync: Callable[[], None] | None = None) -> None:
        self.level = level
        self.sync = sync or (lambda: None)
        self.elapsed: dict[str, float] = {}  # seconds since the last reset, per phase
        self.iterations = 0

    def phase(self, name: str):
        if PHASES.get(name, 99) > self.level:
            return _NULL
        return self._timed(name)

    @contextlib.contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.elapsed[name] = self.elapsed.get(name, 0.0) + time.perf_counter() - start

    def per_iteration_ms(self) -> dict[str, float]:
        """Milliseconds per iteration of each phase seen since the last reset, in PHASES order."""
        n = max(1, self.iterations)
        return {name: self.elapsed[name] * 1000.0 / n for name in PHASES if name in self.elapsed}

    def reset(self) -> None:
        self.elapsed = {}
        self.iterations = 0


NO_TIMERS = Timers(level=0)


OPTIONS = ("max", "minmax", "all")  # Megatron's --timing-log-option


def block(per_rank: dict[str, list[float]], option: str = "minmax") -> str:
    """Megatron's Timers.log text: one line per phase (ms per iteration), reduced over ranks by `option`."""
    title = {"max": "max time across ranks (ms):", "minmax": "(min, max) time across ranks (ms):",
             "all": "times across ranks (ms):"}[option]
    lines = [title]
    for name, values in per_rank.items():
        if option == "max":
            text = f"{max(values):.2f}"
        elif option == "minmax":
            text = f"({min(values):.2f}, {max(values):.2f})"
        else:
            text = "(" + ", ".join(f"{v:.2f}" for v in values) + ")"
        lines.append(f"    {name + ' ':.<48}: {text}")
    return "\n".join(lines)
