"""mmrun's CLIP image encoder on whichever framework this process chose (MMRUN_AI_FRAMEWORK).

Imported by the tests for PyTorch and run as a script for MindSpore: `python clip_vision_run.py CASES.npz OUT.npz`,
CASES.npz holding `dir` (a transformers CLIPVisionModel directory) and `pixel_values`; OUT.npz gets
`hidden_states/<i>`, `pooler_output` and `penultimate`.
"""
from __future__ import annotations

import sys

import numpy as np


def run(path: str, pixel_values: np.ndarray) -> dict[str, np.ndarray]:
    from mmrun.backend import autograd, tensors
    from mmrun.models.clip_vision import CLIPVisionModel, encode_images

    model = CLIPVisionModel.from_pretrained(path)
    with autograd.no_grad():
        out = model(tensors.from_numpy(pixel_values), output_hidden_states=True)
    result = {f"hidden_states/{i}": tensors.to_numpy(h) for i, h in enumerate(out["hidden_states"])}
    result["pooler_output"] = tensors.to_numpy(out["pooler_output"])
    result["penultimate"] = tensors.to_numpy(encode_images(model, pixel_values))
    return result


if __name__ == "__main__":
    cases = dict(np.load(sys.argv[1], allow_pickle=False))
    np.savez(sys.argv[2], **run(str(cases["dir"]), cases["pixel_values"]))
