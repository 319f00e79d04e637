"""MindSpeed-MM's Qwen3-VL-30B-A3B MindSpore job (Ascend/MindSpeed-MM, Apache-2.0, commit
57069cd55a8ab16d5affe379a2e2c5f0a4d962b9): examples/mindspore/qwen3vl/model_30B.json as it is (MODEL_30B) and the
MoE flags of examples/mindspore/qwen3vl/finetune_qwen3vl_30B.sh (MOE_ARGS); `tiny_model_json` keeps every key and
shrinks only the sizes (and the token ids to the offline demo tokenizer's)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

MODEL_30B = {
    "model_id": "qwen3_vl", "img_context_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "text_decoder": {
        "model_id": "qwen3_lm", "add_qkv_bias": False, "hidden_dropout": 0.0, "params_dtype": "bf16", "bf16": True,
        "kv_channels": 128, "activation_func": "silu", "hidden_size": 2048, "init_method_std": 0.01,
        "max_position_embeddings": 262144, "moe_intermediate_size": 768, "norm_topk_prob": True,
        "num_attention_heads": 32, "num_moe_experts": 128, "moe_router_topk": 8, "num_layers": 48,
        "num_query_groups": 4, "layernorm_epsilon": 1e-06,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 5000000, "vocab_size": 151936, "pipeline_num_layers": [6, 14, 14, 14], "ffn_hidden_size": 1024,
        "seq_length": 1024, "untie_embeddings_and_output_weights": True, "disable_bias_linear": True,
        "attention_dropout": 0.0, "position_embedding_type": "mrope", "normalization": "RMSNorm",
        "use_fused_rotary_pos_emb": True, "attention_softmax_in_fp32": True, "parallel_output": True,
        "group_query_attention": True, "moe_grouped_gemm": False, "router_gating_in_fp32": True,
        "gated_linear_unit": True, "add_bias_linear": False, "use_remove_padding": False, "use_qk_norm": True,
        "qk_layernorm": True, "sequence_parallel": True, "recompute_granularity": "full", "recompute_method": "block",
        "recompute_num_layers": 4, "use_te": False},
    "image_encoder": {
        "vision_encoder": {
            "model_id": "qwen3vit", "deepstack_visual_indexes": [8, 16, 24], "num_layers": 27,
            "activation_func": "gelu_pytorch_tanh", "hidden_size": 1152, "in_channels": 3, "ffn_hidden_size": 4304,
            "num_attention_heads": 16, "max_position_embeddings": 2304, "llm_hidden_size": 2048, "patch_size": 16,
            "spatial_merge_size": 2, "temporal_patch_size": 2, "add_bias_linear": True, "add_bias_conv": True,
            "gated_linear_unit": False, "bias_activation_fusion": False, "hidden_dropout": 0.0,
            "attention_dropout": 0.0, "layernorm_epsilon": 1e-06, "normalization": "LayerNorm", "fp16": False,
            "bf16": True, "params_dtype": "bf16", "freeze": True, "use_fused_rotary_pos_emb": True,
            "post_layer_norm": False, "pipeline_num_layers": [27, 0, 0, 0], "intermediate_size": 4304,
            "tokens_per_second": 2, "attention_mask_type": "general"},
        "vision_projector": {
            "model_id": "lnmlp", "num_layers": 1, "gated_linear_unit": False, "bias_activation_fusion": False,
            "add_bias_linear": True, "input_size": 1152, "hidden_size": 2048, "ffn_hidden_size": 4608,
            "activation_func": "gelu", "bf16": True, "params_dtype": "bf16", "freeze": True, "layernorm_epsilon": 1e-06,
            "normalization": "LayerNorm", "use_postshuffle_norm": False}},
    "text_encoder": None, "video_encoder": None,
}
# finetune_qwen3vl_30B.sh's MOE_ARGS and its --expert-model-parallel-size (EP=2 there; 1 for one process)
MOE_ARGS = ["--moe-grouped-gemm", "--moe-permutation-async-comm", "--moe-token-dispatcher-type", "alltoall",
            "--variable-seq-lengths"]

# Sizes only (every key stays): scripts/qwen3vl/model_tiny.json's, the demo tokenizer's ids, 8 experts, top 2.
TINY_TEXT = {"hidden_size": 64, "kv_channels": 16, "num_attention_heads": 4, "num_query_groups": 2, "num_layers": 2,
             "pipeline_num_layers": [2], "ffn_hidden_size": 128, "moe_intermediate_size": 32, "num_moe_experts": 8,
             "moe_router_topk": 2, "vocab_size": 512, "max_position_embeddings": 1024, "rope_theta": 10000.0,
             "rope_scaling": {"mrope_interleaved": True, "mrope_section": [4, 2, 2], "rope_type": "default"},
             "seq_length": 256, "recompute_num_layers": 1}
TINY_VISION = {"deepstack_visual_indexes": [0, 1], "num_layers": 2, "hidden_size": 32, "ffn_hidden_size": 64,
               "intermediate_size": 64, "num_attention_heads": 2, "max_position_embeddings": 16, "llm_hidden_size": 64,
               "pipeline_num_layers": [2]}
TINY_PROJECTOR = {"input_size": 32, "hidden_size": 64, "ffn_hidden_size": 128}
TINY_IDS = {"img_context_token_id": 5, "video_token_id": 6, "vision_start_token_id": 3}


def tiny_model_json(path: Path, **text) -> Path:
    """model_30B.json shrunk (every key kept; `text` overrides text_decoder values), written to path."""
    raw = copy.deepcopy(MODEL_30B)
    raw.update(TINY_IDS)
    raw["text_decoder"].update({**TINY_TEXT, **text})
    raw["image_encoder"]["vision_encoder"].update(TINY_VISION)
    raw["image_encoder"]["vision_projector"].update(TINY_PROJECTOR)
    assert all(set(a) == set(b) for a, b in ((raw, MODEL_30B), (raw["text_decoder"], MODEL_30B["text_decoder"])))
    path.write_text(json.dumps(raw, indent=1))
    return path
