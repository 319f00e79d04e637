"""Offline inputs of the Wan2.1 demo (scripts/pretrain_wan.sh): a synthetic captioned video set, and a tiny
Wan "Diffusers directory" (vae/, text_encoder/, tokenizer/), all in MindSpeed-MM's layout.

    python scripts/wan/make_demo.py OUT_DIR [--videos 64] [--frames 5] [--size 32]

writes
    OUT_DIR/videos/*.mp4            a coloured square moving left/right/up/down on grey, half the frame
                                    through its middle (one path per direction), every (colour, shape,
                                    direction) in turn
    OUT_DIR/annotation.json         [{"path": "clip_000.mp4", "cap": "a red square moves right"}, ...], and
                                    one clip in 5 more captioned "a shape moves" (for classifier-free guidance)
    OUT_DIR/data.txt                `OUT_DIR/videos,OUT_DIR/annotation.json` (data_storage_mode combine)
    OUT_DIR/prompts.txt             a few captions to sample, one per line (inference_model.json's prompt)
    OUT_DIR/Wan-tiny-Diffusers/{vae,text_encoder,tokenizer}/   config.json + safetensors / tokenizer.json
    OUT_DIR/*.json                  MindSpeed-MM's jsons for the four steps (scripts/wan/*.json, paths filled in):
                                    data.json, model_t2v.json, tools.json (extraction), feature_data.json,
                                    pretrain_model.json (training), inference_model.json (sampling)

The models are mmrun's own (models/wan/vae.py, text_encoder.py) built on the chosen framework and written in the
layout diffusers and transformers read (no download, no diffusers needed). The text encoder's weights are random
(its embeddings still tell the captions apart); the VAE's are set by hand (scripts/wan/shape_vae.py: a latent is a
4x4 patch's mean colour, every frame its own latent frame, the first one marked), so it reconstructs these
flat-coloured clips and the DiT's sampled latents decode to pictures of shapes. Its reconstruction error on the
clips is printed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shape_vae  # noqa: E402  (scripts/wan/ is not a package)

COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 80, 230), "yellow": (230, 210, 40)}
# One shape: with squares and discs (and 9 frames, 2 layers) the DiT learnt the colours in 2,000 iterations but
# not which way to move; draw_clip still draws a "disc".
SHAPES = ("square",)
DIRECTIONS = {"right": (0, 1), "left": (0, -1), "down": (1, 0), "up": (-1, 0)}
BACKGROUND = 128
TRAVEL = 0.5  # of the frame's size, first frame to last, through its middle
# The caption of the extra clips that name neither colour nor direction, and the sampler's negative prompt
# (inference_model.json): classifier-free guidance needs the DiT to have learnt what an uninformative caption
# gives. MindSpeed-MM's pretrain drops no captions; here it is a choice of the demo's data.
GENERIC_CAPTION = "a shape moves"
GENERIC_SHARE = 4  # one generic clip per this many captioned ones
SPECIALS = ("<pad>", "</s>", "<unk>")  # T5's ids 0, 1, 2: pad, end of sequence, unknown
MAX_TEXT_LENGTH = 16
VAE_CONFIG = shape_vae.CONFIG
UMT5_CONFIG = {"model_type": "umt5", "architectures": ["UMT5EncoderModel"], "d_model": 32, "d_kv": 8, "d_ff": 64,
               "num_layers": 2, "num_heads": 4, "relative_attention_num_buckets": 8,
               "relative_attention_max_distance": 16, "layer_norm_epsilon": 1e-6, "feed_forward_proj": "gated-gelu",
               "is_encoder_decoder": False, "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
               "dropout_rate": 0.0, "tie_word_embeddings": False}


COMBINATIONS = [(c, s, d) for c in COLOURS for s in SHAPES for d in DIRECTIONS]


def draw_clip(rng: np.random.Generator, frames: int, size: int,
              combination: tuple[str, str, str] | None = None) -> tuple[np.ndarray, str]:
    """One clip (frames, size, size, 3) uint8 and its caption: `combination` (colour, shape, direction), or a
    random one (`rng` draws it)."""
    colour, shape, direction = combination or COMBINATIONS[int(rng.integers(len(COMBINATIONS)))]
    dy, dx = DIRECTIONS[direction]
    radius = size // 6
    # Every clip of a direction takes the same path: through the middle of the frame, TRAVEL of it, starting on
    # the side it leaves. With a random start place (3/8 of the frame) a 2-layer DiT trained 2,000 iterations
    # drew the colours but no motion (0/4 prompts); on one path per direction (with 5 frames, 4 layers, squares
    # only and guidance) it moves the square along the prompted axis, and the prompted way once the VAE marks the
    # first frame (docs/generation.md, "The offline demo").
    travel = int(size * TRAVEL)
    start = (size - travel) // 2
    cross = size // 2  # the coordinate across the motion
    yy, xx = np.mgrid[:size, :size]
    clip = np.full((frames, size, size, 3), BACKGROUND, np.uint8)
    for t in range(frames):
        along = start + travel * t // max(frames - 1, 1)
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
    # every combination once per len(COMBINATIONS) clips (in a random order), so that each prompt has examples
    order = np.concatenate([rng.permutation(len(COMBINATIONS)) for _ in range(-(-count // len(COMBINATIONS)))])
    generic = count // GENERIC_SHARE
    for i in range(count + generic):
        clip, caption = draw_clip(rng, frames, size, COMBINATIONS[order[i % count]])
        caption = caption if i < count else GENERIC_CAPTION
        path = write_video(videos / f"clip_{i:03d}.mp4", clip, fps=8)
        entries.append({"path": path.name, "cap": caption, "fps": 8, "num_frames": frames,
                        "resolution": {"height": size, "width": size}})
    (out / "annotation.json").write_text(json.dumps(entries, indent=1) + "\n", encoding="utf-8")
    (out / "data.txt").write_text(f"{videos.resolve()},{(out / 'annotation.json').resolve()}\n", encoding="utf-8")
    prompts = ["a red square moves right", "a blue square moves down", "a yellow square moves left",
               "a green square moves up"]
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

    words = sorted({*GENERIC_CAPTION.split(), *COLOURS, *SHAPES, *DIRECTIONS})
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


def write_models(out: Path, seed: int) -> tuple[Path, object]:
    """The tiny Diffusers directory's root, and the VAE written there."""
    from mmrun import backend
    from mmrun.backend import tensors
    from mmrun.checkpoint.formats import hf_directory
    from mmrun.models.wan.text_encoder import UMT5EncoderModel, UMT5Config
    from mmrun.models.wan.vae import AutoencoderKLWan, WanVAEConfig

    backend.seeding.seed_everything(seed)
    root = out / "Wan-tiny-Diffusers"
    vocab_size = write_tokenizer(root / "tokenizer")
    text = {**UMT5_CONFIG, "vocab_size": vocab_size}
    encoder = UMT5EncoderModel(UMT5Config.from_dict(text))
    _save(encoder, root / "text_encoder", text, "model.safetensors")
    vae = AutoencoderKLWan(WanVAEConfig.from_dict(VAE_CONFIG))
    shapes = {name: tuple(array.shape) for name, array in tensors.state_dict_to_numpy(vae.state_dict()).items()}
    hf_directory.load_into(vae, shape_vae.weights(shapes), "the demo's VAE", "scripts/wan/shape_vae.py")
    _save(vae, root / "vae", VAE_CONFIG, "diffusion_pytorch_model.safetensors")
    return root, vae


