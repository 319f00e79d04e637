"""Megatron's pipeline- and context-parallel helpers for an entry's get_batch, framework-free.

Megatron-LM's pretrain_gpt.py reads a batch only on the first and last pipeline stages (the others
receive activations) and keeps this context-parallel rank's share of the sequence:

    def get_batch(data_iterator, vp_stage=None):
        if not is_first_or_last_pipeline_stage(vp_stage):
            return None, None, None, None, None
        batch = get_batch_on_this_cp_rank(next(data_iterator))
        ...
    def forward_step(data_iterator, model):
        tokens, labels, loss_mask, attention_mask, position_ids = get_batch(data_iterator, model_vp_stage(model))

These answer from the running job's parallel layout (set by pretrain()); with data parallelism only,
every rank is the first and last stage and holds the whole sequence.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from mmrun import engines
from mmrun.engines.base import ParallelLayout

_LAYOUT: ParallelLayout = ParallelLayout()


def set_layout(layout: ParallelLayout) -> None:
    global _LAYOUT
    _LAYOUT = layout


def get_layout() -> ParallelLayout:
    """This process's place in the parallel grid (data parallelism only before pretrain() sets it)."""
    return _LAYOUT


def is_pipeline_first_stage(vp_stage: int | None = None) -> bool:
    """The stage holding the embeddings; with `vp_stage`, that virtual stage of this rank."""
    return _LAYOUT.pp_rank == 0 and (vp_stage is None or vp_stage == 0)


def is_pipeline_last_stage(vp_stage: int | None = None) -> bool:
    """The stage computing the loss; with `vp_stage`, that virtual stage of this rank."""
    return _LAYOUT.pp_rank == _LAYOUT.pp - 1 and (vp_stage is None or vp_stage == _LAYOUT.vpp - 1)


def is_first_or_last_pipeline_stage(vp_stage: int | None = None) -> bool:
    """Whether get_batch must read data here (Megatron-LM's helper of the same name)."""
    return _LAYOUT.pp == 1 or is_pipeline_first_stage(vp_stage) or is_pipeline_last_stage(vp_stage)


def model_vp_stage(model: Any) -> int | None:
    """The virtual pipeline stage a (wrapped) model chunk was built for, None without virtual stages
    (megatron-core's get_attr_wrapped_model(model, "vp_stage"))."""
    while model is not None:
        stage = getattr(model, "vp_stage", None)
        if stage is not None:
            return int(stage)
        model = getattr(model, "module", None)
    return None


def get_batch_on_this_cp_rank(batch: Mapping[str, Any]) -> dict[str, Any]:
    """This context-parallel rank's share of a [batch, seq] numpy batch (Megatron's load-balanced split):
    the sequence is cut into 2 x cp chunks and rank r keeps chunks r and 2 x cp - 1 - r, so every rank
    gets as much causal-attention work as the others. An identity with context-parallel size 1."""
    cp, rank = _LAYOUT.cp, _LAYOUT.cp_rank
    if cp == 1:
        return dict(batch)
    out = {}
    for key, value in batch.items():
        if value is None or np.ndim(value) < 2:
            out[key] = value
            continue
        dim = 2 if key == "attention_mask" else 1
        array = np.asarray(value)
        chunks = np.split(array, 2 * cp, axis=dim)
        out[key] = np.concatenate([chunks[rank], chunks[2 * cp - 1 - rank]], axis=dim)
    return out


def core_gpt_model(pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None) -> Any:
    """megatron-core's GPTModel for this stage from the run's arguments, starting from mmrun's GPT weights
    (mmrun.engines.core_gpt_model). For an entry's model_provider under --use-mcore-models."""
    from mmrun.training.global_vars import get_args

    return engines.core_gpt_model(get_args(), pre_process, post_process, vp_stage)


def core_vlm_model(config: Any, pipeline_layers: Mapping[str, Any] | None = None, pre_process: bool = True,
                   post_process: bool = True, vp_stage: int | None = None, read_hf: Callable | None = None,
                   frozen: Mapping[str, bool] | None = None) -> Any:
    """Qwen2-VL's stage on megatron-core from the run's arguments (mmrun.engines.core_vlm_model). For
    models/pretrain_vlm.py's model_provider under the megatron-core engine."""
    from mmrun.training.global_vars import get_args

    return engines.core_vlm_model(get_args(), config, pipeline_layers, pre_process, post_process, vp_stage,
                                  read_hf=read_hf, frozen=frozen)
