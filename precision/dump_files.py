"""The dump's files, in msprobe's layout (so that msprobe's tools can read mmrun's dumps):

    DUMP_PATH/step<S>/rank<R>/dump.json       {"task", "level", "framework", "dump_data_dir", "data": {name: record}}
    DUMP_PATH/step<S>/rank<R>/construct.json  {} (msprobe's module tree, left empty at L0)
    DUMP_PATH/step<S>/rank<R>/stack.json      {} (msprobe's call stacks, not recorded)
    DUMP_PATH/step<S>/rank<R>/dump_tensor_data/tensors.safetensors   with task "tensor" only

Record names are msprobe's for modules: `Module.<path>.<Class>.forward.<n>` with `input_args`,
`input_kwargs` and `output`, and `Module.<path>.<Class>.backward.<n>` with `input` (the gradients
arriving at the module's outputs) and `output` (the gradients it passes to its inputs); `n` counts the
module's calls within the step (micro-batches). Records are in execution order. Each tensor entry holds
msprobe's statistics (Max, Min, Mean, Norm) and, with task "tensor", `data_name`: its key in the
safetensors file. Every file is written atomically.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from mmrun.common.atomic_write import atomic_write

RECORD_NAME = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[^.]+)\.(?P<direction>forward|backward)\.(?P<call>\d+)$")
TENSOR_FILE = "dump_tensor_data/tensors.safetensors"


def record_name(path: str, cls: str, direction: str, call: int) -> str:
    return f"Module.{path}.{cls}.{direction}.{call}"


def parse_record_name(name: str) -> dict[str, str] | None:
    match = RECORD_NAME.match(name)
    return match.groupdict() if match else None


def step_dir(dump_path: str | Path, step: int, rank: int) -> Path:
    return Path(dump_path) / f"step{step}" / f"rank{rank}"


def write_step(folder: Path, task: str, framework: str, records: dict[str, Any],
               tensors: dict[str, np.ndarray] | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data_dir = None
    if tensors:
        from safetensors.numpy import save

        data_dir = str(folder / "dump_tensor_data")
        (folder / "dump_tensor_data").mkdir(exist_ok=True)
        atomic_write(folder / TENSOR_FILE, save({k: np.ascontiguousarray(v) for k, v in tensors.items()}))
    dump = {"task": task, "level": "L0", "framework": framework, "dump_data_dir": data_dir, "data": records}
    atomic_write(folder / "dump.json", json.dumps(dump, indent=1) + "\n")
    atomic_write(folder / "construct.json", "{}\n")
    atomic_write(folder / "stack.json", "{}\n")


def read_step(folder: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(dump.json's content, its tensors: {} with task "statistics")."""
    dump = json.loads((folder / "dump.json").read_text(encoding="utf-8"))
    tensors: dict[str, np.ndarray] = {}
    if (folder / TENSOR_FILE).is_file():
        from safetensors.numpy import load_file

        tensors = load_file(str(folder / TENSOR_FILE))
    return dump, tensors


def dumped_steps(dump_path: Path) -> dict[tuple[int, int], Path]:
    """(step, rank) -> folder, for every step<S>/rank<R>/dump.json under dump_path."""
    found = {}
    for dump in sorted(Path(dump_path).glob("step*/rank*/dump.json")):
        step, rank = dump.parent.parent.name[4:], dump.parent.name[4:]
        if step.isdigit() and rank.isdigit():
            found[(int(step), int(rank))] = dump.parent
    return found
