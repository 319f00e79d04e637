"""A text-only micro-batch still runs the whole vision tower (a blank image counted zero times), so every data-parallel
rank runs the same collectives and reduces the same gradients whatever its data mix (issue 37: FSDP2 aborted when
one rank had text and another an image). Checked as the invariant that makes it so: on a text-only batch in training
every parameter has a gradient (the vision tower's all zeros), and the loss and the language model's gradients are
exactly those of the model without the dummy run. transformers' Qwen2-VL and Qwen3-VL with mmrun's hook
(engines/torch/transformers_models.py). mmrun's own Qwen3-VL runs the blank pass with several ranks only (one process
has no collectives to keep in step): its one-process training step equals the step with the pass forced (its
DeepStack mergers too), the skipped ViT updated as with zero gradients. The 2-rank FSDP2 run on a mixed batch is
tests/training/test_fsdp2_e2e.py (test F)."""
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
    if family == "qwen2_vl":  # once: a text model has no tower, nothing registered
        assert not run_vision_tower_on_every_batch(
            __import__("transformers").Qwen2ForCausalLM(__import__("transformers").Qwen2Config(
                hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=64)))


def test_mmrun_qwen3_vl_text_only_step_blank_pass_and_one_process_skip_agree(tiny3, worker, tmp_path, monkeypatch):
    """mmrun's own Qwen3-VL on a text-only training batch, one TrainStep (AdamW with weight decay) twice: on one process
    the blank ViT pass is skipped (merge_vision), and with it forced (as on several ranks, its DeepStack mergers too).
    The same loss and bit-equal weights after: the skipped ViT got exact-zero gradients (Adam's moments zero, the
    weights only decayed), as the blank pass gives them. (The text-only loss against transformers':
    test_qwen3_vl_vs_transformers.py.)"""
    import torch

    from mmrun import backend
    from mmrun.backend import optim, tensors
    from mmrun.models.qwen3_vl import from_pretrained
    from mmrun.models.vlm import blocks

    tiny3.hf_model().save_pretrained(tmp_path)
    batch = tiny3.text_batch()
    inputs = tuple(tensors.from_numpy(batch[k]) for k in ("input_ids", "attention_mask", "labels"))
    lr, decay = 1e-2, 0.1

    def train(force_blank: bool):
        model = from_pretrained(str(tmp_path))
        model.train()
        before = {n: tensors.to_numpy(p).copy() for n, p in model.named_parameters()}
        runs = []
        model.model.visual.register_forward_pre_hook(lambda *_: runs.append(1))
        optimizer = optim.AdamW(model.named_parameters(), lr=lr, weight_decay=decay)
        step = backend.train_step.TrainStep(
            model, optimizer, clip_grad=1.0,
            loss_fn=lambda m, ids, mask, labels: m(input_ids=ids, attention_mask=mask,
                                                   labels=labels)["loss_dict"]["loss"])
        with monkeypatch.context() as patch:
            if force_blank:  # the pass as several ranks run it
                patch.setattr(blocks, "_world_size", lambda: 2)
            result = step([inputs])
        moments = optimizer.state_dict()["tensors"]
        return result, before, dict(model.named_parameters()), moments, len(runs)

    skipped, before, params, moments, runs = train(False)
    forced, _, forced_params, forced_moments, forced_runs = train(True)
    assert (runs, forced_runs) == (0, 1)
    assert skipped.loss == forced.loss and skipped.grad_norm == forced.grad_norm
    vision = [n for n in params if n.startswith("model.visual.")]
    assert any("deepstack_merger_list" in n for n in vision)
    for name, param in params.items():
        assert torch.equal(param, forced_params[name]), name
    for name in vision:
        assert not moments[f"{name}.exp_avg"].any() and not forced_moments[f"{name}.exp_avg"].any(), name
        np.testing.assert_allclose(tensors.to_numpy(params[name]), before[name] * (1 - lr * decay), rtol=1e-6,
                                   atol=0)  # updated (decayed), not left out
