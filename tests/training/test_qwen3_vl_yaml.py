"""MindSpeed-MM's Qwen3-VL PyTorch form: `pretrain_transformers.py qwen3vl_full_sft_8B.yaml` (the single YAML: FSDP2,
transformers' own Qwen3VLForConditionalGeneration, the huggingface mllm_format data with the qwen3_vl_nothink
template), its keys as MindSpeed-MM writes them, tiny (tests/training/qwen3_vl_job.py), on CPU/gloo.

The 2-rank FSDP2 run against the same job unsharded is docs/qwen3-vl.md's `single-yaml` example: the docs drift
test runs it and checks `mmrun compare`'s verdict (rtol 1e-5) and the losses it prints, so it is not run twice."""
from __future__ import annotations

import subprocess
import sys

from .conftest import clean_env
from .qwen3_vl_job import write_job
from .test_fsdp2_e2e import TRANSFORMERS


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
