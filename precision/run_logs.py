"""Per-iteration metrics out of a training log or a --metrics-file.

Formats (detected from the content, not the name):
- Megatron-LM's iteration line (mmrun, Megatron-LM, MindSpeed-LLM and MindSpeed-MM all print it, also
  behind a launcher prefix such as `[rank0]:`):
  ` iteration   10/  20 | consumed samples: 80 | ... | lm loss: 6.81E+00 | loss scale: 1.0 | grad norm: 1.234 |
  number of skipped iterations:   0 | ...`
- mmrun's --metrics-file: JSON lines, `{"kind": "train", "iteration": 1, "lm_loss": ..., "grad_norm": ...}`.
- TensorBoard event files (a --tensorboard-dir or one events.out.tfevents.* file): Megatron's scalar tags
  `lm loss`, `grad-norm`, `loss-scale` (precision/tb_events.py reads them without tensorboard).

A log that restarts (a resumed run appended to the same file: the iteration goes back) keeps the later
run's values for the repeated iterations and says where it restarted.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from mmrun.precision import tb_events

# The metrics compared, in report order: (name in reports, keys in a Megatron line, keys in --metrics-file).
METRICS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "lm loss": (("lm loss", "loss"), ("lm_loss", "lm loss", "loss")),
    "grad norm": (("grad norm",), ("grad_norm", "grad-norm")),
    "loss scale": (("loss scale",), ("loss_scale", "loss-scale")),
    "skipped": (("number of skipped iterations",), ("skipped", "skipped-iterations")),
}

ITERATION_LINE = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_FIELD = re.compile(r"^\s*([A-Za-z][A-Za-z0-9 _()/-]*?)\s*:\s*(\S+)\s*$")


class LogError(ValueError):
    """A file that holds no readable per-iteration metrics (one line: what was received, what to do)."""


@dataclass
class RunMetrics:
    """What one run logged: iteration -> {metric: value}, plus notes on how the file was read."""

    path: str
    source: str  # "megatron log" or "metrics file"
    values: dict[int, dict[str, float]] = field(default_factory=dict)
    train_iters: int | None = None
    restarts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def iterations(self) -> list[int]:
        return sorted(self.values)

    def series(self, metric: str) -> dict[int, float]:
        return {it: row[metric] for it, row in self.values.items() if metric in row}

    def describe(self) -> str:
        its = self.iterations
        span = f"{len(its)} iterations {its[0]}..{its[-1]}" if its else "no iterations"
        return f"{self.path} ({self.source}, {span})"


def _number(text: str) -> float:
    return float(text.rstrip("|").strip())


def _record(run: RunMetrics, it: int, row: dict[str, float], where: str) -> None:
    last = max(run.values) if run.values else None
    if last is not None and it <= last:
        run.restarts.append(f"{where}: iteration {last} -> {it}")
        for later in [i for i in run.values if i >= it]:
            del run.values[later]  # the resumed run replaces what the first one logged from here on
    run.values[it] = row


def _parse_megatron(path: str, text: str) -> RunMetrics:
    run = RunMetrics(path, "megatron log")
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        match = ITERATION_LINE.search(line)
        if not match:
            continue
        incomplete_last = number == len(lines) and not text.endswith("\n")
        fields = {}
        for part in match.group(3).split("|"):
            found = _FIELD.match(part)
            if found:
                fields[found.group(1).strip().lower()] = found.group(2)
        row: dict[str, float] = {}
        for metric, (line_keys, _) in METRICS.items():
            for key in line_keys:
                if key in fields:
                    try:
                        row[metric] = _number(fields[key])
                    except ValueError:
                        if incomplete_last:
                            break
                        raise LogError(f"{path}:{number}: '{key}: {fields[key]}' is not a number in the iteration "
                                       f"line; the log is garbled there. Received: {line.strip()[:120]!r}") from None
                    break
        if incomplete_last and "lm loss" not in row:
            run.notes.append(f"line {number} (the last, cut off) ignored")
            continue
        run.train_iters = int(match.group(2))
        _record(run, int(match.group(1)), row, f"line {number}")
    return run


def _parse_jsonl(path: str, text: str) -> RunMetrics:
    run = RunMetrics(path, "metrics file")
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines) and not text.endswith("\n"):
                run.notes.append(f"line {number} (the last, cut off) ignored")
                continue
            raise LogError(f"{path}:{number}: not a JSON object; the metrics file is garbled there. "
                           f"Received: {line.strip()[:120]!r}") from None
        if not isinstance(record, dict) or record.get("kind", "train") != "train" or "iteration" not in record:
            continue
        row = {}
        for metric, (_, keys) in METRICS.items():
            for key in keys:
                value = record.get(key)
                if isinstance(value, bool):
                    value = float(value)
                if isinstance(value, (int, float)):
                    row[metric] = float(value)
                    break
        _record(run, int(record["iteration"]), row, f"line {number}")
    return run


def _read_tensorboard(path: str) -> RunMetrics:
    """--tensorboard-dir (or one event file): the scalars tagged as Megatron tags them ('lm loss',
    'grad-norm', 'loss-scale'), per step = iteration (log with --tensorboard-log-interval 1 for every one)."""
    try:
        scalars, notes = tb_events.read_scalars(path)
    except tb_events.EventFileError as err:
        raise LogError(str(err)) from None
    except OSError as err:
        raise LogError(f"{path}: cannot be read ({err.strerror}); pass a --tensorboard-dir, a training log or a "
                       "--metrics-file") from None
    run = RunMetrics(path, "tensorboard", notes=notes)
    for metric, (_, keys) in METRICS.items():
        tag = next((k for k in keys if k in scalars), None)
        for step, value in (scalars.get(tag, {}) if tag else {}).items():
            run.values.setdefault(step, {})[metric] = value
    run.values = dict(sorted(run.values.items()))
    if not any("lm loss" in row for row in run.values.values()):
        raise LogError(f"{path}: TensorBoard events without an 'lm loss' scalar (tags: "
                       f"{', '.join(sorted(scalars)[:8]) or 'none'}); pass the --tensorboard-dir of a training run")
    return run


def read_run(path: str | os.PathLike) -> RunMetrics:
    """The per-iteration metrics of one run; LogError when there are none or the file is garbled."""
    p = Path(path)
    if p.is_dir() or p.name.startswith(tb_events.EVENT_PREFIX):
        return _read_tensorboard(str(path))
    try:
        data = p.read_bytes()
    except OSError as err:
        raise LogError(f"{path}: cannot be read ({err.strerror}); pass a training log or a --metrics-file") from None
    text = data.decode("utf-8", errors="replace")
    if text.count("\ufffd") > max(16, len(text) // 20):
        raise LogError(f"{path}: not text (binary or garbled: {text.count(chr(0xfffd))} undecodable bytes); pass a "
                       "training log or a --metrics-file")
    first = next((line for line in text.splitlines() if line.strip()), "")
    run = _parse_jsonl(str(path), text) if first.lstrip().startswith("{") else _parse_megatron(str(path), text)
    if not run.values:
        raise LogError(f"{path}: no training iterations found ({len(text.splitlines())} lines; expected Megatron's "
                       "'iteration N/M | ... | lm loss: X |' lines or --metrics-file JSON lines); pass the run's log "
                       "(stdout of rank 0) or its --metrics-file")
    return run


def finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))
