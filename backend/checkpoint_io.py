"""Framework-neutral checkpoints: safetensors tensors with torch-style names plus a small JSON file.

A checkpoint is a directory:

    model.safetensors       parameter name -> array (`wte.weight`, `h.0.attn.c_attn.bias`, ...)
    optimizer.safetensors   `<param>.exp_avg`, `<param>.exp_avg_sq` (only if an optimizer state was given)
    meta.json               {"format": "mmrun-checkpoint", "version": 1, "optimizer": {"step", "lr"}, ...}

Both frameworks read and write it (through numpy; bf16 is stored as float32, an exact upcast, and
cast back to each parameter's dtype on load). No pickle anywhere. Saving is atomic: everything is
written into a temporary directory beside the target, which replaces the target only when complete,
so an interrupted save never leaves a half-written checkpoint under the final name.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from safetensors.numpy import load_file, save_file

from mmrun.common.atomic_write import fsync_dir, remove_stale_temporaries, replace_directory, temporary_name

FORMAT = "mmrun-checkpoint"
VERSION = 1
MODEL_FILE, OPTIMIZER_FILE, META_FILE = "model.safetensors", "optimizer.safetensors", "meta.json"


@dataclass
class Checkpoint:
    model: dict[str, np.ndarray]
    optimizer: dict[str, Any] | None  # {"step", "lr", "tensors": {name: array}}, as optimizer.load_state_dict takes
    meta: dict[str, Any] = field(default_factory=dict)  # everything else saved in meta.json


def _arrays(state: Mapping[str, Any], what: str) -> dict[str, np.ndarray]:
    out = {}
    for name, value in state.items():
        if not isinstance(value, np.ndarray):
            raise TypeError(f"{what} entry {name!r} is a {type(value).__name__}, not a numpy array; convert "
                            "with tensors.state_dict_to_numpy() first")
        out[name] = np.ascontiguousarray(value)
    return out


def _save_tensors(arrays: Mapping[str, np.ndarray], file: Path) -> None:
    try:
        save_file(arrays, str(file), metadata={"format": FORMAT})
    except Exception as err:  # safetensors reports a failed write as SafetensorError("... (os error 28)")
        code = re.search(r"\(os error (\d+)\)", str(err))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(file)) from None


def save_checkpoint(path: str | os.PathLike, model: Mapping[str, np.ndarray],
                    optimizer: Mapping[str, Any] | None = None, meta: Mapping[str, Any] | None = None,
                    on_step: Callable[[str], None] | None = None) -> Path:
    """Write a checkpoint directory atomically; returns its path. `optimizer` is an optimizer's
    state_dict() with numpy tensors; `meta` must be JSON-serialisable (iteration, RNG seeds, args...).

    `on_step(name)` is called after "model" (model.safetensors written, nothing else yet) and "files"
    (every file written and fsynced, not yet renamed into place): the fault-injection tests kill the
    process there."""
    step = on_step or (lambda name: None)
    target = Path(path)
    model_arrays = _arrays(model, "model state")
    info: dict[str, Any] = {"format": FORMAT, "version": VERSION, **dict(meta or {})}
    opt_arrays = None
    if optimizer is not None:
        opt_arrays = _arrays(optimizer["tensors"], "optimizer state")
        info["optimizer"] = {k: v for k, v in optimizer.items() if k != "tensors"}
    text = json.dumps(info, indent=2, sort_keys=True)  # fails here, before any file is written, if not JSON-able
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target)
    tmp = Path(tempfile.mkdtemp(prefix=temporary_name(target), dir=target.parent))
    try:
        _save_tensors(model_arrays, tmp / MODEL_FILE)
        step("model")
        if opt_arrays is not None:
            _save_tensors(opt_arrays, tmp / OPTIMIZER_FILE)
        (tmp / META_FILE).write_text(text + "\n", encoding="utf-8")
        for name in os.listdir(tmp):
            with open(tmp / name, "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(tmp)
        step("files")
        replace_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint directory written by save_checkpoint (by either framework)."""
    root = Path(path)
    meta_path = root / META_FILE
    if not meta_path.is_file() or not (root / MODEL_FILE).is_file():
        raise FileNotFoundError(f"{root} is not an mmrun checkpoint (needs {MODEL_FILE} and {META_FILE}); "
                                "pass the directory save_checkpoint wrote")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"{meta_path} has format {meta.get('format')!r} version {meta.get('version')!r}; "
                         f"this mmrun reads {FORMAT!r} version {VERSION}")
    optimizer = None
    if "optimizer" in meta:
        optimizer = {**meta.pop("optimizer"), "tensors": load_file(str(root / OPTIMIZER_FILE))}
    for key in ("format", "version"):
        meta.pop(key)
    return Checkpoint(model=load_file(str(root / MODEL_FILE)), optimizer=optimizer, meta=meta)
