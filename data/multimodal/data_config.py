"""MindSpeed-MM's `data.json` `dataset_param`, checked: known keys with their types and defaults, as data.

Defaults are MindSpeed-MM's (`ProcessorArguments`, `DataArguments`, `DatasetAttr`: note that an omitted
`attr` key takes the ShareGPT default, e.g. `messages` -> "conversations"). Keys MindSpeed-MM reads that
mmrun has no use for are accepted; each has a reason below, and a warning names it only when its value
would change what MindSpeed-MM does. Unknown keys are named in a warning; a wrong type is an error.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from mmrun.data.gpt_dataset import DatasetConfigError

REQUIRED = object()
# section -> key -> (accepted types, default); None in the types means the key may be null.
SCHEMA: dict[str, dict[str, tuple[tuple, Any]]] = {
    "preprocess_parameters": {
        "model_name_or_path": ((str,), REQUIRED),
        "image_max_pixels": ((int,), 768 * 768),
        "image_min_pixels": ((int,), 32 * 32),
        "video_max_pixels": ((int,), 256 * 256),
        "video_min_pixels": ((int,), 16 * 16),
        "video_fps": ((int, float), 2.0),
        "video_maxlen": ((int,), 128),
        # Qwen2.5-Omni (template qwen2_omni): the audio rate the files are read at, and whether each <video> is
        # followed by an <audio> of its sound track, interleaved with it in 2-second chunks
        "audio_sampling_rate": ((int,), 16000),
        "use_audio_in_video": ((bool,), False),
    },
    "basic_parameters": {
        "template": ((str,), "qwen2vl"),
        "dataset_dir": ((str,), "data"),
        "dataset": ((str,), REQUIRED),
        "max_samples": ((int, None), None),
        "train_on_prompt": ((bool,), False),
        "mask_history": ((bool,), False),
    },
    "attr": {
        "images": ((str, None), None),
        "videos": ((str, None), None),
        "audios": ((str, None), None),
        "system": ((str, None), None),
        "messages": ((str,), "conversations"),
        "role_tag": ((str,), "from"),
        "content_tag": ((str,), "value"),
        "user_tag": ((str,), "human"),
        "assistant_tag": ((str,), "gpt"),
        "observation_tag": ((str, None), "observation"),
        "function_tag": ((str, None), "function_call"),
        "system_tag": ((str, None), "system"),
    },
}
# section -> key -> (values that change nothing, why mmrun does not use the key).
IGNORED: dict[str, dict[str, tuple[tuple, str]]] = {
    "": {
        "dataset_type": (("huggingface",), "mmrun reads the JSON files itself (no `datasets` library)"),
    },
    "preprocess_parameters": {
        "use_fast_tokenizer": ((True, False), "mmrun always uses tokenizer.json (the fast tokenizer)"),
        "split_special_tokens": ((False,), "special tokens are never split"),
        "image_resolution": ((), "unused by MindSpeed-MM's Qwen2-VL plugin (image_max_pixels applies)"),
        "video_resolution": ((), "unused by MindSpeed-MM's Qwen2-VL plugin (video_max_pixels applies)"),
    },
    "basic_parameters": {
        "cache_dir": ((), "nothing is cached: samples are decoded when they are read"),
        "overwrite_cache": ((), "nothing is cached"),
        "preprocessing_batch_size": ((), "samples are decoded one at a time when read"),
        "preprocessing_num_workers": ((), "use the data loader's worker processes instead"),
        "streaming": ((False, None), "samples are always read lazily; streaming's per-rank split is not done"),
        "preprocess_on_fly": ((), "samples are always processed when read"),
        "tool_format": ((None,), "tool calls are not supported by the qwen2vl template"),
        "val_dataset": ((None,), "mmrun builds no validation set from data.json yet"),
        "val_max_samples": ((None,), "mmrun builds no validation set from data.json yet"),
        "val_rate": ((None, 0, 0.0), "mmrun builds no validation set from data.json yet: all samples train"),
        "packing": ((None, False), "sequence packing is not implemented"),
        "neat_packing": ((False,), "sequence packing is not implemented"),
        "enable_thinking": ((True, None), "MindSpeed-MM's templates never read it (qwen2vl has no thinking mode; "
                                          "qwen3_vl always trains an empty thought before an answer without one)"),
    },
    "attr": {
        "formatting": (("sharegpt",), "only the ShareGPT (messages) layout is read"),
        "ranking": ((False,), "preference (ranking) data is not supported"),
        "chosen": ((None,), "preference (ranking) data is not supported"),
        "rejected": ((None,), "preference (ranking) data is not supported"),
    },
}


@dataclass(frozen=True)
class MultimodalDataConfig:
    """The checked `dataset_param`: one dict per section, every known key present."""

    preprocess: dict
    basic: dict
    attr: dict

    @property
    def dataset_files(self) -> list[str]:
        return [name for name in self.basic["dataset"].split(",") if name]


def _type_names(types: tuple) -> str:
    return " or ".join("null" if t is None else t.__name__ for t in types)


def _check_section(section: str, raw: Any, where: str) -> dict:
    path = f"{where}.{section}"
    if not isinstance(raw, dict):
        raise DatasetConfigError(f"{path} must be a JSON object. Received: {type(raw).__name__}; "
                                 "expected dict.")
    out = {}
    for key, (types, default) in SCHEMA[section].items():
        value = raw.get(key, default)
        if value is REQUIRED:
            raise DatasetConfigError(f"{path}.{key} is missing; it is required ({_type_names(types)}).")
        if value is None and None in types:
            out[key] = None
            continue
        real_types = tuple(t for t in types if t is not None)
        # bool is an int in Python; JSON true where a number is expected (or 1 for a flag) is a mistake.
        wrong = isinstance(value, bool) != (bool in real_types) or not isinstance(value, real_types)
        if wrong:
            raise DatasetConfigError(f"{path}.{key} has the wrong type. Received: {type(value).__name__} {value!r}; "
                                     f"expected {_type_names(types)}.")
        out[key] = value
    _warn_extra(section, raw, path)
    return out


def _warn_extra(section: str, raw: dict, path: str) -> None:
    known = SCHEMA.get(section, {})
    ignored = IGNORED.get(section, {})
    unknown = sorted(k for k in raw if k not in known and k not in ignored)
    if unknown:
        warnings.warn(f"{path}: unknown keys {', '.join(unknown)} are ignored; check their spelling "
                      "(MindSpeed-MM's data.json schema).", stacklevel=4)
    for key in sorted(k for k in raw if k in ignored):
        harmless, reason = ignored[key]
        if harmless and raw[key] not in harmless:
            warnings.warn(f"{path}.{key}={raw[key]!r} is ignored: {reason}.", stacklevel=4)


def parse_dataset_param(dataset_param: Any, where: str = "dataset_param") -> MultimodalDataConfig:
    """Check a data.json `dataset_param` dict; raises DatasetConfigError (one line) or warns as described above."""
    if not isinstance(dataset_param, dict):
        raise DatasetConfigError(f"{where} must be a JSON object. Received: {type(dataset_param).__name__}; "
                                 "expected dict.")
    basic = dataset_param.get("basic_parameters")
    if isinstance(basic, dict) and "cutoff_len" in basic:
        raise DatasetConfigError(f"{where}.basic_parameters.cutoff_len is deprecated (MindSpeed-MM); remove it and "
                                 "pass --seq-length.")
    missing = [name for name in ("preprocess_parameters", "basic_parameters") if name not in dataset_param]
    if missing:
        raise DatasetConfigError(f"{where}.{missing[0]} is missing; MindSpeed-MM's data.json needs "
                                 "preprocess_parameters and basic_parameters (attr is optional).")
    from mmrun.features.mindspeed_keys import check_values  # what features/mindspeed_mm_keys.yaml refuses (audio)

    refused = check_values("vlm_data", {"dataset_param": dataset_param}, "")
    if refused:
        raise DatasetConfigError(refused[0])
    sections = {name: _check_section(name, dataset_param.get(name, {}), where) for name in SCHEMA}
    top = {k: v for k, v in dataset_param.items() if k not in SCHEMA}
    _warn_extra("", top, where)
    config = MultimodalDataConfig(preprocess=sections["preprocess_parameters"],
                                  basic=sections["basic_parameters"], attr=sections["attr"])
    if not config.dataset_files:
        raise DatasetConfigError(f"{where}.basic_parameters.dataset names no file. Received: "
                                 f"{config.basic['dataset']!r}; expected comma-separated JSON paths.")
    if config.basic["max_samples"] is not None and config.basic["max_samples"] <= 0:
        raise DatasetConfigError(f"{where}.basic_parameters.max_samples must be positive or null. Received: "
                                 f"{config.basic['max_samples']}.")
    return config
