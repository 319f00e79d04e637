"""The fixed-shape batch of MindSpore's compiled step (models/pretrain_vlm.py fixed_shape_collate) gives the grid
batch's logits, loss and gradients, for images, videos (Qwen2.5-VL's second_per_grid_ts in the host positions) and
both in one batch (Qwen3-VL's per-frame video blocks): Qwen2.5-VL's windows as per-patch segment ids (vision_layout.window_segment_ids),
Qwen3-VL's learned-position taps and DeepStack (qwen3_vl.modeling.fixed_vision_inputs, embed_fixed), the patches
padded to a bucket. PyTorch in this process; MindSpore, compiled (mindspore.jit), in one subprocess
(workers/vlm_fixed_run.py) on the same weights and batch."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).resolve().parent / "workers" / "vlm_fixed_run.py"


@pytest.fixture(scope="module")
def cases(tiny, tiny3, hf_dirs, tmp_path_factory) -> dict[str, np.ndarray]:
    """Per case: the model directory and the grid batch (with its host M-RoPE positions)."""
    qwen3 = tmp_path_factory.mktemp("qwen3_vl_fixed")
    tiny3.hf_model().save_pretrained(qwen3)
    out: dict[str, np.ndarray] = {}
    for case, path, batch in (("qwen2_5_vl-image", hf_dirs["qwen2_5_vl"], tiny.image_batch()),
                              ("qwen2_5_vl-video", hf_dirs["qwen2_5_vl"], tiny.video_batch()),
                              ("qwen3_vl-image", qwen3, tiny3.image_batch()),
                              ("qwen3_vl-mixed", qwen3, tiny3.image_video_batch()),
                              ("qwen3_vl-text", qwen3, tiny3.text_batch())):
        out[f"{case}/dir"] = np.array(str(path))
        out.update({f"{case}/{k}": v for k, v in batch.items()})
    return out


# One compiled MindSpore step (its compile is the cost: ~30 s of CPU): Qwen3-VL on an image + video batch, whose
# step adds the most to Qwen2-VL's compiled one (position taps, DeepStack, the videos' rows after the images');
# Qwen2.5-VL's adds one segment-id tensor to it, and its demo job is compared with PyTorch's in docs/multimodal.md
# (Where it stands).
TRAINED = ("qwen3_vl-mixed",)


@pytest.fixture(scope="module")
def torch_results(worker, cases):
    import importlib.util

    spec = importlib.util.spec_from_file_location("mmrun_tests_vlm_fixed_run", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run_cases(cases, train=TRAINED)


@pytest.mark.parametrize("case", ["qwen2_5_vl-image", "qwen2_5_vl-video", "qwen3_vl-image", "qwen3_vl-mixed",
                                  "qwen3_vl-text"])
def test_the_fixed_shape_batch_trains_like_the_grid_batch_on_pytorch(torch_results, case):
    grid, fixed = torch_results[f"{case}/grid"], torch_results[f"{case}/fixed"]
    np.testing.assert_allclose(fixed["loss"], grid["loss"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(fixed["logits"], grid["logits"], rtol=0, atol=1e-5)
    assert sorted(fixed["grads"]) == sorted(grid["grads"]) and len(grid["grads"]) > 20
    for name in grid["grads"]:
        np.testing.assert_allclose(fixed["grads"][name], grid["grads"][name], rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_the_compiled_mindspore_step_equals_pytorch_on_fixed_shape_batches(torch_results, cases, tmp_path):
    """MindSpore's TrainStep compiled (mindspore.jit) on the fixed-shape batch: PyTorch's loss, gradient norm and
    parameters after one clipped AdamW step (1e-5)."""
    pytest.importorskip("mindspore")
    np.savez(tmp_path / "cases.npz", **{k: v for k, v in cases.items() if k.split("/")[0] in TRAINED})
    env = {**os.environ, "MMRUN_AI_FRAMEWORK": "mindspore", "GLOG_v": "3"}
    done = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "cases.npz"), str(tmp_path / "ms.npz")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ms = dict(np.load(tmp_path / "ms.npz"))
    for case in TRAINED:
        torch_step = torch_results[f"{case}/train"]
        assert abs(float(ms[f"{case}/loss"]) - float(torch_step["loss"])) <= 1e-5, case
        assert abs(float(ms[f"{case}/grad_norm"]) - float(torch_step["grad_norm"])) <= 1e-5, case
        params = [k for k in torch_step if k.startswith("param/")]
        assert len(params) > 20 and sorted(params) == sorted(k[len(case) + 1:] for k in ms if
                                                             k.startswith(f"{case}/param/"))
        for key in params:
            np.testing.assert_allclose(ms[f"{case}/{key}"], torch_step[key], rtol=0, atol=1e-5, err_msg=key)
