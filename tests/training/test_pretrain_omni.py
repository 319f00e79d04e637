"""models/pretrain_vlm.py trains Qwen2.5-Omni's thinker from MindSpeed-MM's own job files (scripts/qwen2_5omni/:
model_7b.json shrunk, data_7b.json as it is) on a synthetic audio dataset, unsplit, with the same losses on
PyTorch and MindSpore; a split run is refused in one line."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLM_ENTRY = ROOT / "models" / "pretrain_vlm.py"
ITERS = 3
ARGS = ["--micro-batch-size", "2", "--global-batch-size", "4", "--seq-length", "256", "--lr", "2e-3",
        "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--weight-decay", "0", "--clip-grad", "1.0",
        "--seed", "42", "--log-interval", "1", "--eval-iters", "0", "--train-iters", str(ITERS)]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    pytest.importorskip("av")
    spec = importlib.util.spec_from_file_location("mmrun_tests_omni_job", Path(__file__).with_name("omni_job.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root = tmp_path_factory.mktemp("omni_job")
    return module.make_job(root / "files"), root


def _train(tk, job, framework, extra=()):
    paths, root = job
    return tk.run_training(root / framework, [*ARGS, "--mm-model", str(paths["model_json"]), "--mm-data",
                                              str(paths["data_json"]), *extra],
                           framework=framework, nproc=1, timeout=600, entry=VLM_ENTRY)


@pytest.mark.slow
def test_pytorch_and_mindspore_train_the_same_losses(tk, job):
    pt = _train(tk, job, "pytorch")
    assert pt.returncode == 0, pt.output[-3000:]
    assert "frozen (no gradients, no optimizer state): audio_encoder, vision_encoder, vision_projector" in pt.output
    ms = _train(tk, job, "mindspore")
    assert ms.returncode == 0, ms.output[-3000:]
    pt_losses, ms_losses = pt.losses(), ms.losses()
    assert sorted(pt_losses) == sorted(ms_losses) == list(range(1, ITERS + 1))
    assert max(abs(pt_losses[i] - ms_losses[i]) for i in pt_losses) <= 1e-5, (pt_losses, ms_losses)
    assert pt_losses[ITERS] < pt_losses[1] - 0.2, pt_losses


def test_a_split_omni_run_is_refused_in_one_line(tk, job):
    done = _train(tk, job, "pytorch", ["--pipeline-model-parallel-size", "2"])
    assert done.returncode == 2
    assert "Qwen2.5-Omni trains unsplit for now" in done.output
