"""mmrun's Wan2.1 VAE against diffusers' AutoencoderKLWan (tiny random config, every weight perturbed): encode
(mode and a sample with given noise) and decode within 1e-5 in fp32 on PyTorch, MindSpore equal to PyTorch, the
latent normalisation, from_pretrained of a save_pretrained directory, and one-line errors."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from mmrun.backend.errors import UsageError


@pytest.fixture(scope="module")
def torch_vae(wan_refs):
    from mmrun import backend
    try:
        backend.select("pytorch", "tests/models: the in-process side of the comparisons runs PyTorch")
    except backend.BackendError as error:
        pytest.skip(str(error))
    from mmrun.models.wan.vae import AutoencoderKLWan
    return AutoencoderKLWan.from_pretrained(wan_refs["vae_dir"])


def test_parameter_names_are_diffusers_keys(wan_refs, torch_vae):
    theirs = {k: tuple(v.shape) for k, v in wan_refs["vae"].state_dict().items()}
    ours = {k: tuple(v.shape) for k, v in torch_vae.state_dict().items()}
    assert ours == theirs


def test_encode_and_decode_equal_diffusers(wan_tiny, wan_refs, torch_vae):
    import torch
    cases = wan_tiny.vae_cases(wan_refs["vae_dir"])
    video, noise, latents = (torch.from_numpy(cases[f"vae/{k}"]) for k in ("video", "noise", "latents"))
    with torch.no_grad():
        dist = wan_refs["vae"].encode(video).latent_dist
        decoded = wan_refs["vae"].decode(latents).sample
    mean = torch_vae.encode(video)
    assert mean.shape == (1, 4, 3, 2, 2)  # one temporal downsampling: 5 frames -> 1 + 4 / 2 latent frames
    np.testing.assert_allclose(mean.numpy(), dist.mode().numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(torch_vae.encode(video, noise=noise).numpy(), (dist.mean + dist.std * noise).numpy(),
                               rtol=0, atol=1e-5)
    out = torch_vae.decode(latents)
    assert out.shape == decoded.shape == (1, 3, 5, 16, 16)
    assert 0.01 < float((out.abs() < 1).float().mean())  # not all clamped: the comparison sees real values
    np.testing.assert_allclose(out.numpy(), decoded.numpy(), rtol=0, atol=1e-5)


def test_wan_layout_nine_frames_equal_diffusers(wan_tiny, tmp_path):
    """Wan's own temporal layout (two temporal downsamplings): 9 frames, so the second downsampler and the
    decoder's upsamplers carry a cache from chunk to chunk."""
    import torch
    from mmrun.models.wan.vae import AutoencoderKLWan
    ref = wan_tiny.diffusers_vae(dict(wan_tiny.VAE_CONFIG, temperal_downsample=[False, True, True]))
    ref.save_pretrained(tmp_path)
    ours = AutoencoderKLWan.from_pretrained(tmp_path)
    video = torch.from_numpy(wan_tiny.video(frames=9, size=(8, 8)))
    latents = 0.5 * torch.randn(1, 4, 3, 1, 1, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        np.testing.assert_allclose(ours.encode(video).numpy(), ref.encode(video).latent_dist.mode().numpy(),
                                   rtol=0, atol=1e-5)
        np.testing.assert_allclose(ours.decode(latents).numpy(), ref.decode(latents).sample.numpy(), rtol=0, atol=1e-5)


def test_latent_normalisation_is_channel_specified_shift_scale(wan_tiny, wan_refs, torch_vae):
    import torch
    z = torch.from_numpy(wan_tiny.vae_cases(wan_refs["vae_dir"])["vae/latents"])
    mean = torch.tensor(wan_tiny.VAE_CONFIG["latents_mean"]).view(1, 4, 1, 1, 1)
    std = torch.tensor(wan_tiny.VAE_CONFIG["latents_std"]).view(1, 4, 1, 1, 1)
    np.testing.assert_allclose(torch_vae.normalize_latents(z).numpy(), ((z - mean) / std).numpy(), rtol=1e-6)
    # diffusers' WanPipeline: latents / (1 / std) + mean
    np.testing.assert_allclose(torch_vae.denormalize_latents(z).numpy(), (z / (1.0 / std) + mean).numpy(),
                               rtol=1e-6, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("key", ["mean", "sample", "decoded", "normalized", "denormalized"])
def test_mindspore_equals_pytorch(wan_frameworks, key):
    cases, torch_out, ms_out = wan_frameworks
    assert ms_out[f"vae/{key}"].shape == torch_out[f"vae/{key}"].shape
    np.testing.assert_allclose(ms_out[f"vae/{key}"], torch_out[f"vae/{key}"], rtol=0, atol=1e-5)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_from_pretrained_errors_are_one_line(wan_refs, torch_vae, tmp_path):
    import torch
    from mmrun.models.wan.vae import AutoencoderKLWan
    broken = {}
    broken["not a directory"] = tmp_path / "absent"
    (tmp_path / "empty").mkdir()
    broken["has no config.json"] = tmp_path / "empty"
    no_weights = _copy(wan_refs["vae_dir"], tmp_path / "no_weights")
    (no_weights / "diffusion_pytorch_model.safetensors").unlink()
    broken["has no model.safetensors or diffusion_pytorch_model.safetensors"] = no_weights
    broken["has _class_name None, not 'AutoencoderKLWan'"] = wan_refs["umt5_dir"]
    other_shape = _copy(wan_refs["vae_dir"], tmp_path / "other_shape")
    config = json.loads((other_shape / "config.json").read_text())
    (other_shape / "config.json").write_text(json.dumps({**config, "base_dim": 16}))
    broken["has tensors of other shapes than its config.json gives"] = other_shape
    residual = _copy(wan_refs["vae_dir"], tmp_path / "residual")
    (residual / "config.json").write_text(json.dumps({**config, "is_residual": True}))
    broken["is_residual=True (Wan2.2's VAE or encoder attention) is not supported"] = residual
    for expected, path in broken.items():
        with pytest.raises(UsageError) as error:
            AutoencoderKLWan.from_pretrained(path)
        assert expected in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(UsageError, match=r"a clip of 6 frames; .* pass 5$"):
        torch_vae.encode(torch.zeros(1, 3, 6, 16, 16))
    with pytest.raises(UsageError, match="multiples of 8"):
        torch_vae.encode(torch.zeros(1, 3, 5, 12, 16))
    with pytest.raises(UsageError, match="set enable_tiling false"):
        torch_vae.enable_tiling()
