"""Running the real `mmrun analyse` command, as a user would (also without root's file permissions)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
# Root reads and writes whatever the permission bits say; these tests need them to count.
_DROP_ROOT_POWERS = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]


def analyse_command(*args: str, cwd: Path | str = REPO, unprivileged: bool = False, timeout: float = 180,
                    env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m mmrun.analyse ARGS` in a child process; its exit status, stdout and stderr."""
    command = [sys.executable, "-m", "mmrun.analyse", *args]
    if unprivileged and os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: file permissions cannot be tested")
        command = _DROP_ROOT_POWERS + command
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env=env, errors="backslashreplace")


def assert_clean_failure(proc: subprocess.CompletedProcess) -> None:
    """No traceback, and every stderr line is one of the command's own one-line messages."""
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    for line in proc.stderr.splitlines():
        assert (": skipped: " in line or ": not followed: " in line or ": not rewritten: " in line
                or line.startswith("mmrun analyse: ")), line


@pytest.fixture(scope="session")
def cli() -> SimpleNamespace:
    """The helpers above, for test modules (pytest's importlib mode does not import conftest by name)."""
    return SimpleNamespace(run=analyse_command, assert_clean_failure=assert_clean_failure, REPO=REPO)
