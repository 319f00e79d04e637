"""mmrun's Wan VAE, UMT5 text encoder and CLIP image encoder on whichever framework this process chose
(MMRUN_AI_FRAMEWORK).

Imported by the tests for PyTorch (in the pytest process) and run as a script for MindSpore (one subprocess):
`python wan_vae_run.py CASES.npz OUT.npz` (CASES from tests/models/wan_tiny.py: vae/*, umt5/* and clip/* keys).
"""
from __future__ import annotations

import sys

import numpy as np

from mmrun.backend import tensors


def run_cases(cases: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from mmrun.data.tokenizers import HuggingFaceTokenizer
    from mmrun.models.wan.text_encoder import UMT5EncoderModel, encode_prompts
    from mmrun.models.wan.vae import AutoencoderKLWan

    out = {}
    if "vae/dir" in cases:
        vae = AutoencoderKLWan.from_pretrained(str(cases["vae/dir"]))
        video = tensors.from_numpy(cases["vae/video"])
        out["vae/mean"] = tensors.to_numpy(vae.encode(video))
        out["vae/sample"] = tensors.to_numpy(vae.encode(video, noise=tensors.from_numpy(cases["vae/noise"])))
        latents = tensors.from_numpy(cases["vae/latents"])
        out["vae/decoded"] = tensors.to_numpy(vae.decode(latents))
        out["vae/normalized"] = tensors.to_numpy(vae.normalize_latents(latents))
        out["vae/denormalized"] = tensors.to_numpy(vae.denormalize_latents(latents))
    if "umt5/dir" in cases:
        encoder = UMT5EncoderModel.from_pretrained(str(cases["umt5/dir"]))
        hidden = encoder(tensors.from_numpy(cases["umt5/input_ids"]), tensors.from_numpy(cases["umt5/attention_mask"]))
        out["umt5/hidden"] = tensors.to_numpy(hidden)
        tokenizer = HuggingFaceTokenizer(str(cases["umt5/tokenizer"]))
        prompts = [str(p) for p in cases["umt5/prompts"]]
        embeddings, mask = encode_prompts(encoder, tokenizer, prompts, int(cases["umt5/max_length"]))
        out["umt5/prompt_embeds"], out["umt5/prompt_mask"] = tensors.to_numpy(embeddings), mask
    if "clip/dir" in cases:
        out.update(run_clip(str(cases["clip/dir"]), cases["clip/pixel_values"]))
    return out


def run_clip(path: str, pixel_values: np.ndarray) -> dict[str, np.ndarray]:
    """clip/hidden_states/<i>, clip/pooler_output and clip/penultimate (Wan's tokens) of the CLIP image encoder."""
    from mmrun.backend import autograd
    from mmrun.models.clip_vision import CLIPVisionModel, encode_images

    model = CLIPVisionModel.from_pretrained(path)
    with autograd.no_grad():
        result = model(tensors.from_numpy(pixel_values), output_hidden_states=True)
    out = {f"clip/hidden_states/{i}": tensors.to_numpy(h) for i, h in enumerate(result["hidden_states"])}
    out["clip/pooler_output"] = tensors.to_numpy(result["pooler_output"])
    out["clip/penultimate"] = tensors.to_numpy(encode_images(model, pixel_values))
    return out


if __name__ == "__main__":
    cases = dict(np.load(sys.argv[1]))
    np.savez(sys.argv[2], **run_cases(cases))
