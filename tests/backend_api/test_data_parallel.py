"""Data-parallel TrainStep in two real processes (mmrun -> torchrun / msrun): gradients are averaged
over ranks before clipping, so both ranks end identical and equal to one process with the whole batch.
MindSpore runs with jit on, where the all-reduce is inside the compiled step: with one micro-batch per rank in
the one graph of the whole step, with two in the update graph, there over several gradient buckets."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).parent / "workers" / "dp_train_step.py"


def _env(framework: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MMRUN_", "MS_", "PET_", "TORCHELASTIC_"))
           and k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RANK_ID", "RANK_SIZE"}}
    # msrun starts workers as `python` from PATH: it must be this interpreter.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(MMRUN_AI_FRAMEWORK=framework, OMP_NUM_THREADS="1")
    return env


def _run(command: list[str], env: dict[str, str], timeout: int = 400) -> subprocess.CompletedProcess:
    # A new session, killed as a whole on timeout: msrun can leave workers behind.
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(command, proc.returncode, out, "")


def _load(folder: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """framework, jit -> rank0.json of one process with the whole batch: made once, the two MindSpore cases share it."""
    done: dict = {}

    def get(framework: str, jit: str) -> dict:
        if (framework, jit) not in done:
            out = tmp_path_factory.mktemp(f"one-{framework}")
            single = _run([sys.executable, str(WORKER), "--out-dir", str(out), "--jit", jit], _env(framework))
            assert single.returncode == 0, single.stdout[-3000:]
            done[framework, jit] = _load(out)["rank0.json"]
        return done[framework, jit]
    return get


@pytest.mark.slow
@pytest.mark.parametrize("framework, jit, split", [("pytorch", "off", []), ("mindspore", "on", []),
                                                  ("mindspore", "on", ["--micro-batches", "2",
                                                                       "--bucket-elements", "3000"])])
def test_two_ranks_equal_one_process_with_the_global_batch(tmp_path, one_process, framework, jit, split):
    env = _env(framework)
    reference = one_process(framework, jit)
    two = _run([sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", framework, "--nproc-per-node", "2",
                "--master-port", "0", "--log-dir", str(tmp_path / "logs"), str(WORKER),
                "--out-dir", str(tmp_path / "two"), "--jit", jit, *split], env)
    assert two.returncode == 0, two.stdout[-4000:]
    ranks = _load(tmp_path / "two")
    assert sorted(ranks) == ["rank0.json", "rank1.json"] and reference["world_size"] == 1
    assert min(reference["grad_norms"]) > 0.02  # clipping was active on every step
    for result in ranks.values():
        assert result["world_size"] == 2
        if split:
            assert result["buckets"] > 3  # the small bucket size split the gradients
        np.testing.assert_allclose(result["losses"], reference["losses"], atol=2e-6)
        np.testing.assert_allclose(result["grad_norms"], reference["grad_norms"], rtol=1e-5)
        for name, value in reference["params"].items():
            np.testing.assert_allclose(result["params"][name], value, atol=1e-6)
    first, second = ranks["rank0.json"]["params"], ranks["rank1.json"]["params"]
    assert all(first[name] == second[name] for name in first)  # bit-identical ranks


def test_gradient_buckets_hold_parameters_in_order_up_to_the_limit():
    from mmrun.backend.mindspore.train_step import _bucket_ranges
    assert _bucket_ranges([5, 5, 5], 10) == ((0, 2), (2, 3))
    assert _bucket_ranges([3, 20, 3], 10) == ((0, 1), (1, 2), (2, 3))  # a larger tensor travels alone
    assert _bucket_ranges([4, 6], 10) == ((0, 2),)  # exactly full
    assert _bucket_ranges([7]) == ((0, 1),)
    assert _bucket_ranges([1] * 5, 10, tensors=2) == ((0, 2), (2, 4), (4, 5))  # a graph splits each bucket by nested calls
