"""The blocks the Qwen vision-language families share, written once against the portable API: the ViT's patch
embedding and attention (fused qkv, 2-D rotary in fp32, attention within each frame or window), the merge of
vision features at their placeholder tokens, MindSpeed-MM's freezing of the three parts, the causal-LM loss and
the seeded framework-independent init. Configs are duck-typed (Qwen2-VL's, Qwen3-VL's, ...): `config.vision`
sizes, the token ids, `config.text.initializer_range`.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mmrun.backend import nn, ops, tensors
from mmrun.models.transformer_blocks import apply_rotary
from mmrun.models.vlm import vision_layout

IGNORE_INDEX = -100
# The three parts `freeze` switches, by parameter-name prefix (MindSpeed-MM's names for them).
VISION_PROJECTOR_PREFIX = "visual.merger."
VISION_ENCODER_PREFIX = "visual."
TRUNCATION_HINT = ("the sequence cut-off (--seq-length) probably truncated an image or video; raise --seq-length "
                   "or lower image_max_pixels / video_max_pixels")


class VisionPatchEmbed(nn.Module):
    """Patches (N, in_channels*temporal*patch*patch) -> (N, D) by `proj`, a bias-free Linear: the
    checkpoint's Conv3d(kernel = stride = (2, 14, 14)) weight (D, 3, 2, 14, 14) reshaped to (D, 1176)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.proj = nn.Linear(config.patch_dim, config.hidden_size, bias=False)

    def forward(self, pixel_values):
        if pixel_values.dtype != self.proj.weight.dtype:  # the pipeline may send fp32 pixels to a bf16 model
            pixel_values = tensors.cast(pixel_values, self.proj.weight.dtype)
        return self.proj(pixel_values)


