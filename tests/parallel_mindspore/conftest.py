"""Helpers for the MindSpore tensor/pipeline-parallel tests: real jobs (msrun through mmrun for MindSpore,
torchrun for the megatron-core reference) in their own process group, and their result files."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

WORKERS = Path(__file__).parent / "workers"
_DROPPED = ("MMRUN_", "MS_", "PET_", "TORCHELASTIC_")
_DROPPED_NAMES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RANK_ID",
                  "RANK_SIZE", "DEVICE_ID"}  # PYTHONPATH stays: it names the checkout under test


def job_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED_NAMES and not k.startswith(_DROPPED)}
    # msrun starts workers as `python` from PATH: it must be this interpreter. One thread per process (2 cores).
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(OMP_NUM_THREADS="1", GLOG_v="3")
    return env


def _start(cmd: list[str]) -> subprocess.Popen:
    # A new session, killed as a whole afterwards: msrun can leave workers behind.
    return subprocess.Popen(cmd, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=WORKERS)


def _finish(proc: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = f"[timed out after {timeout} s]"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def run_job(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a launcher to its end in its own session."""
    return _finish(_start(cmd), timeout)


def _log_tail(log_dir: Path) -> str:
    return "\n".join(f"--- {p.name}\n" + "\n".join(
        line for line in p.read_text(errors="replace").splitlines()[-40:] if "[WARNING]" not in line)
        for p in sorted(log_dir.glob("*.log")))


@dataclass
class RankResult:
    result: dict
    grads: dict[str, np.ndarray]


def load_results(folder: Path) -> dict[int, RankResult]:
    out = {}
    for path in sorted(folder.glob("rank*.json")):
        rank = int(path.stem[4:])
        grads_file = folder / f"grads_rank{rank}.npz"
        grads = dict(np.load(grads_file)) if grads_file.exists() else {}
        out[rank] = RankResult(json.loads(path.read_text()), grads)
    return out


def _mmrun_cmd(script: Path, nproc: int, args: list[str], log_dir: Path) -> list[str]:
    return [sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", "mindspore", "--nproc-per-node", str(nproc),
            "--master-port", "0", "--log-dir", str(log_dir), str(script), *args]


def _torchrun_cmd(script: Path, nproc: int, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), str(script),
            *args]


def mmrun(script: Path, nproc: int, args: list[str], log_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """`mmrun --ai-framework mindspore --nproc-per-node N <script> ...` (msrun); fails the test unless it exits 0."""
    job = run_job(_mmrun_cmd(script, nproc, args, log_dir), timeout)
    assert job.returncode == 0, job.stdout[-3000:] + _log_tail(log_dir)
    return job


def msrun(script: str, nproc: int, args: list[str], out_dir: Path, timeout: float = 300) -> dict[int, RankResult]:
    """A worker of workers/ under mmrun (msrun), then its result files."""
    mmrun(WORKERS / script, nproc, ["--out-dir", str(out_dir), *args], out_dir.with_name(out_dir.name + "_logs"),
          timeout)
    return load_results(out_dir)


def reference_and_engine(nproc: int, args: list[str], engine_args: list[str], tmp: Path,
                         timeout: float = 400) -> tuple[dict[int, RankResult], dict[int, RankResult]]:
    """workers/mcore_reference.py under torchrun and workers/ms_engine.py under mmrun (msrun) with the same
    arguments, side by side (each waits on its launcher's rendezvous much of the time), then their results."""
    logs = tmp / "mindspore_logs"
    reference = _start(_torchrun_cmd(WORKERS / "mcore_reference.py", nproc, ["--out-dir", str(tmp / "mcore"), *args]))
    engine = _start(_mmrun_cmd(WORKERS / "ms_engine.py", nproc,
                               ["--out-dir", str(tmp / "mindspore"), *args, *engine_args], logs))
    engine_job, reference_job = _finish(engine, timeout), _finish(reference, timeout)
    assert reference_job.returncode == 0, reference_job.stdout[-4000:]
    assert engine_job.returncode == 0, engine_job.stdout[-3000:] + _log_tail(logs)
    return load_results(tmp / "mcore"), load_results(tmp / "mindspore")


@contextmanager
def cpu_load(processes: int):
    """`processes` busy loops (nice 0) for the duration: a loaded machine, where one rank can wait on another
    for tens of seconds (MindSpore's CPU collectives gave up after 30 s: launchers/run.py, CPU_COMM_TIMEOUT_VAR)."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(processes)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


class Jobs:
    """What the tests use from here (test modules cannot import conftest under --import-mode=importlib)."""

    workers = WORKERS
    env = staticmethod(job_env)
    mmrun = staticmethod(mmrun)
    msrun = staticmethod(msrun)
    reference_and_engine = staticmethod(reference_and_engine)
    cpu_load = staticmethod(cpu_load)


@pytest.fixture
def jobs() -> type[Jobs]:
    return Jobs


@pytest.fixture(scope="module")
def jobs_module() -> type[Jobs]:
    """The same, for module-scoped fixtures."""
    return Jobs
