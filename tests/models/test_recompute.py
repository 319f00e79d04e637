"""Activation recomputation (models/recompute.py over backend.nn.recompute): a tiny GPT trained 2 steps with
--recompute-granularity full (uniform, block) and selective gives the same losses, gradient norms and weights
as without, bit for bit, on PyTorch (hash dropout 0.1: the recomputed forward replays the masks) and on
MindSpore (PyNative; the compiled step in the slow test). The plans follow Megatron's flags and MindSpeed-MM's
per-module model-json keys."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mmrun.backend.errors import UsageError
from mmrun.models import recompute

WORKER = Path(__file__).resolve().parent / "workers" / "recompute_run.py"


def _runs(framework: str, *extra: str) -> dict[str, dict]:
    done = subprocess.run([sys.executable, str(WORKER), framework, *extra], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["plan"]: r for r in (json.loads(line) for line in done.stdout.splitlines() if line.startswith("{"))}


def _assert_identical(runs: dict[str, dict]) -> None:
    base = runs["none"]
    for name, run in runs.items():
        assert run["losses"] == base["losses"] and run["grad_norms"] == base["grad_norms"], name
        assert run["max_param_diff"] == 0.0, name


def test_pytorch_recompute_changes_nothing_but_reruns_the_layers():
    runs = _runs("pytorch", "--dropout", "0.1")
    _assert_identical(runs)
    assert runs["full-uniform-1"]["recomputed"] == ["text_decoder (h): 3 of 3 layers (full, uniform 1)"]
    assert runs["none"]["mlp_calls"] == [2, 2, 2]  # 2 steps, one forward each
    assert runs["full-uniform-1"]["mlp_calls"] == [4, 4, 4]  # and one recomputation in each backward
    assert runs["full-block-1"]["mlp_calls"] == [4, 2, 2]  # the first layer only
    assert runs["selective"]["mlp_calls"] == [2, 2, 2]  # the attention only


def test_mindspore_pynative_recompute_changes_nothing():
    _assert_identical(_runs("mindspore", "--jit", "off"))


@pytest.mark.slow
def test_mindspore_compiled_step_recompute_changes_nothing():
    _assert_identical(_runs("mindspore", "--jit", "on", "--plans", "none,full-uniform-1"))


def test_plans_follow_megatrons_flags_and_mindspeed_mms_model_json():
    args = SimpleNamespace(recompute_granularity="full", recompute_method="block", recompute_num_layers="2")
    plans = recompute.plans(args, {"vision_encoder": {"recompute_granularity": "full", "recompute_method": "uniform",
                                                      "recompute_num_layers": 1},
                                   "text_decoder": {"recompute_granularity": None}})
    assert plans["*"].layers(5) == [0, 1] and plans["vision_encoder"].layers(3) == [0, 1, 2]
    assert "text_decoder" not in plans  # null in the json: the flags apply
    assert recompute.from_args(SimpleNamespace(recompute_activations=True)).granularity == "selective"
    assert recompute.from_args(SimpleNamespace(recompute_granularity=None)) is None
    assert recompute.megatron_fields(plans["*"]) == {"recompute_granularity": "full", "recompute_method": "block",
                                                     "recompute_num_layers": 2}
    with pytest.raises(UsageError, match="full recomputation needs recompute_method uniform or block"):
        recompute.from_args(SimpleNamespace(recompute_granularity="full", recompute_method=None))
