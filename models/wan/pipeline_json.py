"""The blocks that MindSpeed-MM's Wan feature-extraction and inference jsons share, read as they are:

    "ae":           {"model_id": "wan_video_vae", "from_pretrained": <Diffusers dir>/vae, "dtype",
                     "norm_latents", "norm_mode": "channel_specified_shift_scale", "do_sample", "enable_tiling", ...}
    "text_encoder": {"model_id": "UMT5", "hub_backend": "hf", "from_pretrained": <dir>/text_encoder, "dtype"}
    "tokenizer":    {"autotokenizer_name": "AutoTokenizer", "from_pretrained": <dir>/tokenizer, "model_max_length"}

Each model loads with mmrun's own classes (models/wan/vae.py, text_encoder.py) from the diffusers directory as
downloaded; the tokenizer is the directory's tokenizer.json (no transformers needed). A block that names another
model, or a key whose value mmrun cannot honour, is one line (UsageError, exit 2).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mmrun.backend.errors import UsageError

VAE_ID, TEXT_ENCODER_ID = "wan_video_vae", "UMT5"
NORM_MODES = ("channel_specified_shift_scale",)
DEFAULT_MAX_LENGTH = 512  # Wan's text_len; MindSpeed-MM's tokenizer_config.model_max_length
# MindSpeed-MM's dtype names -> mmrun.backend's
DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "fp32": "fp32", "float32": "fp32"}


def read_json(path: str | None, flag: str) -> dict[str, Any]:
    """A json file given by `flag`, as a dict, or one line saying what is wrong with it."""
    if not path:
        raise UsageError(f"{flag} is required: pass MindSpeed-MM's json file")
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError(f"{flag} {path}: cannot be read ({error.strerror})") from None
    except json.JSONDecodeError as error:
        raise UsageError(f"{flag} {path}: not JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag} {path}: expected a JSON object, got {type(value).__name__}")
    return value


def block(config: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = config.get(key)
    if not isinstance(value, dict):
        raise UsageError(f"{where}: needs a {key!r} object")
    return value


def dtype_name(value: Any, where: str) -> str | None:
    """mmrun.backend's name of a json's dtype; one line, before any weight is read, for a dtype the framework has
    no kernels for on this device (bf16 on MindSpore's CPU: its Conv3D, Gather and MatMul would fail inside)."""
    if value is None:
        return None
    if value not in DTYPES:
        raise UsageError(f"{where}.dtype {value!r}: use one of {sorted(DTYPES)}")
    from mmrun import backend
    from mmrun.backend import tensors

    info = backend.current()
    if not tensors.supports_compute_dtype(DTYPES[value], info.device_kind):
        raise UsageError(f"{where}.dtype {value!r} cannot run with the {info.framework} backend on "
                         f"{info.device_kind} (no {DTYPES[value]} kernels there); set it to fp16 or fp32")
    return DTYPES[value]


def _pretrained(config: Mapping[str, Any], where: str) -> str:
    path = config.get("from_pretrained")
    if not path or not Path(path).is_dir():
        raise UsageError(f"{where}.from_pretrained {path!r}: not a directory; point it at the Wan Diffusers "
                         "directory's folder as downloaded")
    return str(path)


@dataclass
class VaeSettings:
    norm_latents: bool
    do_sample: bool
    notices: list[str]


def load_vae(ae: Mapping[str, Any], where: str = "ae") -> tuple[Any, VaeSettings]:
    """The Wan VAE of an `ae` block and how its latents are treated (normalised, sampled)."""
    from mmrun.models.wan.vae import AutoencoderKLWan

    if ae.get("model_id") != VAE_ID:
        raise UsageError(f"{where}.model_id {ae.get('model_id')!r}: mmrun runs Wan2.1's {VAE_ID!r}")
    norm = bool(ae.get("norm_latents", False))
    if norm and ae.get("norm_mode", NORM_MODES[0]) not in NORM_MODES:
        raise UsageError(f"{where}.norm_mode {ae.get('norm_mode')!r}: mmrun normalises with {NORM_MODES[0]}")
    notices = []
    if ae.get("enable_tiling"):
        notices.append(f"{where}.enable_tiling: not used; mmrun's VAE already encodes and decodes a few frames "
                       "at a time (the same latents)")
    vae = AutoencoderKLWan.from_pretrained(_pretrained(ae, where), dtype_name(ae.get("dtype"), where))
    return vae, VaeSettings(norm, bool(ae.get("do_sample", False)), notices)


def load_text_encoder(config: Mapping[str, Any], where: str = "text_encoder") -> Any:
    from mmrun.models.wan.text_encoder import UMT5EncoderModel

    if config.get("model_id") != TEXT_ENCODER_ID:
        raise UsageError(f"{where}.model_id {config.get('model_id')!r}: mmrun runs Wan2.1's {TEXT_ENCODER_ID!r}")
    return UMT5EncoderModel.from_pretrained(_pretrained(config, where), dtype_name(config.get("dtype"), where))


def load_tokenizer(config: Mapping[str, Any], where: str = "tokenizer") -> tuple[Any, int]:
    """(tokenizer, max_length): the directory's tokenizer.json and model_max_length (the block's, else the
    directory's tokenizer_config.json's, else 512)."""
    from mmrun.data.tokenizers import HuggingFaceTokenizer, TokenizerError

    path = _pretrained(config, where)
    try:
        tokenizer = HuggingFaceTokenizer(path)
    except TokenizerError as error:
        raise UsageError(f"{where}.from_pretrained: {error}") from None
    length = config.get("model_max_length")
    saved = Path(path) / "tokenizer_config.json"
    if length is None and saved.is_file():
        length = json.loads(saved.read_text(encoding="utf-8")).get("model_max_length")
    if not isinstance(length, int) or not 0 < length <= 1_000_000:  # HF writes 1e30 for "no limit"
        length = DEFAULT_MAX_LENGTH
    return tokenizer, length


def load_image_encoder(config: Any, where: str) -> tuple[Any, str]:
    """(CLIPVisionModel, its directory) of an image encoder given as a directory path or a block
    {"from_pretrained": <dir>/image_encoder, "dtype"}: Wan2.1 I2V's CLIP (models/clip_vision.py)."""
    from mmrun.models.clip_vision import CLIPVisionModel

    if isinstance(config, str):
        config = {"from_pretrained": config}
    if not isinstance(config, Mapping):
        raise UsageError(f"{where} {config!r}: give the Wan I2V Diffusers directory's image_encoder/ folder")
    path = config.get("from_pretrained")
    if not path or not Path(path).is_dir():
        raise UsageError(f"{where} {path!r}: not a directory; point it at the Wan I2V Diffusers directory's "
                         "image_encoder/ folder as downloaded")
    return CLIPVisionModel.from_pretrained(path, dtype_name(config.get("dtype"), where)), str(path)


def whitespace_clean(text: str) -> str:
    """MindSpeed-MM's `whitespace_clean` text preprocessing (and diffusers' prompt_clean without ftfy)."""
    return re.sub(r"\s+", " ", text).strip()
