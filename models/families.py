"""The model families mmrun builds, in one table: which family a Hugging Face `model_type` or a MindSpeed-MM
`model_id` belongs to, and where each of its parts lives.

A family folder (models/<family>/) holds its configuration, its modeling and its name tables, and imports no
other family (tests/test_layers.py). What several families share sits below them (models/vlm/ for the Qwen
vision-language families, models/transformer_blocks.py, checkpoint/formats/); where shared code, an engine, an
entry or the checkpoint room needs one family's part, it asks this table (`part`), which imports that module on
first use. A new family is one row here plus its folder.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Family:
    name: str                     # its folder: mmrun.models.<name>
    model_types: tuple[str, ...]  # config.json's model_type values it reads
    model_ids: tuple[str, ...]    # MindSpeed-MM's model_id values (model.json; the FSDP2 yaml's model_id)
    config_class: str             # in <name>.configuration
    model_class: str              # in <name>.modeling
    chat_template: str = ""       # the data template its prompts use (data/multimodal/templates)
    # role -> "module" or "module:attribute", relative to the family's package
    parts: Mapping[str, str] = field(default_factory=dict)
    # The family it is built on, whose public modules it may import (as transformers' modular Qwen2.5-Omni is
    # built on Qwen2.5-VL's classes); None for most. Nothing else crosses family folders (tests/test_layers.py).
    base: str | None = None

    @property
    def package(self) -> str:
        return f"mmrun.models.{self.name}"


# The parts a Qwen vision-language family provides to the shared code of models/vlm/.
_VLM_PARTS = {"configuration": "configuration", "modeling": "modeling", "hf_checkpoint": "hf_checkpoint",
              "mm_layout": "mm_layout", "model_json": "model_json",
              # (config, grid, patches) -> a fixed-shape batch's own inputs (pretrain_vlm.py fixed_shape_collate)
              "fixed_vision_inputs": "modeling:fixed_vision_inputs"}

FAMILIES: tuple[Family, ...] = (
    Family("qwen2_vl", ("qwen2_vl", "qwen2_5_vl"), ("qwen2vl", "qwen2_5vl"), "Qwen2VLConfig",
           "Qwen2VLForConditionalGeneration", "qwen2vl", {**_VLM_PARTS, "decoding": "generation:Qwen2VLDecoding"}),
    # Qwen2.5-Omni's thinker: Qwen2.5-VL's ViT and Qwen2 decoder plus an audio encoder. MindSpeed-MM's model.json
    # says model_id qwen2_5vl with an audio_encoder section: its model_json's `claims` picks it out first.
    Family("qwen2_5_omni", ("qwen2_5_omni_thinker", "qwen2_5_omni"), (), "OmniConfig",
           "Qwen2_5OmniThinkerForConditionalGeneration", "qwen2_omni",
           {"configuration": "configuration", "modeling": "modeling", "hf_checkpoint": "hf_checkpoint",
            "model_json": "model_json", "decoding": "generation:OmniDecoding", "mm_layout": "mm_layout"},
           base="qwen2_vl"),
    Family("qwen3_vl", ("qwen3_vl", "qwen3_vl_moe"), ("qwen3_vl", "qwen3vl"), "Qwen3VLConfig",
           "Qwen3VLForConditionalGeneration", "qwen3_vl_nothink", {**_VLM_PARTS, "decoding": "generation:Qwen3VLDecoding"}),
    # Wan2.1's DiT: diffusers names its class in config.json's _class_name; MindSpeed-MM's predictor model_id.
    Family("wan", ("WanTransformer3DModel",), ("wandit",), "WanTransformerConfig", "WanTransformer3DModel", "",
           {"configuration": "configuration", "modeling": "transformer"}),
)


class UnknownFamilyError(LookupError):
    """No family in FAMILIES answers to the model_type / model_id given."""


def _find(key: str, value: str | None) -> Family:
    for family in FAMILIES:
        if value in getattr(family, key):
            return family
    known = ", ".join(v for f in FAMILIES for v in getattr(f, key))
    raise UnknownFamilyError(f"{key[:-1]} {value!r} is not a family mmrun builds; known: {known}")


def by_model_type(model_type: str | None) -> Family:
    return _find("model_types", model_type)


def by_model_id(model_id: str | None) -> Family:
    return _find("model_ids", model_id)


def family_of(config: Any) -> Family:
    """The family of a config object (anything with a model_type: Qwen2VLConfig, Qwen3VLConfig, ...)."""
    return by_model_type(getattr(config, "model_type", None))


def part(family: Family | Any, role: str) -> Any:
    """The family's module (or module attribute) for `role`; `family` may be a Family or a config object."""
    if not isinstance(family, Family):
        family = family_of(family)
    if role not in family.parts:
        raise UnknownFamilyError(f"the {family.name} family has no {role!r} part; it has {', '.join(family.parts)}")
    module, _, attribute = family.parts[role].partition(":")
    loaded = importlib.import_module(f"{family.package}.{module}")
    return getattr(loaded, attribute) if attribute else loaded


def config_class(family: Family) -> Any:
    return getattr(part(family, "configuration"), family.config_class)


def by_model_json(raw: Mapping[str, Any]) -> Family:
    """The family of a MindSpeed-MM model.json dict: one whose model_json module `claims` it, else by model_id."""
    readers = [f for f in FAMILIES if "model_json" in f.parts]
    for family in readers:
        claims = getattr(part(family, "model_json"), "claims", None)
        if claims is not None and claims(raw):
            return family
    return by_model_id(raw.get("model_id") if isinstance(raw, Mapping) else None)


def vlm_families() -> tuple[Family, ...]:
    """The Qwen vision-language families (those that provide models/vlm/'s parts)."""
    return tuple(f for f in FAMILIES if "mm_layout" in f.parts)
