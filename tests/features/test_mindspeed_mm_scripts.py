"""MindSpeed-MM's real launch scripts (tests/fixtures/mindspeed_mm/, Ascend/MindSpeed-MM at 57069cd5) as a user
runs them through mmrun: the launch line's training flags, as the script sets them, checked by
`mmrun features --check --device npu` against the entry the user points mmrun at (`pretrain_vlm.py` ->
`models/pretrain_vlm.py`; the single YAML's gpt_args become its flags). The gate must not stop a job whose model
mmrun builds (issue 37, item 6).

The script is parsed as `mmrun translate` parses it (tests/training/real_scripts.py, shared with the test that runs
the scripts: tests/training/test_mindspeed_mm_real_scripts.py).
"""
from __future__ import annotations

import shlex

import pytest

from mmrun.features.cli import main as features_main
from tests.training.real_scripts import FIXTURES, FRAMEWORKS, launch_line


SCRIPTS = sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.sh"))


def test_every_script_of_the_fixtures_is_judged():
    assert len(SCRIPTS) == 26


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_gate_does_not_stop_the_real_script_on_the_npu(name, capsys):
    launcher, entry, args = launch_line(FIXTURES / name)
    code = features_main(["--ai-framework", FRAMEWORKS[launcher], "--device", "npu", "--entry", f"models/{entry}",
                          "--check", shlex.join(args)])
    out = capsys.readouterr()
    stops = [line for line in (out.out + out.err).splitlines() if line.startswith("error")]
    assert code == 0 and not stops, f"{name} ({launcher} {entry}): the gate stops it:\n" + "\n".join(stops)


def test_the_scripts_flags_are_read_as_the_shell_sets_them():
    launcher, entry, args = launch_line(FIXTURES / "mindspore" / "qwen2.5vl" / "finetune_qwen2_5_vl_7b.sh")
    assert (launcher, entry) == ("msrun", "pretrain_vlm.py")
    text = " ".join(args)
    assert "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 --context-parallel-size 1" in text
    assert "--ai-framework mindspore" in text
    launcher, entry, args = launch_line(FIXTURES / "qwen3vl" / "finetune_qwen3vl_8B.sh")
    assert (launcher, entry) == ("torchrun", "pretrain_transformers.py")
    assert "--use-torch-fsdp2" in args and args[-2:] == ["--distributed-backend", "nccl"]
