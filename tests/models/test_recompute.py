"""Activation recomputation (models/recompute.py over backend.nn.recompute): a tiny GPT trained 2 steps with
--recompute-granularity full (uniform, block) and selective gives the same losses, gradient norms and weights
as without, bit for bit, with hash dropout 0.1 (the recomputed forward replays the masks), on PyTorch and on
MindSpore (PyNative; the compiled step in the slow test). The plans follow Megatron's flags and MindSpeed-MM's
per-module model-json keys."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mmrun.backend.errors import UsageError
from mmrun.models import recompute

WORKER = Path(__file__).resolve().parent / "workers" / "recompute_run.py"


def _runs(framework: str, *extra: str) -> dict[str, dict]:
    env = {**os.environ, "MMRUN_AI_FRAMEWORK": framework}  # the worker's framework, whatever this process chose
    done = subprocess.run([sys.executable, str(WORKER), framework, *extra], capture_output=True, text=True, timeout=600,
                          env=env)
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
    # Before the dropout generator was replayed (backend/mindspore/nn.py), step 2's loss was 3.8274 against 3.8474.
    _assert_identical(_runs("mindspore", "--jit", "off", "--dropout", "0.1"))


@pytest.mark.slow
def test_mindspore_compiled_step_recompute_changes_nothing():
    # Before the generator's step was kept out of recomputation (backend/mindspore/seeding.py): 3.8265 against 3.8474.
    _assert_identical(_runs("mindspore", "--jit", "on", "--dropout", "0.1", "--plans", "none,full-uniform-1"))


def test_mindspore_cpu_recomputation_runs_the_pynative_step_unless_ms_jit():
    """The compiled MindSpore step on a CPU does not lower memory with recomputation, PyNative does
    (benchmarks/recompute_memory.py): mmrun's engine picks PyNative there, with one notice; --ms-jit insists."""
    from mmrun.engines.portable import RECOMPUTE_PYNATIVE_NOTICE, ms_step_jit

    plain = SimpleNamespace(no_ms_jit=False, ms_jit=False)
    assert ms_step_jit(plain, "mindspore", "cpu", True) == (False, RECOMPUTE_PYNATIVE_NOTICE)
    assert ms_step_jit(plain, "mindspore", "cpu", False) == (True, None)
    assert ms_step_jit(plain, "mindspore", "npu", True) == (True, None)  # compiled: MindSpore documents recompute for Ascend's graph
    assert ms_step_jit(SimpleNamespace(no_ms_jit=False, ms_jit=True), "mindspore", "cpu", True) == (True, None)
    assert ms_step_jit(SimpleNamespace(no_ms_jit=True, ms_jit=False), "mindspore", "cpu", True) == (False, None)
    assert ms_step_jit(plain, "pytorch", "cpu", True) == (False, None)


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


def _identical_with_recompute(worker, path, batch) -> list[str]:
    """Loss, logits and every gradient of mmrun's model from `path` with full recomputation on every layer loop
    (the text decoder and the ViT) equal those without, exactly (PyTorch, in this process)."""
    plain = worker.forward_backward(worker.from_pretrained(str(path)), batch)
    model = worker.from_pretrained(str(path))
    said = recompute.apply(model, recompute.plans(SimpleNamespace(recompute_granularity="full", recompute_method="uniform",
                                                                  recompute_num_layers="1")))
    again = worker.forward_backward(model, batch)
    assert sorted(again) == sorted(plain) and len(plain) > 20
    for key in plain:
        assert (again[key] == plain[key]).all(), key
    return said


def test_qwen2_5_vl_text_decoder_and_vit_recompute_changes_nothing(worker, tiny, hf_dirs):
    said = _identical_with_recompute(worker, hf_dirs["qwen2_5_vl"], tiny.image_batch())
    assert [line.split(":")[0] for line in said] == ["vision_encoder (visual.blocks)", "text_decoder (model.layers)"]


