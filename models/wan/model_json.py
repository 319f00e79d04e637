"""MindSpeed-MM's pretrain_model.json for Wan2.1 (pretrain_sora.py's --mm-model), read and checked in one place.

    {"load_video_features": true, "load_text_features": true, "task": "t2v" | "i2v",
     "diffusion": {"model_id": "wan_flow_match_scheduler", "num_train_timesteps", "shift", "sigma_min", ...},
     "predictor": {"model_id": "wandit", "model_type", "patch_size", "in_dim", "hidden_size", ...},
     "ae": {...}, "text_encoder": {...}}       (read by feature extraction; training from features ignores them)

mmrun trains from extracted features (MindSpeed-MM's `dataset_type: feature` with both load_*_features true):
encoding videos and captions on the fly during training is refused in one line that says how to extract them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrun.backend.errors import UsageError
from mmrun.models.wan.configuration import WanTransformerConfig
from mmrun.models.wan.flow_match import FlowMatchConfig

TASKS = ("t2v", "i2v")


@dataclass(frozen=True)
class SoraModelJson:
    path: Path
    task: str
    predictor: WanTransformerConfig
    diffusion: FlowMatchConfig
    pipeline_num_layers: Any
    ignored: tuple[str, ...]  # top-level keys present that training does not read (the entry names them once)


def read_sora_model_json(path: str, pipeline_model_parallel_size: int = 1) -> SoraModelJson:
    """The Wan2.1 training model.json at `path`, or UsageError (one line) naming the key and what to do."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--mm-model {path}: no such file; pass MindSpeed-MM's pretrain_model.json")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise UsageError(f"--mm-model {path}: not valid JSON ({err.msg} at line {err.lineno}); fix the file") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("predictor"), dict):
        raise UsageError(f"--mm-model {path}: needs a predictor object (MindSpeed-MM's pretrain_model.json)")
    for key in ("load_video_features", "load_text_features"):
        if raw.get(key) is not True:
            raise UsageError(f"{path}: {key} is {raw.get(key)!r}; mmrun trains Wan2.1 from extracted features: run "
                             "models/get_wan_feature.py first and set load_video_features and load_text_features true")
    task = raw.get("task", "t2v")
    if task not in TASKS:
        raise UsageError(f"{path}: task {task!r} is not one of {', '.join(TASKS)}")
    predictor = raw["predictor"]
    model_type = predictor.get("model_type", "t2v")
    if model_type != task:
        raise UsageError(f"{path}: task {task!r} but predictor.model_type {model_type!r}; make them the same")
    config = WanTransformerConfig.from_mindspeed(predictor, pipeline_model_parallel_size, where=f"{path}: predictor")
    diffusion = raw.get("diffusion")
    if not isinstance(diffusion, dict):
        raise UsageError(f"{path}: needs a diffusion object ({{\"model_id\": \"wan_flow_match_scheduler\", ...}})")
    try:
        flow = FlowMatchConfig.from_mindspeed(diffusion)
    except (TypeError, ValueError) as err:
        raise UsageError(f"{path}: {err}") from None
    return SoraModelJson(path=p, task=task, predictor=config, diffusion=flow,
                         pipeline_num_layers=predictor.get("pipeline_num_layers"),
                         ignored=tuple(sorted(set(raw) - {"load_video_features", "load_text_features", "task",
                                                         "diffusion", "predictor"})))
