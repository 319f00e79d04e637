"""Qwen2-VL / Qwen2.5-VL in MindSpeed-MM's names: the tensors and recipes models/vlm/mm_layout.py splits and converts
(the name table is in that module's docstring)."""
from __future__ import annotations

from typing import Mapping

from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig
from mmrun.models.vlm.mm_layout import OUTPUT_LAYER, PROJECTOR, TEXT, TEXT_LAYERS, VISION, VISION_LAYERS, Recipe

# HF module (inside a ViT block / decoder layer) -> MindSpeed-MM module, for the tensors renamed one to one.
_VISION_BLOCK_RENAMES = {"norm1": "input_layernorm", "norm2": "pre_mlp_layernorm",
                         "attn.proj": "self_attention.linear_proj", "mlp.fc1": "mlp.linear_fc1",
                         "mlp.fc2": "mlp.linear_fc2", "mlp.down_proj": "mlp.linear_fc2"}
_TEXT_LAYER_RENAMES = {"input_layernorm": "input_layernorm", "post_attention_layernorm": "pre_mlp_layernorm",
                       "self_attn.o_proj": "self_attention.linear_proj", "mlp.down_proj": "mlp.linear_fc2"}
_TOP_RENAMES = {"visual.patch_embed.proj": VISION + "patch_embed.proj", "visual.merger.ln_q": PROJECTOR + "layernorm",
                "visual.merger.mlp.0": PROJECTOR + "encoder.linear_fc1",
                "visual.merger.mlp.2": PROJECTOR + "encoder.linear_fc2",
                "model.embed_tokens": TEXT + "embedding.word_embeddings", "model.norm": TEXT + "decoder.final_layernorm",
                "lm_head": TEXT + "output_layer"}

# MindSpeed-MM's module paths (the prefixes its FSDP2 files name, e.g. examples/qwen2.5vl/fsdp2_config.yaml) -> this
# model's; None: a module without parameters here (rotary embeddings are computed, not held), nothing to shard.
MINDSPEED_MM_MODULES: dict[str, str | None] = {
    "text_decoder.output_layer": "lm_head", "text_decoder.embedding": "model.embed_tokens",
    "text_decoder.rotary_pos_emb": None, "text_decoder.decoder.layers": "model.layers",
    "text_decoder.decoder.final_layernorm": "model.norm", "text_decoder": "model",
    "image_encoder.encoder.blocks.layers": "visual.blocks", "image_encoder.encoder.patch_embed": "visual.patch_embed",
    "image_encoder.projector": "visual.merger", "image_encoder": "visual"}


