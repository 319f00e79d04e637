"""Real jobs through `mmrun`: torchrun and msrun started for real on this CPU machine."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from mmrun.launchers.console import MINDSPORE_LOGS_VAR, is_mindspore_log_line


FRAMEWORKS = ["pytorch", "mindspore"]
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_workers_see_torch_style_rank_variables(framework, job_env, tmp_path, jobs):
    port = jobs.free_port()
    result = jobs.run(["--ai-framework", framework, "--nproc-per-node", "2", "--master-port", str(port),
                        str(jobs.workers / "record_env.py"), "--lr", "0.1"], job_env, tmp_path)
    assert result.returncode == 0, result.stderr
    records = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(2)]
    for rank, record in enumerate(records):
        assert record["RANK"] == str(rank) and record["LOCAL_RANK"] == str(rank)
        assert record["WORLD_SIZE"] == "2" and record["LOCAL_WORLD_SIZE"] == "2"
        assert record["MASTER_PORT"] == str(port) and record["MASTER_ADDR"] == "127.0.0.1"
        assert record["MMRUN_AI_FRAMEWORK"] == framework
        assert record["argv"] == ["--lr", "0.1"]  # a plain script: no --ai-framework appended


def test_torch_workers_keep_pythons_exit_semantics(job_env, tmp_path, jobs):
    # the bootstrap leaves torch workers with os._exit (their C++ teardown can abort a finished rank)
    result = jobs.run(["--ai-framework", "pytorch", "--nproc-per-node", "2", "--master-port", "0",
                       str(jobs.workers / "exit_semantics.py")], job_env, tmp_path)
    assert result.returncode == 5, result.stderr[-2000:]
    assert "mmrun: rank 1 (local rank 1) failed with exit code 5" in result.stderr
    for rank in (0, 1):
        assert (tmp_path / f"unclosed_{rank}.txt").read_text() == "buffered, never closed\n"
        assert (tmp_path / f"thread_{rank}.txt").read_text() == "thread finished\n"
        assert (tmp_path / f"atexit_{rank}.txt").read_text() == "atexit ran\n"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_failing_rank_exit_code_and_log_tail(framework, job_env, tmp_path, jobs):
    job_env.update(FAIL_RANK="1", FAIL_CODE="7", SLEEP="30")
    result = jobs.run(["--ai-framework", framework, "--nproc-per-node", "2", "--master-port", "0",
                        str(jobs.workers / "exit_on_rank.py")], job_env, tmp_path)
    assert result.returncode == 7, result.stderr[-2000:]
    assert "mmrun: rank 1 (local rank 1) failed with exit code 7" in result.stderr
    tail_start = result.stderr.index("mmrun: rank 1 (local rank 1) failed")
    assert "lines of" in result.stderr[tail_start:]  # msrun: its log file; torchrun: its recorded output
    assert "rank 1 is about to fail" in result.stderr[tail_start:]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_port_in_use_exits_2_before_spawning(framework, job_env, tmp_path, jobs):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = jobs.run(["--ai-framework", framework, "--nproc-per-node", "2", "--master-port", str(port),
                            str(jobs.workers / "record_env.py")], job_env, tmp_path)
    assert result.returncode == 2
    assert f"master port {port} is already in use" in result.stderr
    assert not list(tmp_path.glob("rank_*.json"))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_sigterm_leaves_no_process(framework, job_env, tmp_path, jobs):
    job_env["SLEEP"] = "120"
    process = subprocess.Popen([*jobs.mmrun, "--ai-framework", framework, "--nproc-per-node", "2", "--master-port", "0",
                                str(jobs.workers / "record_env.py")], env=job_env, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("rank_*.json"))) < 2:
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()[1]
        time.sleep(0.1)
    workers = [json.loads(p.read_text())["pid"] for p in tmp_path.glob("rank_*.json")]
    assert len(jobs.marked_processes(job_env["MMRUN_TEST_MARKER"])) >= 4  # mmrun, launcher, 2 workers
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 128 + signal.SIGTERM
    assert jobs.marked_processes(job_env["MMRUN_TEST_MARKER"]) == []
    for pid in workers:  # gone, or a zombie waiting for a reaper that is not ours (state Z)
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "State:\tZ" in status.read_text()


def test_dry_run_prints_command_and_environment(job_env, tmp_path, jobs):
    job_env.update(MS_ROLE="MS_WORKER", MS_SCHED_PORT="8118")
    result = jobs.run(["--ai-framework", "mindspore", "--dry-run", "--nproc_per_node=4", "--nnodes", "2",
                        "--node-rank", "1", "--master-addr", "10.0.0.1", "train.py", "--lr", "1"], job_env, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "-m mindspore.parallel.cluster.run --local_worker_num 4 --worker_num 8 --master_addr 10.0.0.1 " \
           "--master_port 29500 --node_rank 1 --log_dir msrun_log --join True" in lines[0]
    assert lines[0].endswith("train.py --lr 1")  # not here to read: --framework-arg auto appends nothing
    assert "mmrun: note: train.py: not found here; a dry run goes on, a real run would stop" in result.stderr
    assert "export LOCAL_WORLD_SIZE=4" in lines and "export MMRUN_AI_FRAMEWORK=mindspore" in lines
    assert "unset MS_ROLE" in lines and "unset MS_SCHED_PORT" in lines
    assert "removed variables inherited from an outer job: MS_ROLE, MS_SCHED_PORT" in result.stderr
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


@pytest.mark.parametrize("variable, value", [("TASK_QUEUE_ENABLE", "3"), ("CPU_AFFINITY_CONF", "1,npu0:4-2"),
                                             ("CPU_AFFINITY_CONF", "5"), ("CPU_AFFINITY_CONF", "1,gpu0:0-1")])
def test_bad_ascend_variables_are_usage_errors(variable, value, job_env, tmp_path, jobs):
    job_env[variable] = value
    result = jobs.run(["--dry-run", "train.py"], job_env, tmp_path)
    assert result.returncode == 2
    assert f"{variable}={value!r}" in result.stderr


def test_good_ascend_variables_pass(job_env, tmp_path, jobs):
    job_env.update(TASK_QUEUE_ENABLE="2", CPU_AFFINITY_CONF="1,npu0:0-2,npu1:3-3")
    assert jobs.run(["--dry-run", "train.py"], job_env, tmp_path).returncode == 0


def test_conflicting_framework_in_script_arguments(job_env, tmp_path, jobs):
    result = jobs.run(["--ai-framework", "pytorch", "--dry-run", "train.py", "--ai-framework", "mindspore"], job_env, tmp_path)
    assert result.returncode == 2 and "disagrees" in result.stderr


def test_refused_option_exits_2_and_warn_drops_it(job_env, tmp_path, jobs):
    refused = jobs.run(["--ai-framework", "mindspore", "--dry-run", "--max-restarts", "3", "t.py"], job_env, tmp_path)
    assert refused.returncode == 2
    assert "mmrun: error: --max-restarts 3 cannot run under msrun" in refused.stderr
    warned = jobs.run(["--ai-framework", "mindspore", "--on-unsupported", "warn", "--dry-run", "--max-restarts", "3", "t.py"], job_env, tmp_path)
    assert warned.returncode == 0 and "warning: dropped --max-restarts 3" in warned.stderr
    assert "max" not in warned.stdout


def test_module_mode_on_msrun(job_env, tmp_path, jobs):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "job.py").write_text((jobs.workers / "record_env.py").read_text())
    result = jobs.run(["--ai-framework", "mindspore", "--nproc-per-node", "1", "--master-port", "0", "-m", "pkg.job", "--x"], job_env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "rank_0.json").read_text())["argv"] == ["--x"]


@pytest.mark.parametrize("nproc", [1, 2])
def test_msrun_script_that_calls_init_itself(nproc, job_env, tmp_path, jobs):
    # msrun's scheduler must serve even one worker: this script registers on its own.
    result = jobs.run(["--ai-framework", "mindspore", "--nproc-per-node", str(nproc), "--master-port", "0",
                       str(jobs.workers / "ms_init_directly.py")], job_env, tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [json.loads((tmp_path / f"direct_{r}.json").read_text())["size"] for r in range(nproc)] == [nproc] * nproc


def test_msrun_single_worker_that_never_initialises(job_env, tmp_path, jobs):
    result = jobs.run(["--ai-framework", "mindspore", "--nproc-per-node", "1", "--master-port", "0",
                       str(jobs.workers / "record_env.py")], job_env, tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "rank_0.json").read_text())["WORLD_SIZE"] == "1"


def _mindspore_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if is_mindspore_log_line(line.encode())]


def test_mindspore_own_log_lines_stay_in_the_worker_logs_unless_asked(job_env, tmp_path, jobs):
    args = ["--ai-framework", "mindspore", "--nproc-per-node", "2", "--master-port", "0",
            str(jobs.workers / "record_env.py")]
    quiet = jobs.run(args, job_env, tmp_path)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert not _mindspore_lines(quiet.stdout + quiet.stderr), (quiet.stdout + quiet.stderr)[-2000:]
    assert "Start worker process with rank id:1" in quiet.stdout  # msrun's own lines still shown
    kept = "".join(p.read_text(errors="replace") for p in sorted((tmp_path / "msrun_log").glob("worker_*.log")))
    assert _mindspore_lines(kept), kept[-2000:]  # MindSpore's cluster-forming WARNINGs, where msrun wrote them
    shown = jobs.run(args, {**job_env, MINDSPORE_LOGS_VAR: "console"}, tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert _mindspore_lines(shown.stdout + shown.stderr), (shown.stdout + shown.stderr)[-2000:]
