"""Big, deep and odd input through the real `mmrun analyse`: no segfault, no hang, no traceback.

Each case was a crash, a hang or a traceback before (issues 14 and 16): 2000 nested parentheses
segfaulted LibCST (exit 139), 20000 chained calls ran 100 s and then segfaulted, a FIFO named x.py
in a folder hung the walk, a symlink loop and `-j 2` on a deep file ended in tracebacks, and a
FIFO or broken symlink on the command line was "path does not exist".
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mmrun.launchers.supervisor import processes_with

CUDA = "import torch\ntorch.cuda.synchronize()\n"
FINDING = ":2:1: MM101 torch.cuda.synchronize is CUDA-only [*]"


def _skipped(proc: subprocess.CompletedProcess) -> list[str]:
    """The command's `PATH: skipped: REASON` lines, sorted; it must have ended cleanly with status 1."""
    assert "Traceback" not in proc.stderr and proc.returncode == 1, proc.stderr
    return sorted(line for line in proc.stderr.splitlines() if ": skipped: " in line)


def _tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode() if isinstance(text, str) else text)
    return root


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_deep_nesting_and_long_call_chains_are_skipped_with_the_reason(tmp_path: Path, cli, jobs):
    _tree(tmp_path, {
        "parens.py": CUDA + "x = " + "(" * 2000 + "1" + ")" * 2000 + "\n",
        "chain.py": CUDA + "x = torch.cuda" + ".f()" * 20000 + "\n",
        "plus.py": CUDA + "x = 1" + " + 1" * 20000 + "\n",
        "ok.py": CUDA,
    })
    started = time.monotonic()
    proc = cli.run(str(tmp_path), "-j", jobs, timeout=120)
    seconds = time.monotonic() - started
    cli.assert_clean_failure(proc)
    assert f"{tmp_path / 'ok.py'}{FINDING}" in proc.stdout.splitlines()
    assert _skipped(proc) == [
        f"{tmp_path / 'chain.py'}: skipped: an expression nested more than 1000 levels deep at line 3 "
        "(chained calls, operators, brackets)",
        f"{tmp_path / 'parens.py'}: skipped: brackets nested more than 200 deep at line 3 (more than CPython accepts)",
        f"{tmp_path / 'plus.py'}: skipped: an expression nested more than 1000 levels deep at line 3 "
        "(chained calls, operators, brackets)",
    ]
    assert "3 files skipped (see stderr)" in proc.stdout.splitlines()[-1]
    assert seconds < 60   # refused before parsing: about a second on an idle machine


def test_deep_but_valid_python_is_analysed(tmp_path: Path, cli):
    # What CPython compiles is not refused: 190 nested brackets, a 400-link call chain, a
    # 900-term sum (the worker's stack and recursion limit take LibCST's visitors that deep).
    _tree(tmp_path, {
        "brackets.py": CUDA + "x = " + "(" * 190 + "torch.cuda.current_device()" + ")" * 190 + "\n",
        "chain.py": CUDA + "y = torch.cuda.current_stream()" + ".f()" * 400 + "\n",
        "sum.py": CUDA + "z = " + " + ".join(["torch.cuda.device_count()"] * 900) + "\n",
    })
    proc = cli.run(str(tmp_path), "--select", "MM101", timeout=300)
    cli.assert_clean_failure(proc)
    assert ": skipped: " not in proc.stderr
    lines = proc.stdout.splitlines()
    assert f"{tmp_path / 'brackets.py'}:3:195: MM101 torch.cuda.current_device is CUDA-only [*]" in lines
    assert f"{tmp_path / 'chain.py'}:3:5: MM101 torch.cuda.current_stream is CUDA-only [*]" in lines
    assert sum(line.startswith(f"{tmp_path / 'sum.py'}:3:") for line in lines) == 900
    compile((tmp_path / "chain.py").read_text(), "chain.py", "exec")   # valid Python indeed


def test_a_fifo_in_a_folder_is_skipped_not_read(tmp_path: Path, cli):
    _tree(tmp_path, {"ok.py": CUDA})
    os.mkfifo(tmp_path / "x.py")   # nobody ever writes: reading it would wait forever
    os.symlink("/dev/zero", tmp_path / "zero.py")
    proc = cli.run(str(tmp_path), timeout=60)
    cli.assert_clean_failure(proc)
    assert _skipped(proc) == [
        f"{tmp_path / 'x.py'}: skipped: a FIFO (named pipe), not a regular file",
        f"{tmp_path / 'zero.py'}: skipped: a character device, not a regular file",
    ]
    assert f"{tmp_path / 'ok.py'}{FINDING}" in proc.stdout


