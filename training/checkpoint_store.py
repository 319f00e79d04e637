"""The file layer of Megatron-style checkpoints (numpy state, no framework): save, verify, find, recover.

Saving iteration N into `<root>` is this sequence; `MMRUN_TEST_KILL_DURING_SAVE=N:STEP` SIGKILLs the
process at STEP (the fault-injection tests do it at every step, and at every file operation between):

    begin     leftovers of interrupted saves handled (see recover_interrupted_saves); nothing written yet
    model     model.safetensors written inside a temporary directory; optimizer state and meta.json not yet
    files     every file written and fsynced, still under checkpoint_io's own temporary name
    written   the complete copy fsynced as `<root>/.iter_000000N.mmrun-tmp-<pid>-<random>` (the default)
    swapped   the copy is `<root>/iter_000000N`: put there by one rename, or for a re-save of an existing
              iteration exchanged with the old copy in one step (replace_directory), the old copy removed
    tracker   `latest_checkpointed_iteration.txt` names N (replaced atomically): the save is complete

A crash at any point leaves the tracker naming a complete checkpoint. Without an atomic exchange
(file systems without Linux's RENAME_EXCHANGE) replace_directory moves the old copy aside before the
new one goes in; a crash between the two renames leaves `iter_000000N` missing and two complete copies
under temporary names. The next save or load puts one back (the newest that verifies) before any
leftover is removed, so the cleanup never deletes the only complete copy.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from mmrun.backend import checkpoint_io
from mmrun.common.atomic_write import (TEMP_MARK, atomic_write, fsync_dir, remove_stale_temporaries,
                                       replace_directory, temporary_name)
from mmrun.training.checkpoint_layout import (RANK_DIR, TRACKER_FILE, CheckpointError, checkpoint_dir,
                                              iteration_dir, iteration_of, read_tracker, saved_iterations,
                                              tracker_problem)

MEGATRON_TORCH_FILE = "model_optim_rng.pt"
# Test hook: SIGKILL this process at one step of saving one iteration: "10" (step "written") or "10:model".
KILL_DURING_SAVE_VAR = "MMRUN_TEST_KILL_DURING_SAVE"
SAVE_STEPS = ("begin", "model", "files", "written", "swapped", "tracker")
DEFAULT_KILL_STEP = "written"

# errno of a failed save -> (exit code, what to do). A path the user can fix is a usage error (2);
# a full disk or an I/O error is a runtime error (1).
SAVE_ERRORS: dict[int, tuple[int, str]] = {
    errno.EACCES: (2, "make it writable or pass another --save"),
    errno.EPERM: (2, "make it writable or pass another --save"),
    errno.EROFS: (2, "pass a --save on a writable file system"),
    errno.ENOTDIR: (2, "a file is in the way: pass another --save"),
    errno.EEXIST: (2, "a file is in the way: pass another --save"),
    errno.EISDIR: (2, f"a directory is in the way: remove it (e.g. a directory named {TRACKER_FILE})"),
    errno.ENOSPC: (1, "free space on that file system or pass another --save"),
    errno.EDQUOT: (1, "free quota on that file system or pass another --save"),
    errno.EFBIG: (1, "raise the file size limit (ulimit -f) or pass another --save"),
}
DEFAULT_SAVE_ERROR = (1, "fix the file system or pass another --save")


class CheckpointSaveError(CheckpointError):
    """A checkpoint could not be written (one line); the previous checkpoint is untouched."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class LoadedCheckpoint:
    path: Path
    iteration: int
    model: dict[str, np.ndarray]
    optimizer: dict[str, Any] | None
    meta: dict[str, Any]


# ---------------------------------------------------------------------------------------- saving

def tensor_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over names, dtypes, shapes and bytes, in name order: detects any changed byte on load. A lazy
    Mapping (one tensor read per lookup) keeps one tensor in memory at a time."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.data)  # a memoryview: no copy
    return h.hexdigest()


