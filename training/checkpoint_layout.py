"""Megatron's names on disk for a checkpoint directory, and reading its tracker.

    <root>/latest_checkpointed_iteration.txt     "10" (or "release"): the newest COMPLETE checkpoint
    <root>/iter_0000010/mp_rank_00/              one directory per (tensor, pipeline) model-parallel rank:
    <root>/iter_0000010/mp_rank_01_002/          mp_rank_<tp:02d> without pipeline parallelism,
                                                 mp_rank_<tp:02d>_<pp:03d> with it (Megatron's get_checkpoint_name)
    <root>/release/mp_rank_00/                   a release checkpoint (weights for --finetune)

mmrun's own engine saves one `mp_rank_00`; the megatron-core engine one file set per (tensor, pipeline)
rank, named by `rank_dir_name`.
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from mmrun.engines.base import rank_dir_name  # one definition, below the engines that name their shards

TRACKER_FILE = "latest_checkpointed_iteration.txt"
RELEASE = "release"
# Megatron formats the iteration with {:07d}, which grows past 7 digits after iteration 9,999,999.
_ITERATION_NAME = re.compile(r"iter_(\d{7,})")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be loaded into this run, or saved (one line: what, where, what to do)."""

    exit_code = 2




RANK_DIR = rank_dir_name()  # data parallelism (mmrun's engine): one model shard


def iteration_dir(root: str | os.PathLike, iteration: int | str) -> Path:
    """`<root>/iter_0000010` (Megatron's 7-digit name), or `<root>/release` for a release checkpoint."""
    name = RELEASE if iteration == RELEASE else f"iter_{int(iteration):07d}"
    return Path(root) / name


def checkpoint_dir(root: str | os.PathLike, iteration: int | str, rank_dir: str = RANK_DIR) -> Path:
    return iteration_dir(root, iteration) / rank_dir


def iteration_of(name: str) -> int | str | None:
    """The iteration an `iter_XXXXXXX` (or `release`) directory name stands for; None for any other name."""
    if name == RELEASE:
        return RELEASE
    match = _ITERATION_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def saved_iterations(root: str | os.PathLike) -> list[int | str]:
    """The iterations that have a directory under `root`, newest first (`release` last); not verified."""
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [it for name in names if (it := iteration_of(name)) is not None and (Path(root) / name).is_dir()]
    return sorted((it for it in found if it != RELEASE), reverse=True) + [it for it in found if it == RELEASE]


def tracker_problem(root: str | os.PathLike) -> str | None:
    """Why `<root>/latest_checkpointed_iteration.txt` cannot be used as the tracker, or None when it can
    (or when there is none at all)."""
    path = Path(root) / TRACKER_FILE
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"{path} is a broken symbolic link" if os.path.islink(path) else None
    if stat.S_ISDIR(mode):
        return f"{path} is a directory, not the tracker file"
    if not stat.S_ISREG(mode):
        return f"{path} is not a regular file"
    return None


def read_tracker(root: str | os.PathLike) -> int | str | None:
    """The iteration in `<root>/latest_checkpointed_iteration.txt` ("release" or an int), None if there is
    no tracker. A tracker that is there but unreadable raises CheckpointError (one line)."""
    path = Path(root) / TRACKER_FILE
    problem = tracker_problem(root)
    if problem:
        raise CheckpointError(problem)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read ({err.strerror})") from None
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CheckpointError(f"{path} is not text (not UTF-8). Received: {data[:40]!r}") from None
    if text == RELEASE:
        return RELEASE
    try:
        value = int(text)
    except ValueError:
        raise CheckpointError(f"{path} must hold an iteration number or 'release'. Received: {text[:40]!r}") from None
    if value < 0:
        raise CheckpointError(f"{path} holds a negative iteration. Received: {value}")
    return value
