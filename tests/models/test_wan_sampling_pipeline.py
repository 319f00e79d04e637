"""Wan sampling and feature extraction: the denoising loop against diffusers' WanPipeline, the two entries end to
end on a tiny offline model (against diffusers' VAE and transformers' UMT5), and their one-line refusals."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY_DIT = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
                text_dim=32, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=32)


def tiny_diffusers_dit(path: Path) -> Path:
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(**TINY_DIT)
    with torch.no_grad():  # diffusers zero-initialises some projections: perturb every weight
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(path)
    return path


def test_denoising_loop_equals_diffusers_wan_pipeline(tmp_path):
    import torch
    from diffusers import UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel as Reference

    from mmrun.models.wan import sampling
    from mmrun.models.wan.scheduling_unipc import build_scheduler
    from mmrun.models.wan.transformer import WanTransformer3DModel

    directory = tiny_diffusers_dit(tmp_path / "transformer")
    block = {"model_id": "UniPCMultistepScheduler", "num_train_steps": 1000, "flow_shift": 3.0,
             "prediction_type": "flow_prediction", "use_flow_sigmas": True, "solver_order": 2, "solver_type": "bh2"}
    reference = WanPipeline(tokenizer=None, text_encoder=None, vae=None, transformer=Reference.from_pretrained(directory),
                            scheduler=UniPCMultistepScheduler(num_train_timesteps=1000, flow_shift=3.0,
                                                              prediction_type="flow_prediction", use_flow_sigmas=True))
    reference.set_progress_bar_config(disable=True)
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((1, 4, 3, 4, 6)).astype(np.float32)
    prompt, negative = (rng.standard_normal((1, 7, 32)).astype(np.float32) for _ in range(2))
    expected = reference(prompt_embeds=torch.from_numpy(prompt), negative_prompt_embeds=torch.from_numpy(negative),
                         latents=torch.from_numpy(latents), num_inference_steps=4, guidance_scale=5.0, height=32,
                         width=48, num_frames=9, output_type="latent").frames.numpy()
    ours = sampling.denoise(WanTransformer3DModel.from_pretrained(directory), build_scheduler(block), latents,
                            torch.from_numpy(prompt), torch.from_numpy(negative), num_inference_steps=4,
                            guidance_scale=5.0, show_progress=False)
    assert np.abs(expected - ours).max() < 1e-4
    assert np.abs(expected - latents).max() > 0.1  # the loop moved the latents


def load_make_demo():
    spec = importlib.util.spec_from_file_location("make_demo", ROOT / "scripts" / "wan" / "make_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_entries_refuse_what_they_cannot_run_in_one_line(tmp_path, capsys):
    from mmrun.models import get_wan_feature, inference_sora

    (tmp_path / "i2v.json").write_text(json.dumps({"task": "i2v", "ae": {}, "text_encoder": {}}))
    (tmp_path / "tools.json").write_text(json.dumps({"sorafeature": {"save_path": str(tmp_path / "out")}}))
    (tmp_path / "data.json").write_text(json.dumps({"dataset_param": {}}))
    code = get_wan_feature.main(["--mm-data", str(tmp_path / "data.json"), "--mm-model", str(tmp_path / "i2v.json"),
                                 "--mm-tool", str(tmp_path / "tools.json")])
    error = capsys.readouterr().err.strip()
    assert code == 2 and "task i2v needs an ae.i2v_processor block" in error and "\n" not in error
    (tmp_path / "inference.json").write_text(json.dumps({
        "prompt": "a red square moves right", "save_path": str(tmp_path / "samples"),
        "pipeline_config": {"input_size": [9, 64, 64]}, "predictor": {"model_type": "t2v"},
        "diffusion": {"model_id": "DDIMScheduler"}}))
    code = inference_sora.main(["--mm-model", str(tmp_path / "inference.json")])
    error = capsys.readouterr().err.strip()
    assert code == 2 and "diffusion.model_id 'DDIMScheduler'" in error and "\n" not in error
    code = get_wan_feature.main(["--mm-model", "x.json", "--no-such-flag"])
    assert code == 2 and "unrecognized argument '--no-such-flag'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "samples").exists()


@pytest.mark.slow
def test_extraction_and_sampling_end_to_end_on_a_tiny_model(tmp_path, capsys):
    """make_demo's clips and tiny models -> get_wan_feature.py -> inference_sora.py -> a video file; the features
    equal diffusers' AutoencoderKLWan and transformers' UMT5 on the same pixels and tokens."""
    import torch
    from diffusers import AutoencoderKLWan
    from transformers import UMT5EncoderModel

    from mmrun.data.video import preprocess, readers
    from mmrun.data.video.feature_files import FeatureDataset
    from mmrun.models import get_wan_feature, inference_sora
    from mmrun.models.wan.transformer import WanTransformer3DModel

    demo = load_make_demo()
    demo.main([str(tmp_path), "--videos", "2", "--frames", "5", "--size", "32"])
    for name in ("data.json", "inference_model.json"):  # the demo's jsons, sized down to these clips
        config = json.loads((tmp_path / name).read_text())
        if name == "data.json":
            config["dataset_param"]["preprocess_parameters"].update(num_frames=5, max_height=32, max_width=32)
        else:
            config["pipeline_config"]["input_size"] = [5, 32, 32]
            config["diffusion"]["num_inference_steps"] = 2
        (tmp_path / name).write_text(json.dumps(config))
    flags = ["--micro-batch-size", "1", "--num-workers", "8", "--distributed-backend", "nccl"]
    code = get_wan_feature.main(flags + ["--mm-data", str(tmp_path / "data.json"), "--mm-model",
                                         str(tmp_path / "model_t2v.json"), "--mm-tool", str(tmp_path / "tools.json")])
    assert code == 0, capsys.readouterr().err
    dataset = FeatureDataset(tmp_path / "sora_features" / "data.jsonl", tmp_path / "sora_features", text_dim=32)
    assert [r["file"] for r in dataset.records] == ["features/clip_000_mp4.safetensors",
                                                    "features/clip_001_mp4.safetensors"]
    sample = dataset[0]
    assert sample["video"].shape == (4, 5, 8, 8) and sample["prompt_ids"].shape == (16, 32)  # 4x4 pixels a latent

    # the same sample through diffusers' VAE and transformers' UMT5
    record = dataset.records[0]
    params = preprocess.PreprocessParameters.from_dict(
        json.loads((tmp_path / "data.json").read_text())["dataset_param"]["preprocess_parameters"])
    pixels = preprocess.preprocess_video(readers.read_video(record["path"]), params, np.random.default_rng(0))["video"]
    root = tmp_path / "Wan-tiny-Diffusers"
    vae = AutoencoderKLWan.from_pretrained(root / "vae")
    with torch.no_grad():
        mode = vae.encode(torch.from_numpy(pixels[None])).latent_dist.mode()[0].numpy()
    mean, std = (np.asarray(vae.config[k], np.float32).reshape(-1, 1, 1, 1) for k in ("latents_mean", "latents_std"))
    assert np.abs(sample["video"] - (mode - mean) / std).max() < 1e-4
    encoder = UMT5EncoderModel.from_pretrained(root / "text_encoder")
    ids = [demo.write_tokenizer.__globals__["SPECIALS"].index("</s>")]  # the caption's ids, then </s>
    vocab = json.loads((root / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    ids = [vocab[w] for w in record["cap"].split()] + ids
    with torch.no_grad():
        hidden = encoder(torch.tensor([ids])).last_hidden_state[0].numpy()
    assert np.array_equal(sample["prompt_mask"], np.array([1] * len(ids) + [0] * (16 - len(ids))))
    assert np.abs(sample["prompt_ids"][:len(ids)] - hidden).max() < 1e-4
    assert not sample["prompt_ids"][len(ids):].any()

    # sampling with a tiny DiT saved in diffusers' layout
    dit = WanTransformer3DModel.from_pretrained(tiny_diffusers_dit(tmp_path / "transformer"))
    code = inference_sora.main(["--mm-model", str(tmp_path / "inference_model.json"), "--load",
                                str(tmp_path / "transformer"), "--micro-batch-size", "1"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "denoising [" in out.err and dit.config.in_channels == 4
    videos = sorted((tmp_path / "samples").iterdir())
    assert [v.name for v in videos] == [f"video_{i}.mp4" for i in range(4)]
    frames = readers.read_video(videos[0]).frames
    assert frames.shape == (5, 32, 32, 3) and frames.std() > 0

    # a video that will not decode: one line naming it, exit 2, the user's file untouched
    broken = tmp_path / "videos" / "clip_001.mp4"
    broken.write_bytes(b"broken")
    code = get_wan_feature.main(flags + ["--mm-data", str(tmp_path / "data.json"), "--mm-model",
                                         str(tmp_path / "model_t2v.json"), "--mm-tool", str(tmp_path / "tools.json")])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1 and str(broken) in error[0] and "will not decode" in error[0]
    assert broken.read_bytes() == b"broken"