def reconstruction_error(vae, clips: list[np.ndarray]) -> tuple[float, float]:
    """Mean squared error (pixels in [-1, 1]) and PSNR (dB, peak 255) of decode(encode(clip)) over `clips`."""
    from mmrun.backend import tensors

    errors = []
    for clip in clips:
        pixels = np.ascontiguousarray(clip.transpose(3, 0, 1, 2)[None], np.float32) / 127.5 - 1.0
        video = tensors.to_numpy(vae.decode(vae.encode(tensors.from_numpy(pixels))))
        errors.append(float(np.mean((video - pixels) ** 2)))
    mse = float(np.mean(errors))
    return mse, float(10 * np.log10(4.0 / mse))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--videos", type=int, default=64,
                        help=f"clips with their own caption (64); another N // {GENERIC_SHARE} get the generic caption")
    parser.add_argument("--frames", type=int, default=5, help="1 + 4k frames (the VAE's temporal stride)")
    parser.add_argument("--size", type=int, default=32, help="frame height and width (a multiple of 8)")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    if (args.frames - 1) % 4 or args.size % 8:
        print(f"error: --frames {args.frames} must be 1 + 4k and --size {args.size} a multiple of 8",
              file=sys.stderr)
        return 2
    out = Path(args.out_dir)
    entries = write_videos(out, args.videos, args.frames, args.size, args.seed)
    generic = args.videos // GENERIC_SHARE
    print(f"wrote {len(entries)} clips ({args.videos} captioned, {generic} with the generic caption) of {args.frames} "
          f"frames {args.size}x{args.size} -> {out / 'videos'}")
    root, vae = write_models(out, args.seed)
    print(f"wrote the tiny Wan Diffusers directory -> {root}")
    rng = np.random.default_rng(args.seed + 1)
    mse, psnr = reconstruction_error(vae, [draw_clip(rng, args.frames, args.size, c)[0] for c in COMBINATIONS[::8]])
    print(f"the VAE's reconstruction of {len(COMBINATIONS[::8])} fresh clips: mean squared error {mse:.4f} "
          f"(pixels in [-1, 1]), PSNR {psnr:.1f} dB")
    print(f"wrote MindSpeed-MM's jsons -> {out}: {', '.join(write_configs(out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
