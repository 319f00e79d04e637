"""Sample Wan2.1 videos, MindSpeed-MM style, on PyTorch or MindSpore.

    mmrun --ai-framework pytorch --nproc-per-node 1 models/inference_sora.py --mm-model inference_model.json \\
        --load Wan2.1-T2V-1.3B-Diffusers/transformer $GPT_ARGS

This is MindSpeed-MM's inference_sora.py with its inference_model.json as it is (pipeline_class WanPipeline):

    prompt                      a .txt file, one prompt per line (at most the first 100, as MindSpeed-MM), or
                                one prompt; `negative_prompt` (optional) else MindSpeed-MM's default one
    save_path, fps, frame_interval   video_<i>.mp4 per prompt at fps // frame_interval (GIF without PyAV)
    pipeline_config.input_size  [frames, height, width]; `seed` there or in the file, else --seed
    ae, tokenizer, text_encoder the Diffusers directory's vae/, tokenizer/, text_encoder/ (mmrun's own models)
    predictor                   the DiT (wandit); --load gives its weights: a diffusers transformer/ directory
                                as downloaded, or what pretrain_sora.py saved
    diffusion                   UniPCMultistepScheduler (flow sigmas) or FlowMatchEulerDiscreteScheduler with
                                diffusers' keys; num_inference_steps, guidance_scale

Image-to-video (predictor.model_type i2v, Wan2.1-I2V's DiT: in_dim 36, img_dim 1280) adds, as MindSpeed-MM's i2v
inference json does:

    image                       one picture (.jpg, .jpeg, .png, .bmp, .gif, .tiff) or a text file of picture paths,
                                one per line (the first 100), one picture per prompt, in order
    image_encoder               the Diffusers directory's image_encoder/ (a path, or {"from_pretrained", "dtype"})
    image_processor             its image_processor/ (a path or {"from_pretrained"}); default: the folder beside
                                image_encoder/

and samples as diffusers' WanImageToVideoPipeline (equal to it within 1e-4 on the same inputs): CLIP's
hidden_states[-2] of the picture (models/clip_vision.py, CLIPImageProcessor) join cross-attention, and the picture
resized to the video's size (Lanczos) followed by zero frames, encoded by the VAE (mode, normalised), with the
first-frame mask before it, joins the latents as channels at every step (models/wan/i2v.py).

Prompts are cleaned of extra whitespace, tokenized to model_max_length and encoded by UMT5 (zeros past each
prompt), the noise is drawn from the seed (numpy: the same on both frameworks; not torch's generator, so not
MindSpeed-MM's pixels), the DiT denoises with classifier-free guidance as diffusers' WanPipeline does (equal to
it within 1e-4 on the same inputs), the latents are de-normalised and decoded, and every video is written with a
progress bar on the way. Ranks split the prompts (--micro-batch-size prompts per step).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mmrun.backend.errors import UsageError

PROG = "inference_sora.py"
MAX_PROMPTS = 100  # MindSpeed-MM's load_prompts keeps the first 100 lines
# MindSpeed-MM's wan_pipeline.py NEGATIVE_PROMOPT_DEFAULT (Wan2.1), used when the file names none
NEGATIVE_PROMPT_DEFAULT = (
    "Bright tones, overexposed, static, blurred details, subtitles, style, works, paintings, images, static, overall "
    "gray, worst quality, low quality, JPEG compression residue, ugly, incomplete, extra fingers, poorly drawn hands, "
    "poorly drawn faces, deformed, disfigured, misshapen limbs, fused fingers, still picture, messy background, three "
    "legs, many people in the background, walking backwards")
PIPELINES = ("WanPipeline",)  # MindSpeed-MM's pipeline_class for Wan2.1, text- and image-to-video alike
MODEL_TYPES = ("t2v", "i2v")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tiff")  # MindSpeed-MM's load_images: a picture
MAX_IMAGES = 100  # ... else a file of paths, the first 100 lines


def load_prompts(prompt: Any, where: str) -> list[str]:
    """MindSpeed-MM's load_prompts: the lines of a file that exists, else the text itself."""
    if not isinstance(prompt, str) or not prompt:
        raise UsageError(f"{where}.prompt: give a .txt file of prompts (one per line) or one prompt")
    path = Path(prompt)
    if path.is_file():
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        if len(lines) > MAX_PROMPTS:
            print(f"notice: {path} has {len(lines)} prompts; only the first {MAX_PROMPTS} are sampled", flush=True)
        prompts = [line for line in lines[:MAX_PROMPTS] if line]
        if not prompts:
            raise UsageError(f"{where}.prompt {path}: the file holds no prompt")
        return prompts
    if prompt.endswith(".txt"):
        raise UsageError(f"{where}.prompt {prompt}: no such prompt file")
    return [prompt]


