"""Wan2.1 image-to-video: the conditioning against MindSpeed-MM's and diffusers' recipes, the denoising against
diffusers' WanImageToVideoPipeline on a tiny offline pipeline, and (slow) the three entries end to end on the demo's
tiny models: get_wan_feature.py (i2v features equal to transformers' CLIP and diffusers' VAE) -> pretrain_sora.py
(task i2v, trains on them) -> inference_sora.py (samples from the trained checkpoint and a picture), with the bad
inputs as one line each."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def mindspeed_mask(batch: int, frames: int, h: int, w: int, stride: int):
    """WanVideoI2VProcessor's / WanImageToVideoPipeline.prepare_latents' mask, step for step in torch."""
    import torch
    mask = torch.ones(batch, frames, h, w)
    mask[:, 1:] = 0
    mask = torch.concat([torch.repeat_interleave(mask[:, 0:1], repeats=stride, dim=1), mask[:, 1:]], dim=1)
    return mask.view(batch, mask.shape[1] // stride, stride, h, w).transpose(1, 2).numpy()


def test_frame_mask_and_condition_pixels():
    from mmrun.models.wan import i2v

    for frames, stride in ((9, 4), (81, 4), (5, 2), (1, 4)):
        np.testing.assert_array_equal(i2v.frame_mask(2, frames, 3, 5, stride), mindspeed_mask(2, frames, 3, 5, stride))
    first = np.random.default_rng(0).uniform(-1, 1, (2, 3, 8, 8)).astype(np.float32)
    pixels = i2v.condition_pixels(first, 5)
    assert pixels.shape == (2, 3, 5, 8, 8) and np.array_equal(pixels[:, :, 0], first) and not pixels[:, :, 1:].any()


@pytest.fixture(scope="module")
def i2v_dirs(wan_tiny, wan_refs, tmp_path_factory) -> tuple[Path, Path]:
    """(transformer/, vae/): a tiny diffusers I2V DiT (image_dim = the tiny CLIP's width, in_channels = 2 z_dim +
    the mask's channels) and the tiny VAE with its scale_factor_temporal set (diffusers' pipeline sizes the mask
    by that config value, 4 unless given; the tiny VAE's stride is 2), every weight perturbed."""
    import torch
    from diffusers import WanTransformer3DModel

    z_dim = wan_tiny.VAE_CONFIG["z_dim"]
    stride = 2 ** sum(wan_tiny.VAE_CONFIG["temperal_downsample"])
    torch.manual_seed(0)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=2 * z_dim + stride,
        out_channels=z_dim, text_dim=32, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=32,
        image_dim=wan_tiny.CLIP_CONFIG["hidden_size"], added_kv_proj_dim=16)
    wan_tiny.perturb(model, 7)
    root = tmp_path_factory.mktemp("i2v")
    model.save_pretrained(root / "transformer")
    wan_tiny.diffusers_vae({**wan_tiny.VAE_CONFIG, "scale_factor_temporal": stride}).save_pretrained(root / "vae")
    return root / "transformer", root / "vae"


