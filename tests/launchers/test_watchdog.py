"""--watchdog-seconds: a rank that shows no progress stops the job (exit 124), on both launchers."""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_a_hanging_rank_stops_the_job(framework, job_env, tmp_path, jobs):
    # rank 1 hangs after one line; rank 0 stays silent but calls heartbeat(), so only rank 1 is named
    job_env.update(HANG_RANK="1", SLEEP="600")
    started = time.monotonic()
    result = jobs.run(["--ai-framework", framework, "--watchdog-seconds", "4", "--nproc-per-node", "2", "--master-port", "0",
                       str(jobs.workers / "hang_rank.py")], job_env, tmp_path, timeout=180)
    took = time.monotonic() - started
    assert result.returncode == 124, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("mmrun: error: rank"))
    assert lines[first].startswith("mmrun: error: rank 1 (local rank 1) made no progress for ")
    assert "(--watchdog-seconds 4) since it last printed a line or called heartbeat(); stopped the job (exit 124)" in lines[first]
    assert lines[first + 1:first + 3] == ["mmrun: its last line of output:", "  rank 1: waiting for a message that never comes"]
    assert "rank 0" not in lines[first]
    assert took < 90  # not the 600 s the ranks would have run


def test_heartbeats_and_output_keep_a_rank_alive(job_env, tmp_path, jobs):
    # no output at all for 6 s, but heartbeat() every 0.2 s: a 2 s watchdog must not fire
    job_env.update(SLEEP="6")
    result = jobs.run(["--watchdog_seconds=2", "--nproc-per-node", "2", "--master-port", "0",
                       str(jobs.workers / "hang_rank.py")], job_env, tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def test_watchdog_is_off_by_default(job_env, tmp_path, jobs):
    # silent for 3 s without heartbeats (record_env sleeps): nothing stops it
    job_env.update(SLEEP="3")
    result = jobs.run(["--nproc-per-node", "1", "--master-port", "0", str(jobs.workers / "record_env.py")], job_env, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
