"""Weights, set by hand, that make the demo's tiny Wan VAE (AutoencoderKLWan) reconstruct its flat-coloured clips:
each latent is the mean colour of a 4x4 patch of one frame, and decoding paints it back, smoothly upsampled.

Why by hand: a random VAE decodes the DiT's latents into noise-like texture, and fitting the tiny VAE by gradient
descent on the demo's clips (400 Adam steps) learnt only the grey background. The synthetic clips are flat colours
on grey, so a patch's mean colour is enough to draw them, and the Wan VAE can compute it exactly with its own
layers: with `temperal_downsample` all False (every frame its own latent frame) and `dim_mult` of three entries
(two 2x downsamplings: 4x4 pixels per latent),

  * every residual block's conv2 and every attention's to_qkv/proj are zero, so those blocks pass their input on
    (through an identity `conv_shortcut` where the channels grow);
  * the convolutions carry the channels [K, r, g, b, -r, -g, -b] (K a large constant from conv_in's bias):
    the downsamplers average 2x2 pixels, the upsamplers repeat them and blur with a [1, 2, 1] kernel;
  * each `norm_out` (x / ||x|| * sqrt(dim) * gamma) has gamma = K / sqrt(dim): ||x|| is K to within
    |rgb|^2 / K^2 (3e-6 at K = 1000), so it passes x on; the SiLU after it is undone exactly by the next
    convolution taking silu(v) - silu(-v) = v from the v and -v channels.

Latent channels 0-2 are the patch's mean r, g, b in [-1, 1] (the grey background ~0). Channel 3 marks the first
frame: 1 there, 0 on the others, from encoder.conv_out reading the constant channel at the current frame minus the
frame before (zero padding before the first frame, as every causal convolution of the Wan VAE has; the decoder
does not read it). Why: the DiT's only sense of time is its rotary positions, which are relative; without the
mark, a tiny DiT trained from scratch predicted the same square for the first frame as for the last (measured:
its mean x0 at sigma 0.95 was identical for frames 0 and 4), so it learnt colour and axis but drew "right" and
"left" either way round. The real Wan VAE's first latent frame is special too (it encodes one frame, the others
four).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

K = 1000.0  # the constant channel's value: the norms' error is |rgb|^2 / K^2
COLOUR = 3  # r, g, b
CARRIED = 1 + 2 * COLOUR  # [K, rgb, -rgb]: the channels every stage must have
CONFIG = {"_class_name": "AutoencoderKLWan", "base_dim": 8, "z_dim": 4, "dim_mult": [1, 2, 2],
          "num_res_blocks": 1, "attn_scales": [], "temperal_downsample": [False, False], "dropout": 0.0,
          "latents_mean": [0.0] * 4, "latents_std": [0.5] * 4}
BLUR = np.outer([1.0, 2.0, 1.0], [1.0, 2.0, 1.0]) / 16.0


def _centre(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The tap of a causal 3-D kernel (t, h, w) or a 2-D one (h, w) that reads the current frame and pixel."""
    kernel = shape[2:]
    return tuple(k - 1 if len(kernel) == 3 and i == 0 else k // 2 for i, k in enumerate(kernel))


def _from_colour(weight: np.ndarray, source: slice | int) -> None:
    """Output channels 1-3 = +colour, 4-6 = -colour, reading the colour from input channels `source`."""
    tap = _centre(weight.shape)
    for i in range(COLOUR):
        src = source + i
        weight[(1 + i, src) + tap] = 1.0
        weight[(1 + COLOUR + i, src) + tap] = -1.0


def _to_colour(weight: np.ndarray) -> None:
    """Output channels 0-2 = silu(v) - silu(-v) = v from the carried +colour / -colour channels."""
    tap = _centre(weight.shape)
    for i in range(COLOUR):
        weight[(i, 1 + i) + tap] = 1.0
        weight[(i, 1 + COLOUR + i) + tap] = -1.0


def _identity(weight: np.ndarray, kernel: np.ndarray | None = None) -> None:
    """Carry the first CARRIED channels as they are (or through `kernel` for the colour channels)."""
    tap = _centre(weight.shape)
    for c in range(min(weight.shape[0], weight.shape[1], CARRIED)):
        if kernel is None or c == 0:  # the constant stays K up to the borders
            weight[(c, c) + tap] = 1.0
        else:
            weight[c, c] = kernel


def weights(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The hand-set state dict for a VAE of CONFIG, given its parameter names and shapes."""
    out = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
    for name, array in out.items():
        if name.endswith("gamma"):
            array[...] = K / np.sqrt(array.shape[0]) if name.endswith("norm_out.gamma") else 1.0
        elif not name.endswith("weight"):
            continue
        elif name in ("encoder.conv_in.weight", "decoder.conv_in.weight"):
            _from_colour(array, 0)
            out[name.replace("weight", "bias")][0] = K
        elif name in ("encoder.conv_out.weight", "decoder.conv_out.weight"):
            _to_colour(array)
        elif name in ("quant_conv.weight", "post_quant_conv.weight") or "conv_shortcut" in name:
            _identity(array)
        elif name.endswith("resample.1.weight") and name.startswith("encoder."):
            for c in range(min(array.shape[:2])):  # 2x2 mean (the stride-2 kernel's top-left taps)
                array[c, c, :2, :2] = 0.25
        elif name.endswith("resample.1.weight"):
            _identity(array, BLUR)
    if "encoder.conv_out.weight" in out:  # the first-frame mark: K (this frame) - K (the frame before) over K
        mark, centre = out["encoder.conv_out.weight"], _centre(out["encoder.conv_out.weight"].shape)
        mark[(CONFIG["z_dim"] - 1, 0) + centre] = 1.0 / K
        mark[(CONFIG["z_dim"] - 1, 0, centre[0] - 1) + centre[1:]] = -1.0 / K
    if "encoder.conv_out.bias" in out:  # logvar: as small as diffusers clamps it (a sample is the mean)
        out["encoder.conv_out.bias"][CONFIG["z_dim"]:] = -30.0
    return out
