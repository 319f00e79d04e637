"""Validation of the Ascend tuning variables the migration guides tell users to export.

The MindSpeed-MM migration and tuning guide (gitcode.com/Ascend/MindSpeed-MM, docs/user-guide/model-migration.md)
sets them in its launch scripts; their grammar is in the Ascend Extension for PyTorch environment
variable reference (hiascend.com).

A typo here does not fail loudly on the NPU: torch_npu silently falls back to its defaults. mmrun checks
the grammar before anything starts and names the variable that is wrong.
"""
from __future__ import annotations

import re
from typing import Callable, Mapping

_AFFINITY_RANGE = re.compile(r"npu(\d+):(\d+)-(\d+)")


def _task_queue_enable(value: str) -> str | None:
    if value not in ("0", "1", "2"):
        return "must be 0 (off), 1 (level-1 pipeline) or 2 (level-2 pipeline)"
    return None


def _cpu_affinity_conf(value: str) -> str | None:
    mode, *ranges = value.split(",")
    if mode not in ("0", "1", "2"):
        return f"mode {mode!r} must be 0 (off), 1 (coarse) or 2 (fine); grammar <mode>[,npu<i>:<a>-<b>]..."
    for item in ranges:
        match = _AFFINITY_RANGE.fullmatch(item)
        if not match:
            return f"{item!r} is not npu<i>:<a>-<b>; grammar <mode>[,npu<i>:<a>-<b>]..."
        first, last = int(match.group(2)), int(match.group(3))
        if first > last:
            return f"{item!r} has first core {first} > last core {last}"
    return None


# variable -> validator returning None when valid, else what is wrong
VALIDATORS: dict[str, Callable[[str], str | None]] = {
    "TASK_QUEUE_ENABLE": _task_queue_enable,
    "CPU_AFFINITY_CONF": _cpu_affinity_conf,
}


def check_ascend_env(environ: Mapping[str, str]) -> list[str]:
    """One message per badly set variable, each naming it, its value and the grammar."""
    problems = []
    for name, validate in VALIDATORS.items():
        if name in environ:
            problem = validate(environ[name].strip())
            if problem:
                problems.append(f"{name}={environ[name]!r}: {problem}")
    return problems
