"""mmrun's Qwen2-VL / Qwen2.5-VL (PyTorch backend) against transformers' own forward and backward (fp32).

Same weights (loaded from transformers' save_pretrained directory), same batch: logits at real tokens,
the loss and the gradient of every parameter agree within 1e-5, for two images of different sizes in one
sample beside a padded text-only sample, for a video, and for text alone; Qwen2.5-VL with window
attention active (an image cut into 4 windows of unequal size) and one full-attention block.
"""
from __future__ import annotations

import numpy as np
import pytest


TOL = 1e-5
BATCHES = ("image_batch", "video_batch", "text_batch")


@pytest.mark.parametrize("batch_name", BATCHES)
@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
def test_logits_loss_and_every_gradient_equal_transformers(tiny, worker, hf_models, mmrun_models, model_type,
                                                           batch_name):
    batch = getattr(tiny, batch_name)()
    reference = tiny.hf_forward_backward(hf_models[model_type], batch)
    # transformers' own M-RoPE positions, so this compares the model, not the position rule.
    ours = worker.forward_backward(mmrun_models[model_type],
                                   {**batch, "position_ids": tiny.hf_position_ids(hf_models[model_type], batch)})
    real = batch["attention_mask"] == 1  # transformers masks padded queries too; their logits are not used
    np.testing.assert_allclose(ours["logits"][real], reference["logits"][real], rtol=0, atol=TOL)
    np.testing.assert_allclose(ours["loss"], reference["loss"], rtol=0, atol=TOL)
    assert sorted(k[5:] for k in ours if k.startswith("grad/")) == sorted(reference["grads"])
    for name, grad in reference["grads"].items():
        np.testing.assert_allclose(ours[f"grad/{name}"], grad, rtol=0, atol=TOL, err_msg=name)
    vision_grad = np.abs(ours["grad/visual.blocks.0.attn.qkv.weight"]).max()
    assert (vision_grad > 1e-4) == (batch_name != "text_batch")  # the ViT really took part (or not)


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
def test_positions_computed_in_the_model_equal_transformers_for_images(tiny, worker, hf_models, mmrun_models,
                                                                       model_type):
    from mmrun.backend import tensors

    batch = tiny.image_batch()
    reference = tiny.hf_forward_backward(hf_models[model_type], batch)
    keys = ("input_ids", "attention_mask", "pixel_values", "image_grid_thw")
    out = mmrun_models[model_type](**{k: tensors.from_numpy(batch[k]) for k in keys})
    real = batch["attention_mask"] == 1
    np.testing.assert_allclose(tensors.to_numpy(out["logits"])[real], reference["logits"][real], rtol=0, atol=TOL)
    assert out["loss_dict"] == {}  # no labels, no loss


def test_per_token_loss_is_the_sum_and_its_token_count(tiny, worker, mmrun_models):
    batch = tiny.image_batch()
    mean = worker.forward_backward(mmrun_models["qwen2_vl"], batch)
    summed = worker.forward_backward(mmrun_models["qwen2_vl"], batch, per_token=True)
    expected_count = int((batch["labels"][:, 1:] != -100).sum())  # next-token labels
    assert int(summed["num_tokens"]) == expected_count
    np.testing.assert_allclose(summed["loss"] / expected_count, mean["loss"], rtol=1e-6)
    np.testing.assert_allclose(summed["grad/model.norm.weight"] / expected_count, mean["grad/model.norm.weight"],
                               rtol=1e-5, atol=1e-8)
