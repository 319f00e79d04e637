"""MindSpeed-MM's WanDiT parameter and module names <-> diffusers' (which are mmrun's), as MindSpeed-MM's own
converter maps them (`mm-convert WanConverter hf_to_mm`, checkpoint/sora_model/wan_converter.py): whole names
first, then substrings in order. Used to read weights MindSpeed-MM converted or saved, and to turn its LoRA
targets (`--lora-target-modules ffn.2 ffn.0 proj_q proj_k proj_v proj_out`) into diffusers' module names.

Beware `proj_out`: in MindSpeed-MM's blocks it is the attention output (diffusers' `to_out.0`); diffusers'
`proj_out` is the model's final projection (MindSpeed-MM's `head.head`).
"""
from __future__ import annotations

# diffusers name -> MindSpeed-MM name, for names outside the blocks.
WHOLE_NAMES: dict[str, str] = {
    "condition_embedder.text_embedder.linear_1.bias": "text_embedding.linear_1.bias",
    "condition_embedder.text_embedder.linear_1.weight": "text_embedding.linear_1.weight",
    "condition_embedder.text_embedder.linear_2.bias": "text_embedding.linear_2.bias",
    "condition_embedder.text_embedder.linear_2.weight": "text_embedding.linear_2.weight",
    "condition_embedder.time_embedder.linear_1.bias": "time_embedding.0.bias",
    "condition_embedder.time_embedder.linear_1.weight": "time_embedding.0.weight",
    "condition_embedder.time_embedder.linear_2.bias": "time_embedding.2.bias",
    "condition_embedder.time_embedder.linear_2.weight": "time_embedding.2.weight",
    "condition_embedder.time_proj.bias": "time_projection.1.bias",
    "condition_embedder.time_proj.weight": "time_projection.1.weight",
    "condition_embedder.image_embedder.ff.net.0.proj.weight": "img_emb.proj.1.weight",
    "condition_embedder.image_embedder.ff.net.0.proj.bias": "img_emb.proj.1.bias",
    "condition_embedder.image_embedder.ff.net.2.weight": "img_emb.proj.3.weight",
    "condition_embedder.image_embedder.ff.net.2.bias": "img_emb.proj.3.bias",
    "condition_embedder.image_embedder.norm1.weight": "img_emb.proj.0.weight",
    "condition_embedder.image_embedder.norm1.bias": "img_emb.proj.0.bias",
    "condition_embedder.image_embedder.norm2.weight": "img_emb.proj.4.weight",
    "condition_embedder.image_embedder.norm2.bias": "img_emb.proj.4.bias",
    "condition_embedder.image_embedder.pos_embed": "img_emb.emb_pos",
    "scale_shift_table": "head.modulation",
    "proj_out.bias": "head.head.bias",
    "proj_out.weight": "head.head.weight",
}
# (diffusers substring, MindSpeed-MM substring) inside the blocks, applied in this order.
BLOCK_PARTS: tuple[tuple[str, str], ...] = (
    ("attn1.norm_q", "self_attn.q_norm"),
    ("attn1.norm_k", "self_attn.k_norm"),
    ("attn2.norm_q", "cross_attn.q_norm"),
    ("attn2.norm_k", "cross_attn.k_norm"),
    ("attn1.to_q.", "self_attn.proj_q."),
    ("attn1.to_k.", "self_attn.proj_k."),
    ("attn1.to_v.", "self_attn.proj_v."),
    ("attn1.to_out.0.", "self_attn.proj_out."),
    ("attn2.to_q.", "cross_attn.proj_q."),
    ("attn2.to_k.", "cross_attn.proj_k."),
    ("attn2.to_v.", "cross_attn.proj_v."),
    ("attn2.add_k_proj", "cross_attn.k_img"),
    ("attn2.add_v_proj", "cross_attn.v_img"),
    ("attn2.norm_added_k", "cross_attn.k_norm_img"),
    ("attn2.to_out.0.", "cross_attn.proj_out."),
    (".ffn.net.0.proj.", ".ffn.0."),
    (".ffn.net.2.", ".ffn.2."),
    ("scale_shift_table", "modulation"),
    (".norm2.", ".norm3."),  # the cross-attention LayerNorm (MindSpeed-MM's norm2 is the FFN's, weightless)
)
# MindSpeed-MM's LoRA target module names -> the diffusers modules they select.
LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "proj_q": ("to_q",), "proj_k": ("to_k",), "proj_v": ("to_v",), "proj_out": ("to_out.0",),
    "ffn.0": ("ffn.net.0.proj",), "ffn.2": ("ffn.net.2",),
}
_FROM_WHOLE = {mindspeed: diffusers for diffusers, mindspeed in WHOLE_NAMES.items()}
# Reverse substitutions, longest MindSpeed-MM substring first: `cross_attn.k_norm_img` before `cross_attn.k_norm`.
_FROM_PARTS = tuple(sorted(((m, d) for d, m in BLOCK_PARTS), key=lambda pair: -len(pair[0])))


def to_mindspeed(name: str) -> str:
    """A diffusers (mmrun) parameter name as MindSpeed-MM's WanDiT names it."""
    if name in WHOLE_NAMES:
        return WHOLE_NAMES[name]
    for diffusers, mindspeed in BLOCK_PARTS:
        name = name.replace(diffusers, mindspeed)
    return name


def from_mindspeed(name: str) -> str:
    """A MindSpeed-MM WanDiT parameter name as diffusers (and mmrun) name it."""
    if name in _FROM_WHOLE:
        return _FROM_WHOLE[name]
    for mindspeed, diffusers in _FROM_PARTS:
        if mindspeed in name:
            return name.replace(mindspeed, diffusers)
    return name


def lora_targets_from_mindspeed(targets: list[str] | tuple[str, ...]) -> list[str]:
    """MindSpeed-MM's `--lora-target-modules` as diffusers module names (names it does not know pass as given)."""
    out: list[str] = []
    for target in targets:
        for name in LORA_TARGETS.get(target, (target,)):
            if name not in out:
                out.append(name)
    return out
