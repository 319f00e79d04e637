"""MindSpeed-MM's model.json (`--mm-model`) for Qwen3-VL (dense), read as it is written.

MindSpeed-MM's MindSpore twin of the Qwen3-VL job (examples/mindspore/qwen3vl/model_8B.json) carries
`model_id` "qwen3_vl", a `text_decoder` "qwen3_lm" (kv_channels, rope_scaling with mrope_interleaved,
qk_layernorm) and a "qwen3vit" vision encoder (deepstack_visual_indexes, max_position_embeddings = the
learned position table). Checked key by key as Qwen2-VL's model.json is (models/qwen2_vl/model_json.py: an
unknown key is one warning, a wrong type an error naming it); the result is a ModelJson whose `hf_config`
is a Qwen3-VL config.json (`configuration.Qwen3VLConfig.from_hf_config` reads it). A MoE text decoder
(num_moe_experts, Qwen3-VL-30B-A3B's model_30B.json) gives the MoE variant's config.json (model_type qwen3_vl_moe,
MOE_KEYS renamed to transformers' names); Megatron's moe_aux_loss_coeff > 0 switches on transformers' load-balancing
loss with that coefficient (aux_loss_switch; off where the json leaves it out, as MindSpeed-MM's model_30B.json does).
"""
from __future__ import annotations

import json
import math
from typing import Any, Mapping

from mmrun.backend.errors import UsageError
from mmrun.models.vlm.model_json import (DEFAULT_TOKEN_IDS, SCHEMA, ModelJson, check_section, read_pipeline_layers,
                                         recompute_sections, refuse_from_key_table, require)
from mmrun.models.qwen3_vl.configuration import MODEL_TYPE, MOE_MODEL_TYPE

MODEL_IDS = ("qwen3_vl",)
# The shared table with the keys Qwen3-VL's model.json adds (MoE keys are listed so that the refusal, not an
# "unknown key" warning, answers them).
SCHEMA3: dict[str, dict[str, tuple[type, ...]]] = {
    **SCHEMA,
    "vision_encoder": {**SCHEMA["vision_encoder"], "deepstack_visual_indexes": (list,),
                       "max_position_embeddings": (int,), "add_bias_conv": (bool,), "bias_activation_fusion": (bool,)},
    "vision_projector": {**SCHEMA["vision_projector"], "use_postshuffle_norm": (bool,)},
    "text_decoder": {**SCHEMA["text_decoder"], "qk_layernorm": (bool,), "use_qk_norm": (bool,),
                     "moe_grouped_gemm": (bool,), "sequence_parallel": (bool,), "use_te": (bool,),
                     "num_moe_experts": (int, type(None)), "moe_router_topk": (int,), "moe_intermediate_size": (int,),
                     "norm_topk_prob": (bool,), "router_gating_in_fp32": (bool,),
                     "moe_aux_loss_coeff": (int, float)},
}
# MindSpeed-MM's MoE keys (model_30B.json) -> transformers' Qwen3VLMoeTextConfig names (configuration.MoeConfig)
MOE_KEYS = {"num_moe_experts": "num_experts", "moe_router_topk": "num_experts_per_tok",
            "moe_intermediate_size": "moe_intermediate_size", "norm_topk_prob": "norm_topk_prob",
            "router_gating_in_fp32": "router_gating_in_fp32"}


def aux_loss_switch(path: str, coeff: Any) -> dict:
    """Megatron's moe_aux_loss_coeff -> transformers' text_config keys: > 0 switches on the load-balancing loss
    (output_router_logits, router_aux_loss_coef = coeff: transformers' load_balancing_loss_func over every sparse
    layer, models/qwen3_vl/moe.py); 0 or absent (MindSpeed-MM's model_30B.json) leaves it off. Negative or not a
    finite number: one line (UsageError)."""
    if coeff is None:
        return {"output_router_logits": False}
    if isinstance(coeff, bool) or not isinstance(coeff, (int, float)) or not math.isfinite(coeff) or coeff < 0:
        raise UsageError(f"{path}: text_decoder.moe_aux_loss_coeff must be a number >= 0 (0 or absent: no "
                         f"load-balancing loss). Received: {json.dumps(coeff)}")
    return {"output_router_logits": coeff > 0, "router_aux_loss_coef": float(coeff)} if coeff else \
        {"output_router_logits": False}


def is_qwen3_model_json(raw: Any) -> bool:
    return isinstance(raw, Mapping) and raw.get("model_id") in MODEL_IDS


