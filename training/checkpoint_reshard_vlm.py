"""Loading a Qwen2-VL checkpoint into a run of another layout: the VLM's side of checkpoint_reshard.py.

Sources: a checkpoint in MindSpeed-MM's names at any (TP, PP, per-stage) split ("mindspeed-mm": the parallel
engines' and `mmrun convert`'s), or a data-parallel one in Hugging Face names (the one-process VLM's, and
older conversions' "hf-qwen2-vl"). Targets: the one-process VLM (Hugging Face names, the whole model) or a
parallel engine's rank (model_names "mindspeed-mm": its share of `engine.vlm_layout` where the engine has
one, else of the split that model.json's pipeline_num_layers give for the run's TP and PP sizes). Every rank
reads, one tensor at a time, only the tensors of its own share (training/checkpoint_vlm.py: whole tensors joined
from the source's shards, then split again through mm_layout); the optimizer state (Adam's moments, fp32 main
params) goes the same way, key by key, for the parameters that have it (frozen ones have none).
"""
from __future__ import annotations

import argparse
from typing import Any, Mapping

from mmrun.backend.errors import UsageError
from mmrun.engines.base import ParallelLayout, ShardState
from mmrun.models.vlm import mm_layout
from mmrun.models.vlm.mm_layout import VLMLayout, stages_given, virtual_chunks
from mmrun.training import checkpoint_vlm
from mmrun.training.checkpoint_layout import CheckpointError
from mmrun.training.checkpoint_store import LoadedCheckpoint

VLM_NAMES = (checkpoint_vlm.MM_NAMES, checkpoint_vlm.HF_NAMES)


# Top-level sections of a VLM model.json (MindSpeed-MM's Qwen2-VL / Qwen2.5-VL / Qwen3-VL files); a Wan
# pretrain_model.json (pretrain_sora.py's --mm-model) has `predictor` instead.
VLM_SECTIONS = ("image_encoder", "text_decoder")


def is_vlm(meta: Mapping[str, Any], args: argparse.Namespace) -> bool:
    """A Qwen2-VL checkpoint, or a run whose --mm-model is a VLM model.json (its data-parallel checkpoints carry
    the engine's generic model_names); another entry's --mm-model (a Wan predictor) is not one."""
    return meta.get("model_names") in VLM_NAMES or is_vlm_model_json(getattr(args, "mm_model", None))


def is_vlm_model_json(path: str | None) -> bool:
    """Whether the json at `path` describes a vision-language model (VLM_SECTIONS); False for none, a file that
    does not read as a JSON object, or another model's json."""
    import json
    from pathlib import Path

    if not path or not Path(path).is_file():
        return False
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(raw, dict) and any(isinstance(raw.get(key), dict) for key in VLM_SECTIONS)


def _model_json(args: argparse.Namespace) -> Any:
    from mmrun.models.vlm.model_json import read_model_json

    if not getattr(args, "mm_model", None):
        raise CheckpointError("a Qwen2-VL or Qwen3-VL checkpoint loads into the VLM entry only (models/pretrain_vlm.py "
                              "with --mm-model model.json); pass the model.json it was trained with")
    return read_model_json(args.mm_model)


def run_layout(args: argparse.Namespace, layout: ParallelLayout) -> VLMLayout:
    """The run's split as its engine builds it: model.json's model and pipeline_num_layers per module (where
    they give one count per stage), else the default split for the run's TP and PP sizes."""
    spec = _model_json(args)
    config = checkpoint_vlm.config_class(spec.hf_config).from_hf_config(spec.hf_config)
    lists = getattr(spec, "pipeline_layers", None) or {}

    def fitting(layers: Any) -> Any:  # model.json's list where it is written for this run's stages and chunks
        return layers if (stages_given(layers) == layout.pp and virtual_chunks(layers) == layout.vpp) else None

    vit, llm = (fitting(lists.get(part)) for part in ("vit", "llm"))
    return VLMLayout.build(config, layout.tp, layout.pp, vit, llm, vpp=layout.vpp)


def reshard(probe: LoadedCheckpoint, args: argparse.Namespace, model_names: str, layout: ParallelLayout,
            vlm_layout: VLMLayout | None = None) -> ShardState:
    """This rank's share of a VLM checkpoint written with another layout or names (module docstring)."""
    target = vlm_layout if vlm_layout is not None else run_layout(args, layout)
    try:
        source = checkpoint_vlm.open_iteration(probe.path.parent, probe.iteration, target.config)
    except UsageError as err:
        raise CheckpointError(str(err)) from None
    if model_names != checkpoint_vlm.MM_NAMES:
        target = None  # the one-process model: Hugging Face names, the whole model

    moe, ep = getattr(source.config.text, "moe", None), getattr(layout, "ep", 1)  # experts split per EP rank

    def share(part: checkpoint_vlm.Source) -> dict:
        if target is None:
            return dict(part.hf_tensors())
        tensors = part.rank_tensors(target, layout.tp_rank, layout.pp_rank)  # every expert, global numbers
        return tensors if moe is None or ep == 1 else mm_layout.keep_expert_rank(tensors, moe.num_experts, ep,
                                                                                  layout.ep_rank)

    model = share(source)
    optimizer = None
    keys = source.optimizer_keys()
    if keys is not None:
        tensors = {f"{name}.{key}": value for key in keys for name, value in share(source.optimizer_state(key)).items()}
        optimizer = {**dict(source.meta.get("optimizer") or {}), "tensors": tensors}
    meta = {k: v for k, v in source.meta.items() if k not in ("rng_state", "optimizer", "checksums")}
    return ShardState(model=model, optimizer=optimizer, meta={**meta, "resharded": True})
