"""MindSpeed-MM's Qwen3-VL PyTorch form: `pretrain_transformers.py qwen3vl_full_sft_8B.yaml` (the single YAML: FSDP2,
transformers' own Qwen3VLForConditionalGeneration, the huggingface mllm_format data with the qwen3_vl_nothink
template), its keys as MindSpeed-MM writes them, tiny (tests/training/qwen3_vl_job.py), on CPU/gloo."""
from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import clean_env
from .qwen3_vl_job import write_job
from .test_fsdp2_e2e import TRANSFORMERS, _assert_equal, _run


@pytest.mark.slow
def test_the_qwen3_vl_yaml_trains_on_two_fsdp2_ranks_as_one_unsharded_process(tmp_path):
    ref = _run(tmp_path, TRANSFORMERS, [str(write_job(tmp_path, fsdp2=False))], None)
    sharded = _run(tmp_path, TRANSFORMERS, [str(write_job(tmp_path, fsdp2=True))], 2)
    _assert_equal(sharded, ref, range(1, 4))
    assert ref[3] < ref[1]


def test_the_yamls_unused_keys_are_one_notice_and_a_typo_is_named(tmp_path):
    """MindSpeed-MM's gpt_args flags for what mmrun does anyway are ignored with one warning; a misspelt key
    stops the job before any model is built (exit 2, did-you-mean). No model directory is written: the second
    run stops, exit 2, at the missing init_from_hf_path after the arguments are read."""
    job = write_job(tmp_path, fsdp2=False, make_demo_files=False)
    typo = job.read_text().replace("micro_batch_size:", "micro_bach_size:")
    (tmp_path / "typo.yaml").write_text(typo)
    done = subprocess.run([sys.executable, str(TRANSFORMERS), str(tmp_path / "typo.yaml")], cwd=tmp_path,
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "unrecognized argument '--micro-bach-size'" in done.stderr
    assert "did you mean --micro-batch-size?" in done.stderr
    done = subprocess.run([sys.executable, str(TRANSFORMERS), str(job)], cwd=tmp_path,
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"init_from_hf_path {tmp_path / 'demo' / 'model'} has no config.json" in done.stderr
    warnings = [line for line in done.stderr.splitlines() if "--optimizer-selection" in line]
    assert len(warnings) == 1 and "--init-model-with-meta-device" in warnings[0], done.stderr[-2000:]
    assert "ignoring --swiglu: the model's structure comes from --mm-model" in done.stderr