class VisionAttention(nn.Module):
    """Bidirectional attention inside each segment (frame or window), fused qkv with bias, 2-D rotary in fp32."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x, cos, sin, cu_seqlens: np.ndarray):
        n = x.shape[0]
        q, k, v = (ops.reshape(t, (n, self.num_heads, self.head_dim)) for t in self.project_qkv(x))
        # transformers rotates the vision q/k in fp32 and casts back (apply_rotary_pos_emb_vision).
        dtype = q.dtype
        q = tensors.cast(apply_rotary(tensors.cast(q, "float32"), cos, sin), dtype)
        k = tensors.cast(apply_rotary(tensors.cast(k, "float32"), cos, sin), dtype)
        # Host boundaries, or (the fixed-shape batch of a compiled step) a device tensor of segment ids.
        y = (ops.varlen_attention(q, k, v, cu_seqlens, scale=self.head_dim ** -0.5)
             if isinstance(cu_seqlens, np.ndarray) else
             ops.segment_attention(q, k, v, cu_seqlens, scale=self.head_dim ** -0.5))
        return self.proj(ops.reshape(y, (n, self.num_heads * self.head_dim)))

    def project_qkv(self, x):
        """(q, k, v), each (N, D): the fused projection split (Qwen2.5-Omni's ViT overrides it: three Linears)."""
        return ops.split(self.qkv(x), x.shape[1], dim=-1)


def vision_rotary(positions: np.ndarray, inv_freq: np.ndarray) -> tuple[Any, Any]:
    """The ViT's 2-D rotary: cos, sin (patches, 1, head_dim) fp32 from (patches, 2) (row, column) positions: the
    row angles, then the column angles, twice (rotate_half's halves)."""
    return rotary_of_positions(tensors.from_numpy(positions), inv_freq)


def rotary_of_positions(positions: Any, inv_freq: np.ndarray) -> tuple[Any, Any]:
    """vision_rotary of a device tensor of positions (patches, 2)."""
    angles = ops.reshape(tensors.cast(positions, "float32"), (-1, 2, 1)) * ops.reshape(
        tensors.from_numpy(inv_freq), (1, 1, -1))
    half = ops.reshape(angles, (positions.shape[0], -1))  # [row freqs | column freqs]
    full = ops.cat([half, half], dim=-1)
    n = positions.shape[0]
    return ops.reshape(ops.cos(full), (n, 1, -1)), ops.reshape(ops.sin(full), (n, 1, -1))


def _world_size() -> int:
    from mmrun.backend import distributed

    return distributed.get_world_size()


def merge_vision(config: Any, visual: Any, training: bool, input_ids, embeds, pixel_values, image_grid,
                 pixel_values_videos, video_grid, blank_on_one_process: bool = False):
    """Put the ViT's features where the image / video pad tokens are (sequence length unchanged). `visual`:
    (pixels, grid) -> features, this model's ViT or a tensor-parallel one; grids as numpy (grid_array).
    blank_on_one_process: a training batch without images runs the blank ViT pass on one process too (the parallel
    engines: megatron-core's DDP with --overlap-grad-reduce waits for every parameter's gradient hook)."""
    unit = config.vision.spatial_merge_size ** 2
    batch, seq, hidden = embeds.shape
    ids = ops.reshape(input_ids, (batch * seq,))
    parts, grids, counts = [], [], []
    for name, token, pixels, grid in (("image", config.image_token_id, pixel_values, image_grid),
                                      ("video", config.video_token_id, pixel_values_videos, video_grid)):
        is_token = tensors.cast(ids == token, "int64")
        found = int(tensors.to_numpy(ops.sum(is_token)))
        if pixels is None:
            if found:
                raise ValueError(f"input_ids hold {found} {name} tokens (id {token}) but no {name} pixel values "
                                 f"were given; pass pixel_values{'_videos' if name == 'video' else ''} and "
                                 f"{name}_grid_thw for them")
            continue
        if grid is None:
            raise ValueError(f"{name} pixel values were given without {name}_grid_thw; pass the processor's grid")
        features = int(vision_layout.patch_counts(grid).sum()) // unit
        if found != features:
            raise ValueError(f"{name} tokens and features do not match: input_ids hold {found} {name} tokens "
                             f"(id {token}), the {len(grid)} {name}(s) give {features} features; {TRUNCATION_HINT}")
        parts.append(pixels)
        grids.append(grid)
        counts.append((is_token, features))
    if not parts:
        if _world_size() == 1 and not (training and blank_on_one_process):
            # One process: no collectives to keep in step. The ViT's parameters get no gradient here; the training
            # steps give them zeros (PyTorch's TrainStep and value_and_grad zero-fill, MindSpore's value_and_grad
            # returns zeros), so AdamW updates them as with the blank pass below and as on several ranks.
            return embeds
        # Training without images on several ranks still runs the ViT, on one blank 2x2 image whose result counts
        # zero times: every data-parallel / FSDP rank then runs the same collectives and reduces the same gradients
        # (MindSpeed-MM's fake image, megatron-core's dummy ViT input); the loss and the weights are unchanged.
        # Evaluation too when there are several ranks: FSDP2 all-gathers the ViT's shards in every forward.
        merge = config.vision.spatial_merge_size
        blank = visual(ops.zeros((unit, config.vision.patch_dim), like=embeds), np.array([[1, merge, merge]]))
        return embeds + tensors.cast(ops.sum(blank), embeds.dtype) * 0.0
    # One ViT pass over images and videos together: attention stays within each frame either way.
    pixels = parts[0] if len(parts) == 1 else ops.cat(
        [p if p.dtype == parts[0].dtype else tensors.cast(p, parts[0].dtype) for p in parts], dim=0)
    vision = visual(pixels, np.concatenate(grids, axis=0))
    if vision.dtype != embeds.dtype:
        vision = tensors.cast(vision, embeds.dtype)
    return place_features(ids, embeds, vision, counts)


def place_features(ids, embeds, vision, counts):
    """embeds with each modality's tokens replaced by its rows of `vision` (in token order); counts: (is_token
    int64 (B*S,), number of features) per modality, in the order of vision's rows."""
    batch, seq, hidden = embeds.shape
    # Row r of the result: text row r, or vision row (features before this modality) + (k-th token of it).
    position = ops.arange(batch * seq, like=ids)
    index, before = position, batch * seq
    for is_token, features in counts:
        index = index + is_token * (before + ops.cumsum(is_token, 0) - 1 - position)
        before += features
    table = ops.cat([ops.reshape(embeds, (batch * seq, hidden)), vision], dim=0)
    return ops.reshape(ops.embedding(index, table), (batch, seq, hidden))


def place_fixed_features(config: Any, input_ids, embeds, vision):
    """embeds with the image and video tokens' rows replaced by `vision`, in order: a fixed-shape batch's ViT
    features (models/qwen2_vl/modeling.py merge_fixed_vision, Qwen3-VL's embed_fixed), the images' rows first, then
    the videos' (models/pretrain_vlm.py fixed_shape_collate's order), padding rows unused. The images' row count
    is the image tokens' count, summed on the device (the data path checked tokens against features)."""
    batch, seq, _ = embeds.shape
    ids = ops.reshape(input_ids, (batch * seq,))
    if vision.dtype != embeds.dtype:
        vision = tensors.cast(vision, embeds.dtype)
    is_image = tensors.cast(ids == config.image_token_id, "int64")
    return place_features(ids, embeds, vision, [(is_image, ops.sum(is_image)),
                                                (tensors.cast(ids == config.video_token_id, "int64"), 0)])


def parameter_part(name: str, encoder_prefix: str = VISION_ENCODER_PREFIX,
                   projector_prefix: str = VISION_PROJECTOR_PREFIX) -> str:
    """Which of the three freezable parts a parameter belongs to (the prefixes: this model's names)."""
    if name.startswith(projector_prefix):
        return "vision_projector"
    if name.startswith(encoder_prefix):
        return "vision_encoder"
    return "text_decoder"


def freeze_parts(model: Any, wanted: Mapping[str, bool], prefixes: tuple[str, str] = (VISION_ENCODER_PREFIX,
                 VISION_PROJECTOR_PREFIX), never_frozen: tuple[str, ...] = ()) -> dict:
    """MindSpeed-MM's model.freeze over `model`'s parameters: a part wanted frozen gets requires_grad False (no
    gradient, no optimizer state), except names starting with `never_frozen`; the rest requires_grad True.
    `prefixes`: (vision encoder, vision projector) name prefixes. Returns {part: number of parameters frozen}."""
    frozen = dict.fromkeys(wanted, 0)
    for name, param in model.named_parameters():
        part = parameter_part(name, *prefixes)
        off = wanted[part] and not name.startswith(never_frozen)
        (nn.freeze if off else nn.unfreeze)([param])
        frozen[part] += int(off)
    return frozen


def causal_lm_loss(logits, labels, per_token: bool = False) -> dict:
    """Shifted next-token cross-entropy in fp32 over labels != -100 (see the model's docstring for the keys)."""
    batch, seq, vocab = logits.shape
    # labels shifted left by one, the last position of each row ignored: token s predicts labels[s + 1].
    tail = ops.split(labels, [1, seq - 1], dim=1)[1] if seq > 1 else None
    pad = ops.ones((batch, 1), dtype=labels.dtype, like=labels) * IGNORE_INDEX
    shifted = ops.reshape(pad if tail is None else ops.cat([tail, pad], dim=1), (batch * seq,))
    flat = ops.reshape(logits, (batch * seq, vocab))
    if not per_token:
        return {"loss": ops.cross_entropy(flat, shifted, ignore_index=IGNORE_INDEX, reduction="mean")}
    total = ops.cross_entropy(flat, shifted, ignore_index=IGNORE_INDEX, reduction="sum")
    return {"loss": total, "num_tokens": ops.sum(tensors.cast(shifted != IGNORE_INDEX, "int64"))}


def host_array(value: Any) -> np.ndarray | None:
    """A tensor, array or list as numpy (None stays None); a device tensor is copied to the host."""
    if value is None or isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple, int, float)):
        return np.asarray(value)
    return tensors.to_numpy(value)


def init_weights(model: Any, seed: int, std: float | None = None) -> None:
    """Deterministic, framework-independent init (mm_layout.initial_value: each weight N(0, std) drawn by numpy
    from (seed, its name), norm weights 1, biases 0), so PyTorch and MindSpore, and every tensor/pipeline-parallel
    layout, start from identical weights whatever their parameter order. std defaults to the text config's
    initializer_range (transformers' default init)."""
    from mmrun.models.vlm.mm_layout import initial_value

    std = model.config.text.initializer_range if std is None else std
    state = {name: initial_value(name, tuple(param.shape), seed, std) for name, param in model.named_parameters()}
    model.load_state_dict(tensors.state_dict_from_numpy(state))
