"""Layer-wise dumps of one checkpoint on both frameworks, compared; a perturbed weight and a test-only gradient
hook named as the first diverging module; an injected Inf stopping at its step with the module named.

The worker (workers/probe_gpt.py) trains one step of a tiny GPT from numpy weights through the real
TrainStep and TrainingProbe; each run is a fresh process (one framework per process)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmrun.precision import dump_files
from mmrun.precision.cli import main
from mmrun.precision.dump_config import DumpConfigError, load_dump_config

WORKER = Path(__file__).parent / "workers" / "probe_gpt.py"


def probe(framework: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    # The worker picks its framework itself: a choice this test process made earlier (backend.select exports
    # MMRUN_AI_FRAMEWORK for child processes) must not reach it.
    env = {k: v for k, v in os.environ.items() if k != "MMRUN_AI_FRAMEWORK"}
    return subprocess.run([sys.executable, str(WORKER), framework, str(out), *extra], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("dumps")
    runs = {"pt": ("pytorch",), "ms": ("mindspore",),
            "weight": ("pytorch", "--perturb", "h.1.mlp.c_fc.weight"),
            "grad": ("pytorch", "--scale-grad", "h.0.attn"),
            "pt_tensor": ("pytorch", "--task", "tensor"),
            "weight_tensor": ("pytorch", "--task", "tensor", "--perturb", "h.1.mlp.c_fc.weight")}
    for name, (framework, *extra) in runs.items():
        result = probe(framework, root / name, *extra)
        assert result.returncode == 0, result.stdout + result.stderr
    return root


def first_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith(("first", "verdict"))]


def test_dump_layout_is_msprobes(dumps):
    dump, tensors = dump_files.read_step(dumps / "pt" / "step0" / "rank0")
    assert (dump["task"], dump["level"], dump["framework"]) == ("statistics", "L0", "pytorch") and tensors == {}
    names = list(dump["data"])
    assert len(names) == 56 and names[0] == "Module.wte.Embedding.forward.0"
    assert names.index("Module.h.1.mlp.c_fc.Linear.forward.0") < names.index("Module.h.1.mlp.MLP.forward.0")
    assert names[-1] == "Module.wte.Embedding.backward.0"
    entry = dump["data"]["Module.h.1.mlp.MLP.forward.0"]["output"][0]
    assert entry["type"] == "torch.Tensor" and entry["shape"] == [2, 16, 32] and entry["Norm"] > 0
    assert set(dump["data"]["Module.h.1.mlp.MLP.backward.0"]) == {"input", "output"}
    ms = json.loads((dumps / "ms" / "step0" / "rank0" / "dump.json").read_text())
    assert ms["framework"] == "mindspore" and list(ms["data"]) == names  # the same names, in the same order
    _, tensors = dump_files.read_step(dumps / "pt_tensor" / "step0" / "rank0")
    assert tensors["Module.h.1.mlp.MLP.forward.0.output.0"].shape == (2, 16, 32)


def test_identical_runs_and_the_two_frameworks_pass(dumps, capsys):
    assert main(["--dump", str(dumps / "pt"), str(dumps / "pt_tensor")]) == 0  # the same run, statistics compared
    assert main(["--dump", str(dumps / "pt"), str(dumps / "ms")]) == 0
    assert first_lines(capsys)[-1].startswith("verdict: PASS: every paired module agrees")


def test_perturbed_weight_is_the_first_forward_module(dumps, capsys):
    assert main(["--dump", str(dumps / "pt"), str(dumps / "weight")]) == 1
    lines = first_lines(capsys)
    assert lines[0].startswith("first diverging module: h.1.mlp.c_fc (forward, step 0 rank 0: "
                               "Module.h.1.mlp.c_fc.Linear.forward.0 output.0: Max ")
    assert main(["--dump", str(dumps / "pt_tensor"), str(dumps / "weight_tensor")]) == 1  # msprobe's cosine rule
    lines = first_lines(capsys)
    assert lines[0].startswith("first diverging module: h.1.mlp.c_fc (forward") and "cosine 0.90" in lines[0]
    assert lines[1].startswith("first diverging module in backward: h.1.mlp.c_fc ")


def test_a_changed_gradient_is_the_first_backward_module(dumps, capsys):
    assert main(["--dump", str(dumps / "pt"), str(dumps / "grad")]) == 1
    lines = first_lines(capsys)
    assert lines[0].startswith("first diverging module: h.0.attn (backward, step 0 rank 0: "
                               "Module.h.0.attn.CausalSelfAttention.backward.0 output.0: ")


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_injected_inf_stops_at_its_step_naming_the_module(tmp_path, framework):
    result = probe(framework, tmp_path, "--inf-grad", "h.1.mlp", "--at", "2", "--steps", "3", "--anomaly", "stop",
                   "--dump-step", "99")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert json.loads(lines[0])["iteration"] == 1 and not any('"iteration": 2' in line for line in lines)
    assert ("error: anomaly at iteration 2: module h.1.mlp (backward) is inf in Module.h.1.mlp.MLP.backward.0 "
            "output.0; iteration 2: grad norm is") in result.stdout
    # No tensor printed: MindSpore's eager PyNative update once handed AdamW's jit the gradients as constants, and
    # its recompile warning printed every one of them (backend/mindspore/train_step.py, _update).
    assert "Tensor(shape=" not in result.stdout + result.stderr


def test_dump_compare_usage_errors(tmp_path, dumps, capsys):
    assert main(["--dump", str(tmp_path), str(dumps / "pt")]) == 2
    assert "no step<S>/rank<R>/dump.json found" in capsys.readouterr().err
    assert main(["--dump", str(dumps / "pt"), str(dumps / "ms"), "--step", "3"]) == 2
    assert "no (step, rank) dumped by both: A has [(0, 0)], B has [(0, 0)], --step 3" in capsys.readouterr().err


@pytest.mark.parametrize("config, message", [
    ({"task": "overflow_check"}, "'task' must be one of statistics, tensor"),
    ({"level": "L1"}, "msprobe's L1 and mix (every API call) are not implemented"),
    ({"step": [0, "1"]}, "'step' must be a list of integers >= 0 (empty: all). Received: [0, '1']"),
    ({"statistics": {"scope": ["a"]}}, "'scope' holds two names (from, to) or none"),
    ({"dump_pth": "x"}, "unknown key(s) dump_pth"),
])
def test_dump_config_errors_name_the_key(tmp_path, config, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(DumpConfigError, match=None) as info:
        load_dump_config(str(path))
    assert message in str(info.value)


def test_dump_config_reads_msprobes_template(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "tensor", "dump_path": "d", "rank": [1], "step": [2, 0], "level": "L0",
                                "tensor": {"scope": [], "list": ["h.1.mlp"], "data_mode": ["all"]}}))
    config = load_dump_config(str(path))
    assert (config.task, config.steps, config.ranks, config.names) == ("tensor", (0, 2), (1,), ("h.1.mlp",))
    assert config.wants_step(2) and not config.wants_step(1) and config.wants_rank(1) and not config.wants_rank(0)


def _msprobe_compare(target: Path, golden: Path, out: Path) -> list[dict]:
    """msprobe's own `compare` (mindstudio-probe, the dev extra) on two of mmrun's step directories."""
    import csv

    msprobe = Path(sys.executable).parent / "msprobe"
    result = subprocess.run([str(msprobe), "compare", "-tp", str(target), "-gp", str(golden), "-o", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (table,) = out.glob("compare_result_*.csv")
    with table.open(newline="") as f:
        return list(csv.DictReader(f))


def test_msprobe_reads_mmruns_dumps(dumps, tmp_path):
    """Users who have msprobe feed it mmrun's dumps: its compare pairs every record (the same Module.* names on
    both frameworks) and computes its statistics diffs; a perturbed weight shows from its module on. Across
    frameworks msprobe flags every record for its dtype spelling (MindSpore's Float32 against torch.float32) and
    requires_grad (MindSpore dumps have none), as it does for its own dumps: the numbers agree, and mmrun compare
    --dump is the cross-framework verdict."""
    rows = _msprobe_compare(dumps / "weight" / "step0", dumps / "pt" / "step0", tmp_path / "weight")
    assert len(rows) > 100 and all(r["Bench Name"] == r["NPU Name"] for r in rows)
    first = next(i for i, r in enumerate(rows) if float(r["Max diff"]) != 0.0)
    assert rows[first]["NPU Name"].startswith("Module.h.1.mlp.c_fc.Linear.forward.0"), rows[first]["NPU Name"]
    assert {r["Result"] for r in rows[:first]} == {"pass"}

    rows = _msprobe_compare(dumps / "ms" / "step0", dumps / "pt" / "step0", tmp_path / "frameworks")
    assert len(rows) > 100 and all(r["Bench Name"] == r["NPU Name"] for r in rows)
    assert all(abs(float(r["Max diff"])) < 1e-4 for r in rows if r["Max diff"] not in ("N/A", ""))
    reasons = {m for r in rows for m in json.loads(r["Err_message"] or "[]")}
    assert reasons <= {"error: The Required_Grad of NPU and Bench are inconsistent",
                       "error: The dtype of NPU and Bench are inconsistent."}, reasons
