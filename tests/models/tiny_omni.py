"""A tiny random transformers Qwen2.5-Omni thinker and batches for the tests (offline, seconds).

Audio: 8 mel bins, n_window 4 (chunks of 8 frames), so a 21-frame audio is 3 chunks (8, 8, 5) giving 5 tokens,
10 frames 2 chunks (8, 2) giving 2, 38 frames 5 chunks giving 9. TMRoPE with position_id_per_seconds 2 and
seconds_per_chunk 2: a chunk is 4 time positions, so the 3-step video below (2 s per step: times 0, 4, 8) and
its 9-token audio track (positions 0..8) interleave in three chunks: video 4, audio 4, video 4, audio 4,
video 4, audio 1 (the processor's order). Vision as tests/models/tiny_hf.py's Qwen2.5-VL (window attention
active on the 84x112 image, block 1 full attention).
"""
from __future__ import annotations

import numpy as np

AUDIO_START, AUDIO_END, AUDIO, IMAGE, VS, VE, VIDEO = 247, 248, 249, 250, 251, 252, 253
MEL = 8
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0},
            rms_norm_eps=1e-6, tie_word_embeddings=False)
VISION = dict(depth=2, hidden_size=32, intermediate_size=48, out_hidden_size=32, num_heads=4, window_size=56,
              fullatt_block_indexes=[1])
AUDIO_CONFIG = dict(num_mel_bins=MEL, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=48, d_model=32,
                    max_source_positions=30, n_window=4, output_dim=32)
IDS = dict(audio_token_index=AUDIO, image_token_index=IMAGE, video_token_index=VIDEO, vision_start_token_id=VS,
           vision_end_token_id=VE, audio_start_token_id=AUDIO_START, audio_end_token_id=AUDIO_END,
           position_id_per_seconds=2, seconds_per_chunk=2)
GRID_A, GRID_B, GRID_VIDEO, GRID_AV = (1, 6, 8), (1, 4, 4), (2, 4, 4), (3, 4, 4)
PATCH = 3 * 2 * 14 * 14


def hf_config():
    import transformers
    return transformers.Qwen2_5OmniThinkerConfig(text_config=TEXT, vision_config=VISION, audio_config=AUDIO_CONFIG,
                                                 tie_word_embeddings=False, **IDS)


def hf_model(seed: int = 0):
    """A random transformers thinker (fp32, eval mode), norms and biases randomised too."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.Qwen2_5OmniThinkerForConditionalGeneration(hf_config())
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.add_(0.1 * torch.randn_like(param))
    return model.eval()


def whole_model_dir(thinker, path):
    """The thinker as a whole Qwen2.5-Omni checkpoint (config.json with thinker_config, keys `thinker.*`, plus a
    talker tensor the reader must skip), written with safetensors' numpy writer."""
    import json
    import os

    from safetensors.numpy import save_file

    os.makedirs(path, exist_ok=True)
    thinker_config = thinker.config.to_dict()
    config = {"architectures": ["Qwen2_5OmniForConditionalGeneration"], "model_type": "qwen2_5_omni",
              "enable_audio_output": False, "thinker_config": thinker_config}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    tensors = {"thinker." + hub_name(n): p.detach().numpy().copy() for n, p in thinker.named_parameters()}
    tensors["talker.codec_head.weight"] = np.zeros((4, 4), np.float32)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    return path


def hub_name(name: str) -> str:
    for memory, hub in (("model.audio_tower.", "audio_tower."), ("model.visual.", "visual."),
                        ("model.language_model.", "model.")):
        if name.startswith(memory):
            return hub + name[len(memory):]
    return name


def _tokens(rng, n):
    return rng.integers(3, 240, n).tolist()


