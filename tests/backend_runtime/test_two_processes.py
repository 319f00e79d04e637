"""Two real processes per framework under `mmrun` (torchrun for pytorch, msrun for mindspore), and
under a bare msrun as the Ascend guides write it (no mmrun worker bootstrap: the backend alone must
read msrun's rank variables and keep the scheduler process out of the training body).

Checked: rank information, all_reduce sum/mean, broadcast, barrier, all_gather_object, and seeded
random numbers equal to a single process's. One launch feeds every assertion: the worker writes one
JSON file per rank."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

EXPECTED = {
    "pytorch": {"device_kind": "cpu", "dist_backend": "gloo",
                "replaced": "nccl does not work with pytorch on cpu; using gloo"},
    "mindspore": {"device_kind": "cpu", "dist_backend": "mccl",
                  "replaced": "nccl does not work with mindspore on cpu; using mccl"},
}


def _results(folder: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def _command(launcher: str, framework: str, port: int, logs: Path, script: list[str]) -> list[str]:
    if launcher == "mmrun":
        return [sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", framework, "--nproc-per-node", "2",
                "--master-port", str(port), "--log-dir", str(logs), *script]
    return [sys.executable, "-m", "mindspore.parallel.cluster.run", "--worker_num", "2", "--local_worker_num", "2",
            "--master_port", str(port), "--join", "True", "--cluster_time_out", "120", "--log_dir", str(logs),
            *script, "--ai-framework", framework]


@pytest.mark.slow
@pytest.mark.parametrize("framework, launcher", [("pytorch", "mmrun"), ("mindspore", "mmrun"), ("mindspore", "msrun")])
def test_two_processes(framework, launcher, tmp_path, workers_dir, run_python, clean_env, launch, free_port):
    worker = str(workers_dir / "collectives_worker.py")
    env = clean_env(MMRUN_AI_FRAMEWORK=framework)
    single = run_python(args=[worker, "--out-dir", str(tmp_path / "single")], env=env)
    assert single.returncode == 0, single.stderr[-3000:]
    expected_seeded = _results(tmp_path / "single")["rank0.json"]["seeded"]

    logs = tmp_path / "logs"
    script = [worker, "--out-dir", str(tmp_path / "two"), "--distributed-backend", "nccl"]
    # The bare msrun run gets no MMRUN_AI_FRAMEWORK: `--ai-framework` in the script's arguments decides.
    proc = launch(_command(launcher, framework, free_port(), logs, script), clean_env(), timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]

    results = _results(tmp_path / "two")
    # One file per worker: under msrun the scheduler process never reached the training body.
    assert sorted(results) == ["rank0.json", "rank1.json"]
    for rank in (0, 1):
        out = results[f"rank{rank}.json"]
        assert out["info"]["framework"] == framework
        assert (out["info"]["rank"], out["info"]["local_rank"], out["info"]["world_size"]) == (rank, rank, 2)
        assert out["info"]["device_kind"] == EXPECTED[framework]["device_kind"]
        assert out["info"]["dist_backend"] == EXPECTED[framework]["dist_backend"]
        assert out["script_saw_ai_framework"] == framework  # the script's own parser still sees the option
        assert out["input_after"] == [rank + 1.0, 10.0 * (rank + 1)]  # collectives leave their input alone
        assert out["sum"] == [3.0, 30.0] and out["mean"] == [1.5, 15.0]
        assert out["broadcast_from_last"] == [101.0]
        assert out["gathered"] == [{"rank": 0, "tag": "r0", "pid_is_int": True},
                                   {"rank": 1, "tag": "r1", "pid_is_int": True}]
        assert out["seeded"] == expected_seeded

    everything = proc.stdout + "".join(p.read_text(errors="replace") for p in logs.rglob("*.log"))
    assert everything.count(EXPECTED[framework]["replaced"]) >= 2  # the notice, once per rank
    if framework == "mindspore":
        scheduler_log = (logs / "scheduler.log").read_text(errors="replace")
        assert "wrote result" not in scheduler_log and "Traceback" not in scheduler_log
