"""Forward + backward of mmrun's Qwen2-VL on whichever framework this process chose (MMRUN_AI_FRAMEWORK).

Imported by the tests for PyTorch (in the pytest process) and run as a script for MindSpore (one
subprocess): `python qwen2_vl_run.py CASES.npz OUT.npz`, where CASES.npz holds, per case `<c>`, the model
directory `<c>/dir` and the batch arrays `<c>/<key>`; OUT.npz gets `<c>/logits`, `<c>/loss`, `<c>/grad/<name>`.
"""
from __future__ import annotations

import sys

import numpy as np

from mmrun.backend import autograd, tensors

FLOAT_KEYS = ("pixel_values", "pixel_values_videos", "second_per_grid_ts")
MODEL_KEYS = ("input_ids", "attention_mask", "labels", "pixel_values", "image_grid_thw", "pixel_values_videos",
              "video_grid_thw", "second_per_grid_ts", "position_ids")


def forward_backward(model, batch: dict[str, np.ndarray], per_token: bool = False) -> dict[str, np.ndarray]:
    """logits, loss (and num_tokens) and gradients of the trainable parameters, as numpy."""
    inputs = {k: tensors.from_numpy(v) for k, v in batch.items() if k in MODEL_KEYS}
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for n, p in model.named_parameters() if p.requires_grad]

    def loss_fn():
        out = model(**inputs, calculate_per_token_loss=per_token)
        return out["loss_dict"]["loss"], (out["logits"], out["loss_dict"].get("num_tokens", out["loss_dict"]["loss"]))

    (loss, (logits, count)), grads = autograd.value_and_grad(loss_fn, params, has_aux=True)()
    result = {"logits": tensors.to_numpy(logits), "loss": tensors.to_numpy(loss), "num_tokens": tensors.to_numpy(count)}
    result.update({f"grad/{n}": tensors.to_numpy(g) for n, g in zip(names, grads)})
    return result


def run_cases(cases: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from mmrun.models.qwen2_vl import from_pretrained

    out: dict[str, np.ndarray] = {}
    for case in sorted({k.split("/", 1)[0] for k in cases}):
        model = from_pretrained(str(cases[f"{case}/dir"]))
        batch = {k.split("/", 1)[1]: v for k, v in cases.items() if k.startswith(case + "/") and k != f"{case}/dir"}
        per_token = bool(batch.pop("per_token", np.array(False)))
        out.update({f"{case}/{k}": v for k, v in forward_backward(model, batch, per_token).items()})
    return out


if __name__ == "__main__":
    loaded = dict(np.load(sys.argv[1], allow_pickle=False))
    np.savez(sys.argv[2], **run_cases(loaded))
