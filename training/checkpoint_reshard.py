"""Loading a checkpoint into another parallel layout or the other engine: join its shards, split again.

A checkpoint names its layout in every rank directory's meta.json (`model_names`: "mmrun-gpt" or
"megatron-core"; `parallel`: tp, pp, vpp). When the run differs (TP=2 x PP=2 resumed with TP=1, a
megatron-core checkpoint resumed by mmrun's GPT, or the other way round), every rank reads all rank
directories of the iteration (each verified by its checksums), joins them into the whole model with
models/convert_gpt.py, and takes its own share; the optimizer state, named after the parameters, goes
the same way. Memory: the whole model (and its optimizer state) on every rank, once, at load.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from mmrun.models.convert_gpt import ConversionError, GPTShape, Layout, join, mcore_to_mmrun, mmrun_to_mcore, shard
from mmrun.training.checkpoint_layout import CheckpointError, iteration_dir, rank_dir_name
from mmrun.training.checkpoint_store import LoadedCheckpoint, read_sibling
from mmrun.training.engines.base import ParallelLayout, ShardState


def saved_layout(meta: Mapping[str, Any]) -> tuple[str, Layout]:
    """(model names, tensor/pipeline/virtual layout) a checkpoint was written with (mmrun's GPT, one
    shard, for checkpoints older than this field)."""
    parallel = meta.get("parallel") or {}
    return (meta.get("model_names", "mmrun-gpt"),
            Layout(int(parallel.get("tp", 1)), int(parallel.get("pp", 1)), int(parallel.get("vpp", 1))))


def describe(meta: Mapping[str, Any]) -> str:
    names, layout = saved_layout(meta)
    return f"{names}, tensor-parallel {layout.tp}, pipeline-parallel {layout.pp}, virtual stages {layout.vpp}"


def needs_reshard(meta: Mapping[str, Any], model_names: str, layout: ParallelLayout) -> bool:
    names, saved = saved_layout(meta)
    return names != model_names or saved != Layout(layout.tp, layout.pp, layout.vpp)


def _shape(args: argparse.Namespace) -> GPTShape:
    return GPTShape(args.num_layers, args.hidden_size, args.num_attention_heads,
                    tied=not args.untie_embeddings_and_output_weights)


def _full(parts: Mapping[tuple[int, int], Mapping[str, np.ndarray]], names: str, shape: GPTShape,
          layout: Layout) -> dict[str, np.ndarray]:
    if names == "mmrun-gpt":
        return mmrun_to_mcore(parts[(0, 0)], shape)
    return join(parts, shape, layout)


def _target(full: Mapping[str, np.ndarray], names: str, shape: GPTShape, layout: ParallelLayout) -> dict[str, np.ndarray]:
    if names == "mmrun-gpt":
        return mcore_to_mmrun(full, shape)
    return shard(full, shape, Layout(layout.tp, layout.pp, layout.vpp), layout.tp_rank, layout.pp_rank)


def reshard(probe: LoadedCheckpoint, root: Path, args: argparse.Namespace, model_names: str,
            layout: ParallelLayout) -> ShardState:
    """This rank's share of a checkpoint written with another layout or model names (module docstring)."""
    names, saved = saved_layout(probe.meta)
    shape = _shape(args)
    shards: dict[tuple[int, int], LoadedCheckpoint] = {}
    for t, p in (saved.ranks() if names == "megatron-core" else [(0, 0)]):
        shards[(t, p)] = read_sibling(probe, rank_dir_name(t, p, saved.pp))
    try:
        model = _target(_full({r: c.model for r, c in shards.items()}, names, shape, saved), model_names, shape, layout)
        optimizer = None
        if all(c.optimizer is not None for c in shards.values()):
            tensors = _full({r: c.optimizer["tensors"] for r, c in shards.items()}, names, shape, saved)
            first = shards[(0, 0)].optimizer
            optimizer = {**{k: v for k, v in first.items() if k != "tensors"},
                         "tensors": _target(tensors, model_names, shape, layout)}
    except (ConversionError, KeyError) as err:
        raise CheckpointError(f"{iteration_dir(root, probe.iteration)} ({describe(probe.meta)}) cannot be converted "
                              f"for this run: {err}; pass the model sizes it was saved with") from None
    meta = {k: v for k, v in shards[(0, 0)].meta.items() if k != "rng_state"}
    return ShardState(model=model, optimizer=optimizer, meta={**meta, "resharded": True})
