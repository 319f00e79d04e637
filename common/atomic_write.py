"""The one way mmrun writes a file: all of it or none of it, and never over something that is not a file.

    with AtomicFile("out/script.sh", "w") as f:      # or atomic_write(path, data)
        f.write(text)

A regular file (or a new one) is written to a temporary file beside it, flushed, fsynced, given the
target's permissions (a new file gets 0o666 minus the umask, as `open()` would), and renamed over the
target: a reader sees the old content or the new, never half of either. A symlink is followed and the
file it names is replaced; the link stays a link. A target that is not a regular file (a character
device such as /dev/null, a FIFO, /dev/stdout, a terminal) is written through, as `open()` would: it
is never replaced by a file. A directory is refused. On every error the temporary file is removed.

`replace_directory` is the same promise for a directory (a checkpoint): the new one takes the old
one's place in one atomic exchange where the kernel offers it (Linux renameat2), so there is no moment
at which neither exists.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import shutil
import stat
import tempfile
from glob import escape as glob_escape
from pathlib import Path
from types import TracebackType
from typing import IO, Any

TEMP_MARK = ".mmrun-tmp-"  # in every temporary name: `.<name>.mmrun-tmp-<pid>-<random>`


def _umask() -> int:
    # os.umask() can only be read by setting it, which races with other threads; Linux shows it in /proc.
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    current = os.umask(0o022)
    os.umask(current)
    return current


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or creation inside `path` durable (the directory entry itself is fsynced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def remove_stale_temporaries(target: str | os.PathLike) -> list[Path]:
    """Delete the temporaries that writers of `target` killed mid-write (SIGKILL, power loss) left beside it.

    A temporary belongs to a dead writer when the process id in its name no longer runs; those of
    live processes (another writer at work) are left alone.
    """
    target = Path(target)
    removed = []
    for leftover in target.parent.glob(f".{glob_escape(target.name)}{TEMP_MARK}*"):
        pid_text = leftover.name[len(target.name) + 1 + len(TEMP_MARK):].split("-", 1)[0]
        if not pid_text.isdigit() or _alive(int(pid_text)):
            continue
        try:
            shutil.rmtree(leftover) if leftover.is_dir() and not leftover.is_symlink() else leftover.unlink()
        except FileNotFoundError:
            continue
        removed.append(leftover)
    return removed


def temporary_name(target: str | os.PathLike) -> str:
    """The prefix of this process's temporaries for `target` (tempfile adds a random part)."""
    return f".{Path(target).name}{TEMP_MARK}{os.getpid()}-"


def _target_of(path: Path) -> tuple[Path, os.stat_result | None]:
    """(where the data goes, the existing file's stat or None); refuses a directory."""
    try:
        st = os.stat(path)  # follows symlinks, also /proc's magic links such as /dev/stdout
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file; name a file", str(path))
    if st is not None and not stat.S_ISREG(st.st_mode):
        return path, st  # a device, FIFO or socket: written through, never replaced
    target = Path(os.path.realpath(path)) if os.path.islink(path) or st is not None else Path(os.path.abspath(path))
    if not target.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, "directory does not exist; create it first", str(target.parent))
    return target, st


class AtomicFile:
    """An open file whose content replaces `path` on `commit()` (or leaving a `with` block normally).

    `new_file_mode` is the permission a file that does not exist yet gets (minus the umask; default
    0o666): `mmrun translate` gives its output the input script's +x this way.

    `abort()` (or an exception in the block) removes the temporary file and leaves `path` untouched.
    """

    def __init__(self, path: str | os.PathLike, mode: str = "wb", encoding: str | None = None,
                 newline: str | None = None, new_file_mode: int | None = None) -> None:
        if mode not in ("w", "wb"):
            raise ValueError(f"AtomicFile writes whole files: mode 'w' or 'wb'. Received: {mode!r}")
        self.path = Path(path)
        self.target, existing = _target_of(self.path)
        self._temporary: str | None = None
        text_options: dict[str, Any] = {} if "b" in mode else {"encoding": encoding or "utf-8", "newline": newline}
        if existing is not None and not stat.S_ISREG(existing.st_mode):
            self._mode = None
            self.file: IO = open(self.target, mode, **text_options)  # noqa: SIM115 - closed by commit/abort
            return
        if existing is not None:
            self._mode = existing.st_mode & 0o7777
        else:
            self._mode = (0o666 if new_file_mode is None else new_file_mode) & ~_umask()
        self._owner = (existing.st_uid, existing.st_gid) if existing is not None else None
        remove_stale_temporaries(self.target)
        fd, self._temporary = tempfile.mkstemp(prefix=temporary_name(self.target), dir=self.target.parent)
        try:
            self.file = os.fdopen(fd, mode, **text_options)
        except BaseException:
            os.close(fd)
            os.unlink(self._temporary)
            raise

    def commit(self) -> Path:
        """Make the written content the target's; returns the path written."""
        if self._temporary is None:
            self.file.close()  # written through
            return self.target
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.chmod(self._temporary, self._mode)
            if self._owner is not None and os.geteuid() == 0:
                os.chown(self._temporary, *self._owner)  # root rewriting a user's file keeps it theirs
            os.replace(self._temporary, self.target)
        except BaseException:
            self.abort()
            raise
        self._temporary = None
        fsync_dir(self.target.parent)
        return self.target

    def abort(self) -> None:
        """Forget what was written; the target stays as it was."""
        try:
            self.file.close()
        finally:
            if self._temporary is not None:
                try:
                    os.unlink(self._temporary)
                except FileNotFoundError:
                    pass
                self._temporary = None

    def __enter__(self) -> IO:
        return self.file

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if kind is None:
            self.commit()
        else:
            self.abort()


def atomic_write(path: str | os.PathLike, data: bytes | str, encoding: str = "utf-8",
                 new_file_mode: int | None = None) -> Path:
    """Replace `path` with `data` (bytes, or text in `encoding`) as described above; returns the path written."""
    text = isinstance(data, str)
    writer = AtomicFile(path, "w" if text else "wb", encoding=encoding if text else None,
                        newline="" if text else None, new_file_mode=new_file_mode)
    with writer as stream:
        stream.write(data)
    return writer.target


# ------------------------------------------------------------------------------------- directories

_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


@functools.lru_cache(maxsize=1)
def _renameat2() -> Any:
    """libc's renameat2, or None (not Linux, or a libc older than glibc 2.28)."""
    try:
        renameat2 = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).renameat2
    except (OSError, AttributeError, TypeError):
        return None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return renameat2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directory entries in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False  # a file system or kernel without the exchange
    raise OSError(code, os.strerror(code), str(b))


def replace_directory(new: str | os.PathLike, final: str | os.PathLike) -> Path:
    """Put the complete directory `new` at `final`, replacing what is there; `new` is gone afterwards.

    Where the exchange is not available the old directory is moved aside first, and restored if the
    second rename fails, so `final` is missing only between two renames and never lost.
    """
    new, final = Path(new), Path(final)
    if not final.exists():
        os.rename(new, final)
    elif _exchange(new, final):
        shutil.rmtree(new)  # now the old content
    else:
        aside = final.with_name(f"{temporary_name(final)}old")
        os.rename(final, aside)
        try:
            os.rename(new, final)
        except BaseException:
            os.rename(aside, final)
            raise
        shutil.rmtree(aside)
    fsync_dir(final.parent)
    return final
