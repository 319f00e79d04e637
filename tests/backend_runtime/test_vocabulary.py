"""One vocabulary for frameworks and devices, read the same way by every room of the house."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from mmrun.backend import vocabulary
from mmrun.backend.errors import FrameworkChoiceError, UsageError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("spelling, name", [("pytorch", "pytorch"), ("PyTorch", "pytorch"), ("torch", "pytorch"),
                                            (" MindSpore ", "mindspore"), ("MINDSPORE", "mindspore")])
def test_framework_spellings(spelling, name):
    assert vocabulary.framework_name(spelling) == name


def test_unknown_framework_says_where_it_came_from():
    with pytest.raises(FrameworkChoiceError, match="Unknown AI framework 'jax' from MMRUN_AI_FRAMEWORK=jax. Choose one of: pytorch, mindspore"):
        vocabulary.framework_name("jax", "MMRUN_AI_FRAMEWORK=jax")


@pytest.mark.parametrize("spelling, kind", [("npu", "npu"), ("Ascend", "npu"), ("npu:3", "npu"), ("GPU", "cuda"),
                                            ("cuda:1", "cuda"), ("CPU", "cpu")])
def test_device_spellings(spelling, kind):
    assert vocabulary.device_kind(spelling) == kind


def test_unknown_device_is_a_usage_error():
    with pytest.raises(UsageError, match="Unknown device 'tpu'"):
        vocabulary.device_kind("tpu")


def test_every_mindspore_target_has_a_device_kind():
    assert set(vocabulary.MINDSPORE_TARGETS) == set(vocabulary.DEVICES)


def _assigned_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_frameworks_devices_and_usage_errors_are_defined_once():
    owners: dict[str, list[str]] = {"FRAMEWORKS": [], "DEVICES": [], "UsageError": []}
    for path in ROOT.rglob("*.py"):
        if {".venv", "tests", "build"} & set(path.relative_to(ROOT).parts):
            continue
        text = path.read_text(encoding="utf-8")
        assigned = _assigned_names(path)
        for name in ("FRAMEWORKS", "DEVICES"):
            if name in assigned:
                owners[name].append(str(path.relative_to(ROOT)))
        if "class UsageError" in text:
            owners["UsageError"].append(str(path.relative_to(ROOT)))
    assert owners == {"FRAMEWORKS": ["backend/vocabulary.py"], "DEVICES": ["backend/vocabulary.py"],
                      "UsageError": ["backend/errors.py"]}


def test_the_launcher_reads_the_framework_variable_as_the_backend_does(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    env = {"PATH": "/usr/bin:/bin", "MMRUN_AI_FRAMEWORK": "MindSpore"}
    out = subprocess.run([sys.executable, "-m", "mmrun.launchers.cli", "--dry-run", str(script)],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "mindspore.parallel.cluster.run" in out.stdout and "export MMRUN_AI_FRAMEWORK=mindspore" in out.stdout