def test_symlinks_loops_and_broken_links_in_a_folder(tmp_path: Path, cli):
    _tree(tmp_path, {"real/ok.py": CUDA})
    os.symlink("self.py", tmp_path / "self.py")
    os.symlink("b.py", tmp_path / "a.py")
    os.symlink("a.py", tmp_path / "b.py")
    os.symlink("gone.py", tmp_path / "broken.py")
    os.symlink("gone", tmp_path / "not_python")   # a dangling link that is not *.py: not source
    os.symlink(".", tmp_path / "loop")             # a folder loop: never followed
    os.symlink("real/ok.py", tmp_path / "alias.py")   # the same file twice: analysed once
    proc = cli.run(str(tmp_path), timeout=60)
    cli.assert_clean_failure(proc)
    assert proc.returncode == 1
    err = proc.stderr.splitlines()
    assert f"{tmp_path / 'loop'}: not followed: a symlink to a folder; pass it explicitly to analyse it" in err
    assert sorted(line for line in err if "skipped" in line) == [
        f"{tmp_path / 'a.py'}: skipped: a symlink loop",
        f"{tmp_path / 'b.py'}: skipped: a symlink loop",
        f"{tmp_path / 'broken.py'}: skipped: a broken symlink (to gone.py, which does not exist)",
        f"{tmp_path / 'self.py'}: skipped: a symlink loop",
    ]
    findings = [line for line in proc.stdout.splitlines() if "MM101" in line and ":2:1:" in line]
    assert findings == [f"{tmp_path / 'alias.py'}{FINDING}"]   # sorted first; real/ok.py is the same file


@pytest.mark.parametrize("make, message", [
    (lambda p: os.mkfifo(p), "{p} is a FIFO (named pipe), not a Python file or folder; save the code to a .py "
                             "file and pass that"),
    (lambda p: os.symlink("missing.py", p), "{p} is a broken symlink (to missing.py, which does not exist); "
                                            "pass Python files or folders"),
    (lambda p: os.symlink(p.name, p), "{p} is a symlink loop; pass Python files or folders"),
    (lambda p: None, "path does not exist: {p}; pass Python files or folders"),
])
def test_what_is_not_a_file_on_the_command_line_is_a_usage_error(tmp_path: Path, cli, make, message):
    path = tmp_path / "x.py"
    make(path)
    proc = cli.run(str(path), timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"mmrun analyse: error: {message.format(p=path)}\n"


def test_unreadable_files_and_folders_are_skipped_with_the_reason(tmp_path: Path, cli):
    _tree(tmp_path, {"secret.py": CUDA, "locked/inner.py": CUDA, "ok.py": CUDA})
    os.chmod(tmp_path / "secret.py", 0)
    os.chmod(tmp_path / "locked", 0)
    try:
        proc = cli.run(str(tmp_path), unprivileged=True, timeout=60)
        alone = cli.run(str(tmp_path / "secret.py"), unprivileged=True, timeout=60)
    finally:
        os.chmod(tmp_path / "locked", 0o755)
    cli.assert_clean_failure(proc)
    assert _skipped(proc) == [
        f"{tmp_path / 'locked'}: skipped: cannot list the folder (Permission denied)",
        f"{tmp_path / 'secret.py'}: skipped: cannot be read (Permission denied)",
    ]
    assert f"{tmp_path / 'ok.py'}{FINDING}" in proc.stdout
    assert alone.returncode == 1 and "0 of 1 file" in alone.stdout
    assert f"{tmp_path / 'secret.py'}: skipped: cannot be read (Permission denied)" in alone.stderr


def test_odd_file_names_stay_one_line(tmp_path: Path, cli):
    odd = os.fsdecode(b"bad\xff name\nwith newline.py")
    (tmp_path / odd).write_text(CUDA)
    proc = cli.run(str(tmp_path), timeout=60)
    cli.assert_clean_failure(proc)
    assert proc.stdout.splitlines()[0] == f"{tmp_path}/bad\\xff name\\nwith newline.py{FINDING}"


def test_big_files_are_skipped_not_loaded(tmp_path: Path, cli):
    big = tmp_path / "big.py"
    with open(big, "wb") as f:
        f.truncate(5 << 20)   # sparse: 5 MiB that cost nothing to make
    proc = cli.run(str(big), timeout=60)
    cli.assert_clean_failure(proc)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[0] == f"{big}: skipped: larger than 4 MiB (5.0 MiB)"


def test_a_deep_folder_tree_is_walked(tmp_path: Path, cli):
    deep = tmp_path.joinpath(*["d"] * 400)   # os.walk recursed per level in Python 3.11
    deep.mkdir(parents=True)
    (deep / "x.py").write_text(CUDA)
    proc = cli.run(str(tmp_path), timeout=60)
    cli.assert_clean_failure(proc)
    assert f"{deep / 'x.py'}{FINDING}" in proc.stdout


def test_a_closed_pipe_ends_quietly(cli):
    fixtures = str(cli.REPO / "tests" / "analyse" / "fixtures")
    proc = subprocess.run(f"{sys.executable} -m mmrun.analyse {fixtures} | head -1", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_ctrl_c_stops_the_workers_and_says_so(tmp_path: Path):
    # A file LibCST needs many seconds for (valid Python, nested 30 deep): interrupted meanwhile.
    line = "x = " + 'f(a.b[1], {"k": ' * 30 + "1" + "})" * 30 + "\n"
    (tmp_path / "slow.py").write_text(CUDA + line * 300)
    marker = uuid.uuid4().hex
    env = dict(os.environ, MMRUN_TEST_MARKER=marker)
    proc = subprocess.Popen([sys.executable, "-m", "mmrun.analyse", str(tmp_path), "-j", "2"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(processes_with(f"MMRUN_TEST_MARKER={marker}")) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)   # the command and its worker are running
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err == "mmrun analyse: interrupted\n", err
    time.sleep(0.5)
    assert processes_with(f"MMRUN_TEST_MARKER={marker}") == []   # no worker left behind
