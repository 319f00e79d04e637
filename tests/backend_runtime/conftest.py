"""Fixtures for the backend runtime tests: clean subprocesses (the framework choice is made once per
process, so most checks need a fresh interpreter), free ports, and launcher runs that reap their
process group."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from mmrun.common import ports

WORKERS = Path(__file__).parent / "workers"
# Variables a parent job or shell may carry that would change what a child chooses or joins.
_INHERITED_PREFIXES = ("MMRUN_", "MS_", "PET_", "TORCHELASTIC_")
_INHERITED_NAMES = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
    "RANK_ID", "RANK_SIZE", "DEVICE_ID", "MSADAPTER_PATH", "TORCH_DEVICE_BACKEND_AUTOLOAD",
    "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "PYTHONPATH",
}


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _INHERITED_NAMES and not k.startswith(_INHERITED_PREFIXES)}
    env["OMP_NUM_THREADS"] = "1"  # 2 shared cores: one thread per process
    # msrun starts workers as `python` from PATH: it must be this interpreter.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


@pytest.fixture
def clean_env() -> Callable[..., dict[str, str]]:
    return _clean_env


@pytest.fixture
def workers_dir() -> Path:
    return WORKERS


@pytest.fixture
def free_port() -> Callable[[], int]:
    return lambda: ports.free_port("127.0.0.1")


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess]:
    """`python -c code` (or `python args...`) in a clean environment, from `/` so the checkout's
    folders (backend/torch, backend/mindspore) cannot shadow the real frameworks."""
    def run(code: str | None = None, *, args: list[str] | tuple[str, ...] = (), env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = [sys.executable] + (["-c", code] if code is not None else []) + list(args)
        return subprocess.run(cmd, env=_clean_env() if env is None else env, capture_output=True, text=True,
                              timeout=timeout, cwd="/")
    return run


@pytest.fixture
def last_json() -> Callable[[subprocess.CompletedProcess], dict]:
    """The JSON object a child printed as its last stdout line (after checking it exited 0)."""
    def parse(proc: subprocess.CompletedProcess) -> dict:
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])
    return parse


@pytest.fixture
def launch() -> Callable[..., subprocess.CompletedProcess]:
    """Run a launcher in its own process group and kill that group afterwards: msrun was measured to
    leave processes behind, and a timed-out launcher leaves its workers."""
    def run(cmd: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, cwd="/")
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if timed_out:
            out = proc.communicate()[0] + f"\n[launcher timed out after {timeout} s]"
        return subprocess.CompletedProcess(cmd, -9 if timed_out else proc.returncode, out, "")
    return run
