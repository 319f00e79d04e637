"""The Wan2.1 diffusion transformer's configuration, read from diffusers' config.json or MindSpeed-MM's predictor.

`WanTransformerConfig` holds diffusers' `WanTransformer3DModel` arguments under diffusers' names, so a
`transformer/config.json` as downloaded reads as it is (`from_diffusers`) and `to_diffusers()` writes one that
diffusers loads. MindSpeed-MM's model.json describes the same network under other names (`predictor`,
`model_id` "wandit"); `from_mindspeed` maps them:

| MindSpeed-MM predictor | diffusers config.json |
|---|---|
| `in_dim`, `out_dim` | `in_channels`, `out_channels` |
| `hidden_size`, `num_heads` | `num_attention_heads`, `attention_head_dim` (= hidden_size / num_heads) |
| `img_dim` (i2v and flf2v only) | `image_dim`, with `added_kv_proj_dim` = hidden_size |
| `model_type` flf2v | `pos_embed_seq_len` = 2 * `clip_token_len` |
| `max_seq_len` | `rope_max_seq_len` |
| `patch_size`, `text_dim`, `freq_dim`, `ffn_dim`, `num_layers`, `cross_attn_norm`, `eps` | the same names |

Every error is one line (`WanConfigError`, a UsageError: the entries exit 2 with it).
"""
from __future__ import annotations

import difflib
import json
import os
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping

from mmrun.backend.errors import UsageError

DIFFUSERS_CLASS = "WanTransformer3DModel"
# diffusers writes this for its (only) query/key norm: RMSNorm over all heads together. Its Wan attention
# builds that norm whatever the value says, so every value reads as this one.
QK_NORM = "rms_norm_across_heads"
MODEL_ID = "wandit"
MODEL_TYPES = ("t2v", "i2v", "flf2v")
INT = (int,)
NUMBER = (int, float)
BOOL = (bool,)

# diffusers' config.json key -> accepted types (None where diffusers allows it).
DIFFUSERS_KEYS: dict[str, tuple[type, ...]] = {
    "patch_size": (list, tuple), "num_attention_heads": INT, "attention_head_dim": INT, "in_channels": INT,
    "out_channels": (int, type(None)), "text_dim": INT, "freq_dim": INT, "ffn_dim": INT, "num_layers": INT,
    "cross_attn_norm": BOOL, "qk_norm": (str, type(None)), "eps": NUMBER, "image_dim": (int, type(None)),
    "added_kv_proj_dim": (int, type(None)), "rope_max_seq_len": INT, "pos_embed_seq_len": (int, type(None)),
}
# What diffusers' ConfigMixin adds beside the arguments; never an argument of the model.
DIFFUSERS_BOOKKEEPING = ("_class_name", "_diffusers_version", "_name_or_path", "_use_default_values")

# MindSpeed-MM's predictor keys that mmrun reads -> accepted types.
MINDSPEED_KEYS: dict[str, tuple[type, ...]] = {
    "model_id": (str,), "model_type": (str,), "patch_size": (list, tuple), "text_len": INT, "in_dim": INT,
    "hidden_size": INT, "ffn_dim": INT, "freq_dim": INT, "text_dim": INT, "img_dim": INT, "out_dim": INT,
    "num_heads": INT, "num_layers": INT, "pipeline_num_layers": (list, type(None)), "qk_norm": BOOL,
    "qk_norm_type": (str,), "cross_attn_norm": BOOL, "eps": NUMBER, "max_seq_len": INT, "clip_token_len": INT,
    "from_pretrained": (str, type(None)),
}
# Keys MindSpeed-MM's Wan examples carry that change nothing in mmrun's model (precision comes from the launch
# script's --bf16/--fp16, fusion and offload switches are Ascend kernels choices, FPDT is its long-sequence
# context parallelism): accepted silently.
MINDSPEED_IGNORED = ("dtype", "fa_layout", "attention_async_offload", "use_fused_rmsnorm", "FPDT", "FPDT_chunk_number",
                     "FPDT_with_offload", "fp32_calculate")


