"""A rank that dies is found within seconds, with its real status (128+N for signal N), on both launchers."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# Bound on the time from the rank's death to mmrun's exit. Measured here: about 1 s on both launchers;
# before, msrun took 34 s (it waits on its scheduler) and mmrun answered 1.
FOUND_WITHIN_S = 15.0


@pytest.mark.parametrize("framework, kill_signal", [("pytorch", "SIGKILL"), ("mindspore", "SIGKILL"), ("pytorch", "SIGSEGV")])
def test_rank_killed_by_a_signal(framework, kill_signal, job_env, tmp_path, jobs):
    job_env.update(KILL_RANK="1", KILL_SIGNAL=kill_signal, SLEEP="120")
    result = jobs.run(["--ai-framework", framework, "--nproc-per-node", "2", "--master-port", "0",
                       str(jobs.workers / "kill_rank.py")], job_env, tmp_path)
    ended = time.time()
    number = getattr(signal, kill_signal)
    assert result.returncode == 128 + number, result.stderr[-3000:]
    assert f"mmrun: rank 1 (local rank 1) was killed by signal {number} ({kill_signal}): exit code {128 + number}" in result.stderr
    assert "rank 1 is about to be killed" in result.stderr.split("was killed by signal")[1]  # its last lines
    assert ended - json.loads((tmp_path / "killed.json").read_text())["time"] < FOUND_WITHIN_S


def test_rank_whose_bootstrap_is_killed_on_msrun(job_env, tmp_path, jobs):
    # Nobody can report this rank's end: mmrun notices its bootstrap is gone and stops the job.
    job_env.update(KILL_RANK="1", WHO="bootstrap", SLEEP="120")
    result = jobs.run(["--ai-framework", "mindspore", "--nproc-per-node", "2", "--master-port", "0",
                       str(jobs.workers / "kill_rank.py")], job_env, tmp_path)
    ended = time.time()
    killed = json.loads((tmp_path / "killed.json").read_text())
    assert result.returncode == 1, result.stderr[-3000:]
    assert (f"mmrun: rank 1 (local rank 1) ended without reporting how: its bootstrap (pid {killed['victim']}) "
            "was killed from outside; exit code unknown (1)") in result.stderr
    assert ended - killed["time"] < FOUND_WITHIN_S


def test_rank_killed_by_sigterm_from_outside_on_msrun(job_env, tmp_path, jobs):
    job_env.update(KILL_RANK="0", KILL_SIGNAL="SIGTERM", SLEEP="120")
    result = jobs.run(["--ai-framework", "mindspore", "--nproc-per-node", "2", "--master-port", "0",
                       str(jobs.workers / "kill_rank.py")], job_env, tmp_path)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    assert "mmrun: rank 0 (local rank 0) was killed by signal 15 (SIGTERM)" in result.stderr


def test_failure_found_when_msrun_does_not_join(job_env, tmp_path, jobs):
    # msrun --join False returns at once; mmrun waits for the workers itself and still reports the rank's code
    job_env.update(FAIL_RANK="1", FAIL_CODE="7", SLEEP="120")
    result = jobs.run(["--ai-framework", "mindspore", "--join", "False", "--nproc-per-node", "2", "--master-port", "0",
                       str(jobs.workers / "exit_on_rank.py")], job_env, tmp_path)
    assert result.returncode == 7, result.stderr[-3000:]
    assert "mmrun: rank 1 (local rank 1) failed with exit code 7" in result.stderr


def test_msrun_scheduler_killed_mid_job(job_env, tmp_path, jobs):
    # Without mmrun's watch the ranks would wait --cluster_time_out (600 s) for a scheduler that is gone.
    import subprocess

    from mmrun.launchers.supervisor import processes_with

    job_env["SLEEP"] = "120"
    marker = f"MMRUN_TEST_MARKER={job_env['MMRUN_TEST_MARKER']}"
    process = subprocess.Popen([*jobs.mmrun, "--ai-framework", "mindspore", "--nproc-per-node", "2", "--master-port", "0",
                                str(jobs.workers / "record_env.py")], env=job_env, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while len(list(tmp_path.glob("rank_*.json"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    # the scheduler's bootstrap and the child it forked to serve; the child is the one with a tagged parent
    tagged = processes_with(marker, "MS_ROLE=MS_SCHED")
    (scheduler,) = [pid for pid in tagged if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) in tagged]
    killed = time.monotonic()
    os.kill(scheduler, signal.SIGKILL)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGKILL, err[-3000:]
    assert "mmrun: msrun's scheduler was killed by signal 9 (SIGKILL), and the ranks would wait --cluster_time_out" in err
    assert time.monotonic() - killed < FOUND_WITHIN_S
