"""Image-to-video files for the offline Wan demo: after `python scripts/wan/make_demo.py OUT`, `python tiny_i2v.py OUT`
adds

    OUT/Wan-tiny-Diffusers/image_encoder/   a tiny random CLIP vision tower (transformers' CLIPVisionModel layout:
                                            config.json + model.safetensors, the hub's `vision_model.` names)
    OUT/Wan-tiny-Diffusers/image_processor/ its CLIPImageProcessor preprocessor_config.json (32 px)
    OUT/first.png                           the picture to animate: the first frame of the demo's first clip
    OUT/data_i2v.json, model_i2v.json       extraction (MindSpeed-MM's model_i2v.json: ae.i2v_processor; the data
                                            json's train_pipeline.first_frame_clip / first_frame_vae lists)
    OUT/pretrain_i2v.json                   training (task i2v, a one-layer i2v DiT: in_dim 2 z_dim + the VAE's
                                            temporal stride, img_dim 32)
    OUT/inference_i2v.json                  sampling (model_type i2v, image, image_encoder; 2 steps)

Real Wan2.1 I2V files come from Wan2.1-I2V-14B-480P-Diffusers (image_encoder/, image_processor/).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

CLIP_CONFIG = {"model_type": "clip_vision_model", "architectures": ["CLIPVisionModel"], "hidden_size": 32,
               "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4, "num_channels": 3,
               "image_size": 32, "patch_size": 8, "hidden_act": "gelu", "layer_norm_eps": 1e-5, "projection_dim": 16}
PROCESSOR = {"image_processor_type": "CLIPImageProcessor", "do_resize": True, "size": {"shortest_edge": 32},
             "resample": 3, "do_center_crop": True, "crop_size": {"height": 32, "width": 32}, "do_rescale": True,
             "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
             "image_std": [0.26862954, 0.26130258, 0.27577711], "do_convert_rgb": True}
CLIP_NORM = {"trans_type": "norm_fun", "param": {"mean": PROCESSOR["image_mean"], "std": PROCESSOR["image_std"]}}


def vae_channels(root: Path) -> tuple[int, int]:
    """(z_dim, temporal stride) of the demo's VAE: the i2v DiT takes the noise, the frame mask (one channel per
    frame of a latent frame: the temporal stride) and the first frame's latents."""
    config = json.loads((root / "vae" / "config.json").read_text())
    return int(config["z_dim"]), 2 ** sum(bool(d) for d in config["temperal_downsample"])


def write_clip(directory: Path, seed: int) -> None:
    """A CLIPVisionModel of CLIP_CONFIG with random weights (normal, std 0.2; LayerNorm scales around 1)."""
    from safetensors.numpy import save_file

    from mmrun.backend import tensors
    from mmrun.models.clip_vision import CLIPVisionConfig, CLIPVisionModel

    keys = {f.name for f in dataclasses.fields(CLIPVisionConfig)}
    model = CLIPVisionModel(CLIPVisionConfig(**{k: v for k, v in CLIP_CONFIG.items() if k in keys}))
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, value in tensors.state_dict_to_numpy(model.state_dict()).items():
        noise = rng.normal(0.0, 0.2, value.shape).astype(np.float32)
        arrays[name] = noise + 1.0 if "norm" in name and name.endswith("weight") else noise
    directory.mkdir(parents=True, exist_ok=True)
    save_file(arrays, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(CLIP_CONFIG, indent=1) + "\n", encoding="utf-8")


def write_files(out: Path, seed: int = 1234) -> dict[str, Path]:
    from PIL import Image

    from mmrun.data.video import readers

    root = out / "Wan-tiny-Diffusers"
    write_clip(root / "image_encoder", seed)
    (root / "image_processor").mkdir(parents=True, exist_ok=True)
    (root / "image_processor" / "preprocessor_config.json").write_text(json.dumps(PROCESSOR, indent=1) + "\n")
    annotation = json.loads((out / "annotation.json").read_text())
    Image.fromarray(readers.read_video(out / "videos" / annotation[0]["path"]).frames[0]).save(out / "first.png")

    data = json.loads((out / "data.json").read_text())
    data["dataset_param"]["dataset_type"] = "i2v"
    pipeline = data["dataset_param"]["preprocess_parameters"]["train_pipeline"]
    pipeline["first_frame_clip"] = [
        {"trans_type": "CenterCropResizeVideo",
         "param": {"transform_size": [CLIP_CONFIG["image_size"]] * 2, "interpolation_mode": "bicubic",
                   "antialias": True}}, CLIP_NORM]
    pipeline["first_frame_vae"] = pipeline["video_only"]  # the video's own crop and [-1, 1]
    model = json.loads((out / "model_t2v.json").read_text())
    model["task"] = "i2v"
    model["ae"]["i2v_processor"] = {"processor_id": "wan_i2v_processor", "image_encoder": str(root / "image_encoder"),
                                    "i2v_vae_encode_tiling": "auto"}
    z_dim, stride = vae_channels(root)
    predictor = {"model_type": "i2v", "in_dim": 2 * z_dim + stride, "img_dim": CLIP_CONFIG["hidden_size"],
                 "num_layers": 1}
    pretrain = json.loads((out / "pretrain_model.json").read_text())
    pretrain["task"] = "i2v"
    pretrain["predictor"].update(predictor)
    inference = json.loads((out / "inference_model.json").read_text())
    inference["predictor"].update(predictor)
    inference["diffusion"]["num_inference_steps"] = 2
    inference.update(prompt=annotation[0]["cap"], image=str(out / "first.png"), save_path=str(out / "samples_i2v"),
                     image_encoder={"from_pretrained": str(root / "image_encoder"), "dtype": "float32"},
                     image_processor={"from_pretrained": str(root / "image_processor")})
    files = {}
    for name, content in (("data_i2v.json", data), ("model_i2v.json", model), ("pretrain_i2v.json", pretrain),
                          ("inference_i2v.json", inference)):
        files[name] = out / name
        files[name].write_text(json.dumps(content, indent=1) + "\n", encoding="utf-8")
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="the folder scripts/wan/make_demo.py wrote")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    out = Path(args.out_dir)
    if not (out / "model_t2v.json").is_file():
        print(f"error: {out} holds no model_t2v.json; run scripts/wan/make_demo.py {out} first", file=sys.stderr)
        return 2
    files = write_files(out, args.seed)
    print(f"wrote the tiny CLIP image encoder -> {out / 'Wan-tiny-Diffusers' / 'image_encoder'}")
    print(f"wrote the i2v jsons -> {out}: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
