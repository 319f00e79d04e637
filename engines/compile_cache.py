"""Where a MindSpore job keeps its compiled graphs between runs (--ms-compile-cache ROOT): a directory per job.

MindSpore 2.10 compiles one forward-backward graph of the demo VLM in 15 to 100 s on a 2-core CPU, 100 to 400
steady steps. Its compile cache (MS_COMPILER_CACHE_ENABLE) loads a saved graph in under a second, but it takes
the saved graphs in the order they compiled without comparing what is baked into them: measured here, a rerun
with another --clip-grad printed the old run's losses, one with another --seq-length failed in a Reshape
(docs/multimodal.md). So each job gets its own directory under ROOT, named by a digest of what its graphs depend
on: the arguments (less the ones that only say where to write or how long to run), the content of the files they
name (model.json, data.json), mmrun's own source, the entry script, MindSpore's version, the world size and the
first step's batch shapes. A rerun of the same job finds its graphs; any other job compiles into a new directory.

    directory = job_directory(args, shapes, root)   # ROOT/<24 hex digits>
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

# Argument destinations that change no graph (where to write, how long to run): a rerun that only changes them
# finds the graphs of the run before.
NOT_IN_GRAPHS = frozenset({
    "metrics_file", "save", "load", "train_iters", "log_interval", "save_interval", "eval_interval",
    "exit_interval", "exit_duration_in_mins", "tensorboard_dir", "ms_compile_cache",
    # each rank's own: the job keeps one directory, MindSpore puts each rank's graphs in its rank_N/
    "rank", "local_rank",
})
# mmrun's folders whose code can end up in a compiled graph (the rest is launchers, analysis, docs).
GRAPH_SOURCES = ("backend", "common", "data", "engines", "features", "models", "precision", "training")
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
# Files an argument names are hashed by content up to this size; larger ones (a tokenized corpus) by size and
# modification time, which is what changes when they are rewritten, without reading gigabytes at every start.
CONTENT_LIMIT = 1 << 20


def _file_digest(path: Path) -> str:
    stat = path.stat()
    if stat.st_size > CONTENT_LIMIT:
        return f"{stat.st_size}:{stat.st_mtime_ns}"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sources_digest(folders: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            h.update(str(path.relative_to(PACKAGE_ROOT)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _named_files(values: dict[str, Any]) -> dict[str, str]:
    """name -> digest of each argument value (or list item) that is an existing file."""
    files = {}
    for dest, value in values.items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, str) and item and os.path.isfile(item):
                files[f"{dest}={item}"] = _file_digest(Path(item))
    return files


def job_key(args: argparse.Namespace, shapes: Any, framework_version: str, world_size: int,
            entry: str | None = None) -> dict[str, Any]:
    """What the job's graphs depend on, as JSON-able data (job_directory hashes it)."""
    values = {k: v for k, v in sorted(vars(args).items()) if k not in NOT_IN_GRAPHS}
    entry = entry if entry is not None else sys.argv[0]
    return {
        "arguments": json.loads(json.dumps(values, default=repr)),
        "files": _named_files(values),
        "sources": _sources_digest(PACKAGE_ROOT / name for name in GRAPH_SOURCES),
        "entry": _file_digest(Path(entry)) if entry and os.path.isfile(entry) else entry,
        "framework": framework_version,
        "world_size": world_size,
        "shapes": json.loads(json.dumps(shapes, default=repr)),
    }


def job_directory(args: argparse.Namespace, shapes: Any, root: str, framework_version: str, world_size: int,
                  entry: str | None = None) -> str:
    """ROOT/<digest of job_key>: the job's own compile-cache directory."""
    key = json.dumps(job_key(args, shapes, framework_version, world_size, entry), sort_keys=True)
    return os.path.join(os.path.abspath(root), hashlib.sha256(key.encode()).hexdigest()[:24])


def has_graphs(directory: str) -> bool:
    """Whether an earlier run left compiled graphs there (MindSpore writes rank_N/graph_cache/*.mindir)."""
    return any(Path(directory).glob("rank_*/graph_cache/*.mindir"))


def open_for_job(args: argparse.Namespace, micro_batches: Sequence[Sequence[Any]], log: Callable[[str], None]) -> None:
    """--ms-compile-cache ROOT: MindSpore saves this job's graphs in job_directory and a rerun of the same job
    loads them instead of compiling; said once. Call it after the first step's batches are read and before
    that step (the first compile), on every rank (each keeps its graphs in rank_N/)."""
    from mmrun import backend

    info = backend.current()
    shapes = [[list(t.shape) if hasattr(t, "shape") else None for t in batch] for batch in micro_batches]
    directory = job_directory(args, shapes, args.ms_compile_cache, info.version, info.world_size)
    found = has_graphs(directory)
    if backend.device.compile_cache(directory) is None:
        log("> MindSpore compile cache: MS_COMPILER_CACHE_* set by the user, --ms-compile-cache left out")
        return
    log(f"> MindSpore compile cache: {directory} ("
        f"{'graphs of an earlier run of this job: loading them' if found else 'empty: saving the graphs'})")
