"""What the training loop hands the runtime around it: Megatron's --distributed-timeout-minutes reaches
torch.distributed's process groups (the default one and megatron-core's), and every iteration tells
mmrun's watchdog (`mmrun --watchdog-seconds N`) that the rank lives (launchers/heartbeat.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.training.conftest import ROOT, clean_env

TINY = ["--mock-data", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length",
        "16", "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2", "--lr",
        "1e-3", "--eval-iters", "0", "--hidden-dropout", "0", "--attention-dropout", "0"]

TIMEOUT_WORKER = """
import sys, torch, torch.distributed as dist
import importlib
pretrain = importlib.import_module("mmrun.training.pretrain")
from mmrun.training.arguments import parse_args
args = parse_args(sys.argv[1:])
job = pretrain.initialize(args)
from megatron.core import parallel_state as ps
def seconds(group):
    return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
print("default", seconds(dist.distributed_c10d._get_default_group()))
print("tensor-parallel", seconds(ps.get_tensor_model_parallel_group()))
"""


def _python(code: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=clean_env(), capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_distributed_timeout_minutes_reaches_the_process_groups():
    """Megatron's initialize_megatron passes it to init_process_group and to parallel_state's sub-groups."""
    done = _python(TIMEOUT_WORKER, *TINY, "--train-iters", "1", "--use-mcore-models",
                   "--distributed-timeout-minutes", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    found = dict(line.rsplit(" ", 1) for line in done.stdout.splitlines() if line.startswith(("default", "tensor")))
    assert found == {"default": "180.0", "tensor-parallel": "180.0"}, done.stdout[-2000:]


def test_distributed_timeout_minutes_is_checked():
    from mmrun.training.arguments import ArgumentsError, parse_args

    with pytest.raises(ArgumentsError, match="--distributed-timeout-minutes must be positive. Received: 0"):
        parse_args([*TINY, "--train-iters", "1", "--distributed-timeout-minutes", "0"])


HEARTBEAT_WORKER = """
import os, runpy, sys
from mmrun.launchers import heartbeat
path = sys.argv[1]
heartbeat.create(path, os.getpid(), rank=0, local_rank=0)
heartbeat.attach(path)  # what mmrun's worker bootstrap does before the user's script runs
sys.argv = ["pretrain_gpt.py", *sys.argv[2:]]
runpy.run_path(sys.argv[0] if os.path.exists(sys.argv[0]) else "models/pretrain_gpt.py", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize("engine", [[], ["--use-mcore-models"]], ids=["mmrun", "megatron-core"])
def test_every_iteration_is_a_heartbeat(tmp_path, engine):
    """A rank that logs every 100th iteration still beats once per iteration, so --watchdog-seconds can
    be shorter than the log interval; output lines count too, hence no log line between the beats."""
    heartbeat = pytest.importorskip("mmrun.launchers.heartbeat", reason="the launcher's heartbeat is not in this tree")
    progress = tmp_path / "rank_0.progress"
    done = _python(HEARTBEAT_WORKER, str(progress), *TINY, "--train-iters", "5", "--log-interval", "100", *engine)
    assert done.returncode == 0, done.stderr[-3000:]
    assert heartbeat.read_progress(progress, lines=0).beats == 5
