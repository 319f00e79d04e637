"""What the model refuses, and how it says so; freezing's parts; the shared blocks' names."""
from __future__ import annotations

import numpy as np
import pytest


def _inputs(batch, keys=("input_ids", "attention_mask", "labels", "pixel_values", "image_grid_thw")):
    from mmrun.backend import tensors
    return {k: tensors.from_numpy(batch[k]) for k in keys if k in batch}


def test_truncated_image_names_both_counts_and_the_cut_off(tiny, mmrun_models):
    batch = tiny.image_batch()
    cut = batch["input_ids"][:, :10]  # 3 text + vision_start + 6 of image A's 12 pad tokens
    short = {**batch, "input_ids": cut, "attention_mask": batch["attention_mask"][:, :10],
             "labels": batch["labels"][:, :10]}
    with pytest.raises(ValueError, match=r"image tokens and features do not match: input_ids hold 6 image tokens "
                                         r"\(id 250\), the 2 image\(s\) give 16 features; the sequence cut-off "
                                         r"\(--seq-length\) probably truncated an image or video; raise --seq-length"):
        mmrun_models["qwen2_vl"](**_inputs(short))


def test_image_tokens_without_pixels_and_pixels_without_grid(tiny, mmrun_models):
    batch = tiny.image_batch()
    with pytest.raises(ValueError, match=r"input_ids hold 16 image tokens \(id 250\) but no image pixel values were "
                                         r"given; pass pixel_values and image_grid_thw"):
        mmrun_models["qwen2_vl"](**_inputs(batch, ("input_ids",)))
    with pytest.raises(ValueError, match=r"image pixel values were given without image_grid_thw"):
        mmrun_models["qwen2_vl"](**_inputs(batch, ("input_ids", "pixel_values")))
    wrong = {**batch, "image_grid_thw": np.array([[1, 6, 8], [1, 2, 2]])}
    with pytest.raises(ValueError, match="image tokens and features do not match"):
        mmrun_models["qwen2_vl"](**_inputs(wrong))


def test_freeze_parts_follow_mindspeed_mm(tiny, worker, hf_dirs):
    from mmrun.models.qwen2_vl import from_pretrained

    model = from_pretrained(str(hf_dirs["qwen2_5_vl"]))
    assert model.freeze() == {"vision_encoder": 25, "vision_projector": 0, "text_decoder": 0}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {n.split(".")[0] + ("." + n.split(".")[1] if n.startswith("visual") else "") for n in trainable} == {
        "visual.merger", "model", "lm_head"}
    assert model.freeze(vision_encoder=False, vision_projector=True, text_decoder=True) == {
        "vision_encoder": 0, "vision_projector": 5, "text_decoder": 27}
    out = worker.forward_backward(model, tiny.image_batch())  # gradients of the trainable parameters only
    assert sorted(k[5:] for k in out if k.startswith("grad/")) == sorted(
        n for n, p in model.named_parameters() if n.startswith("visual.") and not n.startswith("visual.merger."))


def test_model_parameter_names_are_the_hub_keys(worker, mmrun_models):
    from mmrun.models.qwen2_vl.hf_checkpoint import hf_parameter_names

    for model in mmrun_models.values():
        assert sorted(n for n, _ in model.named_parameters()) == sorted(hf_parameter_names(model.config))
    assert "lm_head.weight" not in dict(mmrun_models["qwen2_vl"].named_parameters())  # tied