def load_images(image: Any, where: str, count: int) -> list[Any]:
    """MindSpeed-MM's load_images: a picture, or a text file of picture paths; one per prompt, each decoded (RGB)."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(image, str) or not image:
        raise UsageError(f"{where}.image {image!r}: image-to-video needs a picture (or a .txt file of picture "
                         "paths, one per line), one per prompt")
    path = Path(image)
    if not path.is_file():
        raise UsageError(f"{where}.image {image}: no such file")
    if path.suffix.lower() in IMAGE_SUFFIXES:
        paths = [path]
    else:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        if len(lines) > MAX_IMAGES:
            print(f"notice: {path} has {len(lines)} pictures; only the first {MAX_IMAGES} are read", flush=True)
        paths = [Path(line) for line in lines[:MAX_IMAGES] if line]
    if len(paths) != count:
        raise UsageError(f"{where}.image {image}: {len(paths)} picture(s) for {count} prompt(s); give one per prompt")
    images = []
    for picture in paths:
        try:
            with Image.open(picture) as opened:
                images.append(opened.convert("RGB"))
        except (OSError, UnidentifiedImageError) as error:
            raise UsageError(f"{where}.image: {picture} will not decode as a picture ({error}); give a PNG/JPEG "
                             "file") from None
    return images


def load_image_processor(config: Any, encoder_dir: str, where: str) -> Any:
    """CLIPImageProcessor of the json's image_processor (path or block), else the image_processor/ folder beside
    the image encoder's."""
    from mmrun.data.gpt_dataset import DatasetConfigError
    from mmrun.data.multimodal.clip_image_processing import CLIPImageProcessor

    if isinstance(config, dict):
        config = config.get("from_pretrained")
    path = config or str(Path(encoder_dir).parent / "image_processor")
    try:
        return CLIPImageProcessor.from_pretrained(path)
    except DatasetConfigError as error:
        raise UsageError(f"{where}.image_processor: {error}") from None


def load_transformer(load: str | None, predictor: dict[str, Any], where: str, dtype: str | None) -> Any:
    """The DiT: diffusers weights from --load, else the predictor block's shape (random weights, with a notice)."""
    from mmrun.models.wan.configuration import WanTransformerConfig
    from mmrun.models.wan.transformer import WanTransformer3DModel, is_diffusers_directory

    config = WanTransformerConfig.from_mindspeed(predictor, where=f"{where} predictor")
    if load is None:
        print("notice: no --load: the DiT samples with random weights (pass the diffusers transformer/ directory "
              "or pretrain_sora.py's --save)", flush=True)
        model = WanTransformer3DModel(config)
    elif is_diffusers_directory(load):
        model = WanTransformer3DModel.from_pretrained(load)
    else:
        model = _from_mmrun_checkpoint(load, config)
    if model.config.in_channels != config.in_channels or model.config.text_dim != config.text_dim:
        raise UsageError(f"--load {load}: the DiT has in_dim {model.config.in_channels}, text_dim "
                         f"{model.config.text_dim}; {where} predictor says {config.in_channels}, {config.text_dim}")
    if dtype is not None:
        from mmrun.backend import tensors

        model.to(tensors.dtype(dtype))
    model.eval()
    return model


def _from_mmrun_checkpoint(load: str, config: Any) -> Any:
    """pretrain_sora.py's --save: the tracker's iteration (else the newest complete one), model weights only."""
    from mmrun.backend import tensors
    from mmrun.models.wan.transformer import WanTransformer3DModel
    from mmrun.training.checkpoint_store import CheckpointError, find_checkpoint

    try:
        checkpoint = find_checkpoint(load, log=lambda line: print(line, flush=True))
    except CheckpointError as error:
        raise UsageError(f"--load {load}: {error}") from None
    if checkpoint is None:
        raise UsageError(f"--load {load}: neither a diffusers transformer/ directory (config.json naming "
                         "WanTransformer3DModel) nor a directory holding pretrain_sora.py's checkpoints")
    if any(".lora_" in name for name in checkpoint.model):
        raise UsageError(f"--load {load}: a LoRA checkpoint; fold the adapters into the base weights first: "
                         "mmrun convert WanConverter mm_to_hf (then --load the diffusers directory it writes)")
    model = WanTransformer3DModel(config)
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
    missing = sorted(set(expected) - set(checkpoint.model))
    wrong = sorted(n for n in expected if n in checkpoint.model and tuple(checkpoint.model[n].shape) != expected[n])
    if missing or wrong:
        first = (missing or wrong)[0]
        raise UsageError(f"--load {load}: {len(missing)} DiT weights missing, {len(wrong)} of another shape (first: "
                         f"{first}); the predictor block must be the one the checkpoint was trained with")
    model.load_state_dict(tensors.state_dict_from_numpy({n: checkpoint.model[n] for n in expected}))
    return model


