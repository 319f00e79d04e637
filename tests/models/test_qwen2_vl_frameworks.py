"""PyTorch vs MindSpore: the same Qwen2-VL / Qwen2.5-VL weights and batches give the same logits, loss and
gradients; the same seed gives the same initial weights; freezing works alike. MindSpore runs in ONE
subprocess (workers/qwen2_vl_run.py) for every case; PyTorch runs the same functions in this process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).resolve().parent / "workers" / "qwen2_vl_run.py"


@pytest.fixture(scope="module")
def both(tmp_path_factory, tiny, worker, hf_dirs):
    """(cases, torch results, mindspore results)."""
    pytest.importorskip("mindspore")
    cases: dict[str, np.ndarray] = {}
    for model_type, path in hf_dirs.items():
        for batch_name in ("image_batch", "video_batch"):
            case = f"{model_type}-{batch_name}"
            cases.update({f"{case}/{k}": v for k, v in getattr(tiny, batch_name)().items()})
            cases[f"{case}/dir"] = np.array(str(path))
        cases[f"{model_type}-init/kind"], cases[f"{model_type}-init/dir"] = np.array("init"), np.array(str(path))
        cases[f"{model_type}-init/seed"] = np.array(3)
    cases.update({f"per_token/{k}": v for k, v in tiny.image_batch().items()})
    cases["per_token/dir"], cases["per_token/per_token"] = np.array(str(hf_dirs["qwen2_5_vl"])), np.array(True)
    cases.update({f"freeze/{k}": v for k, v in tiny.image_batch().items()})
    cases["freeze/dir"], cases["freeze/kind"] = np.array(str(hf_dirs["qwen2_vl"])), np.array("freeze")
    cases.update({f"lora/{k}": v for k, v in tiny.image_batch().items()})
    cases["lora/dir"], cases["lora/kind"] = np.array(str(hf_dirs["qwen2_vl"])), np.array("lora")
    folder = tmp_path_factory.mktemp("frameworks")
    np.savez(folder / "cases.npz", **cases)
    env = {**os.environ, "MMRUN_AI_FRAMEWORK": "mindspore", "GLOG_v": "3"}
    done = subprocess.run([sys.executable, str(WORKER), str(folder / "cases.npz"),
                           str(folder / "ms.npz")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return cases, worker.run_cases(cases), dict(np.load(folder / "ms.npz"))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["qwen2_vl-image_batch", "qwen2_vl-video_batch", "qwen2_5_vl-image_batch",
                                  "qwen2_5_vl-video_batch", "per_token"])
def test_logits_loss_and_gradients_match(both, case):
    cases, torch_out, ms_out = both
    real = cases[f"{case}/attention_mask"] == 1
    np.testing.assert_allclose(ms_out[f"{case}/logits"][real], torch_out[f"{case}/logits"][real], rtol=0, atol=1e-5)
    np.testing.assert_allclose(ms_out[f"{case}/loss"], torch_out[f"{case}/loss"], rtol=1e-6, atol=1e-5)
    if case == "per_token":  # loss_dict {"loss": sum, "num_tokens": count}
        assert int(ms_out["per_token/num_tokens"]) == int(torch_out["per_token/num_tokens"]) == int(
            (cases["per_token/labels"][:, 1:] != -100).sum())
    grads = sorted(k for k in torch_out if k.startswith(f"{case}/grad/"))
    assert grads == sorted(k for k in ms_out if k.startswith(f"{case}/grad/")) and len(grads) > 50
    for key in grads:
        np.testing.assert_allclose(ms_out[key], torch_out[key], rtol=0, atol=1e-5, err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
def test_same_seed_same_initial_weights_and_names(both, model_type):
    from mmrun.models.qwen2_vl.hf_checkpoint import hf_parameter_names, load_hf_config

    cases, torch_out, ms_out = both
    case = f"{model_type}-init"
    np.testing.assert_array_equal(ms_out[f"{case}/names"], torch_out[f"{case}/names"])  # names and order
    assert sorted(torch_out[f"{case}/names"]) == sorted(hf_parameter_names(load_hf_config(str(cases[f"{case}/dir"]))))
    for name in torch_out[f"{case}/names"]:
        np.testing.assert_array_equal(ms_out[f"{case}/param/{name}"], torch_out[f"{case}/param/{name}"], err_msg=name)
    norm = torch_out[f"{case}/param/model.norm.weight"]
    weight = torch_out[f"{case}/param/model.layers.0.mlp.up_proj.weight"]
    assert np.all(norm == 1) and np.all(torch_out[f"{case}/param/visual.blocks.0.attn.qkv.bias"] == 0)
    assert abs(weight.std() - 0.02) < 0.002


@pytest.mark.slow
def test_frozen_vision_encoder_gets_no_state_and_does_not_move_on_both(both):
    _, torch_out, ms_out = both
    for out in (torch_out, ms_out):
        names = list(out["freeze/optimizer_names"])
        assert names == list(out["freeze/requires_grad"])
        assert not [n for n in names if n.startswith("visual.") and not n.startswith("visual.merger.")]
        assert "visual.merger.mlp.0.weight" in names and "model.layers.0.self_attn.q_proj.weight" in names
        assert not [k for k in out["freeze/state_keys"] if k.startswith("visual.blocks.") or "patch_embed" in k]
        assert out["freeze/frozen_moved"] == 0.0 and out["freeze/trained_moved"] > 1e-4
        assert list(out["freeze/frozen_counts"]) == [25, 0, 0]  # patch_embed + 2 blocks x 12 tensors
    np.testing.assert_array_equal(ms_out["freeze/optimizer_names"], torch_out["freeze/optimizer_names"])


@pytest.mark.slow
def test_lora_trains_only_the_adapters_alike_on_both(both):
    """MindSpeed-MM's Qwen2-VL LoRA targets: adapters on the decoder's, the ViT's and the merger's Linears (24 in
    the tiny model); three AdamW steps give the same losses and adapters on both frameworks, the base stays put."""
    _, torch_out, ms_out = both
    for out in (torch_out, ms_out):
        assert len(out["lora/adapted"]) == 24 and out["lora/base_moved"] == 0.0
        assert all(n.endswith((".lora_A.weight", ".lora_B.weight")) for n in out["lora/optimizer_names"])
        assert out["lora/losses"][-1] < out["lora/losses"][0]
    np.testing.assert_array_equal(ms_out["lora/adapted"], torch_out["lora/adapted"])
    np.testing.assert_allclose(ms_out["lora/losses"], torch_out["lora/losses"], rtol=0, atol=1e-5)
    adapters = sorted(k for k in torch_out if k.startswith("lora/adapter/"))
    assert len(adapters) == 48 and adapters == sorted(k for k in ms_out if k.startswith("lora/adapter/"))
    for key in adapters:  # Adam divides by sqrt(v): gradient differences of 1e-7 move a weight of ~3e-2 by ~1e-5
        np.testing.assert_allclose(ms_out[key], torch_out[key], rtol=0, atol=5e-5, err_msg=key)