def hf_shapes(config: Qwen2VLConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of the model in mmrun's (Hugging Face hub) names, with its shape, in checkpoint order."""
    v, t = config.vision, config.text
    d, f, merged = v.hidden_size, v.intermediate_size, v.hidden_size * v.spatial_merge_size ** 2
    h, i, hd = t.hidden_size, t.intermediate_size, t.head_dim
    norm = ("weight",) if config.is_qwen2_5 else ("weight", "bias")
    shapes: dict[str, tuple[int, ...]] = {"visual.patch_embed.proj.weight": (d, v.patch_dim)}
    for n in range(v.depth):
        block = f"visual.blocks.{n}."
        shapes.update({f"{block}{m}.{p}": (d,) for m in ("norm1", "norm2") for p in norm})
        shapes.update({block + "attn.qkv.weight": (3 * d, d), block + "attn.qkv.bias": (3 * d,),
                       block + "attn.proj.weight": (d, d), block + "attn.proj.bias": (d,)})
        if config.is_qwen2_5:
            for m in ("gate_proj", "up_proj"):
                shapes.update({f"{block}mlp.{m}.weight": (f, d), f"{block}mlp.{m}.bias": (f,)})
            shapes.update({block + "mlp.down_proj.weight": (d, f), block + "mlp.down_proj.bias": (d,)})
        else:
            shapes.update({block + "mlp.fc1.weight": (f, d), block + "mlp.fc1.bias": (f,),
                           block + "mlp.fc2.weight": (d, f), block + "mlp.fc2.bias": (d,)})
    shapes.update({f"visual.merger.ln_q.{p}": (d,) for p in norm})
    shapes.update({"visual.merger.mlp.0.weight": (merged, merged), "visual.merger.mlp.0.bias": (merged,),
                   "visual.merger.mlp.2.weight": (h, merged), "visual.merger.mlp.2.bias": (h,)})
    shapes["model.embed_tokens.weight"] = (t.vocab_size, h)
    q, kv = t.num_attention_heads * hd, t.num_key_value_heads * hd
    for n in range(t.num_hidden_layers):
        layer = f"model.layers.{n}."
        for m, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            shapes.update({f"{layer}self_attn.{m}.weight": (rows, h), f"{layer}self_attn.{m}.bias": (rows,)})
        shapes.update({layer + "self_attn.o_proj.weight": (h, q), layer + "input_layernorm.weight": (h,),
                       layer + "post_attention_layernorm.weight": (h,), layer + "mlp.gate_proj.weight": (i, h),
                       layer + "mlp.up_proj.weight": (i, h), layer + "mlp.down_proj.weight": (h, i)})
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (t.vocab_size, h)
    return shapes


def recipes(config: Qwen2VLConfig) -> dict[str, Recipe]:
    """MindSpeed-MM name -> recipe, for the whole model (global layer numbers), in MindSpeed-MM's order."""
    v, t = config.vision, config.text
    out: dict[str, Recipe] = {}
    hf = hf_shapes(config)

    def rename(hf_name: str, table: Mapping[str, str], hf_prefix: str, mm_prefix: str) -> None:
        module, _, param = hf_name[len(hf_prefix):].rpartition(".")
        out[f"{mm_prefix}{table[module]}.{param}"] = Recipe((hf_name,), "copy")

    out[VISION + "patch_embed.proj.weight"] = Recipe(("visual.patch_embed.proj.weight",), "copy")
    for n in range(v.depth):
        block, mm = f"visual.blocks.{n}.", f"{VISION_LAYERS}{n}."
        for p in ("weight", "bias"):
            if f"{block}norm1.{p}" in hf:
                rename(f"{block}norm1.{p}", _VISION_BLOCK_RENAMES, block, mm)
            out[f"{mm}self_attention.linear_qkv.{p}"] = Recipe((f"{block}attn.qkv.{p}",), "qkv", v.num_heads)
            rename(f"{block}attn.proj.{p}", _VISION_BLOCK_RENAMES, block, mm)
            if f"{block}norm2.{p}" in hf:
                rename(f"{block}norm2.{p}", _VISION_BLOCK_RENAMES, block, mm)
            if config.is_qwen2_5:
                out[f"{mm}mlp.linear_fc1.{p}"] = Recipe((f"{block}mlp.gate_proj.{p}", f"{block}mlp.up_proj.{p}"),
                                                         "concat")
                rename(f"{block}mlp.down_proj.{p}", _VISION_BLOCK_RENAMES, block, mm)
            else:
                rename(f"{block}mlp.fc1.{p}", _VISION_BLOCK_RENAMES, block, mm)
                rename(f"{block}mlp.fc2.{p}", _VISION_BLOCK_RENAMES, block, mm)
    for name in hf:
        if name.startswith(("visual.merger.", "model.embed_tokens.")):
            module, _, param = name.rpartition(".")
            out[f"{_TOP_RENAMES[module]}.{param}"] = Recipe((name,), "copy")
    for n in range(t.num_hidden_layers):
        layer, mm = f"model.layers.{n}.", f"{TEXT_LAYERS}{n}."
        rename(layer + "input_layernorm.weight", _TEXT_LAYER_RENAMES, layer, mm)
        for p in ("weight", "bias"):
            out[f"{mm}self_attention.linear_qkv.{p}"] = Recipe(
                tuple(f"{layer}self_attn.{m}_proj.{p}" for m in "qkv"), "qkv", t.num_key_value_heads)
        rename(layer + "self_attn.o_proj.weight", _TEXT_LAYER_RENAMES, layer, mm)
        rename(layer + "post_attention_layernorm.weight", _TEXT_LAYER_RENAMES, layer, mm)
        out[f"{mm}mlp.linear_fc1.weight"] = Recipe((layer + "mlp.gate_proj.weight", layer + "mlp.up_proj.weight"),
                                                    "concat")
        rename(layer + "mlp.down_proj.weight", _TEXT_LAYER_RENAMES, layer, mm)
    out[TEXT + "decoder.final_layernorm.weight"] = Recipe(("model.norm.weight",), "copy")
    if not config.tie_word_embeddings:
        out[OUTPUT_LAYER] = Recipe(("lm_head.weight",), "copy")
    return out


# MindSpeed-MM's (megatron-core's) LoRA target names -> the Hugging Face Qwen2-VL / Qwen2.5-VL modules (PEFT's
# suffix rule: a module whose dotted name ends in "." + one of these). Names not in the table pass as given.
LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "linear_qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "attn.qkv"),
    "linear_proj": ("self_attn.o_proj", "attn.proj"),
    "linear_fc1": ("mlp.gate_proj", "mlp.up_proj", "mlp.fc1", "merger.mlp.0"),
    "linear_fc2": ("mlp.down_proj", "mlp.fc2", "merger.mlp.2"),
}
