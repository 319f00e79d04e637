"""The worker bootstrap as torchrun and msrun start it: a thin parent that records and mirrors its script's end."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mmrun.launchers import heartbeat
from mmrun.launchers import worker_bootstrap

BOOTSTRAP = worker_bootstrap.__file__


@pytest.fixture
def rank_env(tmp_path):
    status = tmp_path / "status"
    status.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "PET_", "RANK", "MMRUN_"))}
    env.update(RANK="3", LOCAL_RANK="1", WORLD_SIZE="4", MMRUN_STATUS_DIR=str(status), OUT=str(tmp_path))
    return env


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def _status(env: dict) -> dict:
    return json.loads((Path(env["MMRUN_STATUS_DIR"]) / "rank_3.json").read_text())


def _bootstrap(env, *args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-u", BOOTSTRAP, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.mark.parametrize("body, returncode, status", [
    ("import sys; print('bye'); sys.exit(7)", 7, {"exit_code": 7, "signal": None, "tail": ["bye"]}),
    ("print('fine')", 0, {"exit_code": 0, "signal": None, "tail": ["fine"]}),
    ("import os, signal; print('going'); os.kill(os.getpid(), signal.SIGKILL)", -9,
     {"exit_code": 137, "signal": 9, "tail": ["going"]}),
    ("import os, resource, signal; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); os.kill(os.getpid(), signal.SIGSEGV)", -11,
     {"exit_code": 139, "signal": 11, "tail": []}),
    ("import sys; sys.exit('a message')", 1, {"exit_code": 1, "signal": None, "tail": ["a message"]}),
])
def test_end_is_recorded_and_mirrored(body, returncode, status, rank_env, tmp_path):
    process = _bootstrap(rank_env, _script(tmp_path, body))
    process.communicate(timeout=60)
    assert process.returncode == returncode  # what torchrun/msrun see: the script's own end
    record = _status(rank_env)
    assert {k: record[k] for k in status} == status
    assert (record["rank"], record["local_rank"], record["forwarded"]) == (3, 1, None)


def test_exception_traceback_is_in_the_tail(rank_env, tmp_path):
    process = _bootstrap(rank_env, _script(tmp_path, "print('step 1')\nraise RuntimeError('loss is nan')\n"))
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1 and "RuntimeError: loss is nan" in err
    tail = _status(rank_env)["tail"]
    assert tail[0] == "step 1" and tail[-1] == "RuntimeError: loss is nan"


def test_signals_to_the_group_reach_the_script_once(rank_env, tmp_path):
    script = _script(tmp_path, """
        import os, signal, sys, time
        seen = []
        signal.signal(signal.SIGUSR1, lambda s, f: seen.append("USR1"))
        signal.signal(signal.SIGTERM, lambda s, f: seen.append("TERM"))
        print("ready", flush=True)
        deadline = time.monotonic() + 60
        while "TERM" not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a second copy of the signal would arrive meanwhile
        print(",".join(seen), flush=True)
        sys.exit(3)
    """)
    # torchrun signals its worker's whole process group; the script runs in a group of its own
    process = _bootstrap(rank_env, script, start_new_session=True)
    assert process.stdout.readline() == "ready\n"
    os.killpg(process.pid, signal.SIGUSR1)
    time.sleep(0.3)
    os.killpg(process.pid, signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    assert out == "USR1,TERM\n" and process.returncode == 3
    assert _status(rank_env)["forwarded"] == signal.SIGTERM  # stopped from outside: not the cause of a failure


def test_script_keeps_the_bootstraps_stdout_and_interpreter_flags(rank_env, tmp_path):
    out_file = tmp_path / "out.txt"
    script = _script(tmp_path, """
        import os, sys
        print(os.fstat(1).st_ino, sys.stdout.write_through, sys.flags.optimize, sys.argv[1:])
    """)
    with out_file.open("w") as handle:
        subprocess.run([sys.executable, "-u", "-O", BOOTSTRAP, script, "--x", "1"], env=rank_env, stdout=handle, timeout=60, check=True)
    assert out_file.read_text() == f"{out_file.stat().st_ino} True 1 ['--x', '1']\n"


def test_script_dies_with_its_bootstrap(rank_env, tmp_path):
    script = _script(tmp_path, """
        import os, time
        print(os.getpid(), flush=True)
        time.sleep(120)
    """)
    process = _bootstrap(rank_env, script)
    child = int(process.stdout.readline())
    process.kill()
    process.wait()
    deadline = time.monotonic() + 10
    while heartbeat.start_ticks(child) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert heartbeat.start_ticks(child) is None  # ended (or a zombie of a parent that is gone)
    assert not (Path(rank_env["MMRUN_STATUS_DIR"]) / "rank_3.json").exists()  # nobody could report: mmrun calls it vanished


def test_module_mode_and_missing_script(rank_env, tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "job.py").write_text("import sys; print(__name__, sys.argv[1:])\n")
    result = subprocess.run([sys.executable, BOOTSTRAP, "-m", "pkg.job", "--y"], env=rank_env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, "__main__ ['--y']\n")
    result = subprocess.run([sys.executable, BOOTSTRAP], env=rank_env, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (2, "worker_bootstrap: no script given\n")


# --- the progress file ------------------------------------------------------------------------


def test_progress_ring_keeps_the_last_lines(tmp_path):
    path = str(tmp_path / "p")
    heartbeat.create(path, os.getpid(), rank=5, local_rank=2)
    writer = heartbeat._Writer(path)
    for i in range(3000):  # about 50 KiB: the 16 KiB ring wraps several times
        writer.record(f"line {i} ünïcode\n")
    writer.record("partial")
    progress = heartbeat.read_progress(path)
    assert progress.tail == tuple(f"line {i} ünïcode" for i in range(2981, 3000)) + ("partial",)
    assert (progress.rank, progress.local_rank, progress.writer_pid) == (5, 2, os.getpid())
    assert progress.writer_alive() and not progress.finished


def test_progress_time_and_heartbeats(tmp_path):
    path = str(tmp_path / "p")
    heartbeat.create(path, os.getpid(), rank=0, local_rank=0)
    created = heartbeat.read_progress(path)
    assert created.last_progress == created.created and created.tail == ()
    time.sleep(0.2)
    assert heartbeat.read_progress(path).silent_for() >= 0.2
    writer = heartbeat._Writer(path)
    writer.beat()
    writer.beat()
    progress = heartbeat.read_progress(path)
    assert progress.beats == 2 and progress.silent_for() < 0.2
    writer.finish()
    assert heartbeat.read_progress(path).finished


def test_progress_of_a_dead_writer_and_a_foreign_file(tmp_path):
    path = str(tmp_path / "p")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    heartbeat.create(path, int(dead.stdout), rank=0, local_rank=0)
    assert not heartbeat.read_progress(path).writer_alive()
    (tmp_path / "other").write_text("not a progress file")
    assert heartbeat.read_progress(tmp_path / "other") is None and heartbeat.read_progress(tmp_path / "missing") is None


def test_heartbeat_outside_mmrun_does_nothing():
    code = "from mmrun.launchers.heartbeat import heartbeat; heartbeat(); print('ok')"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout == "ok\n"


def test_the_scheduler_ends_cleanly_once_every_rank_has_written_its_end(tmp_path):
    """MindSpore's scheduler notices departed workers on a 5-second tick and msrun waits for it: the scheduler's
    bootstrap ends it (exit 0) as soon as every rank's status file is newer than the scheduler. A file older
    than it (a restarted job's) does not count. The stand-in scheduler would otherwise serve for two minutes."""
    status = tmp_path / "status"
    status.mkdir()
    stale = status / "rank_1.json"
    stale.write_text("{}")
    os.utime(stale, (1, 1))
    driver = textwrap.dedent(f"""
        import os, sys, threading, time
        from pathlib import Path
        from mmrun.launchers import worker_bootstrap
        status = Path({str(status)!r})
        child = worker_bootstrap._Child()
        if child.fork() == 0:
            time.sleep(120)
            os._exit(3)
        start = time.monotonic()
        threading.Timer(0.5, (status / "rank_0.json").write_text, ["{{}}"]).start()
        threading.Timer(1.5, (status / "rank_1.json").write_text, ["{{}}"]).start()
        wait_status = child.wait_scheduler(str(status), 2)
        try:
            os.kill(child.pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        print(wait_status, alive, time.monotonic() - start >= 1.5)
    """)
    run = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["0", "False", "True"]  # a clean end, the scheduler gone, not before rank 1's end
