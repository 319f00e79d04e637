"""Qwen3-VL (dense) in MindSpeed-MM's names: the recipes models/vlm/mm_layout.py splits and converts.

MindSpeed-MM's Qwen3VLMegatronConverter (checkpoint/vlm_model/converters/qwen3vl_megatron.py) names the mcore
model as Qwen2-VL's, with what Qwen3-VL adds (HF name -> MindSpeed-MM name, layer numbers global here):

    model.visual.patch_embed.proj.{weight,bias}     image_encoder.encoder.patch_embed.proj.{weight,bias}
    model.visual.pos_embed.weight                   image_encoder.encoder.pos_embed.weight (replicated, stage 0)
    model.visual.blocks.N.{norm1,norm2}             ...blocks.layers.N.{input_layernorm,pre_mlp_layernorm}
    model.visual.blocks.N.attn.qkv                  ...blocks.layers.N.self_attention.linear_qkv (rows per head)
    model.visual.blocks.N.mlp.linear_fc1 / fc2      ...blocks.layers.N.mlp.linear_fc1 / fc2 (not gated)
    model.visual.deepstack_merger_list.K.norm       ...blocks.layers.{deepstack_visual_indexes[K]}
                                                        .deepstack_layer.layernorm
    model.visual.deepstack_merger_list.K.linear_fc1 / fc2   ...deepstack_layer.encoder.linear_fc1 / fc2
    model.visual.merger.{norm,linear_fc1,linear_fc2} image_encoder.projector.{layernorm,encoder.linear_fc1,fc2}
    model.language_model.layers.N.self_attn.{q,k}_norm   text_decoder.decoder.layers.N.self_attention.{q,k}_layernorm
    (embedding, q/k/v fused per query group, o_proj, norms, [gate; up], down, final norm, lm_head: as Qwen2-VL)
    The MoE variant's sparse layers (qwen3_vl_moe; ExpertSplitOp):
    model.language_model.layers.N.mlp.gate.weight        text_decoder.decoder.layers.N.mlp.router.weight
    ...layers.N.mlp.experts.gate_up_proj[k] (2 x moe_intermediate, hidden: transformers' memory layout, [gate; up])
                                                    ...layers.N.mlp.experts.local_experts.k.linear_fc1.weight (GLU)
    ...layers.N.mlp.experts.down_proj[k] (hidden, moe_intermediate)
                                                    ...layers.N.mlp.experts.local_experts.k.linear_fc2.weight (row)
    k is global here; split over expert-parallel ranks each rank holds num_experts / EP experts numbered from 0
    (megatron-core's local numbering; checkpoint_vlm.write_checkpoint's `ep`).

A DeepStack merger sits with the ViT block whose output it reads, so it lives on that block's stage (stage 0: mmrun
keeps the ViT there). Tensor parallelism as MindSpeed-MM's qwen3_vl_tp_patterns: the DeepStack mergers' fc1
column-, fc2 row-parallel like the projector's; q/k norms (one per head dim, shared by the heads) replicated.
"""
from __future__ import annotations

from mmrun.models.vlm.mm_layout import OUTPUT_LAYER, PROJECTOR, TEXT, TEXT_LAYERS, VISION, VISION_LAYERS, Recipe

BOTH = ("weight", "bias")
# HF module (inside a ViT block / decoder layer / merger) -> MindSpeed-MM module, renamed one to one.
_VISION_BLOCK = {"norm1": "input_layernorm", "attn.proj": "self_attention.linear_proj", "norm2": "pre_mlp_layernorm",
                 "mlp.linear_fc1": "mlp.linear_fc1", "mlp.linear_fc2": "mlp.linear_fc2"}
_MERGER = {"norm": "layernorm", "linear_fc1": "encoder.linear_fc1", "linear_fc2": "encoder.linear_fc2"}