def kill_step(iteration: int | str) -> Callable[[str], None]:
    """The save sequence's step hook for this iteration: SIGKILLs the process at the step that
    MMRUN_TEST_KILL_DURING_SAVE names, does nothing otherwise."""
    wanted = os.environ.get(KILL_DURING_SAVE_VAR)
    if not wanted:
        return lambda step: None
    it_text, _, at = wanted.partition(":")
    at = at or DEFAULT_KILL_STEP
    if at not in SAVE_STEPS:
        raise ValueError(f"{KILL_DURING_SAVE_VAR}={wanted}: the step must be one of {', '.join(SAVE_STEPS)}")
    if it_text != str(iteration):
        return lambda step: None

    def kill(step: str) -> None:
        if step == at:
            print(f"{KILL_DURING_SAVE_VAR}={wanted}: killing this process (SIGKILL) at step {step!r} of the save",
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    return kill


def _usual_permissions(path: Path) -> None:
    """mkdtemp/mkstemp create 0700/0600 entries; a checkpoint is shared like any output (umask applies)."""
    umask = os.umask(0)
    os.umask(umask)
    for dirpath, _, filenames in os.walk(path):
        os.chmod(dirpath, 0o777 & ~umask)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o666 & ~umask)


def _save_error(err: OSError, root: Path, iteration: int | str) -> CheckpointSaveError:
    code, hint = SAVE_ERRORS.get(err.errno, DEFAULT_SAVE_ERROR)
    name = Path(str(err.filename)).name if err.filename else ""
    where = f" ({name})" if name and TEMP_MARK not in name else ""  # the root is named; temporaries mean nothing
    try:
        previous = read_tracker(root)
    except CheckpointError:
        previous = None
    kept = (f"the tracker still names iteration {previous}" if previous not in (None, iteration)
            else "no earlier checkpoint is named by the tracker" if previous is None
            else f"the tracker names iteration {previous}")
    return CheckpointSaveError(f"cannot save the checkpoint of iteration {iteration} to {root}: "
                               f"{err.strerror or err}{where}; {hint}. Nothing half-written is left; {kept}", code)


@dataclass
class RankFiles:
    """One rank directory's content: numpy model tensors, the optimizer state (None: not saved), meta (JSON)."""

    rank_dir: str
    model: Mapping[str, np.ndarray]
    optimizer: Mapping[str, Any] | None
    meta: Mapping[str, Any]


def single_process(value: Any) -> list[Any]:
    """write_checkpoint_shards' all-gather for one process."""
    return [value]


def _os_error_fields(err: OSError) -> list[Any]:
    return [err.errno, err.strerror or str(err), str(err.filename) if err.filename else None]


def write_checkpoint(root: str | os.PathLike, iteration: int, model: Mapping[str, np.ndarray],
                     optimizer: Mapping[str, Any] | None, meta: Mapping[str, Any],
                     log: Callable[[str], None] | None = None) -> Path:
    """Write `<root>/iter_XXXXXXX/mp_rank_00` atomically, then point the tracker at it (the sequence in
    this module's docstring). `model` maps names to numpy arrays; `optimizer` is the optimizer's
    state_dict with numpy tensors (None to leave it out); `meta` is JSON-ready. Returns the iteration
    directory. A file-system error raises CheckpointSaveError (one line) after removing what this save wrote.
    """
    written = write_checkpoint_shards(root, iteration, [RankFiles(RANK_DIR, model, optimizer, meta)], rank=0,
                                      gather=single_process, log=log)
    assert written is not None
    return written


def _begin(root: Path, final: Path, step: Callable[[str], None], log: Callable[[str], None] | None) -> Path:
    """The save sequence's first step: leftovers handled, an empty temporary iteration directory made."""
    root.mkdir(parents=True, exist_ok=True)
    recover_interrupted_saves(root, log)
    step("begin")
    return Path(tempfile.mkdtemp(prefix=temporary_name(final), dir=root))


def _commit(root: Path, tmp: Path, final: Path, iteration: int | str, step: Callable[[str], None]) -> None:
    """The save sequence's last steps: the complete temporary swapped into place, then the tracker moved."""
    _usual_permissions(tmp)
    fsync_dir(tmp)
    step("written")
    replace_directory(tmp, final)  # afterwards the temporary is gone
    step("swapped")
    atomic_write(root / TRACKER_FILE, f"{iteration}\n")
    step("tracker")


def _discard(tmp: Path | None) -> None:
    """Remove a failed save's temporary iteration directory (None: nothing left to remove)."""
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


def write_iteration(root: str | os.PathLike, iteration: int | str, fill: Callable[[Path], None],
                    log: Callable[[str], None] | None = None) -> Path:
    """The save sequence of this module's docstring for one process that writes every rank directory itself:
    `fill(directory)` writes them into the temporary iteration directory (e.g. `mmrun convert`, tensor by
    tensor); the iteration directory appears, and the tracker moves, only when it returned. Any failure
    removes what was written and leaves the previous checkpoint and the tracker as they were."""
    root = Path(root)
    final = iteration_dir(root, iteration)
    step = kill_step(iteration)
    tmp: Path | None = None
    try:
        tmp = _begin(root, final, step, log)
        fill(tmp)
        _commit(root, tmp, final, iteration, step)
        tmp = None
    except BaseException as err:
        _discard(tmp)
        if isinstance(err, OSError):
            raise _save_error(err, root, iteration) from None
        raise
    return final


