"""The Wan demo's hand-set VAE (scripts/wan/shape_vae.py) and its check of sampled videos
(scripts/wan/check_samples.py): the VAE's latents are the patches' mean colours, its decode draws the clip again,
and the check tells a shape moving the prompted way from one moving otherwise."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    sys.path.insert(0, str(ROOT / "scripts" / "wan"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "wan" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "scripts" / "wan"))


def test_the_hand_set_vae_reconstructs_the_demo_clips_and_the_check_reads_them():
    from mmrun.backend import tensors
    from mmrun.checkpoint.formats import hf_directory
    from mmrun.models.wan.vae import AutoencoderKLWan, WanVAEConfig

    shape_vae, demo, check = _script("shape_vae"), _script("make_demo"), _script("check_samples")
    vae = AutoencoderKLWan(WanVAEConfig.from_dict(shape_vae.CONFIG))
    shapes = {k: tuple(v.shape) for k, v in tensors.state_dict_to_numpy(vae.state_dict()).items()}
    hf_directory.load_into(vae, shape_vae.weights(shapes), "the demo's VAE", "shape_vae")
    rng = np.random.default_rng(0)
    for combination in [("blue", "disc", "up")]:
        clip, caption = demo.draw_clip(rng, 5, 32, combination)
        pixels = np.ascontiguousarray(clip.transpose(3, 0, 1, 2)[None], np.float32) / 127.5 - 1.0
        z = tensors.to_numpy(vae.encode(tensors.from_numpy(pixels)))
        patch_means = pixels.reshape(1, 3, 5, 8, 4, 8, 4).mean(axis=(4, 6))
        assert z.shape == (1, 4, 5, 8, 8) and np.abs(z[:, :3] - patch_means).max() < 1e-5
        first_frame_mark = np.zeros((5, 8, 8), np.float32)
        first_frame_mark[0] = 1.0
        assert np.abs(z[0, 3] - first_frame_mark).max() < 1e-4  # channel 3: 1 on the first frame only
        video = tensors.to_numpy(vae.decode(tensors.from_numpy(z)))
        assert float(np.mean((video - pixels) ** 2)) < 0.02  # 0.009 measured: blurred edges, the rest exact
        frames = np.round((video[0].transpose(1, 2, 3, 0) + 1.0) * 127.5).clip(0, 255).astype(np.uint8)
        assert check.check(frames, caption)[0], check.check(frames, caption)[1]
        wrong_way = caption.replace("up", "down")
        wrong_colour = caption.replace(combination[0], "green")
        assert not check.check(frames, wrong_way)[0] and not check.check(frames, wrong_colour)[0]
        assert not check.check(frames[::-1], caption)[0]  # the same shape moving backwards
