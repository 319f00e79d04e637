"""Megatron's checkpoint layout with framework-neutral files, written atomically, loaded all or nothing.

    <save>/latest_checkpointed_iteration.txt     "10": the newest COMPLETE checkpoint
    <save>/iter_0000010/mp_rank_00/              mmrun's engine (data parallelism): one model shard
    <save>/iter_0000010/mp_rank_01_001/          megatron-core's engine: one per (tensor, pipeline) rank
        model.safetensors        parameters by the engine's names: mmrun's GPT (wte.weight, h.0.attn.c_attn.bias,
                                 ...) or megatron-core GPTModel's own state_dict() names for that rank
                                 (embedding.word_embeddings.weight, decoder.layers.0.self_attention.linear_qkv
                                 .weight, ...; `model<v>.` before them for virtual pipeline stages)
        optimizer.safetensors    AdamW moments, <param>.exp_avg / <param>.exp_avg_sq, and for a --fp16/--bf16
                                 run the fp32 main params <param>.main_param (unless --no-save-optim); whole
                                 tensors per parameter, also when the distributed optimizer sharded them
        meta.json                iteration, consumed samples, scheduler, loss scaler, optimizer step, the RNG
                                 states of the ranks sharing this shard, the arguments, framework and versions,
                                 engine, model names and parallel layout, checksums of the tensors

One rank per model shard writes it (the first of its data/context-parallel group); the iteration directory
appears, and the tracker moves, only when every writer succeeded.

Precision moves with the checkpoint: the main params, when saved, are the exact weights, so an fp16 run
resumed in fp32 (or bf16, or on the other framework) starts from them, not from the rounded model copy.

Megatron writes `model_optim_rng.pt` (pickle) in the same place; mmrun never pickles, so PyTorch and
MindSpore read each other's checkpoints (backend/checkpoint_io.py writes the files).

The file layer is checkpoint_store.py (the save sequence, verified reads, recovery after a killed save)
over checkpoint_layout.py (Megatron's names on disk); checkpoint_reshard.py loads a checkpoint into
another tensor/pipeline layout or the other engine; this module is Megatron's save_checkpoint and
load_checkpoint around them. A process killed at any point of a save leaves the tracker naming a
complete checkpoint.

--load finds its checkpoint in this order: --ckpt-step; the tracker; with no tracker file, the newest
checkpoint that verifies (one WARNING line says which); with no checkpoint at all, a fresh start
(Megatron's warning). A tracker that exists but cannot be read stops the run with one line.

Loading checks everything before changing anything, on every rank: tensor names and shapes against the
model and the optimizer, checksums against the files, the schedule against the arguments. A mismatch on
any rank raises the same CheckpointError on all of them, naming the first problems; no model is ever
partially loaded.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from mmrun.training.checkpoint_layout import (RANK_DIR, TRACKER_FILE, CheckpointError, checkpoint_dir,  # noqa: F401
                                              iteration_dir, rank_dir_name, read_tracker, saved_iterations)
from mmrun.training.checkpoint_store import (KILL_DURING_SAVE_VAR, SAVE_STEPS, CheckpointSaveError,  # noqa: F401
                                             LoadedCheckpoint, RankFiles, check_save_dir, find_checkpoint,
                                             read_checkpoint, read_sibling, recover_interrupted_saves,
                                             write_checkpoint, write_checkpoint_shards)
from mmrun.engines.base import ShardState

CHECKPOINT_VERSION = 3.0  # Megatron's checkpoint_version, recorded for tools that look for it


@dataclass
class TrainingProgress:
    """Where a run stands: what Megatron stores beside the weights."""

    iteration: int = 0
    consumed_train_samples: int = 0
    consumed_valid_samples: int = 0


# --------------------------------------------------------------------------------- state to save

def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def args_to_json(args: argparse.Namespace) -> dict[str, Any]:
    return {k: _jsonable(v) for k, v in sorted(vars(args).items())}


def host_rng_state() -> dict[str, Any]:
    """Python's and numpy's global RNG states as JSON (framework RNGs come from the backend)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(internal), gauss],
            "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]}


