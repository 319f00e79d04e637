"""MindSpeed-MM's examples/qwen3vl/qwen3vl_full_sft_8B.yaml, its keys as they are, made tiny: the offline demo's
Qwen3-VL data (mllm_format JSON + images, qwen3_vl_nothink template, its tokenizer and 16-pixel patches) and a
random transformers Qwen3VLForConditionalGeneration saved beside the tokenizer (the YAML's one HF_MODEL_LOAD_PATH
serves the data's model_name_or_path and the model's init_from_hf_path)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

FSDP2 = {"sharding_size": "auto", "sub_modules_to_wrap": ["model.visual.blocks.{*}", "model.language_model.layers.{*}"],
         "recompute_modules": ["model.language_model.layers.{0}"]}


def tiny_hf_qwen3_vl(model_dir: str, moe: bool = False, vocab_size: int | None = None) -> None:
    """A random transformers Qwen3-VL whose token ids are the demo tokenizer's, saved into model_dir (offline); with
    `moe`, Qwen3-VL MoE (every decoder layer's MLP 4 experts of width 16, 2 per token); `vocab_size` rows of
    embeddings (the tokenizer's by default)."""
    import torch
    import transformers

    from mmrun.data.multimodal.demo import special_token_ids_for_model_config

    transformers.utils.logging.disable_progress_bar()  # no progress bar in docs/qwen3-vl.md's output
    ids = special_token_ids_for_model_config(model_dir)
    text = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512, "vocab_size": vocab_size or ids["vocab_size"],
            "bos_token_id": ids["bos_token_id"], "eos_token_id": ids["eos_token_id"],
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2],
                                "mrope_interleaved": True}}
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "out_hidden_size": 32,
              "patch_size": 16, "num_position_embeddings": 16, "deepstack_visual_indexes": [0, 1],
              "spatial_merge_size": 2, "temporal_patch_size": 2}
    tokens = {k: ids[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")}
    if moe:
        text.update({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "decoder_sparse_step": 1})
    config_class, model_class = ((transformers.Qwen3VLMoeConfig, transformers.Qwen3VLMoeForConditionalGeneration)
                                 if moe else (transformers.Qwen3VLConfig, transformers.Qwen3VLForConditionalGeneration))
    torch.manual_seed(0)
    config = config_class(text_config=text, vision_config=vision, tie_word_embeddings=False, **tokens)
    model_class(config).save_pretrained(model_dir)


def write_job(root: Path, fsdp2: bool, iterations: int = 3, gpt_args: dict[str, Any] | None = None,
              make_demo_files: bool = True) -> Path:
    """root/demo (data + tokenizer + model) made once; returns the YAML (FSDP2 on two ranks, or unsharded)."""
    from mmrun.data.multimodal.demo import make_demo

    demo = root / "demo"
    if make_demo_files and not (demo / "model" / "config.json").is_file():
        make_demo(str(demo), num_samples=16, seed=7, model="qwen3_vl")
        tiny_hf_qwen3_vl(str(demo / "model"))
        (root / "fsdp2_config.yaml").write_text(yaml.safe_dump(FSDP2))
    anchors = {"HF_MODEL_LOAD_PATH": str(demo / "model"), "DATASET_PATH": str(demo / "data" / "demo.json"),
               "FSDP2_PATH": str(root / "fsdp2_config.yaml"), "SAVE_PATH": str(root / "save_dir")}
    text = "".join(f"{k}: &{k} {v}\n" for k, v in anchors.items()) + "MM_TOOL_PATH: ./mindspeed_mm/tools/tools.json\n"
    job: dict[str, Any] = {
        "gpt_args": {
            "context_parallel_size": 1, "context_parallel_algo": "ulysses_cp_algo", "use_torch_fsdp2": fsdp2,
            "fsdp2_config_path": "*FSDP2_PATH", "ckpt_format": "torch_dcp", "clip_grad": 0.0, "micro_batch_size": 2,
            "global_batch_size": 4, "optimizer_selection": "fused_torch_adamw", "lr": 1.0e-3, "weight_decay": 0.0,
            "adam_beta1": 0.9, "adam_beta2": 0.999, "lr_decay_style": "cosine", "lr_warmup_fraction": 0.1,
            "train_iters": iterations, "no_load_optim": True, "no_load_rng": True, "no_save_optim": True,
            "no_save_rng": True, "seed": 42, "log_interval": 1, "save_interval": 10000, "eval_interval": 10000,
            "eval_iters": 0, "log_tps": True, "use_cpu_initialization": True, "init_model_with_meta_device": True,
            "normalization": "RMSNorm", "use_fused_rmsnorm": True, "swiglu": True, "use_fused_swiglu": True,
            "use_flash_attn": True, "vocab_size": 512, "seq_length": 256, "make_vocab_size_divisible_by": 1,
            "tokenizer_type": "NullTokenizer", "no_gradient_accumulation_fusion": True,
            "untie_embeddings_and_output_weights": True, "no_masked_softmax_fusion": True, "num_workers": 0,
            # here, not in MindSpeed-MM's file: a CPU run (gloo), and the NPU/GPU kernels it asks for
            # (flash attention, fused RMSNorm/SwiGLU) off with a warning instead of refused by the feature gate
            "distributed_backend": "gloo", "on_unsupported": "warn"},
        "data": {
            "dataset_param": {
                "dataset_type": "huggingface",
                "attr": {"system": None, "images": "images", "videos": None, "messages": "messages", "role_tag": "role",
                         "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
                         "observation_tag": None, "function_tag": None, "system_tag": None},
                "preprocess_parameters": {
                    "model_name_or_path": "*HF_MODEL_LOAD_PATH", "use_fast_tokenizer": True,
                    "split_special_tokens": False, "image_max_pixels": 12544, "image_min_pixels": 1024,
                    "video_max_pixels": 16384, "video_min_pixels": 0, "video_fps": 2.0, "video_maxlen": 64},
                "basic_parameters": {
                    "template": "qwen3_vl_nothink", "enable_thinking": False, "train_on_prompt": False,
                    "mask_history": False, "tool_format": None, "dataset_dir": str(demo / "data"),
                    "dataset": "*DATASET_PATH", "cache_dir": str(root / "cache_dir"), "overwrite_cache": False,
                    "preprocessing_batch_size": 1000, "preprocessing_num_workers": 16, "max_samples": None}},
            "dataloader_param": {
                "pin_memory": True, "shuffle": False, "dataloader_mode": "sampler", "drop_last": True,
                "sampler_type": "BaseRandomBatchSampler",
                "collate_param": {"model_name": "qwen3vl", "ignore_pad_token_for_loss": True}}},
        "model": {
            "model_id": "qwen3_vl", "init_from_hf_path": "*HF_MODEL_LOAD_PATH",
            "image_encoder": {
                "vision_encoder": {"model_id": "qwen3vit", "num_layers": 2, "hidden_size": 32,
                                   "num_attention_heads": 4, "freeze": True, "attn_implementation": "flash_attention_2",
                                   "attn_layout": "TND", "synchronize_per_layer": True},
                "vision_projector": {"model_id": "lnmlp", "num_layers": 1, "freeze": True}},
            "text_decoder": {"model_id": "qwen3lm", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                             "max_position_embeddings": 512, "freeze": False, "use_npu_fused_moe": False,
                             "attn_implementation": "flash_attention_2", "attn_layout": "TND", "is_causal": False,
                             "activation_offload": False, "synchronize_per_layer": True},
            "loss_cfg": {"compute_mode": "default", "chunk_size": 1024, "loss_type": "default"},
            "patch": {"clip_grad_async": True}}}
    job["gpt_args"].update(gpt_args or {})
    body = yaml.safe_dump(job, sort_keys=False, default_flow_style=False)
    body = body.replace("'*", "*").replace("_PATH'", "_PATH")  # the aliases, unquoted as in MindSpeed-MM's file
    path = root / ("qwen3vl_full_sft_tiny.yaml" if fsdp2 and not gpt_args else
                   "qwen3vl_full_sft_tiny_unsharded.yaml" if not gpt_args else "qwen3vl_full_sft_tiny_changed.yaml")
    path.write_text(text + body)
    return path
