"""Megatron's log lines (rank 0) and mmrun's full-precision metrics file.

The iteration line is megatron.training.training_log's format, with tokens per second appended:

     [2025-01-01 12:00:00] iteration       10/      20 | consumed samples:           80 | elapsed time per
     iteration (ms): 41.3 | learning rate: 1.500000E-04 | global batch size:     8 | lm loss: 6.812345E+00 |
     loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |
     tokens per second: 6198.5 |

(one line). As in Megatron: `lm loss` is the average over the iterations since the previous line that
made an update; iterations skipped by fp16 loss scaling are counted instead, and a skipped iteration
whose loss is not finite is also a nan iteration; `loss scale` is 1.0 without loss scaling.
Validation prints Megatron's boxed `validation loss at iteration N | lm loss value: ... | lm loss PPL: ...`.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from mmrun.backend.errors import UsageError

ITERATION_RE = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|")
LOSS_RE = re.compile(r"\| lm loss: ([0-9.Ee+-]+) \|")
VALIDATION_RE = re.compile(r"validation loss at (.+?) \| lm loss value: ([0-9.Ee+-]+) \|")


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


@dataclass
class IntervalStats:
    """What accumulates between two log lines (Megatron's total_loss_dict)."""

    iterations: int = 0
    losses: dict[str, float] = field(default_factory=dict)
    elapsed: float = 0.0
    advanced_iterations: int = 0
    skipped_iterations: int = 0
    nan_iterations: int = 0

    def add(self, losses: dict[str, float], elapsed: float, skipped: bool = False) -> None:
        self.iterations += 1
        self.elapsed += elapsed
        if skipped:
            self.skipped_iterations += 1
            self.nan_iterations += any(not math.isfinite(value) for value in losses.values())
            return
        self.advanced_iterations += 1
        for key, value in losses.items():
            self.losses[key] = self.losses.get(key, 0.0) + value


def iteration_line(iteration: int, train_iters: int, consumed: int, stats: IntervalStats, lr: float,
                   global_batch_size: int, grad_norm: float | None, seq_length: int,
                   loss_scale: float | None = None, throughput: str = "") -> str:
    per_iter = stats.elapsed / max(1, stats.iterations)
    parts = [
        f" [{stamp()}] iteration {iteration:8d}/{train_iters:8d} |",
        f" consumed samples: {consumed:12d} |",
        f" elapsed time per iteration (ms): {per_iter * 1000.0:.1f} |",
        *([throughput] if throughput else []),  # --log-throughput, where Megatron prints it
        f" learning rate: {lr:.6E} |",
        f" global batch size: {global_batch_size:5d} |",
    ]
    for key, total in stats.losses.items():
        parts.append(f" {key}: {total / max(1, stats.advanced_iterations):.6E} |")
    parts.append(f" loss scale: {1.0 if loss_scale is None else loss_scale:.1f} |")
    if grad_norm is not None:
        parts.append(f" grad norm: {grad_norm:.3f} |")
    parts.append(f" number of skipped iterations: {stats.skipped_iterations:3d} |")
    parts.append(f" number of nan iterations: {stats.nan_iterations:3d} |")
    tokens_per_second = global_batch_size * seq_length / per_iter if per_iter > 0 else 0.0
    parts.append(f" tokens per second: {tokens_per_second:.1f} |")
    return "".join(parts)


def validation_block(prefix: str, losses: dict[str, float]) -> str:
    """Megatron's evaluate_and_print_results output: the line between two rules of dashes."""
    text = f" validation loss at {prefix} | "
    for key, value in losses.items():
        ppl = math.exp(min(20.0, value))
        text += f"{key} value: {value:.6E} | {key} PPL: {ppl:.6E} | "
    rule = "-" * (len(text) + 1)
    return f"{rule}\n{text}\n{rule}"


class MetricsFile:
    """--metrics-file: one JSON object per line, full float precision (rank 0 only).

    A path that cannot be opened is a UsageError (one line, exit 2) before the first iteration. A write
    that fails later (a full disk) cuts the file back to its last complete line and stops the metrics
    with a warning: training, and its checkpoints, go on."""

    def __init__(self, path: str | None, enabled: bool) -> None:
        self.path = path
        self._fh = None
        if not (path and enabled):
            return
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise UsageError(f"--metrics-file {path}: the directory {folder} does not exist. Received: "
                             f"--metrics-file {path}; create the directory or pass a file in an existing one")
        try:
            self._fh = open(path, "ab", buffering=0)  # unbuffered: a failed write leaves nothing to flush later
        except OSError as err:
            raise UsageError(f"--metrics-file {path} cannot be opened for appending ({err.strerror}); pass a "
                             "writable file") from None
        self._complete = os.fstat(self._fh.fileno()).st_size

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            return
        data = memoryview((json.dumps(record) + "\n").encode())
        try:
            while data:
                data = data[self._fh.write(data):]
        except OSError as err:
            try:
                os.ftruncate(self._fh.fileno(), self._complete)
            except OSError:
                pass
            self.close()
            print(f"WARNING: --metrics-file {self.path}: {err.strerror or err}; it ends at its last complete line "
                  "and gets no more metrics in this run; training goes on", file=sys.stderr, flush=True)
            return
        self._complete = os.fstat(self._fh.fileno()).st_size

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def parse_log(text: str) -> dict[str, Any]:
    """Losses out of a Megatron-format log: {"train": [(iteration, lm loss)], "validation": [(prefix, loss)]}.
    Used by scripts/plot_loss_curves.py and the tests."""
    train, valid = [], []
    for line in text.splitlines():
        it, loss = ITERATION_RE.search(line), LOSS_RE.search(line)
        if it and loss:
            train.append((int(it.group(1)), float(loss.group(1))))
        v = VALIDATION_RE.search(line)
        if v:
            valid.append((v.group(1), float(v.group(2))))
    return {"train": train, "validation": valid}
