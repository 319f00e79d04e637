"""docs/parallelism-mindspore.md's example stays true: models/megatron_gpt_demo.py trains under mmrun with
TP=2, and a split the processes cannot make is one line, exit 2."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


DEMO = Path(__file__).resolve().parents[2] / "models" / "megatron_gpt_demo.py"


def test_a_split_one_process_cannot_make_is_one_line(jobs):
    run = subprocess.run([sys.executable, str(DEMO), "--tensor-model-parallel-size", "2"], capture_output=True,
                         text=True, env=jobs.env(), timeout=180)
    assert run.returncode == 2
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: the world size (1) must be a multiple of --tensor-model-parallel-size (2) x "
                      "--pipeline-model-parallel-size (1); start tp x pp x dp processes"]
    assert "Traceback" not in run.stderr


# The TP=2 run itself (its banner and five loss lines) is docs/parallelism-mindspore.md's example `demo-tp2`,
# checked line by line by tests/docs/test_docs_drift.py: one run, not two.