def parse_model_json(raw: Mapping[str, Any], path: str = "model.json") -> ModelJson:
    """A Qwen3-VL model.json dict -> ModelJson; one-line UsageError (exit 2) on a wrong type, a missing section
    or what mmrun does not build (a decoder without QK-norm, a non-interleaved M-RoPE)."""
    warnings: list[str] = []
    check_section(path, "top", raw, "the top level", warnings, SCHEMA3)
    require(path, raw, "the top level", ("image_encoder", "text_decoder"))
    image_encoder, text = raw["image_encoder"], raw["text_decoder"]
    check_section(path, "image_encoder", image_encoder, "image_encoder", warnings, SCHEMA3)
    require(path, image_encoder, "image_encoder", ("vision_encoder", "vision_projector"))
    enc, proj = image_encoder["vision_encoder"], image_encoder["vision_projector"]
    for section, values, where in (("vision_encoder", enc, "image_encoder.vision_encoder"),
                                   ("vision_projector", proj, "image_encoder.vision_projector"),
                                   ("text_decoder", text, "text_decoder")):
        check_section(path, section, values, where, warnings, SCHEMA3)
    refuse_from_key_table(path, raw)
    if text.get("qk_layernorm") is False:
        raise UsageError(f"{path}: text_decoder.qk_layernorm is false, but Qwen3-VL's decoder normalises q and k "
                         "per head; set it true (or leave it out)")
    require(path, text, "text_decoder", ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"))
    require(path, enc, "image_encoder.vision_encoder", ("num_layers", "hidden_size", "num_attention_heads"))
    rope = text.get("rope_scaling") or {}
    if rope.get("mrope_interleaved") is False:
        raise UsageError(f"{path}: text_decoder.rope_scaling.mrope_interleaved is false; Qwen3-VL's M-RoPE is "
                         "interleaved: set it true (or leave it out)")
    heads = text["num_attention_heads"]
    head_dim = text.get("kv_channels") or text["hidden_size"] // heads
    mrope = text.get("mrope_section") or rope.get("mrope_section") or [24, 20, 20]
    if len(mrope) != 3 or sum(mrope) * 2 != head_dim:
        raise UsageError(f"{path}: text_decoder mrope_section {mrope} must be three numbers summing to head_dim / 2 "
                         f"= {head_dim // 2} (kv_channels {head_dim})")
    out_hidden = proj.get("hidden_size", enc.get("llm_hidden_size", text["hidden_size"]))
    if out_hidden != text["hidden_size"]:
        raise UsageError(f"{path}: image_encoder.vision_projector.hidden_size ({out_hidden}) must equal "
                         f"text_decoder.hidden_size ({text['hidden_size']}): the projector feeds the text decoder")
    ids = {key: raw.get(key, default) for key, default in DEFAULT_TOKEN_IDS.items()}
    ids["image_token_id"] = raw.get("img_context_token_id", raw.get("image_token_id", ids["image_token_id"]))
    untied = text.get("untie_embeddings_and_output_weights", False)
    text_config = {
        "hidden_size": text["hidden_size"], "intermediate_size": text.get("ffn_hidden_size", 4 * text["hidden_size"]),
        "num_hidden_layers": text["num_layers"], "num_attention_heads": heads,
        "num_key_value_heads": text.get("num_query_groups", heads) if text.get("group_query_attention") else heads,
        "head_dim": head_dim, "hidden_act": text.get("activation_func", "silu"),
        "max_position_embeddings": text.get("max_position_embeddings", 262144),
        "rms_norm_eps": text.get("layernorm_epsilon", 1e-6), "vocab_size": text["vocab_size"],
        "attention_bias": bool(text.get("add_qkv_bias", False)),
        "attention_dropout": text.get("attention_dropout", 0.0),
        "rope_parameters": {"rope_type": "default", "rope_theta": text.get("rope_theta", 5000000.0),
                            "mrope_section": list(mrope), "mrope_interleaved": True},
    }
    vision_config = {
        "depth": enc["num_layers"], "hidden_size": enc["hidden_size"], "num_heads": enc["num_attention_heads"],
        "intermediate_size": enc.get("intermediate_size", enc.get("ffn_hidden_size", 4 * enc["hidden_size"])),
        "out_hidden_size": out_hidden, "hidden_act": enc.get("activation_func", "gelu_pytorch_tanh"),
        "in_channels": enc.get("in_channels", 3), "patch_size": enc.get("patch_size", 16),
        "spatial_merge_size": enc.get("spatial_merge_size", 2),
        "temporal_patch_size": enc.get("temporal_patch_size", 2),
        "num_position_embeddings": enc.get("max_position_embeddings", 2304),
        "deepstack_visual_indexes": list(enc.get("deepstack_visual_indexes", [8, 16, 24])),
    }
    model_type = MODEL_TYPE
    if text.get("num_moe_experts"):  # Qwen3-VL-30B-A3B / 235B-A22B: every decoder layer sparse, as transformers'
        model_type = MOE_MODEL_TYPE
        text_config.update({name: text[key] for key, name in MOE_KEYS.items() if key in text})
        text_config.setdefault("num_experts_per_tok", 2)  # Megatron's moe_router_topk default
        text_config.setdefault("moe_intermediate_size", text_config["intermediate_size"])  # Megatron: ffn_hidden_size
        text_config.setdefault("router_gating_in_fp32", False)
        text_config.update(aux_loss_switch(path, text.get("moe_aux_loss_coeff")))
    elif text.get("moe_aux_loss_coeff") is not None:
        aux_loss_switch(path, text["moe_aux_loss_coeff"])  # a bad value is refused all the same
        warnings.append(f"{path}: text_decoder.moe_aux_loss_coeff has no effect without num_moe_experts (a dense "
                        "decoder has no router)")
    architecture = "Qwen3VLMoeForConditionalGeneration" if model_type == MOE_MODEL_TYPE else "Qwen3VLForConditionalGeneration"
    hf_config = {"model_type": model_type, "architectures": [architecture], **ids,
                 "tie_word_embeddings": not untied, "text_config": text_config, "vision_config": vision_config}
    try:  # the model's own checks (shapes, activations, DeepStack indexes), as one line naming the file
        from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig
        Qwen3VLConfig.from_hf_config(hf_config)
    except ValueError as error:
        raise UsageError(f"{path}: {error}") from None
    freeze = {"vision_encoder": enc.get("freeze", True), "vision_projector": proj.get("freeze", False),
              "text_decoder": text.get("freeze", False)}
    sizes = {"num_layers": text["num_layers"], "hidden_size": text["hidden_size"],
             "ffn_hidden_size": text_config["intermediate_size"], "num_attention_heads": heads,
             "max_position_embeddings": text_config["max_position_embeddings"], "vocab_size": text["vocab_size"],
             "normalization": "RMSNorm", "position_embedding_type": "mrope",
             "untie_embeddings_and_output_weights": untied, "make_vocab_size_divisible_by": 1}
    pipeline_layers = {part: read_pipeline_layers(path, where, section) for part, where, section in
                       (("vit", "image_encoder.vision_encoder", enc), ("llm", "text_decoder", text))}
    return ModelJson(path=path, hf_config=hf_config, freeze=freeze, sizes=sizes, warnings=warnings,
                     pipeline_layers=pipeline_layers, recompute=recompute_sections(enc, text))


# Frameworks whose parallel engine builds Qwen3-VL split over tensor/pipeline ranks (PyTorch: megatron-core's).
SPLIT_FRAMEWORKS = ("mindspore", "pytorch")
# ... and the MoE variant, experts over TP x EP (PyTorch: megatron-core's MoELayer,
# engines/torch/megatron_core/qwen3_vl_moe.py; MindSpore: engines/mindspore/parallel/qwen3_moe.py)
MOE_SPLIT_FRAMEWORKS = ("mindspore", "pytorch")


def check_split(spec: ModelJson, framework: str, split: bool) -> None:
    """An unsplit run needs model.json's pipeline_num_layers to say one stage (one line otherwise); a split run needs
    a framework whose parallel engine builds Qwen3-VL (the MoE variant: MOE_SPLIT_FRAMEWORKS)."""
    if split and spec.hf_config["model_type"] == MOE_MODEL_TYPE and framework not in MOE_SPLIT_FRAMEWORKS:
        raise UsageError(f"{spec.path}: Qwen3-VL MoE (num_moe_experts) split over tensor/pipeline ranks is built on "
                         f"--ai-framework {' or '.join(MOE_SPLIT_FRAMEWORKS)} only. Received: --ai-framework "
                         f"{framework} with a --tensor-/--pipeline-model-parallel-size above 1; train it there, or "
                         "with both at 1 (data parallel, --expert-model-parallel-size as you like)")
    if split and spec.hf_config["text_config"].get("output_router_logits"):
        raise UsageError(f"{spec.path}: text_decoder.moe_aux_loss_coeff "
                         f"{spec.hf_config['text_config'].get('router_aux_loss_coef')}: the load-balancing loss is built "
                         "on the data-parallel engine only (the split engines have no aux loss). Received: a "
                         "--tensor-/--pipeline-model-parallel-size above 1; set moe_aux_loss_coeff 0 or leave it out, "
                         "or train unsplit")
    if split and framework not in SPLIT_FRAMEWORKS:
        raise UsageError(f"tensor/pipeline parallelism of Qwen3-VL is built on --ai-framework "
                         f"{' or '.join(SPLIT_FRAMEWORKS)} only. Received: --ai-framework {framework} with a split; "
                         "train it on one of those, or unsplit (data parallelism)")
    if split:
        return
    for part, where in (("vit", "image_encoder.vision_encoder"), ("llm", "text_decoder")):
        layers = spec.pipeline_layers.get(part)
        if layers is not None and len(layers) != 1:
            raise UsageError(f"{spec.path}: {where}.pipeline_num_layers {json.dumps(layers)} splits Qwen3-VL over "
                             f"{len(layers)} pipeline stages, but the run has one (no --pipeline-model-parallel-size);"
                             f" pass --pipeline-model-parallel-size {len(layers)}, or give one entry holding every "
                             "layer")


# Megatron's MoE flags that only change speed (finetune_qwen3vl_30B.sh passes them): run without, said once.
MOE_SPEED_FLAGS = ("--moe-grouped-gemm", "--moe-permutation-async-comm")
# --moe-token-dispatcher-type values mmrun takes for Qwen3-VL MoE (Megatron's): both give the same numbers; with
# expert parallelism the tokens travel as the allgather dispatcher sends them (the backends here have no
# all-to-all that autograd runs through: MindSpore's CPU collectives have none, gloo none of torch's)
DISPATCHERS = ("alltoall", "allgather")


def _flag_value(argv: list[str], flag: str) -> str | None:
    names = {flag, "--" + flag[2:].replace("-", "_")}
    for i, token in enumerate(argv):
        name, _, value = token.partition("=")
        if name in names:
            return value if value else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def check_experts(spec: ModelJson, expert_parallel: str | None, argv: list[str], world_size: int = 1,
                  megatron_core: bool = False) -> list[str]:
    """--expert-model-parallel-size against model.json's experts and the world size, --moe-token-dispatcher-type
    (one-line UsageError), and the notices for argv's speed-only MoE flags and the dispatcher (returned, one line
    each); `megatron_core`: the run is split on megatron-core, whose MoELayer dispatches as the flag says."""
    text = spec.hf_config["text_config"]
    experts = text.get("num_experts") if spec.hf_config["model_type"] == MOE_MODEL_TYPE else None
    if expert_parallel is not None and not expert_parallel.lstrip("-").isdigit():
        return []  # not a number: the training arguments' parser says so
    ep = 1 if expert_parallel is None else int(expert_parallel)
    if experts is not None and (ep < 1 or experts % ep):
        raise UsageError(f"--expert-model-parallel-size {ep} does not divide {spec.path}'s num_moe_experts {experts}; "
                         "pass a divisor of the experts (each rank holds num_moe_experts / EP of them)")
    if experts is not None and world_size % ep:
        raise UsageError(f"--expert-model-parallel-size {ep} does not divide the world size {world_size}: the ranks "
                         "form expert-parallel groups of EP ranks; start a multiple of EP processes, or pass a divisor "
                         f"of {world_size}")
    notices = []
    dispatcher = _flag_value(argv, "--moe-token-dispatcher-type")
    if experts is not None and dispatcher is not None and dispatcher not in DISPATCHERS:
        raise UsageError(f"--moe-token-dispatcher-type {dispatcher}: mmrun's Qwen3-VL MoE dispatches tokens as "
                         f"Megatron's {' or '.join(DISPATCHERS)}; pass one of those")
    if megatron_core and experts is not None:
        given = [flag for flag in MOE_SPEED_FLAGS if {flag, "--" + flag[2:].replace("-", "_")} & {
            token.split("=")[0] for token in argv}]
        return notices + ([f"{', '.join(given)}: speed flags of Megatron's MoE layer; megatron-core's SequentialMLP "
                           "and unfused permutation run here (GroupedMLP needs the grouped_gemm kernels; the same "
                           "numbers)"] if given else [])
    if experts is not None and ep > 1 and dispatcher in (None, "alltoall"):
        notices.append(f"--expert-model-parallel-size {ep}: tokens are dispatched over the expert-parallel group as "
                       "Megatron's allgather dispatcher does (all-gather, local experts, reduce-scatter: the same "
                       "numbers as alltoall, whose all-to-all exchange mmrun does not build)")
    tokens = {token.split("=")[0] for token in argv}
    given = [flag for flag in MOE_SPEED_FLAGS if {flag, "--" + flag[2:].replace("-", "_")} & tokens]
    if experts is None or not given:
        return notices
    return notices + [f"{', '.join(given)}: speed flags of Megatron's MoE layer; mmrun's Qwen3-VL MoE runs each "
                      "expert on its gathered tokens instead (the same numbers)"]


def expert_groups(world_size: int, ep: int) -> tuple[list[list[int]], list[list[int]]]:
    """(expert-parallel groups, expert-data-parallel groups) of the world in megatron-core's rank order (tp-cp-ep-dp
    -pp, tensor and context parallel sizes 1 here): EP adjacent ranks share the experts out; the ranks r, r + EP,
    ... hold the same experts."""
    return ([list(range(start, start + ep)) for start in range(0, world_size, ep)],
            [list(range(first, world_size, ep)) for first in range(ep)])
