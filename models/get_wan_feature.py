"""Extract Wan2.1 training features, MindSpeed-MM style, on PyTorch or MindSpore.

    mmrun --ai-framework pytorch --nproc-per-node 2 models/get_wan_feature.py $GPT_ARGS \\
        --mm-data data.json --mm-model model_t2v.json --mm-tool tools.json

This is MindSpeed-MM's mindspeed_mm/tools/feature_extraction/get_wan_feature.py with its files as they are:

    --mm-data data.json    dataset_param: basic_parameters.data_path (a `combine` data.txt: lines
                           `<video folder>,<annotation json>`, annotations [{"path", "cap"}]),
                           preprocess_parameters (num_frames, frame_interval, max_height, max_width, train_pipeline,
                           ...: mmrun.data.video.preprocess), tokenizer_config (from_pretrained, model_max_length)
    --mm-model model.json  ae (wan_video_vae, norm_latents) and text_encoder (UMT5), from a Diffusers directory
    --mm-tool tools.json   sorafeature.save_path: the output folder

Each video is decoded (MP4 through PyAV, GIF, folders of frames), its frames picked and transformed as
MindSpeed-MM does, encoded by the VAE (the latent mode, normalised per channel with the VAE config's
latents_mean / latents_std), its caption by UMT5 (padded to model_max_length, zeros past the prompt, the mask).
One safetensors file per video lands in <save_path>/features/ (MindSpeed-MM's name: "clip.mp4" ->
"clip_mp4.safetensors"), and <save_path>/data.jsonl lists them in the annotation's order, each record the
annotation's entry plus "file": "features/<name>" (what feature_data.json's data_path points at). With several
ranks each takes every world_size-th video and rank 0 writes the one merged index.

Image-to-video (model_i2v.json: `task` i2v, or an `ae.i2v_processor` block {"processor_id": "wan_i2v_processor",
"image_encoder": <Wan I2V Diffusers dir>/image_encoder}) adds MindSpeed-MM's two i2v keys to each file, from the
first frame after the shared `video_and_first_frame` transforms (models/wan/i2v.py):
    i2v_clip_feature  [257, 1280]: CLIP's hidden_states[-2] (models/clip_vision.py) of the first frame put through
                      train_pipeline.first_frame_clip (MindSpeed-MM's list, e.g. CenterCropResizeVideo to 224 and
                      norm_fun with CLIP's mean/std; without one: the same two steps at the encoder's image_size)
    i2v_vae_feature   [4 + C, F, H, W]: the frame mask, then the VAE latents of the first frame put through
                      train_pipeline.first_frame_vae (else the video's own `video_only` steps) followed by F - 1 zero
                      frames, encoded and normalised as the video is (do_sample, norm_latents)
pretrain_sora.py (task i2v) trains on them as they are.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mmrun.backend.errors import UsageError

PROG = "get_wan_feature.py"
FEATURES_DIR = "features"
INDEX_NAME = "data.jsonl"


def _extra_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    known = {s for action in parser._actions for s in action.option_strings}
    if "--attention-mask-type" not in known:  # MindSpeed-MM's scripts pass it; it changes nothing here
        parser.add_argument("--attention-mask-type", "--attention_mask_type", dest="attention_mask_type",
                            help="accepted (MindSpeed-MM's flag); not used by feature extraction")
    return parser


def parse_args(argv: Sequence[str], prog: str = PROG) -> argparse.Namespace:
    """MindSpeed-MM's flags as its launch scripts pass them: Megatron's are accepted, the --mm-* files are read."""
    from mmrun.training.arguments import build_parser

    parser = build_parser(_extra_args, prog=prog)
    args, unknown = parser.parse_known_args(list(argv))
    if unknown:
        raise UsageError(f"unrecognized argument {unknown[0]!r} (received: {' '.join(unknown)}); see {prog} --help")
    return args


TASKS = ("t2v", "i2v")
I2V_PROCESSORS = ("wan_i2v_processor",)  # MindSpeed-MM's processor_id of Wan2.1's WanVideoI2VProcessor
# CLIP's normalisation (OpenAI CLIP's mean / std), the default first_frame_clip list's second step
CLIP_NORM = {"trans_type": "norm_fun", "param": {"mean": [0.48145466, 0.4578275, 0.40821073],
                                                 "std": [0.26862954, 0.26130258, 0.27577711]}}


def task_of(model: dict[str, Any], where: str) -> str:
    """t2v, or i2v when the model json says `task` i2v or has an ae.i2v_processor block; others refused."""
    task = model.get("task", "i2v" if "i2v_processor" in (model.get("ae") or {}) else "t2v")
    if task not in TASKS:
        raise UsageError(f"{where}: task {task!r}; mmrun extracts {TASKS} features (Wan2.1)")
    if task == "i2v" and not isinstance((model.get("ae") or {}).get("i2v_processor"), dict):
        raise UsageError(f"{where}: task i2v needs an ae.i2v_processor block (MindSpeed-MM's model_i2v.json: "
                         '{"processor_id": "wan_i2v_processor", "image_encoder": <Diffusers dir>/image_encoder})')
    return task


class Extractor:
    """The models and settings of one extraction run (built once per process)."""

    def __init__(self, data: dict[str, Any], model: dict[str, Any], data_flag: str, model_flag: str,
                 seed: int, task: str = "t2v") -> None:
        from mmrun.data.video.preprocess import PreprocessParameters
        from mmrun.models.wan import pipeline_json

        dataset = pipeline_json.block(data, "dataset_param", data_flag)
        from mmrun.features.mindspeed_keys import check_values  # sample filters not built (features/mindspeed_mm_keys.yaml)

        refused = check_values("wan_extract_data", data, data_flag)
        if refused:
            raise UsageError(refused[0])
        basic = pipeline_json.block(dataset, "basic_parameters", f"{data_flag} dataset_param")
        mode = basic.get("data_storage_mode", "combine")
        if mode != "combine":
            raise UsageError(f"{data_flag}: data_storage_mode {mode!r}; mmrun reads MindSpeed-MM's 'combine' t2v "
                             "annotations (data.txt lines `<video folder>,<annotation json>`)")
        if not basic.get("data_path"):
            raise UsageError(f"{data_flag}: basic_parameters.data_path is missing: name the data.txt")
        self.data_path = basic["data_path"]
        self.params = PreprocessParameters.from_dict(
            pipeline_json.block(dataset, "preprocess_parameters", f"{data_flag} dataset_param"))
        self.clean_text = bool(dataset.get("enable_text_preprocessing", True))
        self.vae, self.vae_settings = pipeline_json.load_vae(pipeline_json.block(model, "ae", model_flag),
                                                              f"{model_flag} ae")
        self.text_encoder = pipeline_json.load_text_encoder(pipeline_json.block(model, "text_encoder", model_flag),
                                                            f"{model_flag} text_encoder")
        tokenizer = dataset.get("tokenizer_config")
        if isinstance(tokenizer, list) and len(tokenizer) == 1:  # MindSpeed-MM also writes a list of one
            tokenizer = tokenizer[0]
        self.tokenizer, self.max_length = pipeline_json.load_tokenizer(
            pipeline_json.block({"tokenizer_config": tokenizer}, "tokenizer_config", f"{data_flag} dataset_param"),
            f"{data_flag} tokenizer_config")
        self.seed = seed
        self.task = task
        if task == "i2v":
            self._init_i2v(model["ae"]["i2v_processor"], f"{model_flag} ae.i2v_processor")

    def _init_i2v(self, processor: dict[str, Any], where: str) -> None:
        from mmrun.data.video.preprocess import DEFAULT_VIDEO_ONLY
        from mmrun.models.wan import pipeline_json

        if processor.get("processor_id", I2V_PROCESSORS[0]) not in I2V_PROCESSORS:
            raise UsageError(f"{where}.processor_id {processor.get('processor_id')!r}: mmrun extracts Wan2.1's "
                             f"{I2V_PROCESSORS}")
        if "image_encoder" not in processor:
            raise UsageError(f"{where}: image_encoder is missing: name the Wan I2V Diffusers directory's "
                             "image_encoder/ folder")
        self.image_encoder, _ = pipeline_json.load_image_encoder(processor["image_encoder"], f"{where}.image_encoder")
        pipeline = self.params.train_pipeline
        size = self.image_encoder.config.image_size
        self.clip_steps = pipeline.get("first_frame_clip") or [
            {"trans_type": "CenterCropResizeVideo",
             "param": {"transform_size": [size, size], "interpolation_mode": "bicubic", "antialias": True}},
            CLIP_NORM]
        self.vae_steps = pipeline.get("first_frame_vae") or pipeline.get("video_only", DEFAULT_VIDEO_ONLY)

    def _encode(self, pixels: np.ndarray, rng: np.random.Generator) -> Any:
        """Latents (1, z_dim, f, h, w) of pixels (1, 3, T, H, W), sampled or the mode, normalised or not."""
        from mmrun.backend import tensors

        # pixels (and noise) in the VAE's own dtype: ae.dtype bf16 loads bf16 weights, and a convolution takes
        # one dtype (as diffusers' pipelines cast the video to vae.dtype)
        dtype = next(iter(dict(self.vae.named_parameters()).values())).dtype
        if self.vae_settings.do_sample:  # MindSpeed-MM's do_sample: latent_dist.sample()
            stride_t, stride_hw = self.vae.config.temporal_compression, self.vae.config.spatial_compression
            shape = (1, self.vae.config.z_dim, (pixels.shape[2] - 1) // stride_t + 1, pixels.shape[3] // stride_hw,
                     pixels.shape[4] // stride_hw)
            latents = self.vae.encode(tensors.from_numpy(pixels, dtype),
                                      noise=tensors.from_numpy(rng.standard_normal(shape).astype("f4"), dtype))
        else:
            latents = self.vae.encode(tensors.from_numpy(pixels, dtype))
        if self.vae_settings.norm_latents:
            latents = self.vae.normalize_latents(latents)
        return latents

    def i2v_features(self, first_frame: np.ndarray, video: np.ndarray, rng: np.random.Generator
                     ) -> dict[str, np.ndarray]:
        """{"i2v_clip_feature": (tokens, img_dim), "i2v_vae_feature": (4 + z_dim, f, h, w)} of a first frame
        (3, H, W) after the shared transforms and the video (3, T, H, W) it opens."""
        from mmrun.backend import tensors
        from mmrun.data.video.feature_files import I2V_CLIP, I2V_VAE
        from mmrun.data.video.preprocess import run_pipeline
        from mmrun.models.clip_vision import encode_images
        from mmrun.models.wan import i2v

        clip_in = run_pipeline(first_frame[None], self.clip_steps, self.params.transform_size(False))
        tokens = tensors.to_numpy(encode_images(self.image_encoder, clip_in.astype(np.float32)))[0]
        vae_in = run_pipeline(first_frame[None], self.vae_steps, self.params.transform_size(False))
        if vae_in.shape[-2:] != video.shape[-2:] or vae_in.dtype != np.float32:
            raise UsageError(f"train_pipeline.first_frame_vae gives the first frame {vae_in.dtype} "
                             f"{tuple(vae_in.shape[-2:])}, the video is float32 {tuple(video.shape[-2:])}: its "
                             "steps must size and normalise the frame as video_only does")
        latents = tensors.to_numpy(self._encode(i2v.condition_pixels(vae_in, video.shape[1]), rng))
        mask = i2v.frame_mask(1, video.shape[1], latents.shape[3], latents.shape[4],
                              self.vae.config.temporal_compression)
        return {I2V_CLIP: tokens, I2V_VAE: np.concatenate([mask, latents.astype(np.float32)], axis=1)[0]}

    def features(self, sample: dict[str, Any], index: int) -> dict[str, np.ndarray]:
        """{"video": latents (C, F, H, W), "prompt_ids": embeddings (L, D), "prompt_mask": (L,)} of one sample, plus
        i2v_clip_feature and i2v_vae_feature for i2v."""
        from mmrun.backend import tensors
        from mmrun.data.video import annotations, preprocess, readers
        from mmrun.models.wan import pipeline_json
        from mmrun.models.wan.text_encoder import encode_prompts

        rng = np.random.default_rng([self.seed, index])  # each sample its own stream: any rank draws the same
        picked = preprocess.preprocess_video(readers.read_video(sample["path"]), self.params, rng)
        video = picked["video"]
        latents = self._encode(video[None], rng)
        extra = self.i2v_features(picked["first_frame"], video, rng) if self.task == "i2v" else {}
        caption = annotations.caption_of(sample, rng)
        if self.clean_text:
            caption = pipeline_json.whitespace_clean(caption)
        embeds, mask = encode_prompts(self.text_encoder, self.tokenizer, [caption], self.max_length)
        return {"video": tensors.to_numpy(latents)[0], "prompt_ids": tensors.to_numpy(embeds)[0],
                "prompt_mask": mask[0], **extra}


def _check_unique_names(samples: list[dict[str, Any]], data_path: str) -> None:
    from mmrun.data.video.feature_files import feature_file_name

    seen: dict[str, str] = {}
    for sample in samples:
        name = feature_file_name(sample["path"])
        if name in seen:
            raise UsageError(f"{data_path}: {seen[name]} and {sample['path']} would both write features/{name} "
                             "(MindSpeed-MM names features by the file's base name); rename one of them")
        seen[name] = sample["path"]


def extract(args: argparse.Namespace) -> Path:
    """Run the extraction of this process's share; rank 0 writes the merged index. Returns the index path."""
    from mmrun import backend
    from mmrun.backend import distributed
    from mmrun.data.video import annotations
    from mmrun.data.video.feature_files import (FILE_KEY, I2V_CLIP, I2V_VAE, feature_file_name, write_feature_file,
                                                write_index)
    from mmrun.models.wan import pipeline_json

    data = pipeline_json.read_json(args.mm_data, "--mm-data")
    model = pipeline_json.read_json(args.mm_model, "--mm-model")
    tool = pipeline_json.read_json(args.mm_tool, "--mm-tool")
    task = task_of(model, f"--mm-model {args.mm_model}")
    save_path = (tool.get("sorafeature") or {}).get("save_path")
    if not save_path:
        raise UsageError(f"--mm-tool {args.mm_tool}: sorafeature.save_path is missing: name the output folder")
    info = backend.init_distributed(args.distributed_backend)
    backend.seeding.seed_everything(args.seed)
    extractor = Extractor(data, model, "--mm-data", "--mm-model", args.seed, task)
    samples = annotations.read_data_txt(extractor.data_path)
    _check_unique_names(samples, extractor.data_path)
    for notice in extractor.vae_settings.notices:
        if info.rank == 0:
            print(f"notice: {notice}", flush=True)
    features_dir = Path(save_path) / FEATURES_DIR
    features_dir.mkdir(parents=True, exist_ok=True)
    mine = list(range(info.rank, len(samples), info.world_size))
    if info.rank == 0:
        print(f"feature extraction: {len(samples)} videos over {info.world_size} rank(s) -> {features_dir}",
              flush=True)
    for done, index in enumerate(mine, 1):
        sample = samples[index]
        name = feature_file_name(sample["path"])
        features = extractor.features(sample, index)
        write_feature_file(features_dir / name, features)
        i2v = "".join(f", {key} {tuple(features[key].shape)}" for key in (I2V_CLIP, I2V_VAE) if key in features)
        print(f"[rank {info.rank}] {done}/{len(mine)} {sample['path']} -> {FEATURES_DIR}/{name} "
              f"latents {tuple(features['video'].shape)}{i2v}", flush=True)
    if info.world_size > 1:
        distributed.barrier()  # every rank's files are on disk before the index names them
    index_path = Path(save_path) / INDEX_NAME
    if info.rank == 0:
        records = [{**sample, FILE_KEY: f"{FEATURES_DIR}/{feature_file_name(sample['path'])}"} for sample in samples]
        write_index(index_path, records)
        print(f"wrote {index_path} ({len(records)} samples)", flush=True)
    return index_path


def main(argv: Sequence[str] | None = None) -> int:
    from mmrun.data.gpt_dataset import DatasetConfigError
    from mmrun.data.video.feature_files import FeatureFileError

    try:
        extract(parse_args(sys.argv[1:] if argv is None else argv))
    except (UsageError, DatasetConfigError, FeatureFileError) as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
