"""MindSpeed-MM's model.json (`--mm-model`) for the Qwen vision-language families: what their readers share.

Each family reads its own file (models/<family>/model_json.py: `parse_model_json(raw, path)` -> ModelJson);
`read_model_json` reads a file of any of them, picking the family by the file's model_id in the family table
(models/families.py). Keys are checked against a schema (one table: where each key may appear and the type it
must have, SCHEMA here for every family, extended by a family that has more): an unknown key is named in one
warning (MindSpeed-MM ignores what its model does not read, and a typo should not pass unseen), a wrong type is an
error naming the key, what was received and what is expected.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from mmrun.backend.errors import UsageError

NUMBER = (int, float)
OPTIONAL_LIST = (list, type(None))

# section -> key -> accepted Python types. Keys MindSpeed-MM's examples carry that change nothing in mmrun
# (dtype switches: the launch script's --bf16/--fp16 decide; fusion switches: the feature gate judges the
# flags; pipeline/recompute: checked below) are listed so that they are not reported as unknown.
SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "top": {
        "model_id": (str,), "img_context_token_id": (int,), "video_token_id": (int,),
        "vision_start_token_id": (int,), "vision_end_token_id": (int,), "image_token_id": (int,),
        "image_encoder": (dict,), "text_decoder": (dict,), "text_encoder": (dict, type(None)),
        "video_encoder": (dict, type(None)), "audio_encoder": (dict, type(None)), "patch": (dict,),
        "loss_type": (str, type(None)),
    },
    "image_encoder": {"vision_encoder": (dict,), "vision_projector": (dict,)},
    "vision_encoder": {
        "model_id": (str,), "num_layers": (int,), "hidden_size": (int,), "ffn_hidden_size": (int,),
        "llm_hidden_size": (int,), "gated_linear_unit": (bool,), "num_attention_heads": (int,),
        "hidden_dropout": NUMBER, "attention_dropout": NUMBER, "in_channels": (int,), "patch_size": (int,),
        "spatial_merge_size": (int,), "temporal_patch_size": (int,), "layernorm_epsilon": NUMBER,
        "normalization": (str,), "activation_func": (str,), "freeze": (bool,), "post_layer_norm": (bool,),
        "pipeline_num_layers": (list,), "intermediate_size": (int,), "tokens_per_second": NUMBER,
        "window_attn_size": (int,), "fullatt_block_indexes": (list,), "attention_mask_type": (str,),
        "fp16": (bool,), "bf16": (bool,), "params_dtype": (str,), "use_fused_rotary_pos_emb": (bool,),
        "recompute_granularity": (str, type(None)), "recompute_method": (str, type(None)),
        "recompute_num_layers": (int, type(None)), "canonical_model": (bool,), "add_qkv_bias": (bool,),
        "add_bias_linear": (bool,), "init_method_std": NUMBER, "rope_theta": NUMBER,
    },
    "vision_projector": {
        "model_id": (str,), "num_layers": (int,), "gated_linear_unit": (bool,), "bias_activation_fusion": (bool,),
        "add_bias_linear": (bool,), "input_size": (int,), "hidden_size": (int,), "ffn_hidden_size": (int,),
        "activation_func": (str,), "bf16": (bool,), "fp16": (bool,), "params_dtype": (str,), "freeze": (bool,),
        "layernorm_epsilon": NUMBER, "normalization": (str,),
    },
    "text_decoder": {
        "model_id": (str,), "num_layers": (int,), "pipeline_num_layers": (list,), "hidden_size": (int,),
        "ffn_hidden_size": (int,), "num_attention_heads": (int,), "seq_length": (int,),
        "max_position_embeddings": (int,), "vocab_size": (int,), "rope_theta": NUMBER,
        "untie_embeddings_and_output_weights": (bool,), "disable_bias_linear": (bool,),
        "attention_dropout": NUMBER, "init_method_std": NUMBER, "hidden_dropout": NUMBER,
        "position_embedding_type": (str,), "normalization": (str,), "activation_func": (str,),
        "use_fused_rotary_pos_emb": (bool,), "attention_softmax_in_fp32": (bool,), "params_dtype": (str,),
        "bf16": (bool,), "fp16": (bool,), "parallel_output": (bool,), "group_query_attention": (bool,),
        "num_query_groups": (int,), "mrope_section": (list,), "rope_scaling": (dict, type(None)),
        "gated_linear_unit": (bool,), "layernorm_epsilon": NUMBER, "add_bias_linear": (bool,),
        "add_qkv_bias": (bool,), "use_remove_padding": (bool,), "freeze": (bool,), "canonical_model": (bool,),
        "kv_channels": (int, type(None)), "recompute_granularity": (str, type(None)),
        "recompute_method": (str, type(None)), "recompute_num_layers": (int, type(None)),
        # MindSpeed-MM's inference / evaluation json (inference_qwen2_5_vl_7b.json)
        "is_encoder_decoder": (bool,), "sequence_parallel": (bool,), "tokenizer_type": (str,), "use_infer_fa": (bool,),
    },
}

# Token ids of Qwen2-VL's tokenizer, used where model.json leaves them out (as MindSpeed-MM's code does).
DEFAULT_TOKEN_IDS = {"vision_start_token_id": 151652, "vision_end_token_id": 151653,
                     "image_token_id": 151655, "video_token_id": 151656}


@dataclass
class ModelJson:
    """What model.json says: the HF config, the freeze switches, the sizes for the training arguments."""

    path: str
    hf_config: dict[str, Any]
    freeze: dict[str, bool]
    sizes: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    # {"vit": [...], "llm": [...]}: pipeline_num_layers per module (one count per stage, or one such list per
    # virtual pipeline chunk), None where absent
    pipeline_layers: dict[str, list[Any] | None] = field(default_factory=dict)
    # {"vision_encoder": {...}, "text_decoder": {...}}: each section's recompute_* keys (models/recompute.py)
    recompute: dict[str, dict[str, Any]] = field(default_factory=dict)


def check_section(path: str, section: str, values: Mapping[str, Any], where: str, warnings: list[str],
                   schemas: Mapping[str, Mapping[str, tuple[type, ...]]] = SCHEMA) -> None:
    schema = schemas[section]
    unknown = sorted(key for key in set(values) - set(schema) if not _in_key_table(where, key))
    if unknown:
        warnings.append(f"{path}: unknown key(s) in {where}: {', '.join(unknown)} (mmrun does not read them)")
    for key, value in values.items():
        allowed = schema.get(key)
        # bool is an int in Python: a true/false where a number is expected is a mistake, not a number.
        wrong = allowed is not None and (not isinstance(value, allowed)
                                         or (isinstance(value, bool) and bool not in allowed))
        if wrong:
            names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            raise UsageError(f"{path}: {where}.{key} must be {names}. Received: {json.dumps(value)}")


def _in_key_table(where: str, key: str) -> bool:
    """Whether features/mindspeed_mm_keys.yaml says what mmrun does with `key` of section `where` (then it is no
    unknown key: docs/mindspeed-mm-keys.md gives the reason it has no effect)."""
    from mmrun.features.mindspeed_keys import load_key_table

    path = key if where == "the top level" else f"{where}.{key}"
    return any(load_key_table().entry(kind, path) is not None for kind in ("vlm_model", "vlm_infer"))


def refuse_from_key_table(path: str, raw: Mapping[str, Any]) -> None:
    """The values features/mindspeed_mm_keys.yaml refuses (an audio encoder, a MoE decoder, a key that describes
    another architecture than model_id's family): one line, exit 2."""
    from mmrun.features.mindspeed_keys import check_values, fixed_refusals

    refused = check_values("vlm_model", raw, path) + fixed_refusals("vlm_model", raw, str(raw.get("model_id")), path)
    if refused:
        raise UsageError(refused[0])


def recompute_sections(vision: Mapping[str, Any], text: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """MindSpeed-MM's per-module recompute keys, by the module names the models' `recompute_layers` use."""
    return {name: {k: v for k, v in section.items() if k.startswith("recompute_")}
            for name, section in (("vision_encoder", vision), ("text_decoder", text))}


def require(path: str, values: Mapping[str, Any], where: str, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in values]
    if missing:
        raise UsageError(f"{path}: {where} needs {', '.join(missing)}. Received keys: {', '.join(sorted(values))}")


def read_pipeline_layers(path: str, where: str, section: Mapping[str, Any]) -> list[Any] | None:
    """pipeline_num_layers: one layer count per pipeline stage, or (virtual pipeline stages) one such list per
    virtual chunk, as MindSpeed-MM writes them; None when absent. Lengths and sums are checked against the run's
    --pipeline-model-parallel-size / --virtual-pipeline-model-parallel-size by the parallel layout
    (models/vlm/mm_layout.py) once the arguments are known; here only the form."""
    layers = section.get("pipeline_num_layers")
    if layers is None:
        return None

    def counts(values: Any) -> bool:
        return isinstance(values, list) and bool(values) and all(
            isinstance(n, int) and not isinstance(n, bool) for n in values)

    if not (counts(layers) or (isinstance(layers, list) and layers and all(counts(chunk) for chunk in layers))):
        raise UsageError(f"{path}: {where}.pipeline_num_layers must be a list of layer counts, one per pipeline "
                          "stage, or one such list per virtual pipeline chunk ([[2, 0], [0, 0]]). Received: "
                          f"{json.dumps(layers)}")
    return [list(chunk) if isinstance(chunk, list) else chunk for chunk in layers]


def parse_model_json(raw: Mapping[str, Any], path: str = "model.json") -> ModelJson:
    """A model.json dict of any Qwen vision-language family -> ModelJson, read by its family's reader (the family
    table's by_model_json: a family that claims the file, else the top-level model_id)."""
    from mmrun.models import families

    model_id = raw.get("model_id") if isinstance(raw, Mapping) else None
    try:
        family = families.by_model_json(raw)
    except families.UnknownFamilyError:
        known = ", ".join(i for f in families.vlm_families() for i in f.model_ids)
        raise UsageError(f"{path}: model_id {model_id!r} is not a vision-language model mmrun builds; use one of "
                         f"{known}") from None
    return families.part(family, "model_json").parse_model_json(raw, path)


def read_model_json(path: str | Path, warn: Callable[[str], None] | None = None) -> ModelJson:
    """Read and check a model.json file; warnings go to `warn` (one line each)."""
    text = _read_text(path, "--mm-model")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
                          "fix the file") from None
    spec = parse_model_json(raw, str(path))
    for line in spec.warnings:
        (warn or (lambda message: None))(line)
    return spec


def _read_text(path: str | Path, flag: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{flag} {path}: no such file; pass the path of MindSpeed-MM's model.json")
    return p.read_text(encoding="utf-8")