def _vision(grid, token):
    return [VS] + [token] * (int(np.prod(grid)) // 4) + [VE]


def _audio(tokens):
    return [AUDIO_START] + [AUDIO] * tokens + [AUDIO_END]


def _features(rng, lengths):
    longest = max(lengths)
    features = rng.standard_normal((len(lengths), MEL, longest)).astype(np.float32)
    mask = (np.arange(longest)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    return {"input_features": features * mask[:, None, :], "feature_attention_mask": mask}


def _pack(rows, rng, extra):
    length = max(len(r) for r in rows)
    ids = np.zeros((len(rows), length), np.int64)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    labels = np.where(mask == 1, ids, -100)
    labels[:, :3] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, **extra}


def text_batch(seed: int = 2):
    rng = np.random.default_rng(seed)
    return _pack([_tokens(rng, 11), _tokens(rng, 7)], rng, {})


def image_batch(seed: int = 0):
    """Sample 0: text, image A, text, image B, text; sample 1: text only, right-padded."""
    rng = np.random.default_rng(seed)
    first = _tokens(rng, 3) + _vision(GRID_A, IMAGE) + _tokens(rng, 4) + _vision(GRID_B, IMAGE) + _tokens(rng, 6)
    return _pack([first, _tokens(rng, 9)], rng, {"pixel_values": rng.standard_normal((64, PATCH)).astype(np.float32),
                                                 "image_grid_thw": np.array([GRID_A, GRID_B], np.int64)})


def video_batch(seed: int = 1):
    rng = np.random.default_rng(seed)
    ids = _tokens(rng, 2) + _vision(GRID_VIDEO, VIDEO) + _tokens(rng, 5)
    return _pack([ids], rng, {"pixel_values_videos": rng.standard_normal((32, PATCH)).astype(np.float32),
                              "video_grid_thw": np.array([GRID_VIDEO], np.int64),
                              "video_second_per_grid": np.array([1.0], np.float32)})


def audio_batch(seed: int = 3):
    """Audio only: sample 0 text, audio (21 frames: 5 tokens), text, audio (10: 2), text; sample 1 text, audio
    (38: 9), padded."""
    rng = np.random.default_rng(seed)
    first = _tokens(rng, 3) + _audio(5) + _tokens(rng, 2) + _audio(2) + _tokens(rng, 4)
    second = _tokens(rng, 2) + _audio(9) + _tokens(rng, 1)
    return _pack([first, second], rng, _features(rng, [21, 10, 38]))


def audio_image_batch(seed: int = 4):
    """Audio beside an image (so TMRoPE's audio rule runs, not the text fallback): sample 0 text, audio, text,
    image B, text; sample 1 text, audio, padded."""
    rng = np.random.default_rng(seed)
    first = _tokens(rng, 2) + _audio(5) + _tokens(rng, 3) + _vision(GRID_B, IMAGE) + _tokens(rng, 4)
    second = _tokens(rng, 4) + _audio(2) + _tokens(rng, 2)
    return _pack([first, second], rng, {**_features(rng, [21, 10]),
                                        "pixel_values": rng.standard_normal((16, PATCH)).astype(np.float32),
                                        "image_grid_thw": np.array([GRID_B], np.int64)})


def video_audio_batch(seed: int = 5):
    """A 3-step video (2 s per step) with its 9-token audio track interleaved (use_audio_in_video)."""
    rng = np.random.default_rng(seed)
    body = [VIDEO] * 4 + [AUDIO] * 4 + [VIDEO] * 4 + [AUDIO] * 4 + [VIDEO] * 4 + [AUDIO] * 1
    ids = _tokens(rng, 3) + [VS, AUDIO_START] + body + [AUDIO_END, VE] + _tokens(rng, 5)
    return _pack([ids], rng, {**_features(rng, [38]),
                              "pixel_values_videos": rng.standard_normal((48, PATCH)).astype(np.float32),
                              "video_grid_thw": np.array([GRID_AV], np.int64),
                              "video_second_per_grid": np.array([2.0], np.float32),
                              "use_audio_in_video": np.array(True)})


BATCHES = ("text_batch", "image_batch", "video_batch", "audio_batch", "audio_image_batch", "video_audio_batch")


def _torch_inputs(batch):
    import torch
    return {k: (bool(v) if k == "use_audio_in_video" else torch.from_numpy(v)) for k, v in batch.items()}


def hf_rope_index(model, batch) -> np.ndarray:
    """transformers' own TMRoPE positions for the batch (its get_rope_index, as its forward calls it)."""
    t = _torch_inputs(batch)
    mask = t.get("feature_attention_mask")
    positions, _ = model.model.get_rope_index(
        t["input_ids"], t.get("image_grid_thw"), t.get("video_grid_thw"), t["attention_mask"],
        t.get("use_audio_in_video", False), None if mask is None else mask.sum(-1), t.get("video_second_per_grid"))
    return positions.numpy()


FLATTENED = ("audio_tower.conv1.weight", "audio_tower.conv2.weight", "visual.patch_embed.proj.weight")


def hf_forward_backward(model, batch) -> dict:
    """transformers' logits, loss and every parameter's gradient (hub names, conv kernels flattened)."""
    import torch

    model.zero_grad()
    out = model(**_torch_inputs(batch))
    out.loss.backward()
    grads = {}
    for name, param in model.named_parameters():
        name = hub_name(name)
        grad = torch.zeros_like(param) if param.grad is None else param.grad.detach()
        grads[name] = grad.reshape(param.shape[0], -1).numpy() if name in FLATTENED else grad.numpy()
    return {"logits": out.logits.detach().numpy(), "loss": out.loss.detach().numpy(), "grads": grads}


def prompt(name: str) -> dict:
    """The first row of a batch as one generation prompt (its real tokens and its own media), numpy."""
    batch = globals()[name]()
    ids = batch["input_ids"][:1, batch["attention_mask"][0] == 1]
    media = {"audio_batch": ("input_features", "feature_attention_mask"),
             "video_audio_batch": ("input_features", "feature_attention_mask", "pixel_values_videos", "video_grid_thw",
                                   "video_second_per_grid", "use_audio_in_video"),
             "image_batch": ("pixel_values", "image_grid_thw")}[name]
    out = {"input_ids": ids, **{k: batch[k] for k in media}}
    if name == "audio_batch":  # the first row holds the first two audios
        out = {**out, "input_features": batch["input_features"][:2], "feature_attention_mask": batch["feature_attention_mask"][:2]}
    return out


def hf_generate(model, prompt: dict, new_tokens: int) -> list[int]:
    """transformers' greedy generate on the prompt: the new token ids."""
    import torch

    inputs = {k: (bool(v) if k == "use_audio_in_video" else torch.from_numpy(v)) for k, v in prompt.items()}
    out = model.generate(**inputs, attention_mask=torch.ones_like(inputs["input_ids"]), max_new_tokens=new_tokens,
                         do_sample=False)
    return out[0, prompt["input_ids"].shape[1]:].tolist()
