"""Wan2.1 sampling, as diffusers' WanPipeline does it, on mmrun's portable API (PyTorch and MindSpore).

    latents = initial_latents(seed, batch, z_dim, frames, height, width)      # numpy, float32
    latents = denoise(transformer, scheduler, latents, prompt_embeds, negative_prompt_embeds,
                      num_inference_steps=50, guidance_scale=5.0)
    frames = decode_to_frames(vae, latents)                                   # uint8 (B, T, H, W, 3)

The loop is WanPipeline's (and WanImageToVideoPipeline's, with the image tokens and conditioning latents): the model
is called at every scheduler timestep (expanded over the batch) on the latents cast to the model's dtype; with
guidance_scale > 1 it is called a second time on the negative prompt and the two predictions mix as uncond + scale *
(cond - uncond); the scheduler (numpy, scheduling_unipc) steps the float32 latents. Latents leave the loop
normalised; decoding undoes the VAE's per-channel normalisation first.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Iterable, Iterator, TextIO

import numpy as np

from mmrun.backend import autograd, tensors

VAE_STRIDE_T, VAE_STRIDE_HW = 4, 8  # Wan2.1's VAE: 1 + 4k frames -> 1 + k latent frames, 8x8 pixels per latent


def latent_shape(batch: int, z_dim: int, frames: int, height: int, width: int,
                 stride_t: int = VAE_STRIDE_T, stride_hw: int = VAE_STRIDE_HW) -> tuple[int, ...]:
    """WanPipeline.prepare_latents' shape: (B, z_dim, (frames - 1) // 4 + 1, height // 8, width // 8)."""
    return batch, z_dim, (frames - 1) // stride_t + 1, height // stride_hw, width // stride_hw


def initial_latents(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Standard normal float32 noise from the seed (numpy: the same on both frameworks)."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def progress(items: Iterable[Any], total: int, label: str = "denoising", stream: TextIO | None = None
             ) -> Iterator[Any]:
    """A one-line progress bar on stderr: `denoising [#####.....] 5/10 1.2 s/it`."""
    stream = stream or sys.stderr
    start = time.perf_counter()
    for done, item in enumerate(items, 1):
        yield item
        seconds = (time.perf_counter() - start) / done
        bar = "#" * (20 * done // total) + "." * (20 - 20 * done // total)
        stream.write(f"\r{label} [{bar}] {done}/{total} {seconds:.2f} s/it")
        stream.flush()
    stream.write("\n")
    stream.flush()


def _model_dtype(model: Any) -> Any:
    """The dtype of the model's first parameter (None for a plain callable: the latents stay float32)."""
    for _, parameter in getattr(model, "named_parameters", lambda: iter(()))():
        return parameter.dtype
    return None


def denoise(transformer: Callable[..., Any], scheduler: Any, latents: np.ndarray, prompt_embeds: Any,
            negative_prompt_embeds: Any = None, *, num_inference_steps: int, guidance_scale: float,
            image_embeds: Any = None, condition: np.ndarray | None = None, show_progress: bool = True,
            on_step: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:
    """Run the scheduler from noise `latents` to clean latents (numpy float32 in and out). Image-to-video
    (WanImageToVideoPipeline) adds `image_embeds` (the CLIP tokens, models/wan/i2v.py) and `condition` (b, 4 + z_dim,
    f, h, w: the first frame's mask and latents), concatenated to the latents along channels at every step."""
    scheduler.set_timesteps(num_inference_steps)
    guided = guidance_scale > 1.0
    if guided and negative_prompt_embeds is None:
        raise ValueError("guidance_scale > 1 needs negative prompt embeddings (an empty negative prompt encodes too)")
    dtype = _model_dtype(transformer)
    steps = scheduler.timesteps
    iterator = progress(steps, len(steps)) if show_progress else iter(steps)
    latents = np.asarray(latents, dtype=np.float32)
    for index, t in enumerate(iterator):
        model_input = latents if condition is None else np.concatenate([latents, condition], axis=1)
        hidden = tensors.from_numpy(model_input, dtype=dtype)
        timestep = tensors.from_numpy(np.full((latents.shape[0],), t, dtype=np.asarray(t).dtype))
        extra = {} if image_embeds is None else {"encoder_hidden_states_image": image_embeds}
        with autograd.no_grad():
            prediction = transformer(hidden_states=hidden, timestep=timestep, encoder_hidden_states=prompt_embeds,
                                     **extra)
            if guided:
                uncond = transformer(hidden_states=hidden, timestep=timestep,
                                     encoder_hidden_states=negative_prompt_embeds, **extra)
                prediction = uncond + guidance_scale * (prediction - uncond)
        latents = scheduler.step(tensors.to_numpy(prediction), latents).astype(np.float32)
        if on_step is not None:
            on_step(index, latents)
    return latents
