"""Two `mmrun --nnodes 2` invocations on loopback form one 4-rank job, as two machines would."""
from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = pytest.mark.slow


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
    outputs = [node.communicate(timeout=240) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], [err[-3000:] for _, err in outputs]
    records = [json.loads((tmp_path / f"reduce_{rank}.json").read_text()) for rank in range(4)]
    assert sorted(r["rank"] for r in records) == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 and r["sum"] == 10.0 and r["framework"] == framework for r in records)
    assert all(r["RANK"] == str(r["rank"]) for r in records)
