"""A text-only micro-batch still runs the whole vision tower (a blank image counted zero times), so every data-parallel
rank runs the same collectives and reduces the same gradients whatever its data mix (issue 37: FSDP2 aborted when
one rank had text and another an image). Checked as the invariant that makes it so: on a text-only batch in training
every parameter has a gradient (the vision tower's all zeros), and the loss and the language model's gradients are
exactly those of the model without the dummy run. transformers' Qwen2-VL and Qwen3-VL with mmrun's hook
(engines/torch/transformers_models.py), mmrun's own Qwen3-VL (its DeepStack mergers too). The 2-rank FSDP2 run on a
mixed batch is tests/training/test_fsdp2_e2e.py (test F)."""
from __future__ import annotations

import copy

import numpy as np
import pytest


def _grads(model, batch) -> tuple[float, dict]:
    import torch

    model.zero_grad(set_to_none=True)
    out = model(**{k: torch.from_numpy(v) for k, v in batch.items()})
    out.loss.backward()
    return float(out.loss.detach()), {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_transformers_vlm_runs_its_vision_tower_on_text_only_batches(tiny, tiny3, family):
    pytest.importorskip("transformers")
    from mmrun.engines.torch.transformers_models import run_vision_tower_on_every_batch

    helper = tiny if family == "qwen2_vl" else tiny3
    plain = helper.hf_model("qwen2_vl") if family == "qwen2_vl" else helper.hf_model()
    plain.train()
    hooked = copy.deepcopy(plain)
    assert run_vision_tower_on_every_batch(hooked)
    text = helper.text_batch()
    loss, grads = _grads(plain, text)
    hooked_loss, hooked_grads = _grads(hooked, text)
    unused = sorted(n for n, g in grads.items() if g is None)
    assert unused and all(n.startswith("model.visual.") for n in unused)  # without the hook: the tower has none
    assert [n for n, g in hooked_grads.items() if g is None] == []  # with it: every parameter has a gradient
    assert hooked_loss == loss
    for name, grad in hooked_grads.items():
        if name in unused:
            assert not grad.any(), name  # counted zero times
        else:
            assert grad.equal(grads[name]), name
    image = helper.image_batch()  # with an image the hook does nothing
    assert _grads(hooked, image)[0] == _grads(plain, image)[0]
    assert not run_vision_tower_on_every_batch(
        __import__("transformers").Qwen2ForCausalLM(__import__("transformers").Qwen2Config(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            vocab_size=64)))  # a text model has no tower: nothing registered


def test_mmrun_qwen3_vl_deepstack_mergers_have_gradients_on_text_only_batches(tiny3, worker, tmp_path):
    from mmrun.backend import tensors
    from mmrun.models.qwen3_vl import from_pretrained

    tiny3.hf_model().save_pretrained(tmp_path)
    model = from_pretrained(str(tmp_path))
    model.train()
    batch = tiny3.text_batch()
    out = model(**{k: tensors.from_numpy(batch[k]) for k in ("input_ids", "attention_mask", "labels")})
    out["loss_dict"]["loss"].backward()
    params = dict(model.named_parameters())
    assert [n for n, p in params.items() if p.grad is None] == []
    assert any("deepstack_merger_list" in n for n in params)
    for name, param in params.items():
        if name.startswith("model.visual."):
            assert not param.grad.any(), name
    reference = tiny3.hf_forward_backward(tiny3.hf_model().train(), batch)
    np.testing.assert_allclose(tensors.to_numpy(out["loss_dict"]["loss"]), reference["loss"], rtol=0, atol=1e-5)
