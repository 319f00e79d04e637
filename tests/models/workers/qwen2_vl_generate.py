"""Generation with mmrun's Qwen2-VL / Qwen3-VL (the directory's model_type) on whichever framework this process
chose (MMRUN_AI_FRAMEWORK).

Imported by the tests for PyTorch; run as a script for MindSpore: `python qwen2_vl_generate.py CASES.npz OUT.npz`.
CASES.npz holds per case `<c>`: `<c>/dir` (a Hugging Face directory), `<c>/input_ids` (1, S), optional
`<c>/pixel_values` and `<c>/image_grid_thw`, and `<c>/config` (a JSON generation_config); OUT.npz gets the
new token ids under `<c>`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

VISION_KEYS = ("pixel_values", "image_grid_thw")


def generate_cases(cases: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from qwen2_vl_run import from_pretrained

    from mmrun.models.vlm.generation import GenerationConfig, Generator, Prompt

    models: dict[str, object] = {}
    out = {}
    for case in sorted({key.split("/")[0] for key in cases}):
        path = str(cases[f"{case}/dir"])
        if path not in models:
            models[path] = from_pretrained(path)
            models[path].eval()
        prompt = Prompt(cases[f"{case}/input_ids"], **{k: cases[f"{case}/{k}"] for k in VISION_KEYS
                                                       if f"{case}/{k}" in cases})
        config = GenerationConfig.from_dict(json.loads(str(cases[f"{case}/config"])))
        out[case] = np.asarray(Generator(models[path]).generate(prompt, config), dtype=np.int64)
    return out


if __name__ == "__main__":
    np.savez(sys.argv[2], **generate_cases(dict(np.load(sys.argv[1]))))
