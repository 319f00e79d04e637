"""Tiny random Wan2.1 VAE (diffusers) and UMT5 text encoder (transformers) for the tests, built offline in a
second, every weight perturbed with noise (their constructors set some weights to ones or zeros, behind which a
wrong layer could hide), plus a tiny T5-style tokenizer and the inputs the comparisons run on."""
from __future__ import annotations

from pathlib import Path

import numpy as np

# Wan's layout, scaled down: three spatial downsamplings (8x), one temporal (5 frames -> 3 latent frames), so the
# encoder runs downsample2d and downsample3d, the decoder upsample3d (with and without a previous chunk) and
# upsample2d.
VAE_CONFIG = dict(base_dim=4, z_dim=4, dim_mult=[1, 1, 2, 2], num_res_blocks=1,
                  temperal_downsample=[False, True, False], latents_mean=[0.1, -0.2, 0.3, 0.05],
                  latents_std=[1.5, 0.5, 2.0, 1.2])
UMT5_CONFIG = dict(vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0)
WORDS = "a red ball rolls left blue square moves right green circle up down fast slow on the table".split()
PROMPTS = ["a red ball rolls left", "blue square moves right fast on the table",
           "green circle up down " * 4]  # the last is longer than MAX_LENGTH: truncation keeps </s>
MAX_LENGTH = 12


def perturb(module, seed: int) -> None:
    import torch
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.1)


def diffusers_vae(config: dict = VAE_CONFIG):
    import torch
    from diffusers import AutoencoderKLWan
    torch.manual_seed(0)
    vae = AutoencoderKLWan(**config).eval()
    perturb(vae, 1)
    return vae


def transformers_umt5():
    import torch
    from transformers import UMT5Config, UMT5EncoderModel
    torch.manual_seed(0)
    model = UMT5EncoderModel(UMT5Config(**UMT5_CONFIG)).eval()
    perturb(model, 2)
    return model


def tokenizer_dir(path: Path) -> Path:
    """A word-level tokenizer.json with T5's specials (<pad> 0, </s> 1, <unk> 2) and its `$A </s>` template,
    plus the tokenizer files transformers' PreTrainedTokenizerFast writes."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(dict.fromkeys(WORDS))}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(path)
    return path


def video(frames: int = 5, size: tuple[int, int] = (16, 16), seed: int = 0) -> np.ndarray:
    """(1, 3, frames, h, w) pixels in [-1, 1]: a smooth moving pattern plus noise, so frames differ."""
    rng = np.random.default_rng(seed)
    t, y, x = np.meshgrid(np.arange(frames), np.arange(size[0]), np.arange(size[1]), indexing="ij")
    base = np.stack([np.sin((x + 2 * t) / 3.0), np.cos((y - t) / 4.0), np.sin((x + y) / 5.0 + t)])
    return np.clip(0.8 * base + 0.2 * rng.standard_normal(base.shape), -1, 1)[None].astype(np.float32)


def vae_cases(vae_dir: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    z_shape = (1, VAE_CONFIG["z_dim"], 3, 2, 2)
    return {"vae/dir": np.array(str(vae_dir)), "vae/video": video(), "vae/noise": rng.standard_normal(z_shape).astype(
        np.float32), "vae/latents": 0.5 * rng.standard_normal(z_shape).astype(np.float32)}


def umt5_cases(umt5_dir: Path, tok_dir: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4)
    mask = np.ones((2, 14), np.int64)
    mask[1, 9:] = 0
    return {"umt5/dir": np.array(str(umt5_dir)), "umt5/tokenizer": np.array(str(tok_dir)),
            "umt5/input_ids": rng.integers(0, UMT5_CONFIG["vocab_size"], (2, 14)).astype(np.int64),
            "umt5/attention_mask": mask, "umt5/prompts": np.array(PROMPTS), "umt5/max_length": np.array(MAX_LENGTH)}


# Wan2.1 I2V's image encoder scaled down: a CLIP ViT with gelu (Wan's hidden_act), 32 px images in 8 px patches:
# 17 tokens (a class token and 16 patches), hidden 32 (the DiT's image_dim).
CLIP_CONFIG = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, image_size=32,
                   patch_size=8, hidden_act="gelu", projection_dim=16, layer_norm_eps=1e-5)
CLIP_PROCESSOR = dict(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})


def transformers_clip():
    import torch
    from transformers import CLIPVisionConfig, CLIPVisionModel
    torch.manual_seed(0)
    model = CLIPVisionModel(CLIPVisionConfig(**CLIP_CONFIG)).eval()
    perturb(model, 5)
    return model


def clip_dirs(root: Path, model=None) -> tuple[Path, Path]:
    """(image_encoder/, image_processor/) as a Wan I2V Diffusers directory holds them (save_pretrained)."""
    from transformers import CLIPImageProcessor
    (model or transformers_clip()).save_pretrained(root / "image_encoder")
    CLIPImageProcessor(**CLIP_PROCESSOR).save_pretrained(root / "image_processor")
    return root / "image_encoder", root / "image_processor"


def clip_hub_layout(model, new_dir: Path, path: Path) -> Path:
    """The same weights as transformers 4.x wrote them (the hub's Wan I2V image_encoder/): `vision_model.` names
    and the position_ids buffer."""
    from safetensors.numpy import save_file
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text((new_dir / "config.json").read_text())
    arrays = {f"vision_model.{k}": v.numpy() for k, v in model.state_dict().items()}
    tokens = (CLIP_CONFIG["image_size"] // CLIP_CONFIG["patch_size"]) ** 2 + 1
    arrays["vision_model.embeddings.position_ids"] = np.arange(tokens, dtype=np.int64)[None]
    save_file(arrays, str(path / "model.safetensors"))
    return path


def clip_cases(clip_dir: Path) -> dict[str, np.ndarray]:
    pixels = np.random.default_rng(6).standard_normal((2, 3, 32, 32)).astype(np.float32)
    return {"clip/dir": np.array(str(clip_dir)), "clip/pixel_values": pixels}


def picture(size: tuple[int, int] = (40, 28), seed: int = 0):
    """A PIL RGB image (width, height): smooth colours plus noise."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size[1], 0:size[0]]
    base = np.stack([128 + 100 * np.sin(x / 5.0), 128 + 100 * np.cos(y / 4.0), 128 + 60 * np.sin((x + y) / 7.0)], -1)
    return Image.fromarray(np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8))
