"""Qwen2.5-VL / Qwen3-VL on fixed-shape batches (models/pretrain_vlm.py fixed_shape_collate's layout) on whichever
framework this process chose (MMRUN_AI_FRAMEWORK).

Imported by tests/models/test_vlm_fixed_shapes.py for PyTorch; run as a script for MindSpore:
`python vlm_fixed_run.py CASES.npz OUT.npz`, CASES.npz holding per case `<c>/dir` (a Hugging Face directory) and
the grid batch `<c>/<key>`. PyTorch: forward + backward of the grid batch and of its fixed-shape twin (run_cases).
Both: one compiled (MindSpore: mindspore.jit) TrainStep on the fixed-shape batch, its loss, gradient norm and the
parameters after AdamW (train_case).
"""
from __future__ import annotations

import sys

import numpy as np

from mmrun.backend import autograd, tensors
from mmrun.models.vlm import vision_layout

GRID_KEYS = ("input_ids", "labels", "position_ids", "pixel_values", "image_grid_thw", "pixel_values_videos",
             "video_grid_thw")
# The fixed-shape batch's inputs, in the order TrainStep passes them to fixed_loss.
FIXED_KEYS = ("input_ids", "labels", "position_ids", "pixel_values", "pixel_segment_ids", "pixel_position_ids",
              "extra_a", "extra_b")
EXTRA = {"qwen2_5_vl": ("pixel_window_ids",), "qwen3_vl": ("pixel_tap_indices", "pixel_tap_weights")}


def load(path: str):
    """(model, model_type) from a Hugging Face directory."""
    import json
    from pathlib import Path

    model_type = json.loads((Path(path) / "config.json").read_text())["model_type"]
    if model_type == "qwen3_vl":
        from mmrun.models.qwen3_vl import from_pretrained
    else:
        from mmrun.models.qwen2_vl import from_pretrained
    return from_pretrained(path), model_type


