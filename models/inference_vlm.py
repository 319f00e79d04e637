"""Chat with a Qwen2-VL / Qwen2.5-VL / Qwen3-VL about an image, MindSpeed-MM's inference_vlm.py on PyTorch or
MindSpore.

    mmrun --ai-framework pytorch   models/inference_vlm.py --mm-model inference_qwen2_5_vl_7b.json --load DIR
    mmrun --ai-framework mindspore models/inference_vlm.py --mm-model inference_qwen2_5_vl_7b.json --load DIR

--mm-model is MindSpeed-MM's inference json as it is: `pipeline_class` (or `model_id`) Qwen2VlPipeline,
`image_encoder` / `text_decoder` (model.json's sections), `tokenizer.from_pretrained` (the Hugging Face directory
with tokenizer.json and preprocessor_config.json), `generation_config` (transformers' keys: max_new_tokens,
do_sample, temperature, top_k, top_p, repetition_penalty, eos_token_id, ...), `image_path`, `prompts` (a string
or a list), `min_pixels` / `max_pixels`, `dtype` (bf16, fp16, fp32) and `device`. --load takes a Hugging Face
directory as downloaded (its config.json must describe the json's network), or an mmrun / MindSpeed-MM-named
checkpoint of any tensor/pipeline split (`mmrun convert ... hf_to_mm` output, or a training run's --save):
it is joined into one model. Without --load, tokenizer.from_pretrained is loaded when it holds weights.
Qwen3-VL (dense): MindSpeed-MM runs its Qwen3-VL inference through transformers (examples/qwen3vl/
inference_demo.py) and has no inference json for it; here the Qwen2.5-VL json serves with Qwen3-VL's model
sections (model.json's: text_decoder.model_id qwen3_lm or qwen3lm, a qwen3vit image encoder), the prompt in
its qwen3_vl_nothink template and its weights from a Hugging Face directory or an mmrun checkpoint, as above.
A LoRA adapter in PEFT's layout (peft's save_pretrained, or `mmrun convert Qwen2VLConverter lora_to_peft`) is
folded into those weights before generation: the json's `lora_path` (mmrun's key: MindSpeed-MM merges adapters
offline and has none) or --lora-load DIR (MindSpeed-LLM's flag; it wins over the json).
Qwen2.5-Omni's thinker: MindSpeed-MM ships no Omni inference json; here the Qwen2.5-VL json serves with Omni's
model.json sections (text_decoder.model_id qwen2_5_omni_thinker, an audio_encoder section) and mmrun's keys for
its other inputs: `audio_path` (audio files), `video_path` (video files, sampled at `video_fps` up to
`video_maxlen` frames of `video_max_pixels` as MindSpeed-MM's data does) and `use_audio_in_video` (each video's own
sound track interleaved with it); the prompt is the images, the videos, the audios, then the text.

The answer streams to stdout token by token; a summary line goes to stderr. The launch script's other Megatron
flags (parallel sizes, --use-flash-attn, ...) are accepted and ignored in one notice: one process runs the
whole model. Bad input (an image that will not decode, a generation_config value of the wrong type, a prompt
longer than the model's positions, a missing file) is one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from mmrun.backend.errors import UsageError
from mmrun.models import families

PIPELINES = ("Qwen2VlPipeline",)
# The inference / evaluation json's own keys (not model.json's): read here, not passed to the model reader.
INFERENCE_KEYS = ("pipeline_class", "tokenizer", "generation_config", "image_path", "video_path", "prompts",
                  "min_pixels", "max_pixels", "dtype", "device", "dataset_path", "evaluation_dataset",
                  "evaluation_model", "result_output_path", "use_custom_prompt", "lora_path",
                  "audio_path", "use_audio_in_video", "video_fps", "video_maxlen", "video_max_pixels",
                  "video_min_pixels")
# Qwen2.5-Omni's video settings in the json, with MindSpeed-MM's data defaults (data_config.py's).
VIDEO_DEFAULTS = {"video_fps": 2.0, "video_maxlen": 128, "video_max_pixels": 256 * 256, "video_min_pixels": 16 * 16}
# text_decoder.model_id -> model.json's model_id (the inference json has no model-level one).
TEXT_DECODERS = {"qwen2lm": "qwen2vl", "qwen2_5_lm": "qwen2_5vl", "qwen3_lm": "qwen3_vl", "qwen3lm": "qwen3_vl",
                 "qwen2_5_omni_thinker": "qwen2_5vl"}  # Omni's model.json: model_id qwen2_5vl, an audio_encoder
DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "fp32": "float32",
          "float32": "float32"}


def notice(message: str) -> None:
    print(f"notice: {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="inference_vlm.py", description=__doc__.split("\n\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("--mm-model", "--mm_model", dest="mm_model", required=True,
                        help="MindSpeed-MM's inference json (pipeline_class, image_encoder, text_decoder, tokenizer, "
                             "generation_config, image_path, prompts, ...)")
    parser.add_argument("--load", help="a Hugging Face directory, or an mmrun / MindSpeed-MM checkpoint directory "
                                       "(any TP/PP split)")
    parser.add_argument("--lora-load", "--lora_load", dest="lora_load", default=None,
                        help="a LoRA adapter directory in PEFT's layout, folded into --load's weights (the json's "
                             "lora_path)")
    parser.add_argument("--seed", type=int, default=1234, help="the sampling seed (numpy; the same draws on both "
                                                               "frameworks)")
    parser.add_argument("--ai-framework", "--ai_framework", dest="ai_framework", default=None,
                        help="pytorch or mindspore (read by mmrun.backend)")
    return parser.parse_known_args(argv)


def read_inference_json(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--mm-model {path}: no such file; pass MindSpeed-MM's inference json")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise UsageError(f"--mm-model {path}: not valid JSON ({err.msg} at line {err.lineno}); fix the file") from None
    if not isinstance(raw, dict):
        raise UsageError(f"--mm-model {path}: the top level must be an object; received {type(raw).__name__}")
    pipeline = raw.get("pipeline_class", raw.get("model_id"))
    if pipeline not in PIPELINES:
        raise UsageError(f"--mm-model {path}: pipeline_class (or model_id) {pipeline!r} is not built; use "
                         f"{' or '.join(PIPELINES)}")
    tokenizer = raw.get("tokenizer")
    if not isinstance(tokenizer, dict) or not isinstance(tokenizer.get("from_pretrained"), str):
        raise UsageError(f"--mm-model {path}: tokenizer.from_pretrained must name the Hugging Face directory "
                         "(tokenizer.json, preprocessor_config.json)")
    for key in ("min_pixels", "max_pixels"):
        if raw.get(key) is not None and (not isinstance(raw[key], int) or isinstance(raw[key], bool)):
            raise UsageError(f"--mm-model {path}: {key} must be an integer; received {raw[key]!r}")
    if raw.get("dtype") is not None and raw["dtype"] not in DTYPES:
        raise UsageError(f"--mm-model {path}: dtype {raw['dtype']!r} is not one of {', '.join(DTYPES)}")
    from mmrun.models.vlm.generation import GenerationConfig

    GenerationConfig.from_dict(raw.get("generation_config") or {}, "generation_config")  # checked before any work
    return raw


def model_spec(raw: dict[str, Any], path: str) -> Any:
    """model.json's part of the inference json, read by its family's model.json reader (model_id from
    text_decoder's)."""
    model = _model_sections(raw, path)
    return families.part(families.by_model_json(model), "model_json").parse_model_json(model, path)


def inference_family(raw: dict[str, Any], path: str) -> Any:
    """The family (models/families.py) of the inference json's model sections (Omni's claims its own)."""
    return families.by_model_json(_model_sections(raw, path))


def _model_sections(raw: dict[str, Any], path: str) -> dict[str, Any]:
    model = {k: v for k, v in raw.items() if k not in INFERENCE_KEYS and k != "model_id"}
    text_id = (raw.get("text_decoder") or {}).get("model_id")
    if text_id not in TEXT_DECODERS:
        raise UsageError(f"--mm-model {path}: text_decoder.model_id must be one of {', '.join(TEXT_DECODERS)}; "
                         f"received {text_id!r}")
    generation = raw.get("generation_config") or {}
    for key in ("vision_start_token_id", "video_token_id", "image_token_id"):  # MindSpeed-MM keeps them there
        if key not in model and isinstance(generation.get(key), int):
            model[key] = generation[key]
    model["model_id"] = TEXT_DECODERS[text_id]
    return model


def build_model(raw: dict[str, Any], path: str, load: str | None, log: Callable[[str], None]) -> Any:
    """The model from --load (an HF directory or an mmrun checkpoint) or tokenizer.from_pretrained's weights."""
    spec = model_spec(raw, path)
    model_id = raw["text_decoder"]["model_id"]
    family = inference_family(raw, path)
    model_class = family.model_class
    hf_checkpoint, modeling = families.part(family, "hf_checkpoint"), families.part(family, "modeling")
    for line in spec.warnings:
        log(line)
    config = families.config_class(family).from_hf_config(spec.hf_config)
    source = load
    if source is None:
        source = raw["tokenizer"]["from_pretrained"]
        if not hf_checkpoint.is_hf_directory(source):
            raise UsageError(f"no --load given and tokenizer.from_pretrained {source} holds no {model_id} weights; "
                             "pass --load (a Hugging Face directory or an mmrun checkpoint)")
    if hf_checkpoint.is_hf_directory(source):
        weights = hf_checkpoint.open_for_model(source, config, described_by=path)
        config = weights.config
        log(f"weights: Hugging Face directory {source}")
    else:  # an mmrun checkpoint of any split, in either names (Qwen3-VL's through models/qwen3_vl/mm_layout.py)
        from mmrun.training import checkpoint_vlm

        opened = checkpoint_vlm.open_checkpoint(source, config)
        weights = dict(opened.hf_tensors())
        log(f"weights: checkpoint {source} ({opened.describe()})")
    if raw.get("lora_path"):
        weights = _with_adapter(weights, str(raw["lora_path"]), log)
    model = getattr(modeling, model_class)(config)
    modeling.load_hf_weights(model, weights)
    return model


def _with_adapter(weights: Any, adapter_dir: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The weights with a PEFT adapter folded in (W + B A lora_alpha / r): generation then costs what the base's
    does. The adapter's module names are transformers' (4.x or 5.x); checkpoint/peft.py maps them."""
    from mmrun.models import lora
    from mmrun.checkpoint.formats.safetensors import to_float_arrays
    from mmrun.checkpoint.peft import adapter_from_peft

    config, adapter = lora.read_adapter(adapter_dir)
    merged = lora.merged_weights(to_float_arrays({name: weights[name] for name in weights}), config,
                                 adapter_from_peft(adapter))
    log(f"LoRA adapter {adapter_dir}: {len(adapter) // 2} layers folded in (r {config['r']}, "
        f"alpha {config['lora_alpha']:g})")
    return merged


class Qwen2VlPipeline:
    """MindSpeed-MM's Qwen2VlPipeline: the json's tokenizer, processor settings, generation_config and model;
    `answer(text, images, streamer)` -> (new token ids, their text). evaluate_vlm.py uses it too."""

    def __init__(self, raw: dict[str, Any], path: str, load: str | None, seed: int, quiet: bool = False) -> None:
        from mmrun import backend
        from mmrun.backend import tensors
        from mmrun.data.multimodal import omni
        from mmrun.data.multimodal.image_processing import ImageProcessorConfig
        from mmrun.data.multimodal.mllm_dataset import special_token_ids
        from mmrun.data.multimodal.templates import TEMPLATES
        from mmrun.data.multimodal.vlm_prompt import with_pixel_limits
        from mmrun.data.tokenizers import HuggingFaceTokenizer
        from mmrun.models.vlm.generation import GenerationConfig, Generator

        say = (lambda message: None) if quiet else notice  # quiet: a data-parallel rank other than 0
        generation = GenerationConfig.from_dict(raw.get("generation_config") or {}, "generation_config")
        model_dir = raw["tokenizer"]["from_pretrained"]
        self.tokenizer = HuggingFaceTokenizer(model_dir)
        self.template = TEMPLATES[inference_family(raw, path).chat_template]
        ids = special_token_ids(self.tokenizer, self.template, f"{model_dir}/tokenizer.json")
        if not generation.eos_token_id:
            generation = generation.replace(eos_token_id=(ids["end_of_turn"], ids["pad"]))
        self.generation = generation.replace(seed=seed)
        self.image_config = with_pixel_limits(ImageProcessorConfig.from_pretrained(model_dir), raw.get("min_pixels"),
                                              raw.get("max_pixels"))
        self.info = backend.current()
        wanted = str(raw.get("device") or self.info.device_kind)
        if wanted != self.info.device_kind:
            say(f"device {wanted!r} in the json is not this machine's; running on {self.info.device_kind}")
        self.dtype = DTYPES[raw.get("dtype") or "fp32"]
        if not tensors.supports_compute_dtype(self.dtype, self.info.device_kind):  # before a kernel fails on it
            raise UsageError(f"--mm-model {path}: dtype {raw.get('dtype')!r} cannot run with the {self.info.framework} "
                             f"backend on {self.info.device_kind} (no {raw.get('dtype')} kernels there, e.g. MindSpore's "
                             "CPU Gather and MatMul); set dtype to fp16 or fp32 in the json")
        model = build_model(raw, path, load, say)
        if model.config.image_token_id != ids["image_pad"]:
            raise UsageError(f"the model's image token id {model.config.image_token_id} is not the tokenizer's "
                             f"<|image_pad|> {ids['image_pad']}; use the model's own tokenizer directory")
        if self.dtype != "float32":
            model.to(tensors.dtype(self.dtype))
        model.eval()
        if generation.ignored:
            shown = ", ".join(generation.ignored[:6]) + (", ..." if len(generation.ignored) > 6 else "")
            say(f"generation_config keys not used by mmrun's generation: {len(generation.ignored)} ({shown})")
        self.generator = Generator(model)
        self.omni = self.template.name == omni.TEMPLATE_NAME
        if self.omni:  # Qwen2.5-Omni: its processor's audio and video settings
            self.rope = omni.rope_config(model_dir, self.image_config.merge_size, self.tokenizer.vocab,
                                         bool(raw.get("use_audio_in_video", False)))
            self.audio_settings = omni.WhisperFeatures.from_pretrained(model_dir)
            self.video_config = ImageProcessorConfig.from_pretrained(model_dir, video=True)
            self.video = {key: raw.get(key, default) for key, default in VIDEO_DEFAULTS.items()}
        # Not printed, as transformers' skip_special_tokens: the template's special tokens and the EOS ids.
        self.hidden = (set(self.generation.eos_token_id) | set(ids.values())
                       | {self.tokenizer.vocab.get("<|im_start|>", -1)})

    def prompt(self, text: str, images: list[Any], videos: list[str] = (), audios: list[str] = ()) -> Any:
        """The generation prompt of one user turn: the images, the videos and audios (files; Qwen2.5-Omni), then
        the text."""
        from mmrun.data.multimodal.vlm_prompt import encode_prompt
        from mmrun.models.vlm.generation import Prompt

        if not self.omni:
            if videos or audios:
                raise UsageError(f"video_path / audio_path: the {self.template.name} pipeline answers about images "
                                 "only; leave them out (Qwen2.5-Omni's json takes them)")
            return Prompt(**encode_prompt(self.tokenizer, self.template, text, images, self.image_config))
        return self._omni_prompt(text, images, videos, audios)

    def _omni_prompt(self, text: str, images: list[Any], videos: list[str], audios: list[str]) -> Any:
        from mmrun.data.audio.reader import read_audio
        from mmrun.data.multimodal import omni
        from mmrun.data.multimodal.image_processing import regularize_image
        from mmrun.data.multimodal.video_files import read_video_file
        from mmrun.models.qwen2_5_omni.generation import OmniPrompt

        rate, settings = self.audio_settings.sampling_rate, self.video
        if self.rope.use_audio_in_video and (audios or not videos):
            raise UsageError("use_audio_in_video reads each video's own sound track: give video_path and no "
                             f"audio_path (received {len(videos)} video(s), {len(audios)} audio file(s))")
        clips = []
        for path in videos:
            frames, fps = read_video_file(path, settings["video_fps"], settings["video_maxlen"])
            clips.append(([regularize_image(f, settings["video_max_pixels"], settings["video_min_pixels"])
                           for f in frames], fps))
        waves = ([read_audio(p, rate, "video") for p in videos] if self.rope.use_audio_in_video
                 else [read_audio(p, rate) for p in audios])
        arrays = omni.encode_prompt(self.tokenizer, self.template, text, self.rope, images=images, videos=clips,
                                    audios=waves, image_config=self.image_config, video_config=self.video_config,
                                    settings=self.audio_settings, sampling_rate=rate)
        return OmniPrompt(**arrays, use_audio_in_video=self.rope.use_audio_in_video)

    def answer(self, text: str, images: list[Any], streamer: Callable[[str], None] | None = None,
               videos: list[str] = (), audios: list[str] = ()) -> tuple[list[int], str, int]:
        """(new token ids, the answer's text, prompt length) for one user turn: the images (the videos and audios
        of Qwen2.5-Omni), then the text."""
        from mmrun.data.multimodal.vlm_prompt import TextStream

        prompt = self.prompt(text, images, videos, audios)
        stream = TextStream(self.tokenizer, self.hidden)
        emit = (lambda token: streamer(stream.push(token))) if streamer is not None else stream.push
        tokens = self.generator.generate(prompt, self.generation, streamer=emit)
        rest = stream.flush()
        if streamer is not None:
            streamer(rest)
        return tokens, stream.text, prompt.input_ids.shape[1]


def run(argv: list[str]) -> int:
    args, rest = parse_args(argv)
    if rest:
        notice(f"ignored (one process runs the whole model): {' '.join(a for a in rest if a.startswith('--'))}")
    raw = read_inference_json(args.mm_model)
    if args.lora_load:
        raw["lora_path"] = args.lora_load
    from mmrun.data.multimodal.vlm_prompt import open_image

    images = raw.get("image_path")
    images = [] if images in (None, "") else [images] if isinstance(images, str) else images
    pictures = [open_image(p, f"image_path {p}") for p in images]
    prompts = raw.get("prompts")
    prompts = [prompts] if isinstance(prompts, str) else prompts
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise UsageError(f"--mm-model {args.mm_model}: prompts must be a string or a list of strings; received "
                         f"{raw.get('prompts')!r}")
    videos, audios = (_paths(raw, key, args.mm_model) for key in ("video_path", "audio_path"))
    pipeline = Qwen2VlPipeline(raw, args.mm_model, args.load, args.seed)
    for text in prompts:
        start = time.perf_counter()
        tokens, _, prompt_length = pipeline.answer(text, pictures, lambda piece: print(piece, end="", flush=True),
                                                   videos, audios)
        seconds = time.perf_counter() - start
        print(flush=True)
        print(f"> {len(tokens)} new tokens after a prompt of {prompt_length} in {seconds:.2f} s "
              f"({len(tokens) / max(seconds, 1e-9):.1f} tokens/s), {pipeline.info.framework} on "
              f"{pipeline.info.device_kind}, {pipeline.dtype}", file=sys.stderr, flush=True)
    return 0


def _paths(raw: dict[str, Any], key: str, path: str) -> list[str]:
    """A json key that holds a file path or a list of them ([] when absent)."""
    value = raw.get(key)
    value = [] if value in (None, "") else [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"--mm-model {path}: {key} must be a file path or a list of them; received {raw.get(key)!r}")
    return value


def input_errors() -> tuple[type[Exception], ...]:
    """The errors that mean bad input (a file, a key, a value): one line and exit code 2."""
    from mmrun.data.gpt_dataset import DatasetConfigError
    from mmrun.data.tokenizers import TokenizerError
    from mmrun.checkpoint.formats.hf_directory import NotAnHFDirectoryError
    from mmrun.training.checkpoint_layout import CheckpointError

    return UsageError, DatasetConfigError, TokenizerError, NotAnHFDirectoryError, CheckpointError


def entry_main(run_entry: Callable[[list[str]], int], argv: list[str] | None) -> int:
    """An entry's main (this one's, evaluate_vlm.py's): run_entry(argv), bad input one line and exit code 2."""
    try:
        return run_entry(list(sys.argv[1:] if argv is None else argv))
    except input_errors() as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> int:
    return entry_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
