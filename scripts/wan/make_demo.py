"""Offline inputs of the Wan2.1 demo (scripts/pretrain_wan.sh): a synthetic captioned video set, and a tiny
Wan "Diffusers directory" (vae/, text_encoder/, tokenizer/) with random weights, all in MindSpeed-MM's layout.

    python scripts/wan/make_demo.py OUT_DIR [--videos 32] [--frames 9] [--size 32]

writes
    OUT_DIR/videos/*.mp4            a coloured shape (square or disc) moving left/right/up/down on grey
    OUT_DIR/annotation.json         [{"path": "clip_000.mp4", "cap": "a red square moves right"}, ...]
    OUT_DIR/data.txt                `OUT_DIR/videos,OUT_DIR/annotation.json` (data_storage_mode combine)
    OUT_DIR/prompts.txt             a few captions to sample, one per line (inference_model.json's prompt)
    OUT_DIR/Wan-tiny-Diffusers/{vae,text_encoder,tokenizer}/   config.json + safetensors / tokenizer.json
    OUT_DIR/*.json                  MindSpeed-MM's jsons for the four steps (scripts/wan/*.json, paths filled in):
                                    data.json, model_t2v.json, tools.json (extraction), feature_data.json,
                                    pretrain_model.json (training), inference_model.json (sampling)

The models are mmrun's own (models/wan/vae.py, text_encoder.py) built on the chosen framework and written in the
layout diffusers and transformers read (no download, no diffusers needed). With `--fit-vae-steps N` the VAE
first learns to reconstruct the clips (PyTorch), so that decoded samples show shapes rather than noise.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 80, 230), "yellow": (230, 210, 40)}
SHAPES = ("square", "disc")
DIRECTIONS = {"right": (0, 1), "left": (0, -1), "down": (1, 0), "up": (-1, 0)}
BACKGROUND = 128
SPECIALS = ("<pad>", "</s>", "<unk>")  # T5's ids 0, 1, 2: pad, end of sequence, unknown
MAX_TEXT_LENGTH = 16
VAE_CONFIG = {"_class_name": "AutoencoderKLWan", "base_dim": 8, "z_dim": 4, "dim_mult": [1, 2, 2, 2],
              "num_res_blocks": 1, "attn_scales": [], "temperal_downsample": [False, True, True], "dropout": 0.0,
              "latents_mean": [0.0] * 4, "latents_std": [1.0] * 4}
UMT5_CONFIG = {"model_type": "umt5", "architectures": ["UMT5EncoderModel"], "d_model": 32, "d_kv": 8, "d_ff": 64,
               "num_layers": 2, "num_heads": 4, "relative_attention_num_buckets": 8,
               "relative_attention_max_distance": 16, "layer_norm_epsilon": 1e-6, "feed_forward_proj": "gated-gelu",
               "is_encoder_decoder": False, "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
               "dropout_rate": 0.0, "tie_word_embeddings": False}


def draw_clip(rng: np.random.Generator, frames: int, size: int) -> tuple[np.ndarray, str]:
    """One clip (frames, size, size, 3) uint8 and its caption."""
    colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
    direction = rng.choice(list(DIRECTIONS))
    dy, dx = DIRECTIONS[direction]
    radius = size // 6
    travel = size - 2 * radius - 4
    cross = int(rng.integers(radius + 2, size - radius - 2))  # the fixed coordinate
    yy, xx = np.mgrid[:size, :size]
    clip = np.full((frames, size, size, 3), BACKGROUND, np.uint8)
    for t in range(frames):
        along = radius + 2 + travel * t // max(frames - 1, 1)
        if dy + dx < 0:
            along = size - 1 - along
        cy, cx = (along, cross) if dy else (cross, along)
        inside = (np.abs(yy - cy) <= radius) & (np.abs(xx - cx) <= radius) if shape == "square" \
            else (yy - cy) ** 2 + (xx - cx) ** 2 <= radius ** 2
        clip[t][inside] = COLOURS[colour]
    return clip, f"a {colour} {shape} moves {direction}"


def write_videos(out: Path, count: int, frames: int, size: int, seed: int) -> list[dict]:
    from mmrun.data.video.writer import write_video

    rng = np.random.default_rng(seed)
    videos = out / "videos"
    videos.mkdir(parents=True, exist_ok=True)
    entries = []
    for i in range(count):
        clip, caption = draw_clip(rng, frames, size)
        path = write_video(videos / f"clip_{i:03d}.mp4", clip, fps=8)
        entries.append({"path": path.name, "cap": caption, "fps": 8, "num_frames": frames,
                        "resolution": {"height": size, "width": size}})
    (out / "annotation.json").write_text(json.dumps(entries, indent=1) + "\n", encoding="utf-8")
    (out / "data.txt").write_text(f"{videos.resolve()},{(out / 'annotation.json').resolve()}\n", encoding="utf-8")
    prompts = ["a red square moves right", "a blue disc moves down", "a yellow square moves left",
               "a green disc moves up"]
    (out / "prompts.txt").write_text("\n".join(prompts) + "\n", encoding="utf-8")
    return entries


def write_configs(out: Path) -> list[str]:
    """scripts/wan/*.json (MindSpeed-MM's files, sized for the demo) with `{out}` replaced by OUT_DIR."""
    names = []
    for template in sorted(Path(__file__).parent.glob("*.json")):
        text = template.read_text(encoding="utf-8").replace("{out}", str(out.resolve()))
        (out / template.name).write_text(text, encoding="utf-8")
        names.append(template.name)
    return names


def write_tokenizer(path: Path) -> int:
    """A word-level tokenizer.json over the captions' words (T5-style: </s> closes every text)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = sorted({"a", "moves", *COLOURS, *SHAPES, *DIRECTIONS})
    vocab = {token: i for i, token in enumerate([*SPECIALS, *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": MAX_TEXT_LENGTH,
              "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    return len(vocab)


def _save(model, directory: Path, config: dict, weights_name: str) -> None:
    from safetensors.numpy import save_file

    from mmrun.backend import tensors

    directory.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.state_dict_to_numpy(model.state_dict()).items()}
    save_file(arrays, str(directory / weights_name), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")


def fit_vae(vae, clips: np.ndarray, steps: int, seed: int) -> tuple[list[float], list[float]]:
    """Teach the tiny VAE to reconstruct the demo's clips (PyTorch autograd through diffusers-equal layers)."""
    import torch

    from mmrun.models.wan.vae import CausalCache

    torch.manual_seed(seed)
    torch.set_num_threads(1)  # small convolutions: more threads only contend
    optimizer = torch.optim.Adam(vae.parameters(), lr=2e-3)
    rng = np.random.default_rng(seed)
    pixels = torch.from_numpy(clips.transpose(0, 4, 1, 2, 3).astype(np.float32) / 127.5 - 1.0)
    for step in range(1, steps + 1):
        batch = pixels[rng.choice(len(pixels), 2, replace=False)]
        cache = CausalCache()
        encoded = []
        for chunk in [batch[:, :, :1]] + [batch[:, :, i:i + 4] for i in range(1, batch.shape[2], 4)]:
            cache.start_chunk()
            encoded.append(vae.encoder(chunk, cache))
        mean = vae.quant_conv(torch.cat(encoded, dim=2))[:, :vae.config.z_dim]
        z = vae.post_quant_conv(mean)
        cache = CausalCache()
        decoded = []
        for i in range(z.shape[2]):
            cache.start_chunk()
            decoded.append(vae.decoder(z[:, :, i:i + 1], cache))
        loss = torch.nn.functional.mse_loss(torch.cat(decoded, dim=2), batch) + 1e-4 * mean.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 25 == 0 or step == steps:
            print(f"  vae fit step {step}/{steps}: reconstruction mse {loss.item():.4f}", flush=True)
    # Wan's config carries its latents' per-channel mean and std (norm_latents divides by them): measure ours.
    with torch.no_grad():
        latents = torch.cat([vae.encode(pixels[i:i + 8]) for i in range(0, len(pixels), 8)])
    return latents.mean(dim=(0, 2, 3, 4)).tolist(), latents.std(dim=(0, 2, 3, 4)).tolist()


def write_models(out: Path, clips: np.ndarray | None, fit_steps: int, seed: int) -> Path:
    from mmrun import backend
    from mmrun.models.wan.text_encoder import UMT5EncoderModel, UMT5Config
    from mmrun.models.wan.vae import AutoencoderKLWan, WanVAEConfig

    backend.seeding.seed_everything(seed)
    root = out / "Wan-tiny-Diffusers"
    vocab_size = write_tokenizer(root / "tokenizer")
    text = {**UMT5_CONFIG, "vocab_size": vocab_size}
    encoder = UMT5EncoderModel(UMT5Config.from_dict(text))
    _save(encoder, root / "text_encoder", text, "model.safetensors")
    vae = AutoencoderKLWan(WanVAEConfig.from_dict(VAE_CONFIG))
    vae_config = dict(VAE_CONFIG)
    if fit_steps and clips is not None:
        if backend.framework() != "pytorch":
            print("  (the VAE fit runs on PyTorch only; the VAE stays random)", flush=True)
        else:
            mean, std = fit_vae(vae, clips, fit_steps, seed)
            vae_config.update(latents_mean=[round(m, 4) for m in mean], latents_std=[round(s, 4) for s in std])
    _save(vae, root / "vae", vae_config, "diffusion_pytorch_model.safetensors")
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--videos", type=int, default=32)
    parser.add_argument("--frames", type=int, default=9, help="1 + 4k frames (the VAE's temporal stride)")
    parser.add_argument("--size", type=int, default=32, help="frame height and width (a multiple of 8)")
    parser.add_argument("--fit-vae-steps", "--fit_vae_steps", dest="fit_vae_steps", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    if (args.frames - 1) % 4 or args.size % 8:
        print(f"error: --frames {args.frames} must be 1 + 4k and --size {args.size} a multiple of 8",
              file=sys.stderr)
        return 2
    out = Path(args.out_dir)
    entries = write_videos(out, args.videos, args.frames, args.size, args.seed)
    print(f"wrote {len(entries)} clips of {args.frames} frames {args.size}x{args.size} -> {out / 'videos'}")
    clips = None
    if args.fit_vae_steps:
        from mmrun.data.video.readers import read_video
        clips = np.stack([read_video(out / "videos" / e["path"]).frames for e in entries])
    root = write_models(out, clips, args.fit_vae_steps, args.seed)
    print(f"wrote the tiny Wan Diffusers directory -> {root}")
    print(f"wrote MindSpeed-MM's jsons -> {out}: {', '.join(write_configs(out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