def with_positions(model, model_type: str, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The batch with the data pipeline's M-RoPE positions (position_ids), computed on the host."""
    if model_type == "qwen3_vl":
        from mmrun.models.qwen3_vl.modeling import rope_index
    else:
        from mmrun.models.qwen2_vl.modeling import rope_index
    seconds = {} if "second_per_grid_ts" not in batch else {"second_per_grid_ts": batch["second_per_grid_ts"]}
    positions = rope_index(model.config, batch["input_ids"], batch.get("image_grid_thw"), batch.get("video_grid_thw"),
                           batch["attention_mask"], **seconds)[0]
    return {**batch, "position_ids": np.asarray(positions, np.int64)}


def fixed_batch(model, model_type: str, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The grid batch as fixed_shape_collate lays it out: the images' then the videos' patches padded to their
    bucket (smallest 48), the segment ids, rotary positions and the model's own inputs (window ids / position
    taps)."""
    from mmrun.models import families

    own_inputs = families.part(model.config, "fixed_vision_inputs")
    vision = model.config.vision
    grids = [batch[k] for k in ("image_grid_thw", "video_grid_thw") if k in batch]
    grid = np.concatenate(grids) if grids else None
    pixels = np.concatenate([np.zeros((0, vision.patch_dim), np.float32)]
                            + [batch[k] for k in ("pixel_values", "pixel_values_videos") if k in batch])
    patches = vision_layout.patch_bucket(pixels.shape[0], 48)
    out = {k: batch[k] for k in ("input_ids", "labels", "position_ids")}
    out["pixel_values"] = np.concatenate([pixels, np.zeros((patches - pixels.shape[0], pixels.shape[1]), np.float32)])
    out["pixel_segment_ids"], out["pixel_position_ids"] = vision_layout.fixed_layout(grid, vision.spatial_merge_size,
                                                                                     patches)
    out.update(own_inputs(model.config, grid, patches))
    return out


def forward_backward(model, inputs: dict[str, np.ndarray]) -> dict:
    """logits, loss and the gradients of every parameter, as numpy."""
    tensor_inputs = {k: tensors.from_numpy(v) for k, v in inputs.items()}
    names, params = zip(*model.named_parameters())

    def loss_fn():
        out = model(**tensor_inputs)
        return out["loss_dict"]["loss"], out["logits"]

    (loss, logits), grads = autograd.value_and_grad(loss_fn, list(params), has_aux=True)()
    return {"loss": tensors.to_numpy(loss), "logits": tensors.to_numpy(logits),
            "grads": {n: tensors.to_numpy(g) for n, g in zip(names, grads)}}


def fixed_loss(model, input_ids, labels, position_ids, pixel_values, pixel_segment_ids, pixel_position_ids,
               extra_a, extra_b=None):
    """The model's loss on a fixed-shape batch (TrainStep's loss_fn: positional tensors)."""
    if extra_b is None:  # Qwen2.5-VL: its window ids
        out = model(input_ids=input_ids, labels=labels, position_ids=position_ids, pixel_values=pixel_values,
                    pixel_segment_ids=pixel_segment_ids, pixel_position_ids=pixel_position_ids,
                    pixel_window_ids=extra_a)
    else:  # Qwen3-VL: its position taps
        out = model(input_ids=input_ids, labels=labels, position_ids=position_ids, pixel_values=pixel_values,
                    pixel_segment_ids=pixel_segment_ids, pixel_position_ids=pixel_position_ids,
                    pixel_tap_indices=extra_a, pixel_tap_weights=extra_b)
    return out["loss_dict"]["loss"]


def train_case(model, model_type: str, fixed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One TrainStep (compiled on MindSpore) on the fixed-shape batch: loss, gradient norm, parameters after."""
    from mmrun import backend
    from mmrun.backend import optim

    optimizer = optim.AdamW(model.named_parameters(), lr=1e-4, weight_decay=0.0)  # Adam's first step is lr * sign(g)
    step = backend.train_step.TrainStep(model, optimizer, loss_fn=fixed_loss, clip_grad=1.0,
                                        jit=True if backend.selection.framework() == "mindspore" else None)
    arrays = [fixed[k] for k in FIXED_KEYS[:6]] + [fixed[k] for k in EXTRA[model_type]]
    result = step([tuple(tensors.from_numpy(a) for a in arrays)])
    out = {"loss": np.float64(result.loss), "grad_norm": np.float64(result.grad_norm)}
    out.update({f"param/{n}": tensors.to_numpy(p) for n, p in model.named_parameters()})
    return out


def run_cases(cases: dict[str, np.ndarray], train: tuple[str, ...] = ()) -> dict:
    """PyTorch: per case {grid: ..., fixed: ...} forward + backward results; cases in `train` also get one step."""
    results = {}
    for case in sorted({key.split("/")[0] for key in cases}):
        batch = {key.split("/", 1)[1]: value for key, value in cases.items() if key.startswith(case + "/")}
        model, model_type = load(str(batch.pop("dir")))
        batch = with_positions(model, model_type, batch)
        fixed = fixed_batch(model, model_type, batch)
        results[f"{case}/grid"] = forward_backward(model, {k: batch[k] for k in GRID_KEYS if k in batch})
        results[f"{case}/fixed"] = forward_backward(model, fixed)
        if case in train:
            results[f"{case}/train"] = train_case(model, model_type, fixed)
    return results


def main(cases_path: str, out_path: str) -> None:
    """MindSpore: one compiled step per case."""
    cases = dict(np.load(cases_path))
    out = {}
    for case in sorted({key.split("/")[0] for key in cases}):
        batch = {key.split("/", 1)[1]: value for key, value in cases.items() if key.startswith(case + "/")}
        model, model_type = load(str(batch.pop("dir")))
        fixed = fixed_batch(model, model_type, with_positions(model, model_type, batch))
        out.update({f"{case}/{k}": v for k, v in train_case(model, model_type, fixed).items()})
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
