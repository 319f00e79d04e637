"""Tiny random Hugging Face Qwen2-VL / Qwen2.5-VL models and batches for the tests (offline, seconds).

Images: A is 84x112 px (grid 1x6x8: 48 patches, 12 merged tokens), B 56x56 px (1x4x4: 16 patches, 4
tokens); the video is 4 frames of 56x56 (grid 2x4x4: 32 patches, 8 tokens). Qwen2.5-VL's window_size 56
(2x2 merged tokens) cuts A into windows of 4, 4, 2 and 2 tokens, so window attention is active, and
block 1 of 2 is a full-attention block.
"""
from __future__ import annotations

import numpy as np

IMAGE, VS, VE, VIDEO = 250, 251, 252, 253
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]}, rope_theta=10000.0,
            bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-6)
IDS = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VS, vision_end_token_id=VE)
VISION = {
    "qwen2_vl": dict(depth=2, embed_dim=32, hidden_size=32, mlp_ratio=2, num_heads=4, patch_size=14,
                     spatial_merge_size=2, temporal_patch_size=2),
    "qwen2_5_vl": dict(depth=2, hidden_size=32, intermediate_size=48, out_hidden_size=32, num_heads=4, patch_size=14,
                       spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
                       tokens_per_second=2),
}
TIED = {"qwen2_vl": True, "qwen2_5_vl": False}
GRID_A, GRID_B, GRID_VIDEO = (1, 6, 8), (1, 4, 4), (2, 4, 4)


def hf_model(model_type: str, seed: int = 0):
    """A random transformers model (fp32, eval mode) of `model_type`."""
    import torch
    import transformers

    config_cls = transformers.Qwen2VLConfig if model_type == "qwen2_vl" else transformers.Qwen2_5_VLConfig
    model_cls = (transformers.Qwen2VLForConditionalGeneration if model_type == "qwen2_vl"
                 else transformers.Qwen2_5_VLForConditionalGeneration)
    config = config_cls(**TEXT, **IDS, tie_word_embeddings=TIED[model_type], vision_config=VISION[model_type])
    torch.manual_seed(seed)
    model = model_cls(config)
    with torch.no_grad():  # transformers inits norms to 1 and biases to 0: randomise them so the test sees them
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.add_(0.1 * torch.randn_like(param))
    return model.eval()


def _tokens(rng, n):
    return rng.integers(3, 240, n).tolist()


def _vision(grid, token):
    return [VS] + [token] * (int(np.prod(grid)) // 4) + [VE]


def image_batch(seed: int = 0) -> dict[str, np.ndarray]:
    """Sample 0: text, image A, text, image B, text; sample 1: text only, right-padded. Labels -100 on the prompt."""
    rng = np.random.default_rng(seed)
    first = _tokens(rng, 3) + _vision(GRID_A, IMAGE) + _tokens(rng, 4) + _vision(GRID_B, IMAGE) + _tokens(rng, 6)
    second = _tokens(rng, 9)
    return _pack([first, second], rng, {"pixel_values": rng.standard_normal((48 + 16, 1176)).astype(np.float32),
                                        "image_grid_thw": np.array([GRID_A, GRID_B], np.int64)})


def video_batch(seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = _tokens(rng, 2) + _vision(GRID_VIDEO, VIDEO) + _tokens(rng, 5)
    return _pack([ids], rng, {"pixel_values_videos": rng.standard_normal((32, 1176)).astype(np.float32),
                              "video_grid_thw": np.array([GRID_VIDEO], np.int64),
                              "second_per_grid_ts": np.array([1.0], np.float32)})


def text_batch(seed: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return _pack([_tokens(rng, 11), _tokens(rng, 7)], rng, {})


def _pack(rows, rng, extra):
    length = max(len(r) for r in rows)
    ids = np.zeros((len(rows), length), np.int64)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    labels = np.where(mask == 1, ids, -100)
    labels[:, :3] = -100  # a prompt
    mm = np.where(ids == IMAGE, 1, np.where(ids == VIDEO, 2, 0)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "mm_token_type_ids": mm, **extra}


def hf_position_ids(model, batch) -> np.ndarray:
    """transformers' own M-RoPE positions for the batch (what its forward uses)."""
    import torch

    t = {k: torch.from_numpy(v) for k, v in batch.items()}
    kwargs = {"image_grid_thw": t.get("image_grid_thw"), "video_grid_thw": t.get("video_grid_thw"),
              "attention_mask": t["attention_mask"]}
    if "second_per_grid_ts" in t:
        kwargs["second_per_grid_ts"] = t["second_per_grid_ts"]
    if kwargs["image_grid_thw"] is None and kwargs["video_grid_thw"] is None:
        positions = np.cumsum(batch["attention_mask"], axis=1) - 1
        return np.broadcast_to(np.where(batch["attention_mask"] == 1, positions, 1), (3,) + positions.shape).copy()
    positions, _ = model.model.get_rope_index(t["input_ids"], t["mm_token_type_ids"], **kwargs)
    return positions.numpy()


def hf_forward_backward(model, batch) -> dict[str, np.ndarray]:
    """transformers' logits, loss and every parameter's gradient (hub names, patch kernel flattened)."""
    import torch

    model.zero_grad()
    t = {k: torch.from_numpy(v) for k, v in batch.items()}
    out = model(**t)
    out.loss.backward()
    grads = {}
    for name, param in model.named_parameters():
        for memory, hub in (("model.visual.", "visual."), ("model.language_model.", "model.")):
            if name.startswith(memory):
                name = hub + name[len(memory):]
        grad = torch.zeros_like(param) if param.grad is None else param.grad.detach()  # unused: zero, as ours
        grads[name] = grad.reshape(param.shape[0], -1).numpy() if name.endswith("patch_embed.proj.weight") \
            else grad.numpy()
    return {"logits": out.logits.detach().numpy(), "loss": out.loss.detach().numpy(), "grads": grads}
