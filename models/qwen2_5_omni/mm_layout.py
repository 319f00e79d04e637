"""Qwen2.5-Omni's thinker in MindSpeed-MM's names: the tensors and recipes models/vlm/mm_layout.py splits and converts.

MindSpeed-MM's Qwen2_5_OmniConverter (Ascend/MindSpeed-MM, checkpoint/vlm_model/converters/qwen2_5omni.py at
57069cd55a8ab16d5affe379a2e2c5f0a4d962b9) names the ViT and the decoder as Qwen2.5-VL's (models/qwen2_vl/mm_layout.py),
except that Omni's ViT stores q, k and v apart (fused per head like Qwen2.5-VL's qkv), and adds the audio encoder
(HF name -> MindSpeed-MM name, layer numbers global):

    audio_tower.conv1 / conv2 / ln_post / proj            audio_encoder.encoder.conv1 / conv2 / ln_post / proj
    audio_tower.audio_bos_eos_token                        audio_encoder.encoder.audio_bos_eos_token
    audio_tower.layers.N.self_attn_layer_norm              audio_encoder.encoder.blocks.layers.N.input_layernorm
    audio_tower.layers.N.self_attn.{q,k,v}_proj.weight     ...layers.N.self_attention.linear_qkv.weight, per head
                                                           [q_h; k_h; v_h]
    audio_tower.layers.N.self_attn.{q,v}_proj.bias         ...layers.N.self_attention.linear_qkv.bias, per head
                                                           [q_h; 0; v_h] (k has no bias: zeros, dropped on the way back)
    audio_tower.layers.N.self_attn.out_proj                ...layers.N.self_attention.linear_proj
    audio_tower.layers.N.final_layer_norm                  ...layers.N.pre_mlp_layernorm
    audio_tower.layers.N.fc1 / fc2                         ...layers.N.mlp.linear_fc1 / linear_fc2 (not gated)

The Conv1d kernels are kept flattened (D, C*3) as mmrun's model holds them (same bytes), like the ViT's patch kernel.
Tensor parallelism as MindSpeed-MM's qwen2_5_omni_tp_patterns: the audio qkv and fc1 column-parallel, linear_proj and
fc2 row-parallel (their biases replicated), the rest replicated. Pipeline: the whole audio encoder sits on stage 0
beside the ViT (MindSpeed-MM's audio_pp_layers [[32,0]]).
"""
from __future__ import annotations

from mmrun.models.qwen2_vl import mm_layout as qwen2_vl_layout
from mmrun.models.vlm.mm_layout import Recipe

AUDIO = "audio_encoder.encoder."
AUDIO_LAYERS = AUDIO + "blocks.layers."
_AUDIO_LAYER = {"self_attn_layer_norm": "input_layernorm", "self_attn.out_proj": "self_attention.linear_proj",
                "final_layer_norm": "pre_mlp_layernorm", "fc1": "mlp.linear_fc1", "fc2": "mlp.linear_fc2"}
_AUDIO_TOP = ("conv1", "conv2", "ln_post", "proj")


def _vision_qkv_apart(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        if ".attn.qkv." in name:
            block, param = name.split(".attn.qkv.")
            out.update({f"{block}.attn.{p}.{param}": (shape[0] // 3,) + shape[1:] for p in "qkv"})
        else:
            out[name] = shape
    return out


def hf_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every parameter of the thinker in mmrun's (a thinker directory's) names, with its shape, in the order of
    models/qwen2_5_omni/hf_checkpoint.hf_parameter_names."""
    shapes = _vision_qkv_apart(qwen2_vl_layout.hf_shapes(config.as_qwen2_5_vl()))
    a = config.audio
    d, f = a.hidden_size, a.intermediate_size
    audio = "audio_tower."
    shapes.update({audio + "conv1.weight": (d, a.num_mel_bins * 3), audio + "conv1.bias": (d,),
                   audio + "conv2.weight": (d, d * 3), audio + "conv2.bias": (d,)})
    for n in range(a.num_layers):
        layer = f"{audio}layers.{n}."
        shapes[layer + "self_attn.k_proj.weight"] = (d, d)
        for m in ("q_proj", "v_proj", "out_proj"):
            shapes.update({f"{layer}self_attn.{m}.weight": (d, d), f"{layer}self_attn.{m}.bias": (d,)})
        for m, shape in (("self_attn_layer_norm", (d,)), ("fc1", (f, d)), ("fc2", (d, f)), ("final_layer_norm", (d,))):
            shapes.update({f"{layer}{m}.weight": shape, f"{layer}{m}.bias": shape[:1]})
    shapes.update({audio + "ln_post.weight": (d,), audio + "ln_post.bias": (d,),
                   audio + "proj.weight": (a.output_dim, d), audio + "proj.bias": (a.output_dim,),
                   audio + "audio_bos_eos_token.weight": (2, a.output_dim)})
    return shapes


def recipes(config) -> dict[str, Recipe]:
    """MindSpeed-MM name (global layer numbers) -> how it is made of HF tensors: vision, text, then audio (the
    order of MindSpeed-MM's schemas)."""
    out: dict[str, Recipe] = {}
    for name, recipe in qwen2_vl_layout.recipes(config.as_qwen2_5_vl()).items():
        source = recipe.sources[0]
        if ".attn.qkv." in source:  # Omni's ViT: q, k, v apart, fused per head as Qwen2.5-VL's qkv
            block, param = source.split(".attn.qkv.")
            recipe = Recipe(tuple(f"{block}.attn.{p}.{param}" for p in "qkv"), "qkv", recipe.groups)
        out[name] = recipe
    a = config.audio
    for n in range(a.num_layers):
        layer, mm = f"audio_tower.layers.{n}.", f"{AUDIO_LAYERS}{n}."
        for module in ("self_attn_layer_norm",):
            for p in ("weight", "bias"):
                out[f"{mm}{_AUDIO_LAYER[module]}.{p}"] = Recipe((f"{layer}{module}.{p}",), "copy")
        out[mm + "self_attention.linear_qkv.weight"] = Recipe(
            tuple(f"{layer}self_attn.{m}_proj.weight" for m in "qkv"), "qkv", a.num_heads)
        out[mm + "self_attention.linear_qkv.bias"] = Recipe(
            (f"{layer}self_attn.q_proj.bias", f"{layer}self_attn.v_proj.bias"), "qkv_zero_k", a.num_heads)
        for module in ("self_attn.out_proj", "final_layer_norm", "fc1", "fc2"):
            for p in ("weight", "bias"):
                out[f"{mm}{_AUDIO_LAYER[module]}.{p}"] = Recipe((f"{layer}{module}.{p}",), "copy")
    for module in _AUDIO_TOP:
        for p in ("weight", "bias"):
            out[f"{AUDIO}{module}.{p}"] = Recipe((f"audio_tower.{module}.{p}",), "copy")
    out[AUDIO + "audio_bos_eos_token.weight"] = Recipe(("audio_tower.audio_bos_eos_token.weight",), "copy")
    return out


def tp_sizes(config) -> dict[str, int]:
    """The audio encoder's sizes a tensor-parallel size must divide (beside the ViT's and decoder's)."""
    return {"audio encoder_attention_heads": config.audio.num_heads, "audio encoder_ffn_dim":
            config.audio.intermediate_size}
