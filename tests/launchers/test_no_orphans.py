"""No process of a job outlives mmrun, however mmrun ends: kill -9 of mmrun mid-job, on both launchers."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _wait_for_ranks(folder: Path, count: int, process: subprocess.Popen, timeout: float = 90) -> list[dict]:
    deadline = time.monotonic() + timeout
    while len(list(folder.glob("rank_*.json"))) < count:
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()[1][-3000:]
        time.sleep(0.1)
    return [json.loads(path.read_text()) for path in sorted(folder.glob("rank_*.json"))]


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_kill_9_of_mmrun_leaves_no_process(framework, job_env, tmp_path, jobs):
    job_env["SLEEP"] = "300"
    marker = job_env["MMRUN_TEST_MARKER"]
    process = subprocess.Popen([*jobs.mmrun, "--ai-framework", framework, "--nproc-per-node", "2", "--master-port", "0",
                                str(jobs.workers / "record_env.py")], env=job_env, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    records = _wait_for_ranks(tmp_path, 2, process)
    # mmrun, its guardian, the launcher and a bootstrap + script per rank (msrun: also its scheduler and tails)
    assert len(jobs.marked_processes(marker)) >= 7

    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    killed_at = time.monotonic()
    while jobs.marked_processes(marker) and time.monotonic() - killed_at < 30:
        time.sleep(0.2)
    took = time.monotonic() - killed_at
    assert jobs.marked_processes(marker) == [], "processes still running 30 s after kill -9 of mmrun"
    assert took < 30
    assert "mmrun guardian: mmrun (pid" in process.stderr.read()
    status_dir = Path(records[0]["MMRUN_STATUS_DIR"])
    assert not status_dir.parent.exists()  # the run's temporary folder went with it


def test_guardian_leaves_at_once_after_a_clean_end(job_env, tmp_path, jobs):
    result = jobs.run(["--nproc-per-node", "1", "--master-port", "0", str(jobs.workers / "record_env.py")], job_env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "guardian" not in result.stderr
    assert jobs.marked_processes(job_env["MMRUN_TEST_MARKER"]) == []
    assert not Path(json.loads((tmp_path / "rank_0.json").read_text())["MMRUN_STATUS_DIR"]).parent.exists()


def test_guardian_sweeps_the_run_when_mmrun_dies(tmp_path):
    """The guardian alone, in this process: a tagged sleeper is stopped once its 'mmrun' (a child here) dies."""
    import sys
    import uuid

    from mmrun.launchers.supervisor import RUN_ID_VARIABLE, tagged_processes

    run_id = f"test-{uuid.uuid4().hex[:8]}"
    temp = tmp_path / "run"
    temp.mkdir()
    # A stand-in for mmrun: it starts the guardian, then a tagged process in a session of its own (as msrun's
    # workers are), then dies by SIGKILL without cleaning anything.
    code = f"""
import os, subprocess, sys, time
from mmrun.launchers.guardian import Guardian
Guardian({run_id!r}, {str(temp)!r}).start()
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                 env={{**os.environ, {RUN_ID_VARIABLE!r}: {run_id!r}}})
print("started", flush=True)
time.sleep(300)
"""
    stand_in = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert stand_in.stdout.readline() == "started\n"
    deadline = time.monotonic() + 10
    while not tagged_processes(run_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(tagged_processes(run_id)) == 1
    os.kill(stand_in.pid, signal.SIGKILL)
    stand_in.wait()
    deadline = time.monotonic() + 20
    while (tagged_processes(run_id) or temp.exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tagged_processes(run_id) == [] and not temp.exists()
    assert "stopped 1 process of run " + run_id in stand_in.stderr.read()