class Sampler:
    """The models of one inference_model.json, loaded once."""

    def __init__(self, config: dict[str, Any], load: str | None, where: str) -> None:
        from mmrun.backend import tensors
        from mmrun.models.wan import pipeline_json
        from mmrun.models.wan.scheduling_unipc import SchedulerConfigError, build_scheduler

        if config.get("pipeline_class", PIPELINES[0]) not in PIPELINES:
            raise UsageError(f"{where}.pipeline_class {config.get('pipeline_class')!r}: mmrun samples {PIPELINES}")
        predictor = pipeline_json.block(config, "predictor", where)
        self.task = predictor.get("model_type", "t2v")
        if self.task not in MODEL_TYPES:
            raise UsageError(f"{where}.predictor.model_type {self.task!r}: mmrun samples {MODEL_TYPES} (Wan2.1)")
        self.diffusion = pipeline_json.block(config, "diffusion", where)
        try:
            self.scheduler = build_scheduler(self.diffusion)
        except SchedulerConfigError as error:
            raise UsageError(f"{where}: {error}") from None
        self.steps = int(self.diffusion.get("num_inference_steps", 50))
        self.guidance_scale = float(self.diffusion.get("guidance_scale", 5.0))
        size = (config.get("pipeline_config") or {}).get("input_size")
        if not (isinstance(size, list) and len(size) == 3 and all(isinstance(v, int) and v > 0 for v in size)):
            raise UsageError(f"{where}.pipeline_config.input_size {size!r}: give [frames, height, width]")
        self.frames, self.height, self.width = size
        self.vae, _ = pipeline_json.load_vae(pipeline_json.block(config, "ae", where), f"{where} ae")
        stride_t, stride_hw = self.vae.config.temporal_compression, self.vae.config.spatial_compression
        if (self.frames - 1) % stride_t or self.height % stride_hw or self.width % stride_hw:
            raise UsageError(f"{where}.pipeline_config.input_size {size}: frames must be 1 + {stride_t}k and height, "
                             f"width multiples of {stride_hw} (the VAE's strides)")
        self.text_encoder = pipeline_json.load_text_encoder(pipeline_json.block(config, "text_encoder", where),
                                                            f"{where} text_encoder")
        self.tokenizer, self.max_length = pipeline_json.load_tokenizer(pipeline_json.block(config, "tokenizer", where),
                                                                       f"{where} tokenizer")
        self.dtype = pipeline_json.dtype_name(predictor.get("dtype", config.get("dtype")), f"{where}.predictor")
        self.transformer = load_transformer(load, predictor, where, self.dtype)
        self.model_dtype = tensors.dtype(self.dtype) if self.dtype else None
        self.negative_prompt = config.get("negative_prompt") or NEGATIVE_PROMPT_DEFAULT
        if self.task == "i2v":
            if "image_encoder" not in config:
                raise UsageError(f"{where}: image_encoder is missing: image-to-video needs the Wan I2V Diffusers "
                                 "directory's image_encoder/ (CLIP) folder")
            self.image_encoder, encoder_dir = pipeline_json.load_image_encoder(config["image_encoder"],
                                                                               f"{where}.image_encoder")
            self.image_processor = load_image_processor(config.get("image_processor"), encoder_dir, where)

    def _embed(self, texts: list[str]) -> Any:
        from mmrun.backend import tensors
        from mmrun.models.wan import pipeline_json
        from mmrun.models.wan.text_encoder import encode_prompts

        cleaned = [pipeline_json.whitespace_clean(text) for text in texts]
        embeds, _ = encode_prompts(self.text_encoder, self.tokenizer, cleaned, self.max_length)
        return embeds if self.model_dtype is None else tensors.cast(embeds, self.model_dtype)

    def image_inputs(self, images: list[Any]) -> tuple[Any, np.ndarray]:
        """(CLIP image tokens (B, tokens, img_dim) in the DiT's dtype, conditioning latents (B, 4 + z_dim, f, h, w))
        of one picture per prompt, as WanImageToVideoPipeline builds them."""
        from mmrun.models.clip_vision import encode_images
        from mmrun.models.wan import i2v

        tokens = encode_images(self.image_encoder, self.image_processor(images), self.model_dtype)
        first = i2v.first_frame_pixels(images, self.height, self.width)
        return tokens, i2v.condition_latents(self.vae, first, self.frames)

    def latents(self, prompts: list[str], seed: int, images: list[Any] | None = None) -> np.ndarray:
        """Denoised (normalised) latents (B, z_dim, f, h, w) of a batch of prompts (and, for i2v, their pictures)."""
        from mmrun.models.wan import sampling

        stride_t, stride_hw = self.vae.config.temporal_compression, self.vae.config.spatial_compression
        shape = sampling.latent_shape(len(prompts), self.vae.config.z_dim, self.frames, self.height, self.width,
                                      stride_t, stride_hw)
        image_embeds, condition = self.image_inputs(images) if self.task == "i2v" else (None, None)
        negative = self._embed([self.negative_prompt] * len(prompts)) if self.guidance_scale > 1 else None
        return sampling.denoise(self.transformer, self.scheduler, sampling.initial_latents(seed, shape),
                                self._embed(prompts), negative, num_inference_steps=self.steps,
                                guidance_scale=self.guidance_scale, image_embeds=image_embeds, condition=condition)

    def decode(self, latents: np.ndarray) -> np.ndarray:
        """uint8 videos (B, T, H, W, 3) of normalised latents."""
        from mmrun.backend import tensors
        from mmrun.data.video.writer import to_uint8_frames

        z = tensors.from_numpy(latents)
        parameter = next(iter(dict(self.vae.named_parameters()).values()))
        z = tensors.cast(z, parameter.dtype)
        video = tensors.to_numpy(self.vae.decode(self.vae.denormalize_latents(z)))
        return np.stack([to_uint8_frames(v) for v in video])


