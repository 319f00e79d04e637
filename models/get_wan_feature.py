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

Image-to-video extraction (model_i2v.json: CLIP image features of the first frame) is refused in one line:
mmrun has no CLIP image encoder yet.
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


def _i2v_refusal(model: dict[str, Any], where: str) -> None:
    if model.get("task", "t2v") != "t2v" or "i2v_processor" in (model.get("ae") or {}):
        raise UsageError(f"{where}: image-to-video extraction (task i2v, ae.i2v_processor: CLIP image features of "
                         "the first frame) is not supported yet: mmrun has no CLIP image encoder; extract t2v "
                         "features, or extract i2v features with MindSpeed-MM (mmrun trains on its .pt files)")


class Extractor:
    """The models and settings of one extraction run (built once per process)."""

    def __init__(self, data: dict[str, Any], model: dict[str, Any], data_flag: str, model_flag: str,
                 seed: int) -> None:
        from mmrun.data.video.preprocess import PreprocessParameters
        from mmrun.models.wan import pipeline_json

        dataset = pipeline_json.block(data, "dataset_param", data_flag)
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

    def features(self, sample: dict[str, Any], index: int) -> dict[str, np.ndarray]:
        """{"video": latents (C, F, H, W), "prompt_ids": embeddings (L, D), "prompt_mask": (L,)} of one sample."""
        from mmrun.backend import tensors
        from mmrun.data.video import annotations, preprocess, readers
        from mmrun.models.wan import pipeline_json
        from mmrun.models.wan.text_encoder import encode_prompts

        rng = np.random.default_rng([self.seed, index])  # each sample its own stream: any rank draws the same
        video = preprocess.preprocess_video(readers.read_video(sample["path"]), self.params, rng)["video"]
        pixels = tensors.from_numpy(video[None])
        if self.vae_settings.do_sample:  # MindSpeed-MM's do_sample: latent_dist.sample()
            stride_t, stride_hw = self.vae.config.temporal_compression, self.vae.config.spatial_compression
            shape = (1, self.vae.config.z_dim, (video.shape[1] - 1) // stride_t + 1, video.shape[2] // stride_hw,
                     video.shape[3] // stride_hw)
            latents = self.vae.encode(pixels, noise=tensors.from_numpy(rng.standard_normal(shape).astype("f4")))
        else:
            latents = self.vae.encode(pixels)
        if self.vae_settings.norm_latents:
            latents = self.vae.normalize_latents(latents)
        caption = annotations.caption_of(sample, rng)
        if self.clean_text:
            caption = pipeline_json.whitespace_clean(caption)
        embeds, mask = encode_prompts(self.text_encoder, self.tokenizer, [caption], self.max_length)
        return {"video": tensors.to_numpy(latents)[0], "prompt_ids": tensors.to_numpy(embeds)[0],
                "prompt_mask": mask[0]}


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
    from mmrun.data.video.feature_files import FILE_KEY, feature_file_name, write_feature_file, write_index
    from mmrun.models.wan import pipeline_json

    data = pipeline_json.read_json(args.mm_data, "--mm-data")
    model = pipeline_json.read_json(args.mm_model, "--mm-model")
    tool = pipeline_json.read_json(args.mm_tool, "--mm-tool")
    _i2v_refusal(model, f"--mm-model {args.mm_model}")
    save_path = (tool.get("sorafeature") or {}).get("save_path")
    if not save_path:
        raise UsageError(f"--mm-tool {args.mm_tool}: sorafeature.save_path is missing: name the output folder")
    info = backend.init_distributed(args.distributed_backend)
    backend.seeding.seed_everything(args.seed)
    extractor = Extractor(data, model, "--mm-data", "--mm-model", args.seed)
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
        print(f"[rank {info.rank}] {done}/{len(mine)} {sample['path']} -> {FEATURES_DIR}/{name} "
              f"latents {tuple(features['video'].shape)}", flush=True)
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