def test_qwen3_vl_text_decoder_and_vit_recompute_changes_nothing(worker, tiny3, tmp_path):
    tiny3.hf_model().save_pretrained(tmp_path)
    said = _identical_with_recompute(worker, tmp_path, tiny3.image_batch())
    assert [line.split(":")[0] for line in said] == ["vision_encoder (model.visual.blocks)",
                                                     "text_decoder (model.language_model.layers)"]


def _same_gradients_after_marking(model, loss_of) -> list[str]:
    """loss and every gradient of `model` before and after recompute.apply (full, uniform) on the same instance."""
    import numpy as np

    from mmrun.backend import autograd, tensors

    def run():
        names, params = zip(*model.named_parameters())
        loss, grads = autograd.value_and_grad(lambda: loss_of(model), list(params))()
        return {"loss": tensors.to_numpy(loss), **{n: tensors.to_numpy(g) for n, g in zip(names, grads)}}

    plain = run()
    said = recompute.apply(model, recompute.plans(SimpleNamespace(recompute_granularity="full", recompute_method="block",
                                                                  recompute_num_layers="2")))
    again = run()
    for key in plain:
        np.testing.assert_array_equal(again[key], plain[key], err_msg=key)
    return said


def test_wan_dit_and_clip_recompute_changes_nothing():
    import numpy as np

    from mmrun.backend import ops, tensors
    from mmrun.models.clip_vision import CLIPVisionConfig, CLIPVisionModel
    from mmrun.models.wan import WanTransformer3DModel, WanTransformerConfig, init_weights

    rng = np.random.default_rng(0)
    wan = WanTransformer3DModel(WanTransformerConfig(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, text_dim=16,
        freq_dim=16, ffn_dim=32, num_layers=3, cross_attn_norm=True))
    init_weights(wan, 0)
    inputs = {"hidden_states": tensors.from_numpy(rng.standard_normal((1, 4, 3, 4, 6), np.float32)),
              "timestep": tensors.from_numpy(np.array([500.0], np.float32)),
              "encoder_hidden_states": tensors.from_numpy(rng.standard_normal((1, 5, 16), np.float32))}
    said = _same_gradients_after_marking(wan, lambda m: ops.sum(m(**inputs) ** 2))
    assert said == ["predictor (blocks): 2 of 3 layers (full, block 2)"]
    clip = CLIPVisionModel(CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                            num_attention_heads=2, image_size=8, patch_size=4))
    pixels = tensors.from_numpy(rng.standard_normal((2, 3, 8, 8), np.float32))
    said = _same_gradients_after_marking(clip, lambda m: ops.sum(m(pixels)["last_hidden_state"] ** 2))
    assert said == ["vision_encoder (vision_model.encoder.layers): 2 of 2 layers (full, block 2)"]


def test_model_json_recompute_keys_reach_each_module(worker, hf_dirs):
    """MindSpeed-MM's per-module keys in model.json (image_encoder.vision_encoder / text_decoder) become each layer
    loop's plan; a module without them follows the flags (none here)."""
    import copy
    import json

    from mmrun.models.qwen2_vl.model_json import parse_model_json

    raw = copy.deepcopy(json.loads((Path(__file__).resolve().parents[2] / "scripts" / "qwen2vl" / "model_tiny.json")
                                   .read_text()))
    raw["image_encoder"]["vision_encoder"].update(recompute_granularity="full", recompute_method="block",
                                                  recompute_num_layers=1)
    spec = parse_model_json(raw)
    assert spec.recompute["vision_encoder"] == {"recompute_granularity": "full", "recompute_method": "block",
                                                "recompute_num_layers": 1}
    model = worker.from_pretrained(str(hf_dirs["qwen2_vl"]))
    said = recompute.apply(model, recompute.plans(SimpleNamespace(recompute_granularity=None), spec.recompute))
    assert said == [f"vision_encoder (visual.blocks): 1 of {len(model.visual.blocks)} layers (full, block 1)"]