def write_checkpoint_shards(root: str | os.PathLike, iteration: int, files: Sequence[RankFiles], *, rank: int,
                            gather: Callable[[Any], list[Any]], log: Callable[[str], None] | None = None) -> Path:
    """The save sequence of the module docstring with one writer per model shard: every process calls it
    (`gather` is an all-gather of JSON values over all of them, `rank` this process's global rank); the
    ones that hold shards pass their `files` (the others none; one process may write several). Rank 0 prepares the temporary iteration directory, every writer
    fills its own rank directory in it, and only when all of them succeeded does rank 0 swap it into place
    and then move the tracker. Any failure anywhere leaves the previous checkpoint and the tracker as they
    were and raises the same CheckpointSaveError on every process."""
    root = Path(root)
    final = iteration_dir(root, iteration)
    step = kill_step(iteration)
    tmp: Path | None = None
    failure: list[Any] | None = None
    if rank == 0:
        try:
            tmp = _begin(root, final, step, log)
        except OSError as err:
            failure = _os_error_fields(err)
    shared_tmp, failure = gather([str(tmp) if tmp else None, failure])[0]
    if failure is not None:
        raise _save_error(OSError(*failure), root, iteration)
    try:
        own: list[Any] | None = None
        for one in files:
            checksums = {"model": tensor_digest(one.model)}
            if one.optimizer is not None:
                checksums["optimizer"] = tensor_digest(one.optimizer["tensors"])
            try:
                checkpoint_io.save_checkpoint(Path(shared_tmp) / one.rank_dir, one.model, one.optimizer,
                                              {**one.meta, "checksums": checksums}, on_step=step)
            except OSError as err:
                own = _os_error_fields(err)
                break
        failures = [f for f in gather(own) if f is not None]
        if failures:
            raise OSError(*failures[0])
        if rank == 0:
            try:
                _commit(root, Path(shared_tmp), final, iteration, step)
                tmp = None
            except OSError as err:
                failure = _os_error_fields(err)
        failure = gather(failure)[0]
        if failure is not None:
            raise OSError(*failure)
    except BaseException as err:
        _discard(tmp)
        if isinstance(err, OSError):
            raise _save_error(err, root, iteration) from None
        raise
    return final


# ------------------------------------------------------------------------------- verified reading

def _first_line(err: BaseException) -> str:
    text = str(err)
    return f"{type(err).__name__}: {text.splitlines()[0] if text else 'no detail'}"


def _check_readable(file: Path) -> None:
    """Open one safetensors file's header, so that a damaged file is named in the error."""
    from safetensors import safe_open

    if not file.exists():
        return
    try:
        with safe_open(str(file), framework="np") as f:
            f.keys()
    except Exception as err:  # safetensors raises SafetensorError (not importable by a stable name)
        raise CheckpointError(f"{file} is corrupt or truncated ({_first_line(err)}); resume from an earlier "
                              "iteration with --ckpt-step N") from None


def read_checkpoint_dir(path: Path, iteration: int | str) -> LoadedCheckpoint:
    """Read and verify the files of one rank directory (checksums, format); nothing is applied here."""
    if (path / MEGATRON_TORCH_FILE).is_file() and not (path / checkpoint_io.MODEL_FILE).is_file():
        raise CheckpointError(f"{path / MEGATRON_TORCH_FILE} is a Megatron torch (pickle) checkpoint; mmrun loads "
                              "only its own safetensors checkpoints and never unpickles. Start from scratch "
                              "or convert the weights to safetensors")
    for name in (checkpoint_io.MODEL_FILE, checkpoint_io.OPTIMIZER_FILE):
        _check_readable(path / name)
    try:
        ckpt = checkpoint_io.load_checkpoint(path)
    except FileNotFoundError as err:
        raise CheckpointError(f"incomplete checkpoint in {path}: {err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path / checkpoint_io.META_FILE} is corrupt (not valid JSON: {err}); "
                              "resume from an earlier iteration with --ckpt-step N") from None
    except Exception as err:  # safetensors raises its own SafetensorError for truncated or garbled files
        raise CheckpointError(f"a checkpoint file in {path} is corrupt or truncated ({_first_line(err)}); "
                              "resume from an earlier iteration with --ckpt-step N") from None
    checksums = ckpt.meta.get("checksums", {})
    parts = {"model": ckpt.model, "optimizer": None if ckpt.optimizer is None else ckpt.optimizer["tensors"]}
    for part, arrays in parts.items():
        if arrays is not None and part in checksums and tensor_digest(arrays) != checksums[part]:
            filename = checkpoint_io.MODEL_FILE if part == "model" else checkpoint_io.OPTIMIZER_FILE
            raise CheckpointError(f"{path / filename} is corrupt: its tensors do not match the checksum recorded "
                                  "when it was saved; resume from an earlier iteration with --ckpt-step N")
    saved_iteration = ckpt.meta.get("iteration", 0 if iteration == "release" else iteration)
    return LoadedCheckpoint(path=path, iteration=int(saved_iteration), model=ckpt.model,
                            optimizer=ckpt.optimizer, meta=ckpt.meta)