def set_host_rng_state(state: Mapping[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


# ------------------------------------------------------------------------------------- loading

def _shape_problems(saved: Mapping[str, np.ndarray], expected: Mapping[str, tuple[int, ...]],
                    optional: Mapping[str, tuple[int, ...]] | None = None) -> list[str]:
    """`optional` tensors may be absent, and are shape-checked when present."""
    missing = [k for k in expected if k not in saved]
    expected = {**expected, **(optional or {})}
    unexpected = [k for k in saved if k not in expected]
    mismatched = [f"{k} (checkpoint {tuple(saved[k].shape)}, model {tuple(expected[k])})"
                  for k in expected if k in saved and tuple(saved[k].shape) != tuple(expected[k])]
    problems = []
    for label, keys in (("shape mismatch", mismatched), ("missing in checkpoint", missing),
                        ("not in model", unexpected)):
        if keys:
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            problems.append(f"{label}: {', '.join(keys[:3])}{more}")
    return problems


def check_model_fits(ckpt: LoadedCheckpoint, expected_shapes: Mapping[str, tuple[int, ...]]) -> None:
    problems = _shape_problems(ckpt.model, expected_shapes)
    if problems:
        saved_args = ckpt.meta.get("args", {})
        sizes = ", ".join(f"--{k.replace('_', '-')} {saved_args[k]}" for k in
                          ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                           "max_position_embeddings") if saved_args.get(k) is not None)
        hint = f"it was saved with {sizes}; pass the same model sizes" if sizes else "pass the same model sizes"
        raise CheckpointError(f"checkpoint {ckpt.path} does not fit this model ({'; '.join(problems)}); {hint}")


def check_optimizer_fits(ckpt: LoadedCheckpoint, expected_shapes: Mapping[str, tuple[int, ...]],
                         optional: Mapping[str, tuple[int, ...]] | None = None) -> None:
    if ckpt.optimizer is None:
        return
    problems = _shape_problems(ckpt.optimizer["tensors"], expected_shapes, optional)
    if problems:
        raise CheckpointError(f"optimizer state in {ckpt.path} does not fit this model ({'; '.join(problems)}); "
                              "pass --no-load-optim to start the optimizer afresh")


def timestamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


# ------------------------------------------------------------------ the training loop's two calls

def _rng_slot(layout: Any) -> int:
    """This rank's index among the ranks sharing its model shard (data x context parallel), which is
    the global rank with data parallelism only."""
    return layout.dp_rank * layout.cp + layout.cp_rank


def _rng_states(save_rng: bool, engine: Any) -> list[Any] | None:
    """The RNG states of the ranks sharing this rank's model shard, in _rng_slot order (JSON): Python,
    numpy, the framework's when the backend can export it, and the engine's own streams."""
    from mmrun import backend

    layout = engine.layout
    state: dict[str, Any] = host_rng_state()
    getter = getattr(backend.seeding, "get_rng_state", None)
    if save_rng and getter is not None:
        state["framework"] = {"name": backend.framework(), "state": getter()}
    engine_state = engine.rng_state() if save_rng else None
    if engine_state is not None:
        state["engine"] = {"name": engine.name, "state": engine_state}
    gathered = backend.distributed.all_gather_object([layout.tp_rank, layout.pp_rank, _rng_slot(layout), state])
    if not save_rng:
        return None
    mine = sorted((slot, st) for tp, pp, slot, st in gathered if (tp, pp) == (layout.tp_rank, layout.pp_rank))
    return [st for _, st in mine]


def _restore_rng(states: list[Any] | None, slot: int, engine: Any) -> str | None:
    """Restore this rank's RNG state; returns a notice when part of it cannot be restored."""
    from mmrun import backend

    if not states:
        return "the checkpoint has no RNG state (saved with --no-save-rng); RNGs keep their seeded state"
    if slot >= len(states):
        return (f"the checkpoint holds RNG states for {len(states)} ranks, this is rank {slot} of its model shard; "
                "its RNGs keep their seeded state")
    state = states[slot]
    set_host_rng_state(state)
    saved_engine = state.get("engine")
    if saved_engine is not None and saved_engine.get("name") == engine.name:
        engine.set_rng_state(saved_engine["state"])
    saved = state.get("framework")
    setter = getattr(backend.seeding, "set_rng_state", None)
    if saved is None or setter is None:
        return "the framework RNG state was not saved or cannot be restored here; dropout masks after resume differ"
    if saved["name"] != backend.framework():
        # Dropout's counter generator has one format and one hash on both frameworks; nothing else carries over.
        if "dropout" not in saved["state"]:
            return (f"the framework RNG state was saved by {saved['name']}, this run is {backend.framework()}, "
                    "and holds no dropout state; dropout masks after resume differ (weights, optimizer and data "
                    "order resume exactly)")
        setter({"dropout": saved["state"]["dropout"]})
        return None
    setter(saved["state"])
    return None


def save_checkpoint(args: argparse.Namespace, progress: TrainingProgress, engine: Any, scheduler: Any,
                    log: Any = print) -> Path | None:
    """Megatron's save_checkpoint: every rank takes part; one rank per (tensor, pipeline) model shard writes
    its rank directory (`engine.checkpoint_state()`), the iteration directory appears and the tracker
    moves only when all of them succeeded (checkpoint_store.write_checkpoint_shards)."""
    from mmrun import backend

    if getattr(args, "ckpt_format", None) == "torch_dcp" and hasattr(engine, "save_dcp"):
        from mmrun.training import checkpoint_dcp  # sharded, torch.distributed.checkpoint's own files

        return checkpoint_dcp.save(args, progress, engine, scheduler, log)
    dist = backend.distributed
    layout = engine.layout
    rng = _rng_states(not args.no_save_rng, engine)
    shard = engine.checkpoint_state()
    files = []
    if shard is not None:
        meta = {
            "iteration": progress.iteration,
            "consumed_train_samples": progress.consumed_train_samples,
            "consumed_valid_samples": progress.consumed_valid_samples,
            "checkpoint_version": CHECKPOINT_VERSION,
            "opt_param_scheduler": scheduler.state_dict(),
            "rng_state": rng,
            "framework": backend.framework(),
            "framework_version": backend.load().version(),
            "world_size": dist.get_world_size(),
            "engine": engine.name,
            "model_names": engine.model_names,
            "parallel": {**layout.to_json(), "tp_rank": layout.tp_rank, "pp_rank": layout.pp_rank},
            "args": args_to_json(args),
            "saved_at": timestamp(),
            **shard.meta,
        }
        files = [RankFiles(layout.rank_dir, shard.model, None if args.no_save_optim else shard.optimizer, meta)]
    log(f"saving checkpoint at iteration {progress.iteration:7d} to {args.save} in safetensors format")
    start = time.time()
    written = write_checkpoint_shards(args.save, progress.iteration, files, rank=dist.get_rank(),
                                      gather=dist.all_gather_object, log=log)
    log(f"  successfully saved checkpoint from iteration {progress.iteration:7d} to {args.save} "
        f"[ t {layout.tp_rank + 1}/{layout.tp}, p {layout.pp_rank + 1}/{layout.pp} ] ({time.time() - start:.2f} s)")
    return written


def _agree(error: str | None) -> None:
    """Every rank learns whether any rank failed, and all raise the first failure (nothing is applied)."""
    from mmrun import backend

    failures = [e for e in backend.distributed.all_gather_object(error) if e]
    if failures:
        raise CheckpointError(failures[0])


def _find(args: argparse.Namespace, root: Path, log: Any) -> LoadedCheckpoint | None:
    from mmrun import backend

    dist = backend.distributed
    if dist.get_rank() == 0 and root.is_dir():
        try:
            recover_interrupted_saves(root, log)
        except OSError:
            pass  # a read-only --load: read what is there; a missing iteration is named by find_checkpoint
    dist.barrier()
    error, ckpt = None, None
    try:
        ckpt = find_checkpoint(root, args.ckpt_step, log)
    except CheckpointError as err:
        error = str(err)
    _agree(error)
    found = dist.all_gather_object(None if ckpt is None else ckpt.iteration)
    if len(set(found)) > 1:
        raise CheckpointError(f"the ranks found different checkpoints in {root} (iterations {sorted(set(map(str, found)))}); "
                              "pass --ckpt-step N to name one")
    return ckpt


def _shard_for_this_rank(args: argparse.Namespace, root: Path, probe: LoadedCheckpoint, engine: Any,
                         log: Any) -> tuple[ShardState, LoadedCheckpoint]:
    """This rank's tensors from the checkpoint: its own rank directory when the layout and names match the
    run, else the whole model joined from every rank directory and re-split for this rank."""
    from mmrun.training import checkpoint_reshard

    layout = engine.layout
    if not checkpoint_reshard.needs_reshard(probe.meta, engine.model_names, layout):
        ckpt = read_sibling(probe, layout.rank_dir)
        # the same sizes but other layers per pipeline stage (Qwen2-VL's pipeline_num_layers): re-split too
        if engine.model_names != "mindspeed-mm" or set(ckpt.model) == set(engine.expected_shapes()[0]):
            return ShardState(ckpt.model, ckpt.optimizer, ckpt.meta), ckpt
    if layout.tp_rank == 0 and layout.pp_rank == 0 and layout.writes_checkpoint:
        log(f"  the checkpoint's layout ({checkpoint_reshard.describe(probe.meta)}) differs from this run's "
            f"({engine.model_names}, {layout.describe()}): joining its shards and splitting them again")
    shard = checkpoint_reshard.reshard(probe, root, args, engine.model_names, layout,
                                       getattr(engine, "vlm_layout", None))
    return shard, probe


def load_checkpoint(args: argparse.Namespace, engine: Any, scheduler: Any, log: Any = print) -> TrainingProgress:
    """Megatron's load_checkpoint for --load: the newest complete checkpoint (or --ckpt-step), verified
    in full on every rank before any state is changed. With no checkpoint there: start fresh (a warning),
    or stop under --exit-on-missing-checkpoint. --finetune loads weights only and starts at iteration 0.
    A checkpoint saved with another tensor/pipeline layout, or by the other engine (mmrun's GPT names vs
    megatron-core's), is joined and re-split for this run (checkpoint_reshard.py)."""
    root = Path(args.load)
    from mmrun.training import checkpoint_dcp

    dcp_dir = checkpoint_dcp.find_dcp(root, args.ckpt_step)
    if dcp_dir is not None:  # a torch_dcp checkpoint, whatever --ckpt-format this run saves with
        return checkpoint_dcp.load(args, dcp_dir, engine, scheduler, log)
    ckpt = _find(args, root, log)
    if ckpt is None:
        # Megatron's words, unless the entry's model already holds weights (pretrain_transformers.py's
        # init_from_hf_path): then the run starts from those, and says so.
        start = getattr(args, "initial_weights", None) or "random"
        message = (f"could not find the metadata file {root / TRACKER_FILE}; will not load any checkpoint "
                   f"and will start from {start}")
        if args.exit_on_missing_checkpoint:
            raise CheckpointError(f"--exit-on-missing-checkpoint: no checkpoint to load in {root} "
                                  f"({TRACKER_FILE} is missing). Received: --load {args.load}")
        log(f"WARNING: {message}")
        return TrainingProgress()
    load_optim = not (args.finetune or args.no_load_optim)
    saved_schedule = ckpt.meta.get("opt_param_scheduler")
    schedule_from_ckpt = not args.finetune and saved_schedule is not None
    error, shard = None, None
    try:
        shard, mine = _shard_for_this_rank(args, root, ckpt, engine, log)
        model_shapes, optimizer_shapes, optional = engine.expected_shapes()
        check_model_fits(LoadedCheckpoint(mine.path, mine.iteration, shard.model, shard.optimizer, mine.meta),
                         model_shapes)
        if load_optim:
            if shard.optimizer is None:
                raise CheckpointError(f"{mine.path} has no optimizer state (saved with --no-save-optim); "
                                      "pass --no-load-optim (or --finetune) to start the optimizer afresh")
            check_optimizer_fits(LoadedCheckpoint(mine.path, mine.iteration, shard.model, shard.optimizer, mine.meta),
                                 optimizer_shapes, optional=optional)
        if schedule_from_ckpt and not (args.override_opt_param_scheduler or args.use_checkpoint_opt_param_scheduler):
            differing = [f"{k} (checkpoint {v!r}, arguments {getattr(scheduler, k)!r})"
                         for k, v in saved_schedule.items() if k != "num_steps" and getattr(scheduler, k, v) != v]
            if differing:
                raise CheckpointError(f"the learning-rate schedule differs from the checkpoint's: "
                                      f"{', '.join(differing)}; pass the same schedule arguments, or "
                                      "--override-opt-param-scheduler to use the new ones, or "
                                      "--use-checkpoint-opt-param-scheduler to keep the saved ones")
    except CheckpointError as err:
        error = str(err)
    _agree(error)

    # Everything is verified on every rank: apply.
    log(f" loading checkpoint from {root} at iteration {ckpt.iteration}")
    engine.load_checkpoint_state(shard, load_optim)
    if schedule_from_ckpt:
        if args.override_opt_param_scheduler:
            scheduler.num_steps = saved_schedule["num_steps"]
        else:
            for key, value in saved_schedule.items():
                setattr(scheduler, key, value)
    if args.finetune:
        log(f"  successfully loaded weights from {root} at iteration {ckpt.iteration} (--finetune: "
            "starting at iteration 0)")
        return TrainingProgress()
    if not args.no_load_rng:
        states = shard.meta.get("rng_state")
        moved = shard.meta.get("resharded") or shard.meta.get("converted_from")
        notice = (_restore_rng(states, _rng_slot(engine.layout), engine) if not moved
                  else "the checkpoint was saved with another parallel layout; RNGs keep their seeded state "
                       "(dropout masks after resume differ; weights, optimizer and data order resume exactly)")
        if notice:
            log(f"WARNING: {notice}")
    if ckpt.meta.get("framework") not in (None, backend_framework()):
        log(f"  the checkpoint was saved by {ckpt.meta['framework']}; resuming on {backend_framework()}")
    layout = engine.layout
    log(f"  successfully loaded checkpoint from {root} [ t {layout.tp_rank + 1}/{layout.tp}, p {layout.pp_rank + 1}/"
        f"{layout.pp} ] at iteration {ckpt.iteration}")
    return TrainingProgress(iteration=ckpt.iteration,
                            consumed_train_samples=int(ckpt.meta.get("consumed_train_samples", 0)),
                            consumed_valid_samples=int(ckpt.meta.get("consumed_valid_samples", 0)))


def backend_framework() -> str:
    from mmrun import backend

    return backend.framework()
