"""mmrun's watch over a node's ranks, on status folders written the way the bootstrap writes them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from mmrun.launchers import heartbeat
from mmrun.launchers.failure import first_failure, read_statuses
from mmrun.launchers.options import MSRUN, TORCHRUN
from mmrun.launchers.watchdog import WATCHDOG_EXIT_CODE, RankWatch


def _status(folder, rank, code, when, signal=None, forwarded=None, tail=()):
    record = {"rank": rank, "local_rank": rank, "exit_code": code, "signal": signal, "forwarded": forwarded,
              "time": when, "pid": 1, "tail": list(tail)}
    (folder / f"rank_{rank}.json").write_text(json.dumps(record))


def _running(folder, rank, pid=None):
    heartbeat.create(str(folder / f"rank_{rank}.progress"), pid or os.getpid(), rank=rank, local_rank=rank)


def test_a_rank_that_failed_alone_is_the_cause_not_the_ranks_stopped_after_it(tmp_path):
    _status(tmp_path, 0, 143, when=2.0, signal=15, forwarded=15)  # torchrun stopped it after rank 1 failed
    _status(tmp_path, 1, 7, when=3.0, tail=["boom"])  # its status landed later, yet it is the cause
    assert first_failure(read_statuses(tmp_path)).rank == 1
    stop = RankWatch(tmp_path, TORCHRUN, None, stop_on_failure=False).after_exit(1)
    assert stop.exit_code == 7 and stop.lines[:3] == ["mmrun: rank 1 (local rank 1) failed with exit code 7",
                                                      "mmrun: its last line of output:", "  boom"]


def test_only_stopped_ranks_then_the_earliest_is_reported(tmp_path):
    _status(tmp_path, 0, 130, when=2.0, forwarded=2)
    _status(tmp_path, 1, 143, when=1.0, signal=15, forwarded=15)
    stop = RankWatch(tmp_path, TORCHRUN, None, stop_on_failure=False).after_exit(1)
    assert stop.exit_code == 143
    assert stop.lines[0].endswith("after its bootstrap passed SIGTERM on to it (the rank was being stopped)")


def test_success_of_the_launcher_wins_over_an_earlier_attempt(tmp_path):
    _status(tmp_path, 0, 7, when=1.0)  # torchrun --max-restarts: a failed attempt, then success
    assert RankWatch(tmp_path, TORCHRUN, None, stop_on_failure=False).after_exit(0) is None


def test_msrun_stops_at_a_failure_and_at_a_vanished_rank(tmp_path):
    watch = RankWatch(tmp_path, MSRUN, None, stop_on_failure=True)
    _running(tmp_path, 0)
    assert watch.check() is None
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _running(tmp_path, 1, pid=int(dead.stdout))
    stop = watch.check()
    assert stop.exit_code == 1 and stop.lines[0].startswith("mmrun: rank 1 (local rank 1) ended without reporting how")
    _status(tmp_path, 1, 137, when=1.0, signal=9)
    assert watch.check().exit_code == 137
    assert RankWatch(tmp_path, TORCHRUN, None, stop_on_failure=False).check() is None  # torchrun acts itself


def test_watchdog_names_the_silent_rank_and_skips_finished_ones(tmp_path):
    watch = RankWatch(tmp_path, TORCHRUN, None, stop_on_failure=False, watchdog_seconds=0.3)
    _running(tmp_path, 0)
    _running(tmp_path, 1)
    _running(tmp_path, 2)
    writer = heartbeat._Writer(str(tmp_path / "rank_1.progress"))
    writer.record("rank 1 at step 3\n")
    heartbeat._Writer(str(tmp_path / "rank_2.progress")).finish()  # returned; tearing down
    assert watch.check() is None
    time.sleep(0.4)
    heartbeat._Writer(str(tmp_path / "rank_0.progress")).beat()
    stop = watch.check()
    assert stop.exit_code == WATCHDOG_EXIT_CODE
    assert stop.lines[0].startswith("mmrun: error: rank 1 (local rank 1) made no progress for 0.")
    assert stop.lines[1:] == ["mmrun: its last line of output:", "  rank 1 at step 3"]
    assert RankWatch(tmp_path, TORCHRUN, None, stop_on_failure=False).check() is None  # off by default


def test_msrun_scheduler_that_failed_or_vanished_stops_the_job(tmp_path):
    watch = RankWatch(tmp_path, MSRUN, tmp_path / "msrun_log", stop_on_failure=True)
    _running(tmp_path, 0)
    heartbeat.create(str(tmp_path / "scheduler.progress"), os.getpid(), rank=-1, local_rank=-1)
    assert watch.check() is None  # serving
    (tmp_path / "scheduler.json").write_text(json.dumps({"exit_code": 0, "signal": None, "tail": []}))
    assert watch.check() is None  # a clean end before the last rank reported its own
    (tmp_path / "scheduler.json").write_text(json.dumps({"exit_code": 1, "signal": None, "tail": ["OSError: port"]}))
    stop = watch.check()
    assert stop.exit_code == 1 and stop.lines == [
        "mmrun: msrun's scheduler failed with exit code 1, and the ranks would wait --cluster_time_out for it; "
        "stopped the job (exit 1)", "mmrun: its last line of output:", "  OSError: port"]
    (tmp_path / "scheduler.json").write_text(json.dumps({"exit_code": 137, "signal": 9, "tail": []}))
    assert watch.check().lines[0].startswith("mmrun: msrun's scheduler was killed by signal 9 (SIGKILL), and")
    (tmp_path / "scheduler.json").unlink()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    heartbeat.create(str(tmp_path / "scheduler.progress"), int(dead.stdout), rank=-1, local_rank=-1)
    assert "ended without reporting how" in watch.check().lines[0]