class WanConfigError(UsageError):
    """A Wan transformer configuration mmrun cannot build: one line naming the key, the value and what to do."""


@dataclass
class WanTransformerConfig:
    """diffusers' WanTransformer3DModel arguments (its defaults: Wan2.1-T2V-14B), plus MindSpeed-MM's `text_len`."""

    patch_size: tuple[int, int, int] = (1, 2, 2)
    num_attention_heads: int = 40
    attention_head_dim: int = 128
    in_channels: int = 16
    out_channels: int = 16
    text_dim: int = 4096
    freq_dim: int = 256
    ffn_dim: int = 13824
    num_layers: int = 40
    cross_attn_norm: bool = True
    qk_norm: str | None = QK_NORM
    eps: float = 1e-6
    image_dim: int | None = None  # CLIP feature width of i2v (1280); None: text-to-video
    added_kv_proj_dim: int | None = None  # the image keys/values' input width (the hidden size) in i2v
    rope_max_seq_len: int = 1024  # longest frame / row / column count the rotary tables cover
    pos_embed_seq_len: int | None = None  # flf2v: learned positions of the two images' CLIP tokens
    # MindSpeed-MM's prompt length (UMT5 tokens); informational: the model takes any length.
    text_len: int = field(default=512, metadata={"diffusers": False})

    def __post_init__(self) -> None:
        if self.out_channels is None:  # diffusers: out_channels or in_channels
            self.out_channels = self.in_channels
        if isinstance(self.patch_size, (list, tuple)):
            self.patch_size = tuple(self.patch_size)
        _check(self)

    @property
    def inner_dim(self) -> int:
        """The hidden size: heads * head dim."""
        return self.num_attention_heads * self.attention_head_dim

    @property
    def model_type(self) -> str:
        """MindSpeed-MM's name of the task: t2v, i2v (CLIP image tokens), flf2v (first and last frame)."""
        if self.image_dim is None:
            return "t2v"
        return "flf2v" if self.pos_embed_seq_len is not None else "i2v"

    @property
    def rope_dims(self) -> tuple[int, int, int]:
        """The head dimensions rotated by frame, row and column (diffusers' WanRotaryPosEmbed split)."""
        h = w = 2 * (self.attention_head_dim // 6)
        return self.attention_head_dim - h - w, h, w

    # ------------------------------------------------------------------ diffusers

    @classmethod
    def from_diffusers(cls, config: Mapping[str, Any] | str | os.PathLike) -> "WanTransformerConfig":
        """From diffusers' config dict, its config.json, or the `transformer/` directory holding it."""
        where = "config"
        if not isinstance(config, Mapping):
            path = Path(config)
            path = path / "config.json" if path.is_dir() else path
            where = str(path)
            try:
                config = json.loads(path.read_text())
            except OSError as error:
                raise WanConfigError(f"cannot read {path} ({error.strerror}); pass a diffusers Wan transformer "
                                     "directory (config.json + diffusion_pytorch_model.safetensors)") from None
            except ValueError as error:
                raise WanConfigError(f"{path} is not valid JSON ({error}); restore the file") from None
            if not isinstance(config, dict):
                raise WanConfigError(f"{path} holds a {type(config).__name__}, not a config object; pass a "
                                     "diffusers Wan transformer config.json")
        class_name = config.get("_class_name", DIFFUSERS_CLASS)
        if class_name != DIFFUSERS_CLASS:
            raise WanConfigError(f"{where} describes a {class_name}, not a {DIFFUSERS_CLASS}; pass the "
                                 "transformer/ directory of a Wan2.1 diffusers model")
        values = {}
        for key, value in config.items():
            if key in DIFFUSERS_BOOKKEEPING or key.startswith("_"):
                continue
            if key not in DIFFUSERS_KEYS:
                raise WanConfigError(_unknown(where, key, DIFFUSERS_KEYS, "mmrun's Wan transformer does not "
                                              "implement it; remove it or use diffusers"))
            _check_type(where, key, value, DIFFUSERS_KEYS[key])
            values[key] = value
        if values.get("qk_norm") is None:
            values["qk_norm"] = QK_NORM
        return cls(**values)

    def to_diffusers(self) -> dict[str, Any]:
        """config.json for diffusers' WanTransformer3DModel.from_pretrained."""
        out: dict[str, Any] = {"_class_name": DIFFUSERS_CLASS}
        for f in fields(self):
            if f.metadata.get("diffusers", True):
                value = getattr(self, f.name)
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    # ------------------------------------------------------------------ MindSpeed-MM

    @classmethod
    def from_mindspeed(cls, predictor: Mapping[str, Any], pipeline_model_parallel_size: int = 1,
                       where: str = "predictor", warn: Callable[[str], None] | None = None) -> "WanTransformerConfig":
        """From MindSpeed-MM's model.json `predictor` (model_id "wandit"); `where` names it in messages (e.g.
        "pretrain_model.json: predictor"). Unknown keys: one line naming them, to `warn` (default: a Python
        warning); a near miss of a key mmrun reads is an error (did you mean). `pipeline_num_layers` is honoured
        as MindSpeed-MM does: ignored with one pipeline stage (`--pipeline-model-parallel-size 1`, as its
        Wan2.1 scripts run it), refused with more (mmrun does not split the Wan DiT into stages)."""
        if not isinstance(predictor, Mapping):
            raise WanConfigError(f"{where} is a {type(predictor).__name__}, not an object; pass model.json's "
                                 "predictor section")
        unknown = []
        for key, value in predictor.items():
            if key in MINDSPEED_KEYS:
                _check_type(where, key, value, MINDSPEED_KEYS[key])
            elif key not in MINDSPEED_IGNORED:
                close = difflib.get_close_matches(key, MINDSPEED_KEYS, n=1, cutoff=0.8)
                if close and close[0] not in predictor:
                    raise WanConfigError(f"{where}: unknown key {key!r}; did you mean {close[0]}?")
                unknown.append(key)
        if unknown:
            message = f"{where}: mmrun's Wan DiT does not read {', '.join(map(repr, sorted(unknown)))}; ignored"
            (warn or (lambda line: warnings.warn(line, stacklevel=3)))(message)
        model_id = predictor.get("model_id", MODEL_ID)
        if model_id != MODEL_ID:
            raise WanConfigError(f"{where}.model_id is {model_id!r}; mmrun's video generation builds "
                                 f"{MODEL_ID!r} (Wan2.1) only")
        model_type = predictor.get("model_type", "t2v")
        if model_type not in MODEL_TYPES:
            raise WanConfigError(f"{where}.model_type is {model_type!r}; mmrun's Wan DiT builds "
                                 f"{', '.join(MODEL_TYPES)} (Wan2.1)")
        if predictor.get("qk_norm", True) is not True or predictor.get("qk_norm_type", "rmsnorm") != "rmsnorm":
            raise WanConfigError(f"{where}: qk_norm {predictor.get('qk_norm', True)!r} with qk_norm_type "
                                 f"{predictor.get('qk_norm_type', 'rmsnorm')!r}; Wan2.1 (and diffusers) normalise "
                                 "queries and keys with RMSNorm: set qk_norm true, qk_norm_type \"rmsnorm\"")
        check_pipeline(predictor.get("pipeline_num_layers"), pipeline_model_parallel_size, where)
        hidden, heads = predictor.get("hidden_size", 2048), predictor.get("num_heads", 16)
        if heads <= 0 or hidden % heads:
            raise WanConfigError(f"{where}: hidden_size {hidden} is not a multiple of num_heads {heads}; "
                                 "fix one of them")
        image = model_type in ("i2v", "flf2v")
        # MindSpeed-MM's WanDiT defaults, where the predictor leaves a key out.
        return cls(
            patch_size=tuple(predictor.get("patch_size", (1, 2, 2))), num_attention_heads=heads,
            attention_head_dim=hidden // heads, in_channels=predictor.get("in_dim", 16),
            out_channels=predictor.get("out_dim", 16), text_dim=predictor.get("text_dim", 4096),
            freq_dim=predictor.get("freq_dim", 256), ffn_dim=predictor.get("ffn_dim", 8192),
            num_layers=predictor.get("num_layers", 32), cross_attn_norm=predictor.get("cross_attn_norm", False),
            eps=predictor.get("eps", 1e-6), image_dim=predictor.get("img_dim", 1280) if image else None,
            added_kv_proj_dim=hidden if image else None, rope_max_seq_len=predictor.get("max_seq_len", 1024),
            pos_embed_seq_len=2 * predictor.get("clip_token_len", 257) if model_type == "flf2v" else None,
            text_len=predictor.get("text_len", 512))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_pipeline(pipeline_num_layers: Any, pipeline_model_parallel_size: int, where: str = "predictor") -> None:
    """MindSpeed-MM splits the DiT's blocks over pipeline stages only when the job has more than one
    (`--pipeline-model-parallel-size`); with one it ignores `pipeline_num_layers` (its Wan2.1 1.3B scripts
    carry [7, 8, 8, 7] with PP=1). mmrun does the same and refuses more than one stage."""
    if pipeline_model_parallel_size > 1:
        raise WanConfigError(f"pipeline parallelism of the Wan DiT is not supported (received "
                             f"--pipeline-model-parallel-size {pipeline_model_parallel_size}, {where}."
                             f"pipeline_num_layers {pipeline_num_layers}); run with "
                             "--pipeline-model-parallel-size 1 and data parallelism or FSDP2")


def _unknown(where: str, key: str, known: Mapping[str, Any], otherwise: str) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
    return f"{where}: unknown key {key!r}; " + (f"did you mean {close[0]}?" if close else otherwise)


def _check_type(where: str, key: str, value: Any, types: tuple[type, ...]) -> None:
    # bool is an int in Python: a count given as true/false is refused, a flag given as 0/1 too.
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise WanConfigError(f"{where}.{key} is {value!r} ({type(value).__name__}); expected {names}")


def _check(config: WanTransformerConfig) -> None:
    """One clear error for the first value the model cannot be built with."""
    def bad(key: str, rule: str) -> WanConfigError:
        return WanConfigError(f"Wan transformer config: {key} {getattr(config, key)!r} {rule}")

    for key in ("num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "text_dim", "freq_dim",
                "ffn_dim", "num_layers", "rope_max_seq_len", "text_len"):
        value = getattr(config, key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise bad(key, "must be a positive integer")
    for key in ("image_dim", "added_kv_proj_dim", "pos_embed_seq_len"):
        value = getattr(config, key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise bad(key, "must be a positive integer or null")
    if len(config.patch_size) != 3 or not all(isinstance(p, int) and not isinstance(p, bool) and p > 0
                                              for p in config.patch_size):
        raise bad("patch_size", "must be three positive integers (frames, height, width)")
    if config.attention_head_dim % 2:
        raise bad("attention_head_dim", "must be even (the rotary embedding turns pairs of channels)")
    if config.freq_dim % 2:
        raise bad("freq_dim", "must be even (cos and sin halves of the timestep embedding)")
    if not isinstance(config.eps, (int, float)) or isinstance(config.eps, bool) or not 0 < config.eps < 1:
        raise bad("eps", "must be a number between 0 and 1")
    if (config.image_dim is None) != (config.added_kv_proj_dim is None):
        raise bad("image_dim", f"with added_kv_proj_dim {config.added_kv_proj_dim!r}: image-to-video needs both "
                  "(Wan2.1 I2V: image_dim 1280, added_kv_proj_dim = the hidden size), text-to-video neither")
    if config.added_kv_proj_dim is not None and config.added_kv_proj_dim != config.inner_dim:
        raise bad("added_kv_proj_dim", f"must equal the hidden size {config.inner_dim} (heads x head dim): the "
                  "image tokens reach cross-attention at that width")
    if config.pos_embed_seq_len is not None and config.image_dim is None:
        raise bad("pos_embed_seq_len", "needs image_dim (it positions image tokens)")
    if config.qk_norm is not None and not isinstance(config.qk_norm, str):
        raise bad("qk_norm", f"must be a string ({QK_NORM!r})")
