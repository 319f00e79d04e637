"""Which files to analyse, and reading one: every path ends up analysed, skipped with a reason, or refused.

A path named on the command line must be a Python file or a folder; anything else (a FIFO, a broken
symlink, a symlink loop) is a usage error that says what it is. Inside a folder, hidden and cache
folders are left out (documented); a `*.py` entry that cannot be analysed (not a regular file, a
broken link, a folder that cannot be listed) is kept as a skipped file with its reason; a symlink
to a folder is not followed (a loop or a link to `/` would never end) and is named in a note.
Files are read without blocking (a FIFO renamed into place after the walk cannot hang the run).
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from typing import Iterable

SKIP_DIRS = frozenset({"__pycache__", "node_modules"})

_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symlink",
}


class PathError(ValueError):
    """A path given on the command line is not a Python file or folder (a usage error)."""


class SkipFile(Exception):
    """A file that cannot be analysed; the message is the reason, one line without the path."""


@dataclass
class Sources:
    files: list[tuple[str, str]] = field(default_factory=list)    # (path to read, path to display)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path to display, reason)
    notes: list[str] = field(default_factory=list)                # one line each, not failures


def file_kind(mode: int) -> str:
    """'a FIFO (named pipe)', 'a folder', ... for a stat mode."""
    return _KINDS.get(stat.S_IFMT(mode), "an unknown kind of file")


def printable(path: str) -> str:
    """`path` as one printable line: undecodable bytes as \\xNN, control characters escaped."""
    if path.isprintable():
        return path
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _broken(path: str, error: OSError) -> str:
    """Why stat() failed on `path`: a broken link, a link loop, or the system's words."""
    if error.errno == errno.ELOOP:
        return "a symlink loop"
    if error.errno == errno.ENOENT and os.path.islink(path):
        try:
            return f"a broken symlink (to {printable(os.readlink(path))}, which does not exist)"
        except OSError:
            return "a broken symlink"
    return f"cannot be read ({error.strerror})"


def discover(paths: Iterable[str]) -> Sources:
    """The .py files under `paths` (sorted by display path, each real file once) and what was skipped.

    Raises PathError for a command-line path that is not a Python file or a folder.
    """
    found: list[tuple[str, str, tuple[int, int]]] = []   # (display, path, (device, inode))
    sources = Sources()
    for given in paths:
        try:
            st = os.stat(given)
        except OSError as exc:
            if exc.errno == errno.ENOENT and not os.path.lexists(given):
                raise PathError(f"path does not exist: {printable(given)}; pass Python files or folders") from None
            raise PathError(f"{printable(given)} is {_broken(given, exc)}; pass Python files or folders") from None
        if stat.S_ISDIR(st.st_mode):
            _walk(given, found, sources)
        elif stat.S_ISREG(st.st_mode):
            found.append((printable(given), given, (st.st_dev, st.st_ino)))
        else:
            raise PathError(f"{printable(given)} is {file_kind(st.st_mode)}, not a Python file or folder; "
                            "save the code to a .py file and pass that")
    seen: set[tuple[int, int]] = set()
    for display, path, key in sorted(found):
        if key not in seen:
            seen.add(key)
            sources.files.append((path, display))
    sources.skipped.sort()
    sources.notes.sort()
    return sources


def _walk(top: str, found: list, sources: Sources) -> None:
    # Iterative: a tree nested thousands of folders deep needs no recursion.
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError as exc:
            sources.skipped.append((printable(folder), f"cannot list the folder ({exc.strerror})"))
            continue
        for entry in entries:
            name, path = entry.name, entry.path
            hidden = name.startswith(".") or name in SKIP_DIRS
            try:
                if entry.is_dir(follow_symlinks=False):
                    if not hidden:
                        stack.append(path)
                    continue
                if not entry.is_symlink():
                    if name.endswith(".py"):
                        st = entry.stat(follow_symlinks=False)
                        _add(path, st, found, sources)
                    continue
                try:
                    st = os.stat(path)
                except OSError as exc:
                    if name.endswith(".py"):
                        sources.skipped.append((printable(path), _broken(path, exc)))
                    continue   # a dangling link not named *.py is not Python source
                if stat.S_ISDIR(st.st_mode):
                    if not hidden:
                        sources.notes.append(f"{printable(path)}: not followed: a symlink to a folder; "
                                             "pass it explicitly to analyse it")
                elif name.endswith(".py"):
                    _add(path, st, found, sources)
            except OSError as exc:
                if name.endswith(".py"):
                    sources.skipped.append((printable(path), f"cannot be read ({exc.strerror})"))


def _add(path: str, st: os.stat_result, found: list, sources: Sources) -> None:
    if stat.S_ISREG(st.st_mode):
        found.append((printable(path), path, (st.st_dev, st.st_ino)))
    else:
        sources.skipped.append((printable(path), f"{file_kind(st.st_mode)}, not a regular file"))


def read_source(path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes`; SkipFile says why not.

    Opened without blocking and checked after opening: a FIFO or device put in the file's place
    is refused, never read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SkipFile(f"cannot be read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SkipFile(f"{file_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise SkipFile(f"larger than {max_bytes / 2**20:g} MiB ({st.st_size / 2**20:.1f} MiB)")
        chunks, size = [], 0
        while size <= max_bytes:   # st_size can be 0 or wrong (/proc): read to the end, bounded
            chunk = os.read(fd, max(max_bytes + 1 - size, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise SkipFile(f"larger than {max_bytes / 2**20:g} MiB")
        return b"".join(chunks)
    except OSError as exc:
        raise SkipFile(f"cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
