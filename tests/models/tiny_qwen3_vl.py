"""A tiny random Hugging Face Qwen3-VL and its batches for the tests (offline, seconds).

Text: head_dim 16 given explicitly (not hidden / heads = 8, as Qwen3-VL-4B's differs too), mrope_section
(4, 2, 2) so every interleaved row is used, attention bias on. Vision: 3 blocks, DeepStack after blocks 0
and 2 (injected after decoder layers 0 and 1), a 4 x 4 learned position table resampled to the image's
6 x 8 grid (image 96 x 128 px, patch 16: 48 patches, 12 merged tokens). Every weight is perturbed from
transformers' init (norms 1, biases 0 would hide mistakes).
"""
from __future__ import annotations

import numpy as np

IMAGE, VS, VE, VIDEO = 250, 251, 252, 253
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=256, attention_bias=True, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2],
                             "mrope_interleaved": True})
VISION = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=32, patch_size=16,
              num_position_embeddings=16, deepstack_visual_indexes=[0, 2], spatial_merge_size=2,
              temporal_patch_size=2)
IDS = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VS, vision_end_token_id=VE)
GRID = (1, 6, 8)
PATCH_DIM = 3 * 2 * 16 * 16


def hf_model(seed: int = 0):
    """A random transformers Qwen3VLForConditionalGeneration (fp32, eval mode), every weight perturbed."""
    import torch
    import transformers

    config = transformers.Qwen3VLConfig(text_config=TEXT, vision_config=VISION, tie_word_embeddings=False, **IDS)
    torch.manual_seed(seed)
    model = transformers.Qwen3VLForConditionalGeneration(config)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return model.eval()


def _pack(rows, extra):
    length = max(len(r) for r in rows)
    ids = np.zeros((len(rows), length), np.int64)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    labels = np.where(mask == 1, ids, -100)
    labels[:, :3] = -100  # a prompt
    mm = np.where(ids == IMAGE, 1, np.where(ids == VIDEO, 2, 0)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "mm_token_type_ids": mm, **extra}


def image_batch(seed: int = 0) -> dict[str, np.ndarray]:
    """One sample: text, the image's vision block (12 pad tokens), text."""
    rng = np.random.default_rng(seed)
    ids = (rng.integers(3, 240, 3).tolist() + [VS] + [IMAGE] * (int(np.prod(GRID)) // 4) + [VE]
           + rng.integers(3, 240, 7).tolist())
    return _pack([ids], {"pixel_values": rng.standard_normal((int(np.prod(GRID)), PATCH_DIM)).astype(np.float32),
                         "image_grid_thw": np.array([GRID], np.int64)})


def image_video_batch(seed: int = 1) -> dict[str, np.ndarray]:
    """Sample 0: text, the image, text, a 2-frame video of 4 x 4 patches (each frame its own vision block, a
    timestamp token between them, as Qwen3-VL's processor writes videos), text; sample 1: text, right-padded.
    DeepStack then adds image and video features at their own rows."""
    rng = np.random.default_rng(seed)
    frame = [VS] + [VIDEO] * 4 + [VE]
    first = (rng.integers(3, 240, 3).tolist() + [VS] + [IMAGE] * (int(np.prod(GRID)) // 4) + [VE]
             + rng.integers(3, 240, 2).tolist() + frame + rng.integers(3, 240, 1).tolist() + frame
             + rng.integers(3, 240, 3).tolist())
    return _pack([first, rng.integers(3, 240, 5).tolist()], {
        "pixel_values": rng.standard_normal((int(np.prod(GRID)), PATCH_DIM)).astype(np.float32),
        "image_grid_thw": np.array([GRID], np.int64),
        "pixel_values_videos": rng.standard_normal((32, PATCH_DIM)).astype(np.float32),
        "video_grid_thw": np.array([[2, 4, 4]], np.int64)})


def text_batch(seed: int = 2) -> dict[str, np.ndarray]:
    """Two text-only samples, the second right-padded."""
    rng = np.random.default_rng(seed)
    return _pack([rng.integers(3, 240, 11).tolist(), rng.integers(3, 240, 7).tolist()], {})


def hf_position_ids(model, batch) -> np.ndarray:
    """transformers' own M-RoPE positions (3, B, S) for the batch (what its forward uses)."""
    import torch

    if "image_grid_thw" not in batch and "video_grid_thw" not in batch:
        positions = np.cumsum(batch["attention_mask"], axis=1) - 1
        return np.broadcast_to(np.where(batch["attention_mask"] == 1, positions, 0), (3,) + positions.shape).copy()
    t = {k: torch.from_numpy(v) for k, v in batch.items()}
    positions, _ = model.model.get_rope_index(t["input_ids"], t["mm_token_type_ids"],
                                              image_grid_thw=t.get("image_grid_thw"),
                                              video_grid_thw=t.get("video_grid_thw"),
                                              attention_mask=t["attention_mask"])
    return positions.numpy()


def hf_forward_backward(model, batch) -> dict[str, np.ndarray]:
    """transformers' logits, loss and every parameter's gradient (patch kernel flattened as ours)."""
    import torch

    model.zero_grad()
    out = model(**{k: torch.from_numpy(v) for k, v in batch.items()})
    out.loss.backward()
    grads = {}
    for name, param in model.named_parameters():
        grad = torch.zeros_like(param) if param.grad is None else param.grad.detach()
        grads[name] = grad.reshape(param.shape[0], -1).numpy() if name.endswith("patch_embed.proj.weight") \
            else grad.numpy()
    return {"logits": out.logits.detach().numpy(), "loss": out.loss.detach().numpy(), "grads": grads}


# The MoE variant (Qwen3-VL-30B-A3B's shape, shrunk): three decoder layers, the middle one dense (mlp_only_layers),
# six experts of width 8, two per token.
MOE = dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=8, decoder_sparse_step=1,
           mlp_only_layers=[1], router_aux_loss_coef=0.05)


def hf_moe_model(seed: int = 0, **text):
    """A random transformers Qwen3VLMoeForConditionalGeneration (fp32, eval mode), every weight perturbed; `text`
    overrides text_config fields (e.g. output_router_logits=True)."""
    import torch
    import transformers

    config = transformers.Qwen3VLMoeConfig(text_config={**TEXT, **MOE, "num_hidden_layers": 3, **text},
                                           vision_config=VISION, tie_word_embeddings=False, **IDS)
    torch.manual_seed(seed)
    model = transformers.Qwen3VLMoeForConditionalGeneration(config)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return model.eval()
