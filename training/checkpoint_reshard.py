"""Loading a checkpoint into another parallel layout or the other engine: join its shards, split again.

A checkpoint names its layout in every rank directory's meta.json (`model_names`: "mmrun-gpt" or
"megatron-core"; `parallel`: tp, pp, vpp). When the run differs (TP=2 x PP=2 resumed with TP=1, a
megatron-core checkpoint resumed by mmrun's GPT, or the other way round), every rank reads all rank
directories of the iteration (each verified by its checksums), joins them into the whole model with
models/gpt_names.py, and takes its own share; the optimizer state, named after the parameters, goes
the same way. Memory: the whole model (and its optimizer state) on every rank, once, at load.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from mmrun.models.gpt_names import ConversionError, GPTShape, Layout, join, mcore_to_mmrun, mmrun_to_mcore, shard
from mmrun.training.checkpoint_layout import CheckpointError, rank_dir_name
from mmrun.training.checkpoint_store import LoadedCheckpoint, read_sibling
from mmrun.engines.base import ParallelLayout, ShardState


def saved_layout(meta: Mapping[str, Any]) -> tuple[str, Layout]:
    """(model names, tensor/pipeline/virtual layout) a checkpoint was written with (mmrun's GPT, one
    shard, for checkpoints older than this field)."""
    parallel = meta.get("parallel") or {}
    return (meta.get("model_names", "mmrun-gpt"),
            Layout(int(parallel.get("tp", 1)), int(parallel.get("pp", 1)), int(parallel.get("vpp", 1))))


def describe(meta: Mapping[str, Any]) -> str:
    names, layout = saved_layout(meta)
    ep = (meta.get("parallel") or {}).get("ep", 1)
    return (f"{names}, tensor-parallel {layout.tp}, pipeline-parallel {layout.pp}, virtual stages {layout.vpp}"
            + (f", expert-parallel {ep}" if ep > 1 else ""))


def needs_reshard(meta: Mapping[str, Any], model_names: str, layout: ParallelLayout) -> bool:
    names, saved = saved_layout(meta)
    # Experts split over EP ranks (mmrun convert's split, MindSpore's parallel engine) load as they are into a run
    # of the same EP with per-EP-rank directories (its layout has `ep`); else joined into global numbers on load.
    saved_ep = (meta.get("parallel") or {}).get("ep", 1)
    other_experts = saved_ep > 1 and saved_ep != getattr(layout, "ep", 1)
    return names != model_names or saved != Layout(layout.tp, layout.pp, layout.vpp) or other_experts


def shape_of(args: Mapping[str, Any] | argparse.Namespace) -> GPTShape:
    """The GPT's shape from training arguments (a Namespace, or the `args` a checkpoint's meta.json keeps)."""
    get = args.get if isinstance(args, Mapping) else (lambda key, default=None: getattr(args, key, default))
    try:
        return GPTShape(int(get("num_layers")), int(get("hidden_size")), int(get("num_attention_heads")),
                        tied=not get("untie_embeddings_and_output_weights", False))
    except (TypeError, ValueError):
        raise CheckpointError("the checkpoint's meta.json does not record the model sizes (num_layers, hidden_size, "
                              "num_attention_heads) under args; it was not written by mmrun's trainer") from None


@dataclass
class WholeCheckpoint:
    """A checkpoint joined into the whole model: megatron-core names, TP = PP = 1."""

    model: dict[str, np.ndarray]
    optimizer: dict[str, Any] | None  # {"step", "lr", "tensors": whole tensors}; None when any shard lacks it
    meta: dict[str, Any]  # rank (0, 0)'s meta.json


def read_whole(probe: LoadedCheckpoint, shape: GPTShape) -> WholeCheckpoint:
    """Every rank directory of `probe`'s iteration, verified and joined (module docstring)."""
    names, saved = saved_layout(probe.meta)
    shards: dict[tuple[int, int], LoadedCheckpoint] = {}
    for t, p in (saved.ranks() if names == "megatron-core" else [(0, 0)]):
        shards[(t, p)] = read_sibling(probe, rank_dir_name(t, p, saved.pp))
    try:
        model = _full({r: c.model for r, c in shards.items()}, names, shape, saved)
        optimizer = None
        if all(c.optimizer is not None for c in shards.values()):
            first = shards[(0, 0)].optimizer
            optimizer = {**{k: v for k, v in first.items() if k != "tensors"},
                         "tensors": _full({r: c.optimizer["tensors"] for r, c in shards.items()}, names, shape, saved)}
    except (ConversionError, KeyError) as err:
        raise CheckpointError(f"{probe.path.parent} ({describe(probe.meta)}) cannot be joined: {err}; pass the "
                              "model sizes it was saved with") from None
    return WholeCheckpoint(model, optimizer, dict(shards[(0, 0)].meta))


def _full(parts: Mapping[tuple[int, int], Mapping[str, np.ndarray]], names: str, shape: GPTShape,
          layout: Layout) -> dict[str, np.ndarray]:
    if names == "mmrun-gpt":
        return mmrun_to_mcore(parts[(0, 0)], shape)
    return join(parts, shape, layout)


def for_rank(whole: Mapping[str, np.ndarray], model_names: str, shape: GPTShape, layout: Layout, tp_rank: int,
             pp_rank: int) -> dict[str, np.ndarray]:
    """The whole model's tensors as one rank of `layout` names them (mmrun's GPT: the one shard)."""
    try:
        if model_names == "mmrun-gpt":
            return mcore_to_mmrun(whole, shape)
        return shard(whole, shape, layout, tp_rank, pp_rank)
    except (ConversionError, KeyError) as err:
        raise CheckpointError(f"the checkpoint cannot be split for {model_names} ({layout}): {err}") from None


def reshard(probe: LoadedCheckpoint, root: Path, args: argparse.Namespace, model_names: str,
            layout: ParallelLayout, vlm_layout: Any = None) -> ShardState:
    """This rank's share of a checkpoint written with another layout or model names (module docstring); a
    Qwen2-VL checkpoint or run goes through checkpoint_reshard_vlm.py (`vlm_layout`: the engine's VLMLayout)."""
    from mmrun.training import checkpoint_reshard_vlm

    if checkpoint_reshard_vlm.is_vlm(probe.meta, args):
        return checkpoint_reshard_vlm.reshard(probe, args, model_names, layout, vlm_layout)
    shape = shape_of(args)
    whole = read_whole(probe, shape)
    target = Layout(layout.tp, layout.pp, layout.vpp)
    model = for_rank(whole.model, model_names, shape, target, layout.tp_rank, layout.pp_rank)
    optimizer = None
    if whole.optimizer is not None:
        optimizer = {**whole.optimizer, "tensors": for_rank(whole.optimizer["tensors"], model_names, shape, target,
                                                            layout.tp_rank, layout.pp_rank)}
    meta = {k: v for k, v in whole.meta.items() if k != "rng_state"}
    return ShardState(model=model, optimizer=optimizer, meta={**meta, "resharded": True})
