"""Reading the script to translate: a regular file of bounded size, never a pipe or a device.

A FIFO given as SCRIPT would block `open()` until a writer comes (and then never end), `/dev/zero` would
fill the memory: both are refused before anything is read. Bytes that are not UTF-8 (a GBK or Latin-1
comment) are kept exactly; a NUL byte means a binary file, which no shell script contains.
"""
from __future__ import annotations

import os
import stat

from mmrun.backend.errors import UsageError

MAX_SCRIPT_BYTES = 16 * 1024 * 1024  # launch scripts are kilobytes; 16 MiB is far beyond any real one
_KINDS = {  # what a path that is not a regular file is, in words
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}
_FIX = "give the path of a launch script"


def read_script(path: str) -> bytes:
    """The bytes of the launch script at `path`; UsageError (one line) for anything else."""
    try:
        _check_kind(path, os.stat(path))  # before open(): opening a FIFO blocks, opening a device can act
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror}. Received: {path!r}; {_FIX}") from None
    try:
        _check_kind(path, os.fstat(fd))  # what was opened (the path may have changed since the stat)
        chunks, size = [], 0
        while size <= MAX_SCRIPT_BYTES:
            chunk = os.read(fd, min(1 << 20, MAX_SCRIPT_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror}. Received: {path!r}; {_FIX}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_SCRIPT_BYTES:
        raise _too_big(path, len(data))
    nul = data.find(b"\0")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise UsageError(f"{path} holds a NUL byte (byte {nul}, line {line}): it is a binary file "
                         f"(or UTF-16 text), not a shell script. Received: {path!r}; {_FIX} (convert UTF-16 with iconv -t UTF-8)")
    return data


def _check_kind(path: str, info: os.stat_result) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{path} is a directory. Received: {path!r}; {_FIX}")
    if not stat.S_ISREG(info.st_mode):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
        raise UsageError(f"{path} is {kind}, not a file: mmrun translate reads a script from a regular file only (a pipe "
                         f"or device may never end). Received: {path!r}; save the script to a file and give its path")
    if info.st_size > MAX_SCRIPT_BYTES:
        raise _too_big(path, info.st_size)


def _too_big(path: str, size: int) -> UsageError:
    return UsageError(f"{path} is {size} bytes, more than the {MAX_SCRIPT_BYTES // (1024 * 1024)} MiB a launch script "
                      f"may have. Received: {path!r}; {_FIX}")
