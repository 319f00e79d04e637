"""docs/parallelism-mindspore.md's example stays true: models/megatron_gpt_demo.py trains under mmrun with
TP=2, and a split the processes cannot make is one line, exit 2."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "models" / "megatron_gpt_demo.py"
LINE = re.compile(r"^ iteration +(\d)/5 \| lm loss: (\S+) \| grad norm: (\S+) \| elapsed \(ms\): \S+$", re.M)


def test_a_split_one_process_cannot_make_is_one_line(jobs):
    run = subprocess.run([sys.executable, str(DEMO), "--tensor-model-parallel-size", "2"], capture_output=True,
                         text=True, env=jobs.env(), timeout=180)
    assert run.returncode == 2
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: the world size (1) must be a multiple of --tensor-model-parallel-size (2) x "
                      "--pipeline-model-parallel-size (1); start tp x pp x dp processes"]
    assert "Traceback" not in run.stderr


@pytest.mark.slow
def test_demo_trains_with_two_tensor_parallel_ranks(tmp_path, jobs):
    job = jobs.mmrun(DEMO, 2, ["--tensor-model-parallel-size", "2"], tmp_path / "logs")
    assert "> megatron GPT on MindSpore: 2 processes = tp 2 x pp 1 x dp 1;" in job.stdout
    lines = LINE.findall(job.stdout)
    assert [int(it) for it, _, _ in lines] == [1, 2, 3, 4, 5]
    losses = [float(loss) for _, loss, _ in lines]
    assert 5.0 < losses[0] < 7.0 and all(float(norm) > 0 for _, _, norm in lines)
