"""What `mmrun translate` reads and writes: regular files only in, the one atomic writer out.

Input that is not a regular text file (a FIFO, a magic link to a pipe, a binary file, a directory, a file over the
size bound) is refused with one line and exit 2, before anything is read from it; output goes through devices,
FIFOs and symlinks without replacing them; nothing is lost on an error. No test touches a real /dev file.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mmrun.launchers.translate.cli import main
from mmrun.launchers.translate.script_file import MAX_SCRIPT_BYTES

SCRIPT = b"#!/bin/bash\nGPUS=2\ntorchrun --nproc_per_node $GPUS --nnodes 1 pretrain_gpt.py\n"
MMRUN = [sys.executable, "-m", "mmrun.launchers.cli", "translate"]
TIMEOUT = 60  # a refused FIFO answers at once; this only turns a hang into a failure


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.sh"
    path.write_bytes(SCRIPT)
    path.chmod(0o750)
    return path


def run(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*MMRUN, *argv], capture_output=True, timeout=TIMEOUT, **kwargs)


def one_error_line(stderr: bytes) -> str:
    """The single `mmrun translate: error:` line of stderr (and no traceback)."""
    text = stderr.decode("utf-8", errors="replace")
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("mmrun translate: error:")]
    assert len(errors) == 1, text
    return errors[0]


# ------------------------------------------------------------------------------------------ input


def test_a_fifo_as_input_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "script.fifo"
    os.mkfifo(fifo)
    result = run(str(fifo))  # no writer: open() would block for ever
    assert result.returncode == 2
    assert "is a FIFO (named pipe), not a file" in one_error_line(result.stderr)


def test_a_magic_link_to_a_pipe_as_input_is_refused(tmp_path: Path) -> None:
    """/proc/self/fd/0 of a child whose stdin is a pipe that never ends (a stand-in for /dev/zero and the like)."""
    reader, writer = os.pipe()
    try:
        result = subprocess.run([*MMRUN, "/proc/self/fd/0"], stdin=reader, capture_output=True, timeout=TIMEOUT)
    finally:
        os.close(reader)
        os.close(writer)
    assert result.returncode == 2
    assert "is a FIFO (named pipe), not a file" in one_error_line(result.stderr)


def test_a_file_over_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    huge = tmp_path / "huge.sh"
    with open(huge, "wb") as sparse:  # a hole: no disk used, and nothing to read if the bound holds
        sparse.truncate(MAX_SCRIPT_BYTES + 1)
    result = run(str(huge))
    assert result.returncode == 2
    assert f"{MAX_SCRIPT_BYTES + 1} bytes, more than the 16 MiB" in one_error_line(result.stderr)


@pytest.mark.parametrize("content, message", [
    (b"\x7fELF\x02\x01\x01\x00\x00\x00", "holds a NUL byte (byte 7, line 1): it is a binary file"),
    ("torchrun train.py\n".encode("utf-16"), "holds a NUL byte"),
])
def test_binary_files_are_refused(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "binary.sh"
    path.write_bytes(content)
    result = run(str(path))
    assert result.returncode == 2 and result.stdout == b""
    assert message in one_error_line(result.stderr)


def test_a_directory_and_a_missing_file_are_one_line_each(tmp_path: Path) -> None:
    result = run(str(tmp_path), str(tmp_path / "missing.sh"), "--check")
    assert result.returncode == 2
    lines = result.stderr.decode().splitlines()
    assert lines == [f"mmrun translate: error: {tmp_path} is a directory. Received: {str(tmp_path)!r}; give the path of a launch script",
                     f"mmrun translate: error: cannot read {tmp_path / 'missing.sh'}: No such file or directory. "
                     f"Received: {str(tmp_path / 'missing.sh')!r}; give the path of a launch script"]


def test_bytes_that_are_not_utf8_are_kept_exactly(tmp_path: Path) -> None:
    """A GBK comment and a Latin-1 value (seen in scripts written on Windows): translated, every such byte kept,
    and the way back gives the same bytes; the text report quotes them as they are, the JSON one escaped."""
    source = (b"#!/bin/bash\n# \xd6\xd0\xce\xc4\xd7\xa2\xca\xcd\nNAME=caf\xe9\n"
              b"torchrun --nproc-per-node=2 --master-addr=h\xf6st train.py --name $NAME --tag \xff\n")
    path = tmp_path / "latin.sh"
    path.write_bytes(source)
    there = run(str(path), "-o", str(tmp_path / "ms.sh"))
    assert there.returncode == 0, there.stderr
    output = (tmp_path / "ms.sh").read_bytes()
    assert b"--master_addr=h\xf6st" in output and b"--tag \xff --ai-framework mindspore" in output
    assert b"# \xd6\xd0\xce\xc4\xd7\xa2\xca\xcd\nNAME=caf\xe9\n" in output
    assert b"\xef\xbf\xbd" not in output  # no U+FFFD replacement anywhere
    assert b"change: `--master-addr=h\xf6st` -> `--master_addr=h\xf6st`: " in there.stderr
    back = run(str(tmp_path / "ms.sh"), "--to", "pytorch")
    assert back.returncode == 0 and back.stdout == source
    report = json.loads(run(str(path), "--report", "json").stderr)
    assert report["translated"] and report["changes"]
    diff = run(str(path), "--diff")
    assert diff.returncode == 0 and b"-torchrun --nproc-per-node=2 --master-addr=h\xf6st" in diff.stdout


def test_a_tampered_undo_record_is_a_note_not_a_crash(script: Path, tmp_path: Path) -> None:
    """A record nested 100000 deep (json.loads would exhaust the stack): the record is ignored, the rules translate."""
    assert main([str(script), "-o", str(tmp_path / "ms.sh")]) == 0
    lines = (tmp_path / "ms.sh").read_bytes().splitlines(keepends=True)
    forged = lines[:2] + [b"# mmrun translate undo: " + b"[" * 100_000 + b"]" * 100_000 + b"\n"] + lines[2:]
    (tmp_path / "forged.sh").write_bytes(b"".join(forged))
    result = run(str(tmp_path / "forged.sh"), "--to", "pytorch")
    assert result.returncode == 0 and b"Traceback" not in result.stderr
    assert b"torchrun --nproc_per_node $GPUS --nnodes 1 pretrain_gpt.py" in result.stdout
    assert b"no longer matches the script" in result.stderr


# ------------------------------------------------------------------------------------------ output


def test_output_to_a_fifo_is_written_through(script: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    result = run(str(script), "-o", str(fifo))
    reader.join(TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert b"msrun --local_worker_num $GPUS" in received[0]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still a FIFO, never replaced by a file
    assert not [p for p in tmp_path.iterdir() if ".mmrun-tmp-" in p.name]


def test_output_to_a_magic_link_to_a_pipe(script: Path) -> None:
    """`-o /proc/self/fd/1` in a child whose stdout is a pipe: the pipe receives the script."""
    result = run(str(script), "-o", "/proc/self/fd/1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(b"#!/bin/bash\n# mmrun translate: torchrun -> msrun")


def test_output_through_a_symlink_keeps_the_link(script: Path, tmp_path: Path) -> None:
    target = tmp_path / "real_out.sh"
    target.write_bytes(b"old\n")
    target.chmod(0o700)
    link = tmp_path / "out_link.sh"
    link.symlink_to(target.name)
    assert run(str(script), "-o", str(link)).returncode == 0
    assert link.is_symlink() and os.readlink(link) == target.name
    assert b"msrun " in target.read_bytes() and stat.S_IMODE(target.stat().st_mode) == 0o700


def test_in_place_through_a_symlink_keeps_the_link_the_mode_and_a_backup(script: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.sh"
    link.symlink_to(script.name)
    result = run(str(link), "--in-place")
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == script.name
    assert b"msrun " in script.read_bytes() and stat.S_IMODE(script.stat().st_mode) == 0o750
    backup = tmp_path / "link.sh.bak"
    assert backup.read_bytes() == SCRIPT and stat.S_IMODE(backup.stat().st_mode) == 0o750


def test_in_place_refuses_a_dangling_backup_link(script: Path, tmp_path: Path) -> None:
    """`SCRIPT.bak` as a link to nowhere: writing the backup would create a file wherever it points."""
    Path(str(script) + ".bak").symlink_to(tmp_path / "elsewhere" / "x")
    assert run(str(script), "--in-place").returncode == 2
    assert script.read_bytes() == SCRIPT and not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("where", ["missing/dir/out.sh", "."])
def test_output_errors_are_one_line_and_write_nothing(script: Path, tmp_path: Path, where: str) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run(str(script), "-o", str(tmp_path / where))
    assert result.returncode == 2 and result.stdout == b""
    line = one_error_line(result.stderr)
    assert line.startswith(f"mmrun translate: error: cannot write -o {tmp_path / where}: ") and "nothing was written" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == before and script.read_bytes() == SCRIPT
