from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from mmrun.common.ports import free_port
from mmrun.launchers.supervisor import processes_with

WORKERS = Path(__file__).parent / "workers"
MMRUN = [sys.executable, "-m", "mmrun.launchers.cli"]


def marked_processes(marker: str) -> list[int]:
    """Processes whose environment carries this test's marker (every descendant inherits it)."""
    return processes_with(f"MMRUN_TEST_MARKER={marker}")


@pytest.fixture
def job_env(tmp_path):
    """An environment for one mmrun job: a unique marker to find its processes, an output folder."""
    marker = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "PET_")) and k not in ("RANK", "WORLD_SIZE")}
    env.update(MMRUN_TEST_MARKER=marker, OUT=str(tmp_path), PYTHONUNBUFFERED="1")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    yield env
    leftovers = marked_processes(marker)
    for pid in leftovers:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    assert not leftovers, f"processes left behind by the job: {leftovers}"


def run_mmrun(args: list[str], env: dict, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run one job; past `timeout` stop it as a user's Ctrl-C would (mmrun then stops its workers, which
    the job_env fixture checks) and fail with msrun's logs, which say where the job stood."""
    proc = subprocess.Popen([*MMRUN, *args], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        logs = "".join(f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}"
                       for log in sorted(Path(cwd).glob("msrun_log/*.log")))
        pytest.fail(f"mmrun {' '.join(args)} ran past {timeout} s\n{out[-2000:]}\n{err[-2000:]}\n{logs}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# Runs mmrun with torch, torch_npu and mindspore unimportable, as on a machine with the base install only.
WITHOUT_FRAMEWORKS = """
import importlib.machinery, sys
class HidingPathFinder(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'torch_npu', 'mindspore'):
            return None  # what a machine without them answers
        return importlib.machinery.PathFinder.find_spec(name, path, target)
sys.meta_path = [HidingPathFinder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
from mmrun.launchers.cli import main
sys.exit(main(sys.argv[1:]))
"""


def mmrun_without_frameworks(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_FRAMEWORKS, *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


@pytest.fixture
def jobs():
    """The helpers above, for tests (conftest modules are not importable under --import-mode=importlib)."""
    class Jobs:
        mmrun = MMRUN
        workers = WORKERS
        free_port = staticmethod(free_port)
        marked_processes = staticmethod(marked_processes)
        run = staticmethod(run_mmrun)
        without_frameworks = staticmethod(mmrun_without_frameworks)
    return Jobs
