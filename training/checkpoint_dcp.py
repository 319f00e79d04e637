"""--ckpt-format torch_dcp in Megatron's layout: torch.distributed.checkpoint shards plus mmrun's meta.json.

    <save>/latest_checkpointed_iteration.txt     "10", moved only after the directory below is complete
    <save>/iter_0000010/.metadata                DCP's index of every shard (global shapes, offsets)
    <save>/iter_0000010/__<rank>_0.distcp        each rank's shards of model (and optimizer) state
    <save>/iter_0000010/meta.json                iteration, consumed samples, the LR schedule, arguments,
                                                 the world size and sharding it was saved with

DCP writes its own files, so they go into a temporary directory beside the final one (the name
checkpoint_store's recovery removes after a killed save) and the complete directory is swapped in by
`replace_directory`; the tracker moves last. Loading reads what this run's shards need from any saved
world size or sharding_size (DCP reshards by the metadata). Framework-free: the engine's
`save_dcp(dir)` / `load_dcp(dir)` (backend/torch/fsdp2/) do the torch part.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from mmrun.common.atomic_write import atomic_write, fsync_dir, replace_directory, temporary_name
from mmrun.training.checkpoint_layout import TRACKER_FILE, CheckpointError, iteration_dir, read_tracker

DCP_INDEX = ".metadata"
META_FILE = "meta.json"


def is_dcp_dir(path: str | Path) -> bool:
    return (Path(path) / DCP_INDEX).is_file()


def find_dcp(root: str | Path, ckpt_step: int | None = None) -> Path | None:
    """The DCP iteration directory --load names (--ckpt-step, else the tracker's), None if it is not DCP."""
    try:
        iteration = ckpt_step if ckpt_step is not None else read_tracker(root)
    except CheckpointError:
        return None  # a broken tracker: the safetensors path reports it, with what to do (find_checkpoint)
    if iteration is None:
        return None
    path = iteration_dir(root, iteration)
    return path if is_dcp_dir(path) else None


def read_meta(path: str | Path) -> dict[str, Any]:
    try:
        return json.loads((Path(path) / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: no readable {META_FILE} ({err}); it was not saved by mmrun's trainer") from None


def save(args: argparse.Namespace, progress: Any, engine: Any, scheduler: Any, log: Any = print) -> Path:
    """Every rank takes part (DCP's save is collective); rank 0 prepares, finishes and swaps."""
    from mmrun import backend
    from mmrun.training.checkpoint_store import _usual_permissions, recover_interrupted_saves
    from mmrun.training.checkpointing import args_to_json, timestamp

    dist = backend.distributed
    rank = dist.get_rank()
    root = Path(args.save)
    final = iteration_dir(root, progress.iteration)
    log(f"saving checkpoint at iteration {progress.iteration:7d} to {args.save} in torch_dcp format")
    start = time.time()
    tmp = None
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        recover_interrupted_saves(root, log)
        tmp = tempfile.mkdtemp(prefix=temporary_name(final), dir=root)
    tmp = dist.all_gather_object(tmp)[0]
    try:
        engine.save_dcp(tmp, with_optimizer=not args.no_save_optim)
        dist.barrier()
        if rank == 0:
            meta = {"iteration": progress.iteration, "consumed_train_samples": progress.consumed_train_samples,
                    "consumed_valid_samples": progress.consumed_valid_samples, "ckpt_format": "torch_dcp",
                    "opt_param_scheduler": scheduler.state_dict(), "framework": backend.framework(),
                    "framework_version": backend.load().version(), "world_size": dist.get_world_size(),
                    "engine": engine.name, "model_names": engine.model_names,
                    "fsdp2": getattr(engine.config, "summary", lambda w: None)(dist.get_world_size())
                    if getattr(engine, "config", None) else None,
                    "optimizer": not args.no_save_optim, "args": args_to_json(args), "saved_at": timestamp()}
            hf = getattr(engine, "hf_config", lambda: None)()
            if hf is not None:
                meta["hf_config"] = hf  # what a Hugging Face directory's config.json needs (convert-checkpoint)
            atomic_write(Path(tmp) / META_FILE, json.dumps(meta, indent=1, sort_keys=True) + "\n")
            _usual_permissions(Path(tmp))  # mkdtemp made it 0700
            fsync_dir(tmp)
            replace_directory(tmp, final)
            tmp = None
            atomic_write(root / TRACKER_FILE, f"{progress.iteration}\n")
        dist.barrier()
    finally:
        if rank == 0 and tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"  successfully saved checkpoint from iteration {progress.iteration:7d} to {args.save} "
        f"(torch_dcp, {dist.get_world_size()} rank(s)) ({time.time() - start:.2f} s)")
    return final


def load(args: argparse.Namespace, path: Path, engine: Any, scheduler: Any, log: Any = print) -> Any:
    """Resume from a DCP iteration directory: weights (and optimizer unless --no-load-optim/--finetune),
    then the schedule and progress from meta.json."""
    from mmrun import backend
    from mmrun.training.checkpointing import TrainingProgress

    if not hasattr(engine, "load_dcp"):
        raise CheckpointError(f"{path} is a torch_dcp checkpoint, which the {engine.name} engine cannot read; "
                              "convert it with `python -m mmrun.checkpoint.dcp --to safetensors`, or add --use-torch-fsdp2")
    meta = read_meta(path)
    load_optim = not (args.finetune or args.no_load_optim)
    if load_optim and not meta.get("optimizer", True):
        raise CheckpointError(f"{path} has no optimizer state (saved with --no-save-optim); pass --no-load-optim "
                              "(or --finetune) to start the optimizer afresh")
    log(f" loading checkpoint from {args.load} at iteration {meta['iteration']} (torch_dcp, saved by "
        f"{meta.get('world_size')} rank(s){', ' + meta['fsdp2'] if meta.get('fsdp2') else ''})")
    engine.load_dcp(str(path), with_optimizer=load_optim)
    if args.finetune:
        return TrainingProgress()
    saved = meta.get("opt_param_scheduler")
    if saved:
        for key, value in saved.items():
            if args.override_opt_param_scheduler and key != "num_steps":
                continue
            setattr(scheduler, key, value)
    log(f"  successfully loaded checkpoint from {args.load} on {backend.distributed.get_world_size()} rank(s) "
        f"at iteration {meta['iteration']}")
    return TrainingProgress(iteration=int(meta["iteration"]),
                            consumed_train_samples=int(meta.get("consumed_train_samples", 0)),
                            consumed_valid_samples=int(meta.get("consumed_valid_samples", 0)))
