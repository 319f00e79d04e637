"""mmrun's Wan2.1 VAE against diffusers' AutoencoderKLWan (tiny random config, every weight perturbed): encode
(mode and a sample with given noise) and decode within 1e-5 in fp32 on PyTorch, MindSpore equal to PyTorch, the
latent normalisation, from_pretrained of a save_pretrained directory, one-line errors, and bf16 feature extraction
with MindSpeed-MM's real model_t2v.json equal to diffusers' bf16 latents."""
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


# MindSpeed-MM's examples/wan2.1/feature_extract/model_t2v.json (Ascend/MindSpeed-MM, Apache-2.0, commit
# 57069cd55a8ab16d5affe379a2e2c5f0a4d962b9), every key as written; only the two from_pretrained paths point at the
# tiny model.
REAL_MODEL_T2V = {
    "ae": {"model_id": "wan_video_vae", "from_pretrained": "Wan2.1-I2V-14B-Diffusers/vae", "dtype": "bf16",
           "enable_tiling": True, "tiling_param": {"tile_size": [34, 34], "tile_stride": [18, 16]},
           "norm_latents": True, "norm_mode": "channel_specified_shift_scale", "do_sample": False},
    "text_encoder": {"model_id": "UMT5", "dtype": "bf16", "hub_backend": "hf",
                     "from_pretrained": "Wan2.1-I2V-14B-Diffusers/text_encoder"}}


@pytest.mark.slow
def test_bf16_extraction_with_the_real_model_json_equals_diffusers_bf16(tmp_path, capsys):
    """get_wan_feature.py with the real model_t2v.json (ae and text_encoder dtype bf16) runs, and its latents equal
    diffusers' AutoencoderKLWan in bf16 on the same pixels (normalised in bf16 as the latents are) within bf16's
    rounding, its prompt embeddings transformers' UMT5 in bf16."""
    import importlib.util
    from pathlib import Path

    import torch
    from diffusers import AutoencoderKLWan
    from transformers import UMT5EncoderModel

    from mmrun.data.video import preprocess, readers
    from mmrun.data.video.feature_files import FeatureDataset
    from mmrun.models import get_wan_feature

    spec = importlib.util.spec_from_file_location(
        "make_demo", Path(__file__).resolve().parents[2] / "scripts" / "wan" / "make_demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    demo.main([str(tmp_path), "--videos", "1", "--frames", "5", "--size", "32"])
    data = json.loads((tmp_path / "data.json").read_text())
    data["dataset_param"]["preprocess_parameters"].update(num_frames=5, max_height=32, max_width=32)
    (tmp_path / "data.json").write_text(json.dumps(data))
    root = tmp_path / "Wan-tiny-Diffusers"
    model = json.loads(json.dumps(REAL_MODEL_T2V))
    model["ae"]["from_pretrained"], model["text_encoder"]["from_pretrained"] = str(root / "vae"), str(
        root / "text_encoder")
    (tmp_path / "model_t2v.json").write_text(json.dumps(model))
    code = get_wan_feature.main(["--micro-batch-size", "1", "--mm-data", str(tmp_path / "data.json"), "--mm-model",
                                 str(tmp_path / "model_t2v.json"), "--mm-tool", str(tmp_path / "tools.json")])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "notice: --mm-model ae.enable_tiling" in out.out  # tiling only bounds memory: one notice, no error
    dataset = FeatureDataset(tmp_path / "sora_features" / "data.jsonl", tmp_path / "sora_features", text_dim=32)
    sample, record = dataset[0], dataset.records[0]

    params = preprocess.PreprocessParameters.from_dict(data["dataset_param"]["preprocess_parameters"])
    pixels = preprocess.preprocess_video(readers.read_video(record["path"]), params, np.random.default_rng(0))["video"]
    vae = AutoencoderKLWan.from_pretrained(root / "vae", torch_dtype=torch.bfloat16)
    with torch.no_grad():
        mode = vae.encode(torch.from_numpy(pixels[None]).to(torch.bfloat16)).latent_dist.mode()[0]
    mean, std = (torch.tensor(vae.config[k]).reshape(-1, 1, 1, 1).to(torch.bfloat16)
                 for k in ("latents_mean", "latents_std"))
    expected = ((mode - mean) / std).float().numpy()
    fp32 = AutoencoderKLWan.from_pretrained(root / "vae")
    with torch.no_grad():
        exact = ((fp32.encode(torch.from_numpy(pixels[None])).latent_dist.mode()[0] - mean.float()) / std.float())
    assert sample["video"].shape == expected.shape == (4, 5, 8, 8)
    scale = float(np.abs(expected).max())
    ours_err, theirs_err = (float(np.abs(x - exact.numpy()).max()) for x in (sample["video"], expected))
    assert np.abs(sample["video"] - expected).max() <= 0.02 * scale  # bf16 keeps 8 bits (measured: 0, bit-equal)
    assert 0 < ours_err <= 2 * theirs_err + 1e-3 * scale  # really bf16 (not float32), and no worse than diffusers'

    encoder = UMT5EncoderModel.from_pretrained(root / "text_encoder", dtype=torch.bfloat16)
    vocab = json.loads((root / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    ids = [vocab[w] for w in record["cap"].split()] + [vocab["</s>"]]
    with torch.no_grad():
        hidden = encoder(torch.tensor([ids])).last_hidden_state[0].float().numpy()
    assert np.abs(sample["prompt_ids"][:len(ids)] - hidden).max() <= 0.02 * float(np.abs(hidden).max())

    # MindSpore has no bf16 CPU kernels: the same json there is one line and exit 2, before a kernel fails inside
    import subprocess
    import sys
    entry = Path(__file__).resolve().parents[2] / "models" / "get_wan_feature.py"
    done = subprocess.run([sys.executable, str(entry), "--micro-batch-size", "1", "--mm-data",
                           str(tmp_path / "data.json"), "--mm-model", str(tmp_path / "model_t2v.json"), "--mm-tool",
                           str(tmp_path / "tools.json"), "--ai-framework", "mindspore"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == (
        "error: --mm-model ae.dtype 'bf16' cannot run with the mindspore backend on cpu (no bf16 kernels there); set "
        "it to fp16 or fp32"), done.stderr[-3000:]