def sample(args: argparse.Namespace) -> list[Path]:
    """Write this rank's videos; returns their paths."""
    from mmrun import backend
    from mmrun.data.video.writer import write_video
    from mmrun.models.wan import pipeline_json

    where = f"--mm-model {args.mm_model}"
    config = pipeline_json.read_json(args.mm_model, "--mm-model")
    prompts = load_prompts(config.get("prompt"), where)
    save_path = config.get("save_path")
    if not save_path:
        raise UsageError(f"{where}.save_path is missing: name the folder the videos go to")
    fps = config.get("fps", 16) // max(int(config.get("frame_interval", 1)), 1)
    seed = int(config.get("seed", (config.get("pipeline_config") or {}).get("seed", args.seed)))
    batch = int(args.micro_batch_size or 1)
    if len(prompts) % batch:
        raise UsageError(f"{len(prompts)} prompts do not split into micro-batches of {batch}: "
                         "change --micro-batch-size or the prompt file")
    info = backend.init_distributed(args.distributed_backend)
    backend.seeding.seed_everything(seed)
    task = (config.get("predictor") or {}).get("model_type", "t2v")
    images = load_images(config.get("image"), where, len(prompts)) if task == "i2v" else None  # before any model
    sampler = Sampler(config, args.load, where)
    Path(save_path).mkdir(parents=True, exist_ok=True)
    written = []
    for start in range(info.rank * batch, len(prompts), batch * info.world_size):
        chunk = prompts[start:start + batch]
        print(f"[rank {info.rank}] prompts {start}..{start + len(chunk) - 1}: {chunk}", flush=True)
        pictures = None if images is None else images[start:start + batch]
        videos = sampler.decode(sampler.latents(chunk, seed + start, pictures))
        for offset, video in enumerate(videos):
            path = write_video(Path(save_path) / f"video_{start + offset}.mp4", video, fps)
            written.append(path)
            print(f"[rank {info.rank}] wrote {path} ({video.shape[0]} frames {video.shape[1]}x{video.shape[2]}, "
                  f"{fps} fps)", flush=True)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    from mmrun.data.gpt_dataset import DatasetConfigError
    from mmrun.models.get_wan_feature import parse_args

    try:
        sample(parse_args(sys.argv[1:] if argv is None else argv, prog=PROG))
    except (UsageError, DatasetConfigError) as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