def _available(root: Path) -> str:
    names = [iteration_dir(root, it).name for it in saved_iterations(root)]
    return f"the checkpoints here: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}" if names else \
        "there is no iter_* directory here"


def rank_dirs(path: Path) -> list[str]:
    """The rank directories (`mp_rank_*`) of one iteration directory, sorted."""
    try:
        return sorted(p.name for p in path.iterdir() if p.name.startswith("mp_rank_") and p.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def read_checkpoint(root: str | os.PathLike, iteration: int | str, rank_dir: str | None = None) -> LoadedCheckpoint:
    """Read and verify `<root>/iter_XXXXXXX/<rank_dir>`; without `rank_dir`, the first one there
    (`mp_rank_00`, or `mp_rank_00_000` with pipeline stages): its meta.json names the layout of all."""
    root = Path(root)
    if rank_dir is None:
        present = rank_dirs(iteration_dir(root, iteration))
        rank_dir = RANK_DIR if RANK_DIR in present or not present else present[0]
    path = checkpoint_dir(root, iteration, rank_dir)
    if not path.is_dir() and not (path / MEGATRON_TORCH_FILE).is_file():
        if iteration_dir(root, iteration).is_dir():
            raise CheckpointError(f"checkpoint directory {path} does not exist (iteration {iteration} holds "
                                  f"{', '.join(rank_dirs(iteration_dir(root, iteration))[:4]) or 'no rank directory'})"
                                  f". Received: --load {root}; load it with the tensor and pipeline sizes it was "
                                  "saved with")
        raise CheckpointError(f"checkpoint directory {path} does not exist (iteration {iteration}). Received: "
                              f"--load {root}; {_available(root)}: pick one with --ckpt-step or fix {TRACKER_FILE}")
    return read_checkpoint_dir(path, iteration)


def read_sibling(ckpt: LoadedCheckpoint, rank_dir: str) -> LoadedCheckpoint:
    """Another rank directory of the iteration `ckpt` was read from, read and verified."""
    if ckpt.path.name == rank_dir:
        return ckpt
    path = ckpt.path.parent / rank_dir
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist ({ckpt.path.parent} holds "
                              f"{', '.join(rank_dirs(ckpt.path.parent)[:4])}); it is incomplete, or it was saved "
                              "with another layout than its meta.json says")
    return read_checkpoint_dir(path, ckpt.iteration)


def verify_iteration_dir(path: Path, iteration: int | str) -> None:
    """Read and verify every rank directory of one iteration directory (CheckpointError on the first problem)."""
    names = rank_dirs(path)
    if not names:
        raise CheckpointError(f"{path} holds no mp_rank_* directory")
    for name in names:
        read_checkpoint_dir(path / name, iteration)


# -------------------------------------------------------------------- finding what to resume from

def _writer_alive(leftover: Path, final_name: str) -> bool:
    """Whether the process named in a temporary's name (`.<final>.mmrun-tmp-<pid>-...`) still runs."""
    pid_text = leftover.name[len(final_name) + 1 + len(TEMP_MARK):].split("-", 1)[0]
    if not pid_text.isdigit():
        return True  # not ours to judge: leave it
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def recover_interrupted_saves(root: str | os.PathLike, log: Callable[[str], None] | None = None) -> list[Path]:
    """Clean up after saves that were killed: where `iter_XXXXXXX` is missing but a dead writer left a
    complete copy of it (verified), rename that copy back into place; then remove the dead writers'
    temporaries. Returns the iteration directories put back. Never removes the only complete copy."""
    root = Path(root)
    leftovers: dict[str, list[Path]] = {}
    for path in root.glob(f".*{TEMP_MARK}*"):
        final_name = path.name[1:].split(TEMP_MARK, 1)[0]
        if iteration_of(final_name) is not None and path.is_dir() and not _writer_alive(path, final_name):
            leftovers.setdefault(final_name, []).append(path)
    restored = []
    for final_name, paths in sorted(leftovers.items()):
        final = root / final_name
        if not os.path.lexists(final):
            for copy in sorted(paths, key=lambda p: p.stat().st_mtime, reverse=True):  # the re-save first
                try:
                    verify_iteration_dir(copy, iteration_of(final_name))
                except CheckpointError:
                    continue
                replace_directory(copy, final)  # final is absent: a plain rename, then fsync of root
                restored.append(final)
                if log:
                    log(f"WARNING: {final} was missing after an interrupted save; put back the complete copy "
                        f"{copy.name} (checksums verified)")
                break
        remove_stale_temporaries(final)
    return restored


def find_checkpoint(root: str | os.PathLike, ckpt_step: int | None = None,
                    log: Callable[[str], None] = print) -> LoadedCheckpoint | None:
    """The verified checkpoint `--load root` resumes from: --ckpt-step's, else the tracker's, else (no
    tracker file at all) the newest complete one, said in one line. None when `root` holds no checkpoint.

    A tracker that is there but unreadable (a directory, not UTF-8, not a number) stops with a one-line
    CheckpointError rather than a guess: someone wrote it, and it may name an older iteration on purpose.
    Call recover_interrupted_saves first (one process), so that a copy a killed save left is back in place.
    """
    root = Path(root)
    if ckpt_step is not None:
        return read_checkpoint(root, ckpt_step)
    try:
        iteration = read_tracker(root)
    except CheckpointError as err:
        newest = saved_iterations(root)
        how = f"--ckpt-step {newest[0]}" if newest else "--ckpt-step N"
        raise CheckpointError(f"{err}; nothing was loaded. Fix or remove it (without a tracker, --load resumes from "
                              f"the newest complete checkpoint), or pass {how}; {_available(root)}") from None
    if iteration is not None:
        return read_checkpoint(root, iteration)
    skipped = []
    for candidate in saved_iterations(root):
        try:
            ckpt = read_checkpoint(root, candidate)
        except CheckpointError:
            skipped.append(iteration_dir(root, candidate).name)
            continue
        note = f"; skipped {', '.join(skipped)} (incomplete or corrupt)" if skipped else ""
        log(f"WARNING: {root / TRACKER_FILE} is missing; resuming from the newest complete checkpoint, "
            f"{iteration_dir(root, candidate).name} (checksums verified){note}")
        return ckpt
    if skipped:
        raise CheckpointError(f"{root} has no {TRACKER_FILE} and none of its checkpoints is complete "
                              f"({', '.join(skipped[:5])} fail verification); nothing was loaded. Pass --ckpt-step N "
                              "to see why one fails, or another --load")
    return None


def check_save_dir(save: str | os.PathLike | None) -> None:
    """Before any training: stop now, not at the first save, when `--save` cannot take checkpoints."""
    if not save:
        return
    path = Path(save)
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise CheckpointError(f"--save {save}: {existing} is not a directory. Received: --save {save}; "
                              "pass a directory (it is created if missing)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CheckpointError(f"--save {save}: {existing} is not writable; make it writable or pass another --save")
    problem = tracker_problem(path) if existing == path else None
    if problem:
        raise CheckpointError(f"--save {save}: {problem}, so no save could be recorded; remove it "
                              "(the iter_* checkpoints beside it are not touched)")


def open_save_directory(root: str, entry: str) -> Any:
    """The newest complete checkpoint of a training run's --save directory, for the converters: an interrupted
    save recovered first; a missing directory or one with no checkpoint is a UsageError naming `entry` (the
    script whose --save it should be)."""
    from mmrun.backend.errors import UsageError

    if not Path(root).is_dir():
        raise UsageError(f"--cfg.source_path {root}: no such directory; pass the --save directory of the {entry} run")
    recover_interrupted_saves(root)
    ckpt = find_checkpoint(root, log=print)
    if ckpt is None:
        raise UsageError(f"--cfg.source_path {root} holds no checkpoint (no iter_* directory)")
    return ckpt