def hf_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every parameter of the model in transformers' names (= checkpoint keys) with its shape, in checkpoint order
    (models/qwen3_vl/hf_checkpoint.hf_parameter_names)."""
    v, t = config.vision, config.text
    d, f, merged = v.hidden_size, v.intermediate_size, v.hidden_size * v.spatial_merge_size ** 2
    h, i, hd = t.hidden_size, t.intermediate_size, t.head_dim
    q, kv = t.num_attention_heads * hd, t.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "model.visual.patch_embed.proj.weight": (d, v.patch_dim), "model.visual.patch_embed.proj.bias": (d,),
        "model.visual.pos_embed.weight": (v.num_position_embeddings, d)}
    for n in range(v.depth):
        block = f"model.visual.blocks.{n}."
        for module, out, inp in (("norm1", d, None), ("norm2", d, None), ("attn.qkv", 3 * d, d), ("attn.proj", d, d),
                                 ("mlp.linear_fc1", f, d), ("mlp.linear_fc2", d, f)):
            shapes[f"{block}{module}.weight"] = (out,) if inp is None else (out, inp)
            shapes[f"{block}{module}.bias"] = (out,)
    for merger, norm in [("model.visual.merger.", d)] + [(f"model.visual.deepstack_merger_list.{k}.", merged)
                                                         for k in range(len(v.deepstack_visual_indexes))]:
        shapes.update({f"{merger}norm.weight": (norm,), f"{merger}norm.bias": (norm,),
                       f"{merger}linear_fc1.weight": (merged, merged), f"{merger}linear_fc1.bias": (merged,),
                       f"{merger}linear_fc2.weight": (h, merged), f"{merger}linear_fc2.bias": (h,)})
    text = "model.language_model."
    shapes[text + "embed_tokens.weight"] = (t.vocab_size, h)
    for n in range(t.num_hidden_layers):
        layer = f"{text}layers.{n}.self_attn."
        for module, rows, cols in (("q_proj", q, h), ("k_proj", kv, h), ("v_proj", kv, h), ("o_proj", h, q)):
            shapes[f"{layer}{module}.weight"] = (rows, cols)
            if t.attention_bias:
                shapes[f"{layer}{module}.bias"] = (rows,)
        shapes.update({layer + "q_norm.weight": (hd,), layer + "k_norm.weight": (hd,)})
        layer = f"{text}layers.{n}."
        shapes.update({layer + "input_layernorm.weight": (h,), layer + "post_attention_layernorm.weight": (h,)})
        if t.moe is not None and t.moe.is_sparse(n):  # transformers' router and fused experts (memory layout)
            e, mi = t.moe.num_experts, t.moe.moe_intermediate_size
            shapes.update({layer + "mlp.gate.weight": (e, h), layer + "mlp.experts.gate_up_proj": (e, 2 * mi, h),
                           layer + "mlp.experts.down_proj": (e, h, mi)})
        else:
            shapes.update({layer + "mlp.gate_proj.weight": (i, h), layer + "mlp.up_proj.weight": (i, h),
                           layer + "mlp.down_proj.weight": (h, i)})
    shapes[text + "norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (t.vocab_size, h)
    return shapes


def recipes(config) -> dict[str, Recipe]:
    """MindSpeed-MM name (global layer numbers) -> how it is made of HF tensors, for the whole model."""
    v, t = config.vision, config.text
    out: dict[str, Recipe] = {}

    def copy(mm: str, hf: str) -> None:
        out[mm] = Recipe((hf,), "copy")

    for p in BOTH:
        copy(f"{VISION}patch_embed.proj.{p}", f"model.visual.patch_embed.proj.{p}")
    copy(VISION + "pos_embed.weight", "model.visual.pos_embed.weight")
    for n in range(v.depth):
        block, mm = f"model.visual.blocks.{n}.", f"{VISION_LAYERS}{n}."
        for p in BOTH:
            copy(f"{mm}input_layernorm.{p}", f"{block}norm1.{p}")
            out[f"{mm}self_attention.linear_qkv.{p}"] = Recipe((f"{block}attn.qkv.{p}",), "qkv", v.num_heads)
            for module in ("attn.proj", "norm2", "mlp.linear_fc1", "mlp.linear_fc2"):
                copy(f"{mm}{_VISION_BLOCK[module]}.{p}", f"{block}{module}.{p}")
        if n in v.deepstack_visual_indexes:
            merger = f"model.visual.deepstack_merger_list.{v.deepstack_visual_indexes.index(n)}."
            for module in ("norm", "linear_fc1", "linear_fc2"):
                for p in BOTH:
                    copy(f"{mm}deepstack_layer.{_MERGER[module]}.{p}", f"{merger}{module}.{p}")
    for module in ("norm", "linear_fc1", "linear_fc2"):
        for p in BOTH:
            copy(f"{PROJECTOR}{_MERGER[module]}.{p}", f"model.visual.merger.{module}.{p}")
    copy(TEXT + "embedding.word_embeddings.weight", "model.language_model.embed_tokens.weight")
    params = BOTH if t.attention_bias else ("weight",)
    for n in range(t.num_hidden_layers):
        layer, mm = f"model.language_model.layers.{n}.", f"{TEXT_LAYERS}{n}."
        copy(mm + "input_layernorm.weight", layer + "input_layernorm.weight")
        for p in params:
            out[f"{mm}self_attention.linear_qkv.{p}"] = Recipe(
                tuple(f"{layer}self_attn.{m}_proj.{p}" for m in "qkv"), "qkv", t.num_key_value_heads)
        copy(mm + "self_attention.q_layernorm.weight", layer + "self_attn.q_norm.weight")
        copy(mm + "self_attention.k_layernorm.weight", layer + "self_attn.k_norm.weight")
        for p in params:
            copy(f"{mm}self_attention.linear_proj.{p}", f"{layer}self_attn.o_proj.{p}")
        copy(mm + "pre_mlp_layernorm.weight", layer + "post_attention_layernorm.weight")
        if t.moe is not None and t.moe.is_sparse(n):  # megatron-core's router and experts (global numbers here)
            copy(mm + "mlp.router.weight", layer + "mlp.gate.weight")
            for k in range(t.moe.num_experts):
                expert = f"{mm}mlp.experts.local_experts.{k}."
                out[expert + "linear_fc1.weight"] = Recipe((layer + "mlp.experts.gate_up_proj",), "expert", k)
                out[expert + "linear_fc2.weight"] = Recipe((layer + "mlp.experts.down_proj",), "expert", k)
        else:
            out[mm + "mlp.linear_fc1.weight"] = Recipe(
                (layer + "mlp.gate_proj.weight", layer + "mlp.up_proj.weight"), "concat")
            copy(mm + "mlp.linear_fc2.weight", layer + "mlp.down_proj.weight")
    copy(TEXT + "decoder.final_layernorm.weight", "model.language_model.norm.weight")
    if not config.tie_word_embeddings:
        copy(OUTPUT_LAYER, "lm_head.weight")
    return out