def test_i2v_denoising_equals_diffusers_pipeline(wan_tiny, wan_refs, i2v_dirs):
    """The same picture, prompt embeddings and noise through WanImageToVideoPipeline (its CLIPVisionModel,
    CLIPImageProcessor, AutoencoderKLWan) and through mmrun's CLIP, processor, VAE conditioning and loop."""
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanImageToVideoPipeline
    from diffusers import WanTransformer3DModel as Reference
    from transformers import CLIPImageProcessor, CLIPVisionModel

    from mmrun import backend
    try:
        backend.select("pytorch", "tests/models: the in-process side of the comparisons runs PyTorch")
    except backend.BackendError as error:
        pytest.skip(str(error))
    from mmrun.data.multimodal.clip_image_processing import CLIPImageProcessor as Processor
    from mmrun.models.clip_vision import CLIPVisionModel as Encoder, encode_images
    from mmrun.models.wan import i2v, sampling
    from mmrun.models.wan.scheduling_unipc import build_scheduler
    from mmrun.models.wan.transformer import WanTransformer3DModel
    from mmrun.models.wan.vae import AutoencoderKLWan as Vae

    i2v_dit, vae_dir = i2v_dirs
    reference = WanImageToVideoPipeline(
        tokenizer=None, text_encoder=None, image_encoder=CLIPVisionModel.from_pretrained(wan_refs["clip_dir"]),
        image_processor=CLIPImageProcessor.from_pretrained(wan_refs["clip_processor_dir"]),
        transformer=Reference.from_pretrained(i2v_dit), vae=AutoencoderKLWan.from_pretrained(vae_dir),
        scheduler=UniPCMultistepScheduler(num_train_timesteps=1000, flow_shift=3.0, prediction_type="flow_prediction",
                                          use_flow_sigmas=True))
    reference.set_progress_bar_config(disable=True)
    picture = wan_tiny.picture((48, 40), 4)  # not the video's size: both resize it
    rng = np.random.default_rng(0)
    frames, size = 5, 32
    latents = rng.standard_normal((1, wan_tiny.VAE_CONFIG["z_dim"], 3, 4, 4)).astype(np.float32)
    # diffusers' i2v attention takes all but the last 512 context tokens as the image's: Wan's 512 text tokens
    prompt, negative = (rng.standard_normal((1, 512, 32)).astype(np.float32) for _ in range(2))
    expected = reference(image=picture, prompt_embeds=torch.from_numpy(prompt),
                         negative_prompt_embeds=torch.from_numpy(negative), latents=torch.from_numpy(latents),
                         num_inference_steps=3, guidance_scale=5.0, height=size, width=size, num_frames=frames,
                         output_type="latent").frames.numpy()

    encoder = Encoder.from_pretrained(wan_refs["clip_dir"])
    tokens = encode_images(encoder, Processor.from_pretrained(wan_refs["clip_processor_dir"])([picture]))
    condition = i2v.condition_latents(Vae.from_pretrained(vae_dir),
                                      i2v.first_frame_pixels([picture], size, size), frames)
    block = {"model_id": "UniPCMultistepScheduler", "num_train_steps": 1000, "flow_shift": 3.0,
             "prediction_type": "flow_prediction", "use_flow_sigmas": True, "solver_order": 2, "solver_type": "bh2"}
    ours = sampling.denoise(WanTransformer3DModel.from_pretrained(i2v_dit), build_scheduler(block), latents,
                            torch.from_numpy(prompt), torch.from_numpy(negative), num_inference_steps=3,
                            guidance_scale=5.0, image_embeds=tokens, condition=condition, show_progress=False)
    assert np.abs(expected - ours).max() < 1e-4
    assert np.abs(expected - latents).max() > 0.1  # the loop moved the latents
    # the picture matters: another one gives other latents
    other = i2v.condition_latents(Vae.from_pretrained(vae_dir),
                                  i2v.first_frame_pixels([wan_tiny.picture((48, 40), 5)], size, size), frames)
    moved = sampling.denoise(WanTransformer3DModel.from_pretrained(i2v_dit), build_scheduler(block), latents,
                             torch.from_numpy(prompt), torch.from_numpy(negative), num_inference_steps=3,
                             guidance_scale=5.0, image_embeds=tokens, condition=other, show_progress=False)
    assert np.abs(moved - ours).max() > 1e-3


