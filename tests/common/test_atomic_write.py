"""The one atomic writer: replaces regular files whole, writes through everything else, leaves nothing behind."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mmrun.common import atomic_write as aw
from mmrun.common.atomic_write import AtomicFile, atomic_write, replace_directory


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def test_replaces_a_regular_file_and_keeps_its_mode(tmp_path):
    target = tmp_path / "run.sh"
    target.write_text("old\n")
    target.chmod(0o751)
    atomic_write(target, "new\n")
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o751
    assert _siblings(target) == ["run.sh"]


def test_a_new_file_gets_the_umask_mode_or_the_one_asked_for(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "plain.txt", b"x")
        atomic_write(tmp_path / "script.sh", b"x", new_file_mode=0o755)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "script.sh").stat().st_mode) == 0o750


def test_new_file_mode_does_not_change_an_existing_file(tmp_path):
    target = tmp_path / "out.sh"
    target.write_text("old")
    target.chmod(0o600)
    atomic_write(target, "new", new_file_mode=0o755)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_symlink_is_followed_and_stays_a_link(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    written = atomic_write(link, "new")
    assert written == real and link.is_symlink() and real.read_text() == "new"
    assert _siblings(real) == ["link.txt", "real.txt"]


def test_a_dangling_symlink_creates_the_file_it_names(tmp_path):
    link = tmp_path / "link.txt"
    link.symlink_to(tmp_path / "made.txt")
    atomic_write(link, "hello")
    assert link.is_symlink() and (tmp_path / "made.txt").read_text() == "hello"


def test_a_fifo_is_written_through_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    atomic_write(fifo, b"through the pipe")
    reader.join(timeout=10)
    assert received == [b"through the pipe"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert _siblings(fifo) == ["pipe"]


def test_a_pipe_behind_a_magic_link_is_written_through(tmp_path):
    # /dev/stdout is a link to /proc/self/fd/1; a child whose stdout is a pipe writes to /proc/self/fd/1.
    code = "from mmrun.common.atomic_write import atomic_write; atomic_write('/proc/self/fd/1', 'via the pipe')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "via the pipe"


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory"):
        atomic_write(tmp_path, "x")
    assert _siblings(tmp_path / "x") == []


def test_a_missing_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        atomic_write(tmp_path / "nowhere" / "out.txt", "x")
    assert info.value.filename == str(tmp_path / "nowhere")


def test_an_error_while_writing_leaves_the_target_and_no_temporary(tmp_path):
    target = tmp_path / "data.bin"
    target.write_bytes(b"original")
    with pytest.raises(RuntimeError):
        with AtomicFile(target, "wb") as stream:
            stream.write(b"half")
            raise RuntimeError("interrupted")
    assert target.read_bytes() == b"original"
    assert _siblings(target) == ["data.bin"]


def test_abort_forgets_everything(tmp_path):
    target = tmp_path / "never.txt"
    writer = AtomicFile(target, "w")
    writer.file.write("x")
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_leftovers_of_a_killed_writer_are_removed_by_the_next_write(tmp_path):
    target = tmp_path / "out.txt"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".out.txt{aw.TEMP_MARK}{int(dead.stdout)}-abc123"
    stale.write_text("half")
    live = tmp_path / f".out.txt{aw.TEMP_MARK}{os.getppid()}-def456"  # a process that runs: kept
    live.write_text("in progress")
    atomic_write(target, "whole")
    assert _siblings(target) == sorted(["out.txt", live.name])


def test_replace_directory_swaps_in_one_step(tmp_path):
    final, new = tmp_path / "ckpt", tmp_path / "ckpt.new"
    final.mkdir()
    (final / "a").write_text("old")
    new.mkdir()
    (new / "a").write_text("new")
    replace_directory(new, final)
    assert (final / "a").read_text() == "new"
    assert _siblings(final) == ["ckpt"]


def test_replace_directory_without_the_exchange_restores_the_old_one_on_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(aw, "_exchange", lambda a, b: False)  # a file system without renameat2's exchange
    final, new = tmp_path / "ckpt", tmp_path / "missing-new"
    final.mkdir()
    (final / "a").write_text("old")
    with pytest.raises(FileNotFoundError):
        replace_directory(new, final)
    assert (final / "a").read_text() == "old" and _siblings(final) == ["ckpt"]
    new.mkdir()
    (new / "a").write_text("new")
    replace_directory(new, final)
    assert (final / "a").read_text() == "new" and _siblings(final) == ["ckpt"]


def test_replace_directory_into_a_new_place(tmp_path):
    new = tmp_path / "tmp"
    new.mkdir()
    replace_directory(new, tmp_path / "final")
    assert _siblings(tmp_path / "final") == ["final"]
