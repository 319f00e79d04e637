"""Wan2.1 image-to-video conditioning, as MindSpeed-MM's WanVideoI2VProcessor and diffusers'
WanImageToVideoPipeline build it, on mmrun's portable API (PyTorch and MindSpore).

Two inputs join the DiT besides the prompt:
- the CLIP image tokens of the first frame (models/clip_vision.py: hidden_states[-2], (b, 257, 1280) for Wan),
  given to cross-attention as `encoder_hidden_states_image`;
- the conditioning latents `[mask (4), latents (z_dim)]` (b, 4 + z_dim, f, h, w) concatenated to the noisy latents
  along channels (in_dim = 2 * z_dim + 4 = 36 for Wan2.1 I2V): the VAE latents of the first frame followed by
  frames - 1 black (zero) frames, normalised per channel as the video latents are, and before them the frame mask
  laid out over the VAE's temporal stride (4 channels: the first frame counted 4 times, then 4 frames per latent
  frame), so 1 on the first latent frame's 4 channels and 0 everywhere else.

MindSpeed-MM stores the second as `i2v_vae_feature` and the first as `i2v_clip_feature` in each feature file
(data/video/feature_files.py); pretrain_sora.py concatenates them as the DiT wants.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mmrun.backend import autograd, tensors

MASK_CHANNELS = 4  # the VAE's temporal stride: the mask of 4 frames per latent frame


def frame_mask(batch: int, frames: int, latent_height: int, latent_width: int, stride_t: int = MASK_CHANNELS
               ) -> np.ndarray:
    """float32 (batch, stride_t, (frames - 1) // stride_t + 1, h, w): 1 where a frame is given (the first), else 0."""
    per_frame = np.zeros((frames + stride_t - 1,), np.float32)
    per_frame[:stride_t] = 1.0  # the first frame, repeated over the first latent frame's stride_t slots
    grouped = per_frame.reshape(-1, stride_t).T  # (stride_t, latent frames)
    return np.ascontiguousarray(np.broadcast_to(grouped[None, :, :, None, None],
                                                (batch, stride_t, grouped.shape[1], latent_height, latent_width)))


def condition_pixels(first_frame: np.ndarray, frames: int) -> np.ndarray:
    """(b, 3, frames, H, W): the first frame (b, 3, H, W) in [-1, 1] followed by frames - 1 zero frames."""
    b, c, h, w = first_frame.shape
    out = np.zeros((b, c, frames, h, w), np.float32)
    out[:, :, 0] = first_frame
    return out


def condition_latents(vae: Any, first_frame: np.ndarray, frames: int, normalize: bool = True,
                      noise: np.ndarray | None = None) -> np.ndarray:
    """i2v_vae_feature (b, 4 + z_dim, f, h, w) float32 of first frames (b, 3, H, W) in [-1, 1]: the mask, then the
    VAE latents (the mode, or the sample with `noise`) of the first frame plus frames - 1 zero frames, normalised
    per channel when `normalize` (MindSpeed-MM's norm_latents; diffusers always normalises)."""
    parameter = next(iter(dict(vae.named_parameters()).values()))
    pixels = tensors.cast(tensors.from_numpy(condition_pixels(first_frame, frames)), parameter.dtype)
    with autograd.no_grad():
        if noise is None:
            latents = vae.encode(pixels)
        else:
            latents = vae.encode(pixels, noise=tensors.cast(tensors.from_numpy(noise), parameter.dtype))
        if normalize:
            latents = vae.normalize_latents(latents)
    latents = tensors.to_numpy(tensors.cast(latents, tensors.dtype("fp32")))
    b, _, f, h, w = latents.shape
    mask = frame_mask(b, frames, h, w, vae.config.temporal_compression)
    if mask.shape[2] != f:
        raise ValueError(f"{frames} frames give {mask.shape[2]} latent frames by the mask, {f} by the VAE")
    return np.concatenate([mask, latents], axis=1)


def first_frame_pixels(images: list[Any], height: int, width: int) -> np.ndarray:
    """float32 (b, 3, height, width) in [-1, 1] of PIL images, as diffusers' VideoProcessor.preprocess gives
    WanImageToVideoPipeline its first frame: Pillow's Lanczos resize to (height, width) (no crop: the aspect is the
    caller's), RGB, / 255, * 2 - 1."""
    from PIL import Image

    frames = [np.asarray(image.resize((width, height), Image.Resampling.LANCZOS).convert("RGB"), np.float32) / 255.0
              for image in images]
    return np.ascontiguousarray(np.stack(frames).transpose(0, 3, 1, 2) * 2.0 - 1.0, dtype=np.float32)