def load_make_demo():
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_demo", ROOT / "scripts" / "wan" / "make_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_i2v():
    """docs/examples/generation/tiny_i2v.py: the demo's i2v files (docs/generation.md runs it)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("tiny_i2v", ROOT / "docs" / "examples" / "generation" / "tiny_i2v.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_i2v_extraction_training_and_sampling_end_to_end(wan_tiny, tmp_path, capsys):
    import torch
    from diffusers import AutoencoderKLWan
    from transformers import CLIPVisionModel

    from mmrun.data.video import preprocess, readers
    from mmrun.data.video.feature_files import FeatureDataset
    from mmrun.models import get_wan_feature, inference_sora

    load_make_demo().main([str(tmp_path), "--videos", "2", "--frames", "5", "--size", "32"])
    files = tiny_i2v().write_files(tmp_path)
    for name, change in (("data_i2v.json", lambda c: c["dataset_param"]["preprocess_parameters"].update(num_frames=5)),
                         ("inference_i2v.json", lambda c: (c["pipeline_config"].update(input_size=[5, 32, 32]),
                                                           c["diffusion"].update(guidance_scale=1.0)))):
        config = json.loads(files[name].read_text())  # the demo's 9 frames cut to its 5 (and no guidance: tested
        change(config)                                # against diffusers above)
        files[name].write_text(json.dumps(config))
    flags = ["--micro-batch-size", "1", "--num-workers", "8", "--distributed-backend", "nccl"]
    extract = flags + ["--mm-data", str(files["data_i2v.json"]), "--mm-model", str(files["model_i2v.json"]),
                       "--mm-tool", str(tmp_path / "tools.json")]
    code = get_wan_feature.main(extract)
    assert code == 0, capsys.readouterr().err
    root = tmp_path / "Wan-tiny-Diffusers"
    z_dim, stride = tiny_i2v().vae_channels(root)
    dataset = FeatureDataset(tmp_path / "sora_features" / "data.jsonl", tmp_path / "sora_features", task="i2v",
                             text_dim=32, img_dim=32, in_channels=2 * z_dim + stride)
    sample = dataset[0]
    latent = sample["video"].shape[1:]  # (latent frames, h, w) of the demo's VAE
    assert sample["i2v_clip_feature"].shape == (17, 32)
    assert sample["i2v_vae_feature"].shape == (stride + z_dim, *latent)

    # the same first frame through transformers' CLIP and diffusers' VAE, the mask by MindSpeed-MM's recipe
    params = preprocess.PreprocessParameters.from_dict(
        json.loads(files["data_i2v.json"].read_text())["dataset_param"]["preprocess_parameters"])
    picked = preprocess.preprocess_video(readers.read_video(dataset.records[0]["path"]), params,
                                         np.random.default_rng(0))
    steps = params.train_pipeline
    clip_in = preprocess.run_pipeline(picked["first_frame"][None], steps["first_frame_clip"], {})
    vae_in = preprocess.run_pipeline(picked["first_frame"][None], steps["first_frame_vae"],
                                     params.transform_size(False))
    assert np.array_equal(vae_in[0], picked["video"][:, 0])  # the VAE's first frame is the video's
    with torch.no_grad():
        tokens = CLIPVisionModel.from_pretrained(root / "image_encoder")(
            torch.from_numpy(clip_in), output_hidden_states=True).hidden_states[-2][0].numpy()
        vae = AutoencoderKLWan.from_pretrained(root / "vae")
        pixels = torch.cat([torch.from_numpy(vae_in)[:, :, None], torch.zeros(1, 3, 4, 32, 32)], dim=2)
        mode = vae.encode(pixels).latent_dist.mode()[0].numpy()
    mean, std = (np.asarray(vae.config[k], np.float32).reshape(-1, 1, 1, 1) for k in ("latents_mean", "latents_std"))
    np.testing.assert_allclose(sample["i2v_clip_feature"], tokens, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(sample["i2v_vae_feature"][:stride], mindspeed_mask(1, 5, *latent[1:], stride)[0])
    np.testing.assert_allclose(sample["i2v_vae_feature"][stride:], (mode - mean) / std, rtol=0, atol=1e-4)

    # pretrain_sora.py (task i2v) trains on these files (the demo's feature_data.json): 2 iterations, PyTorch
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MMRUN_AI_FRAMEWORK")}
    train = subprocess.run(
        [sys.executable, str(ROOT / "models" / "pretrain_sora.py"), "--ai-framework", "pytorch",
         "--mm-data", str(tmp_path / "feature_data.json"), "--mm-model", str(files["pretrain_i2v.json"]),
         "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-3",
         "--log-interval", "1", "--save-interval", "2", "--save", str(tmp_path / "ckpt"), "--eval-iters", "0",
         "--seed", "1234"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert train.returncode == 0, (train.stdout + train.stderr)[-3000:]
    assert "building Wan2.1 i2v transformer" in train.stdout and "iteration        2/       2" in train.stdout

    # inference_sora.py samples i2v from the trained checkpoint and the picture
    code = inference_sora.main(["--mm-model", str(files["inference_i2v.json"]), "--load", str(tmp_path / "ckpt")])
    out = capsys.readouterr()
    assert code == 0, out.err
    frames = readers.read_video(tmp_path / "samples_i2v" / "video_0.mp4").frames
    assert frames.shape == (5, 32, 32, 3) and frames.std() > 0

    # bad inputs: one line, exit 2, nothing overwritten
    inference = json.loads(files["inference_i2v.json"].read_text())
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    for change, message in (({"image": str(broken)}, f"{broken} will not decode as a picture"),
                            ({"image_encoder": str(tmp_path / "absent")}, "image_encoder")):
        files["inference_i2v.json"].write_text(json.dumps({**inference, **change}))
        code = inference_sora.main(["--mm-model", str(files["inference_i2v.json"])])
        error = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(error) == 1 and message in error[0], error
    assert broken.read_bytes() == b"not a png"
    model = json.loads(files["model_i2v.json"].read_text())
    model["ae"]["i2v_processor"]["image_encoder"] = str(tmp_path / "absent")
    files["model_i2v.json"].write_text(json.dumps(model))
    code = get_wan_feature.main(extract)
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1 and "ae.i2v_processor.image_encoder" in error[0] and "absent" in error[0]
