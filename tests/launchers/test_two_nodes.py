"""Two `mmrun --nnodes 2` invocations on loopback form one 4-rank job, as two machines would."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import pytest

pytestmark = pytest.mark.slow


def _wait_for_listener(port: int, node0: subprocess.Popen, timeout: float = 120) -> None:
    """Start the second node once the master (torchrun's store, msrun's scheduler) listens, as a cluster operator would."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and node0.poll() is None:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_two_nodes_all_reduce_over_four_ranks(framework, job_env, tmp_path, jobs):
    port = jobs.free_port()
    nodes = []
    for node_rank in (0, 1):
        folder = tmp_path / f"node{node_rank}"  # each "machine" has its own working dir (msrun_log/)
        folder.mkdir()
        nodes.append(subprocess.Popen(
            [*jobs.mmrun, "--ai-framework", framework, "--nnodes", "2", "--node-rank", str(node_rank),
             "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
             str(jobs.workers / "all_reduce.py")],
            env=job_env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        if node_rank == 0:
            _wait_for_listener(port, nodes[0])
    try:
        outputs = [node.communicate(timeout=180) for node in nodes]
    except subprocess.TimeoutExpired:
        # Kill every process of both jobs first: a launcher blocked in rendezvous ignores SIGTERM and
        # keeps our pipes open, so reading them would wait forever.
        for pid in jobs.marked_processes(job_env["MMRUN_TEST_MARKER"]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        outputs = [node.communicate(timeout=30) for node in nodes]
        pytest.fail("two-node job timed out:\n" + "\n---\n".join(err[-3000:] for _, err in outputs))
    assert [node.returncode for node in nodes] == [0, 0], [err[-3000:] for _, err in outputs]
    records = [json.loads((tmp_path / f"reduce_{rank}.json").read_text()) for rank in range(4)]
    assert sorted(r["rank"] for r in records) == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 and r["sum"] == 10.0 and r["framework"] == framework for r in records)
    assert all(r["RANK"] == str(r["rank"]) for r in records)
