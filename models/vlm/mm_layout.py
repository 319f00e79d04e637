"""The Qwen vision-language families split over tensor- and pipeline-parallel ranks, with MindSpeed-MM's names.

Each family gives its own tensors and how MindSpeed-MM's are made of them (its mm_layout part: `hf_shapes`,
`recipes`; models/families.py); the split, the fusing and the initial values below serve them all. Below,
Qwen2-VL / Qwen2.5-VL's names (Qwen3-VL's differ in the ViT: models/qwen3_vl/mm_layout.py).

The one definition of the parallel VLM's tensors, framework-free (numpy): `mmrun convert` writes checkpoints
with it, and both parallel engines (megatron-core on PyTorch, Megatron's design on MindSpore) name, shape and
initialise their parameters from it, so a checkpoint written by either loads in the other.

Names are MindSpeed-MM's (its mm-convert `hf_to_mm`), which are megatron-core's local-spec names under three
prefixes; layer numbers are local to each pipeline stage (from 0), as megatron-core and mm-convert write them:

    image_encoder.encoder.patch_embed.proj.weight          (D, 1176) replicated: HF's Conv3d kernel (D, 3, 2, 14, 14),
                                                            flattened as mmrun's models keep it (same bytes)
    image_encoder.encoder.blocks.layers.N.input_layernorm / pre_mlp_layernorm     HF norm1 / norm2
    image_encoder.encoder.blocks.layers.N.self_attention.linear_qkv   HF attn.qkv, rows per head [q_h k_h v_h]
    image_encoder.encoder.blocks.layers.N.self_attention.linear_proj  HF attn.proj
    image_encoder.encoder.blocks.layers.N.mlp.linear_fc1 / linear_fc2 HF mlp.fc1 / fc2; Qwen2.5-VL: [gate; up] / down
    image_encoder.projector.layernorm                      HF merger.ln_q
    image_encoder.projector.encoder.linear_fc1 / linear_fc2                       HF merger.mlp.0 / mlp.2
    text_decoder.embedding.word_embeddings.weight          HF model.embed_tokens
    text_decoder.decoder.layers.N.input_layernorm / pre_mlp_layernorm             HF input / post_attention_layernorm
    text_decoder.decoder.layers.N.self_attention.linear_qkv  HF q/k/v_proj fused per query group g: [q heads of g; k_g; v_g]
    text_decoder.decoder.layers.N.self_attention.linear_proj HF o_proj
    text_decoder.decoder.layers.N.mlp.linear_fc1 / linear_fc2                     HF [gate_proj; up_proj] / down_proj
    text_decoder.decoder.final_layernorm                   HF model.norm
    text_decoder.output_layer.weight                       HF lm_head; with tied embeddings and 2+ stages, the last
                                                           stage's copy of the word embeddings (as megatron-core)

Tensor parallelism (megatron-core's): column-parallel tensors split on dim 0 (the fused QKV gives each rank whole
query groups / heads; a fused gate/up gives rank r [gate_r; up_r]), row-parallel weights on dim 1 with their biases
replicated, embeddings and the output layer on the vocabulary; norms and the patch embedding are replicated.

Pipeline parallelism: `vit_pp_layers` / `llm_pp_layers` hold one layer count per stage (MindSpeed-MM's model.json
`pipeline_num_layers`, mm-convert's `--cfg.parallel_config.vit_pp_layers` / `llm_pp_layers`). mmrun keeps the whole
ViT and its projector on the first stage, next to the word embeddings, and every stage holds at least one decoder
layer: the vision features then never cross stages, and each stage sends the same [seq, batch, hidden] activations.

Virtual pipeline stages (VPP): MindSpeed-MM writes pipeline_num_layers as a list of lists, outer = virtual chunk,
inner = pipeline rank (vit [[2, 0], [0, 0]], llm [[1, 1], [1, 1]]); the forward order is chunk-major (rank 0 chunk 0,
rank 1 chunk 0, ..., rank 0 chunk 1, ...), megatron-core's pipeline_model_parallel_layout order. The layout keeps
them flat in that order (`vit_pp_layers[v * pp + r]`) with `vpp` chunks; the ViT sits on the very first virtual
stage and every virtual stage holds a decoder layer. A rank's tensors of chunk v are named `model{v}.` + the local
name (megatron-core engine's checkpoint names), layer numbers local to each virtual stage; a flat list is vpp = 1.
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from mmrun.backend.errors import UsageError

VISION = "image_encoder.encoder."
VISION_LAYERS = VISION + "blocks.layers."
PROJECTOR = "image_encoder.projector."
TEXT = "text_decoder."
TEXT_LAYERS = TEXT + "decoder.layers."
WORD_EMBEDDINGS = TEXT + "embedding.word_embeddings.weight"
OUTPUT_LAYER = TEXT + "output_layer.weight"
PARTS = ("vit", "llm")
_FLAGS = {"vit": "image_encoder.vision_encoder", "llm": "text_decoder"}  # model.json's section of each part
_CHUNK = re.compile(r"model(\d+)\.")  # a virtual chunk's name prefix, as the megatron-core engine writes it
_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.")  # megatron-core's expert k of a MoE layer

# How a tensor splits over tensor-parallel ranks.
COLUMN, ROW, GLU, REPLICATED = "column", "row", "glu", "replicated"

# (q_norm, k_norm: Qwen3-VL's per-head norms, which initial_value serves too.)
_HF_NORM_MODULES = frozenset({"norm1", "norm2", "ln_q", "input_layernorm", "post_attention_layernorm", "norm",
                              "q_norm", "k_norm"})
_NORM_MODULES = ("layernorm",)  # every MindSpeed-MM norm module name ends so: input_/pre_mlp_/final_layernorm, layernorm


class LayoutError(UsageError):
    """Sizes or per-stage layer counts that the model cannot be split into (one line; exit 2)."""


# ------------------------------------------------------------------------------------------ the model's tensors

def _family(config: Any) -> Any:
    """The family's own name tables (its `mm_layout` part in models/families.py): hf_shapes and recipes."""
    from mmrun.models import families

    return families.part(config, "mm_layout")


def hf_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """Every parameter of the model in mmrun's (Hugging Face hub) names, with its shape, in checkpoint order."""
    return _family(config).hf_shapes(config)


@dataclass(frozen=True)
class Recipe:
    """How one MindSpeed-MM tensor is made of Hugging Face tensors: `sources` joined by `fuse`."""

    sources: tuple[str, ...]
    fuse: str  # "copy", "qkv" (interleave rows per group), "concat" (gate; up), "expert" (one of fused experts),
    #            "qkv_zero_k" (qkv from q and v, k zeros: Qwen2.5-Omni's audio attention has no k bias)
    groups: int = 1  # qkv: query groups (text) or heads (vision); expert: the expert's (global) number


def _recipes(config: Any) -> dict[str, Recipe]:
    """MindSpeed-MM name -> recipe, for the whole model (global layer numbers), in MindSpeed-MM's order."""
    return _family(config).recipes(config)


def _fuse(recipe: Recipe, parts: Sequence[np.ndarray]) -> np.ndarray:
    if recipe.fuse == "copy":
        return parts[0]
    if recipe.fuse == "expert":
        return parts[0][recipe.groups]
    if recipe.fuse == "concat":
        return np.concatenate(parts, axis=0)
    g = recipe.groups
    if recipe.fuse == "qkv_zero_k":
        parts = [parts[0], np.zeros_like(parts[0]), parts[1]]
    if len(parts) == 1:  # the ViT's qkv: [Q; K; V], each `heads` row blocks -> per head [q_h; k_h; v_h]
        q, k, vv = np.split(parts[0], 3, axis=0)
    else:
        q, k, vv = parts
    blocks = [x.reshape(g, x.shape[0] // g, *x.shape[1:]) for x in (q, k, vv)]
    return np.concatenate(blocks, axis=1).reshape(-1, *q.shape[1:])


def _unfuse(recipe: Recipe, fused: np.ndarray, shapes: Mapping[str, tuple[int, ...]]) -> list[np.ndarray]:
    if recipe.fuse in ("copy", "expert"):  # expert: one slice, stacked by _hf_stream
        return [fused]
    if recipe.fuse == "concat":
        return np.split(fused, 2, axis=0)
    g = recipe.groups
    if len(recipe.sources) == 1 or recipe.fuse == "qkv_zero_k":
        q_rows = kv_rows = fused.shape[0] // 3
    else:
        q_rows, kv_rows = shapes[recipe.sources[0]][0], shapes[recipe.sources[1]][0]
    grouped = fused.reshape(g, (q_rows + 2 * kv_rows) // g, *fused.shape[1:])
    q, k, vv = np.split(grouped, [q_rows // g, (q_rows + kv_rows) // g], axis=1)
    q, k, vv = (x.reshape(-1, *fused.shape[1:]) for x in (q, k, vv))
    if recipe.fuse == "qkv_zero_k":
        return [q, vv]
    return [np.concatenate([q, k, vv], axis=0)] if len(recipe.sources) == 1 else [q, k, vv]


def hf_to_mm(config: Any, read_hf: Callable[[str], np.ndarray]) -> Iterator[tuple[str, np.ndarray]]:
    """The whole model in MindSpeed-MM's names, one tensor at a time (`read_hf(name)` gives an HF tensor, any
    dtype: bf16 bits travel untouched), so memory holds a few tensors, never the model."""
    last: dict[str, np.ndarray] = {}  # the fused experts tensor read last: each expert is one slice of it

    def read(source: str) -> np.ndarray:
        if source not in last:
            last.clear()
            last[source] = read_hf(source)
        return last[source]

    for name, recipe in _recipes(config).items():
        yield name, np.ascontiguousarray(_fuse(recipe, [read(s) for s in recipe.sources]))


def mm_to_hf(config: Any, read_mm: Callable[[str], np.ndarray]) -> Iterator[tuple[str, np.ndarray]]:
    """The inverse of hf_to_mm, one MindSpeed-MM tensor read at a time; yields HF names in checkpoint order
    of the MindSpeed-MM tensors (hf_shapes gives the canonical order)."""
    return hf_stream(config, ((name, read_mm(name)) for name in _recipes(config)))


def hf_stream(config: Any, items: Iterable[tuple[str, np.ndarray]]) -> Iterator[tuple[str, np.ndarray]]:
    """Whole MindSpeed-MM tensors (global names, model order) -> the Hugging Face tensors they hold; the experts
    of one fused tensor (Recipe "expert") come one by one and leave stacked once the last has come."""
    recipes, shapes = _recipes(config), hf_shapes(config)
    experts: dict[str, list[np.ndarray]] = {}
    for name, whole in items:
        recipe = recipes[name]
        if recipe.fuse == "expert":
            source = recipe.sources[0]
            experts.setdefault(source, []).append(whole)
            if len(experts[source]) == shapes[source][0]:
                yield source, np.stack(experts.pop(source))
            continue
        for source, part in zip(recipe.sources, _unfuse(recipe, whole, shapes)):
            yield source, np.ascontiguousarray(part)


def hf_sources(config: Any) -> dict[str, tuple[str, ...]]:
    """MindSpeed-MM name (global) -> the Hugging Face tensors it is made of, for the whole model."""
    return {name: recipe.sources for name, recipe in _recipes(config).items()}


def hf_parts(config: Any, name: str, array: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """The Hugging Face tensors (name, array) that one whole MindSpeed-MM tensor (global name) holds: mm_to_hf for
    one tensor (one expert of a fused experts tensor is none: hf_stream stacks them)."""
    return list(hf_stream(config, [(name, array)]))


# ------------------------------------------------------------------------------------------ the split

def _even_split(total: int, stages: int) -> tuple[int, ...]:
    base, extra = divmod(total, stages)
    return tuple(base + (1 if s >= stages - extra else 0) for s in range(stages))  # the remainder on later stages


def chunk_prefix(vp_stage: int, vpp: int) -> str:
    """The name prefix of virtual chunk `vp_stage`'s tensors: `model{v}.` with 2+ chunks, none with one."""
    return f"model{vp_stage}." if vpp > 1 else ""


def _virtual_stages(layers: Sequence[Any], part: str, pp: int) -> tuple[tuple[int, ...], int]:
    """model.json's pipeline_num_layers (flat: one count per stage; nested: one list per virtual chunk, each one
    count per stage) -> (counts per virtual stage in forward order, chunks)."""
    if layers and all(isinstance(chunk, (list, tuple)) for chunk in layers):
        for chunk in layers:
            if len(chunk) != pp:
                raise LayoutError(f"{_FLAGS[part]}.pipeline_num_layers {_show(layers)} has a virtual chunk of "
                                  f"{len(chunk)} entries for {pp} pipeline stages (--pipeline-model-parallel-size "
                                  f"{pp}); give each chunk one count per stage")
        return tuple(int(n) for chunk in layers for n in chunk), len(layers)
    if any(isinstance(n, (list, tuple)) for n in layers):
        raise LayoutError(f"{_FLAGS[part]}.pipeline_num_layers {_show(layers)} mixes counts and lists; give one "
                          "count per stage, or one list per virtual chunk")
    return tuple(int(n) for n in layers), 1


def virtual_chunks(layers: Sequence[Any] | None) -> int:
    """How many virtual chunks per stage a pipeline_num_layers list gives: its outer length when it holds lists
    (MindSpeed-MM's VPP form), else 1 (flat, or absent)."""
    return len(layers) if layers and all(isinstance(chunk, (list, tuple)) for chunk in layers) else 1


def stages_given(layers: Sequence[Any] | None) -> int:
    """How many pipeline stages a pipeline_num_layers list is written for (0 when absent)."""
    if not layers:
        return 0
    return len(layers[0]) if isinstance(layers[0], (list, tuple)) else len(layers)


def _show(layers: Sequence[Any]) -> str:
    return str([list(chunk) if isinstance(chunk, (list, tuple)) else chunk for chunk in layers])


@dataclass(frozen=True)
class VLMLayout:
    """One Qwen2-VL model split over `tp` tensor-parallel ranks, pipeline stages and `vpp` virtual chunks per
    stage: `vit_pp_layers` / `llm_pp_layers` hold one count per virtual stage in forward order (chunk-major)."""

    config: Any
    tp: int
    vit_pp_layers: tuple[int, ...]
    llm_pp_layers: tuple[int, ...]
    vpp: int = 1

    @classmethod
    def build(cls, config: Any, tp: int = 1, pp: int = 1, vit_pp_layers: Sequence[Any] | None = None,
              llm_pp_layers: Sequence[Any] | None = None, vpp: int | None = None) -> "VLMLayout":
        """The layout, checked (LayoutError names what does not fit). The lists are MindSpeed-MM's (flat, or one
        list per virtual chunk); `vpp` is the run's --virtual-pipeline-model-parallel-size (None: the lists say).
        Lists left out default to the whole ViT on the first stage and the decoder layers split evenly over the
        virtual stages (the remainder on the later ones)."""
        given = {part: _virtual_stages(layers, part, pp) for part, layers in (("vit", vit_pp_layers),
                                                                              ("llm", llm_pp_layers))
                 if layers is not None}
        chunks = {part: v for part, (_, v) in given.items()}
        if len(set(chunks.values())) > 1:
            raise LayoutError(f"image_encoder.vision_encoder.pipeline_num_layers {_show(vit_pp_layers or [])} and "
                              f"text_decoder.pipeline_num_layers {_show(llm_pp_layers or [])} give {chunks['vit']} and "
                              f"{chunks['llm']} virtual chunks; give both the same form")
        found = next(iter(chunks.values()), None)
        if vpp is not None and found is not None and found != vpp:
            part = next(iter(chunks))
            lists = {"vit": vit_pp_layers, "llm": llm_pp_layers}[part] or []
            raise LayoutError(f"{_FLAGS[part]}.pipeline_num_layers {_show(lists)} "
                              f"holds {found} virtual chunk{'s' if found > 1 else ''} per stage, but the run has "
                              f"--virtual-pipeline-model-parallel-size {vpp}; pass {found}, or give "
                              f"{'one list per virtual chunk' if vpp > 1 else 'one flat count per stage'}")
        vpp = int(vpp or found or 1)
        stages = pp * vpp
        vit = given["vit"][0] if "vit" in given else (config.vision.depth,) + (0,) * (stages - 1)
        llm = given["llm"][0] if "llm" in given else _even_split(config.text.num_hidden_layers, stages)
        layout = cls(config, int(tp), vit, llm, vpp)
        layout.check(pp)
        return layout

    @property
    def pp(self) -> int:
        return len(self.llm_pp_layers) // self.vpp

    def pipeline_num_layers(self, part: str) -> list[Any]:
        """`part`'s counts as model.json writes them: flat per stage, or one list per virtual chunk (vpp > 1)."""
        counts = list({"vit": self.vit_pp_layers, "llm": self.llm_pp_layers}[part])
        if self.vpp == 1:
            return counts
        return [counts[v * self.pp:(v + 1) * self.pp] for v in range(self.vpp)]

    def _as_written(self, part: str, counts: Sequence[int]) -> list[Any]:
        """Flat per-virtual-stage `counts` of `part` as model.json writes them (for the errors' suggestions)."""
        return VLMLayout(self.config, self.tp, tuple(counts) if part == "vit" else self.vit_pp_layers,
                         tuple(counts) if part == "llm" else self.llm_pp_layers, self.vpp).pipeline_num_layers(part)

    def check(self, pp: int | None = None) -> None:
        """One-line LayoutError for the first thing the split cannot hold."""
        v, t = self.config.vision, self.config.text
        pp = self.pp if pp is None else pp
        stages = pp * self.vpp
        if self.vpp > 1 and pp < 2:
            raise LayoutError(f"virtual pipeline stages ({self.vpp} chunks per stage) need "
                              f"--pipeline-model-parallel-size 2 or more; received {pp}")
        for what, part, total in (("vision", "vit", v.depth), ("text", "llm", t.num_hidden_layers)):
            layers, flag = {"vit": self.vit_pp_layers, "llm": self.llm_pp_layers}[part], _FLAGS[part]
            shown = self.pipeline_num_layers(part) if len(layers) == stages else list(layers)
            if len(layers) != stages:
                raise LayoutError(f"{flag}.pipeline_num_layers {list(layers)} has {len(layers)} entries for "
                                  f"{pp} pipeline stages (--pipeline-model-parallel-size {pp}); give one per stage")
            if sum(layers) != total or min(layers) < 0:
                raise LayoutError(f"{flag}.pipeline_num_layers {shown} sums to {sum(layers)}, but the {what} "
                                  f"model has {total} layers; make the counts add up to {total}")
        where = "stage" if self.vpp == 1 else "virtual stage (chunk 0 of stage 0)"
        if any(self.vit_pp_layers[1:]):
            raise LayoutError(f"image_encoder.vision_encoder.pipeline_num_layers {self.pipeline_num_layers('vit')} "
                              f"puts ViT layers after the first {where}; mmrun keeps the whole ViT on stage 0: give "
                              f"{self._as_written('vit', [v.depth] + [0] * (stages - 1))}")
        if min(self.llm_pp_layers) < 1:
            raise LayoutError(f"text_decoder.pipeline_num_layers {self.pipeline_num_layers('llm')} leaves a "
                              f"{'stage' if self.vpp == 1 else 'virtual stage'} without decoder layers; give every "
                              f"{'stage' if self.vpp == 1 else 'virtual stage'} at least one")
        needs = {"vision num_attention_heads": v.num_heads, "vision ffn_hidden_size": v.intermediate_size,
                 "projector ffn_hidden_size": v.hidden_size * v.spatial_merge_size ** 2,
                 "text num_attention_heads": t.num_attention_heads, "text num_query_groups": t.num_key_value_heads,
                 "text ffn_hidden_size": t.intermediate_size, "vocab_size": t.vocab_size,
                 **getattr(_family(self.config), "tp_sizes", lambda config: {})(self.config)}
        for what, size in needs.items():
            if self.tp < 1 or size % self.tp:
                raise LayoutError(f"{what} {size} is not divisible by --tensor-model-parallel-size {self.tp}; "
                                  f"use a tensor-parallel size that divides it")

    # ------------------------------------------------------------------ stages

    def stage_layers(self, part: str, pp_rank: int, vp_stage: int = 0) -> range:
        """Global layer indices of `part` ("vit" or "llm") on pipeline stage `pp_rank`, virtual chunk `vp_stage`."""
        counts = {"vit": self.vit_pp_layers, "llm": self.llm_pp_layers}[part]
        index = vp_stage * self.pp + pp_rank
        start = sum(counts[:index])
        return range(start, start + counts[index])

    def split_chunk(self, local_name: str) -> tuple[int, str]:
        """(virtual chunk, name inside the chunk) of a rank's tensor name (chunk 0, the name itself, at vpp 1)."""
        found = _CHUNK.match(local_name) if self.vpp > 1 else None
        return (int(found.group(1)), local_name[found.end():]) if found else (0, local_name)

    @property
    def ties_output_copy(self) -> bool:
        """Tied embeddings over 2+ stages: the last stage holds its own copy as output_layer (megatron-core)."""
        return self.config.tie_word_embeddings and self.pp > 1

    def _stage_of(self, name: str) -> tuple[int, str]:
        """(pipeline stage, local name) of a global MindSpeed-MM name."""
        last = (self.pp - 1, chunk_prefix(self.vpp - 1, self.vpp))
        for prefix, part in ((VISION_LAYERS, "vit"), (TEXT_LAYERS, "llm")):
            if name.startswith(prefix):
                index, _, rest = name[len(prefix):].partition(".")
                layer = int(index)
                for chunk in range(self.vpp):
                    for stage in range(self.pp):
                        layers = self.stage_layers(part, stage, chunk)
                        if layer in layers:
                            return stage, f"{chunk_prefix(chunk, self.vpp)}{prefix}{layer - layers.start}.{rest}"
                raise KeyError(name)
        if name.startswith(TEXT + "decoder.final_layernorm.") or name == OUTPUT_LAYER:
            return last[0], last[1] + name
        return 0, chunk_prefix(0, self.vpp) + name  # the ViT's and projector's other tensors, the word embeddings

    def locate(self, name: str) -> list[tuple[int, str]]:
        """Where a global tensor lives: [(pipeline stage, local name)], two places for tied embeddings over
        2+ stages (the last stage's copy is its output_layer)."""
        places = [self._stage_of(name)]
        if name == WORD_EMBEDDINGS and self.ties_output_copy:
            places.append((self.pp - 1, chunk_prefix(self.vpp - 1, self.vpp) + OUTPUT_LAYER))
        return places

    def global_name(self, pp_rank: int, local_name: str) -> str:
        """The inverse of locate for one place (the tied copy maps to output_layer: it is no tensor of the HF
        model)."""
        chunk, local_name = self.split_chunk(local_name)
        for prefix, part in ((VISION_LAYERS, "vit"), (TEXT_LAYERS, "llm")):
            if local_name.startswith(prefix):
                index, _, rest = local_name[len(prefix):].partition(".")
                return f"{prefix}{self.stage_layers(part, pp_rank, chunk).start + int(index)}.{rest}"
        return local_name

    def full_shapes(self) -> dict[str, tuple[int, ...]]:
        """The whole model (TP=1) in global MindSpeed-MM names and order; the tied copy excluded."""
        hf = hf_shapes(self.config)
        return {name: _fused_shape(recipe, hf) for name, recipe in _recipes(self.config).items()}

    def rank_shapes(self, tp_rank: int, pp_rank: int) -> dict[str, tuple[int, ...]]:
        """What rank (tp_rank, pp_rank) holds: local name -> shard shape, chunk by chunk in the model's order."""
        del tp_rank  # every tensor-parallel rank holds the same shapes
        out: dict[str, tuple[int, ...]] = {}
        for name, shape in self.full_shapes().items():
            for stage, local in self.locate(name):
                if stage == pp_rank:
                    out[local] = self.shard_shape(name, shape)
        copy = chunk_prefix(self.vpp - 1, self.vpp) + OUTPUT_LAYER
        if self.ties_output_copy and pp_rank == self.pp - 1:
            out[copy] = out.pop(copy)  # the copy sits last, where an untied output layer would
        return dict(sorted(out.items(), key=lambda item: self.split_chunk(item[0])[0]))  # stable: model order

    # ------------------------------------------------------------------ tensor parallelism

    def split_kind(self, name: str) -> str:
        """COLUMN, ROW, GLU or REPLICATED: how megatron-core splits this tensor over tensor-parallel ranks."""
        module, _, param = self.split_chunk(name)[1].rpartition(".")
        if module.endswith(("word_embeddings", "output_layer", "linear_qkv", "projector.encoder.linear_fc1",
                            "deepstack_layer.encoder.linear_fc1")):
            return COLUMN
        if module.endswith("mlp.linear_fc1") or module.endswith("linear_fc1") and _EXPERT.search(module):
            return GLU if (module.startswith(TEXT) or module.startswith(VISION) and getattr(
                self.config, "is_qwen2_5", False)) else COLUMN
        if module.endswith(("linear_proj", "linear_fc2")):
            return ROW if param == "weight" else REPLICATED
        return REPLICATED

    def partition_dim(self, name: str) -> int | None:
        """The dim split over tensor-parallel ranks (GLU tensors: dim 0, per half), None when replicated."""
        return {COLUMN: 0, GLU: 0, ROW: 1}.get(self.split_kind(name))

    def is_sequence_parallel(self, name: str) -> bool:
        """Replicated tensors that see only this rank's part of the sequence under --sequence-parallel, whose
        gradients megatron-core sums over the TP group: the norms and the row-parallel layers' biases."""
        module = name.rpartition(".")[0]
        return module.endswith(_NORM_MODULES) or self.split_kind(name) == REPLICATED and module.endswith(
            ("linear_proj", "linear_fc2"))

    def shard_shape(self, name: str, shape: Sequence[int]) -> tuple[int, ...]:
        dim = self.partition_dim(name)
        shape = tuple(shape)
        if dim is None or self.tp == 1:
            return shape
        return shape[:dim] + (shape[dim] // self.tp,) + shape[dim + 1:]

    def shard(self, name: str, array: np.ndarray, tp_rank: int) -> np.ndarray:
        """This tensor-parallel rank's part of a whole tensor (a name local to a stage or global)."""
        kind = self.split_kind(name)
        if kind == REPLICATED or self.tp == 1:
            return array
        if kind == GLU:
            gate, up = np.split(array, 2, axis=0)
            return np.concatenate([np.split(gate, self.tp, axis=0)[tp_rank], np.split(up, self.tp, axis=0)[tp_rank]])
        return np.ascontiguousarray(np.split(array, self.tp, axis=self.partition_dim(name))[tp_rank])

    def join(self, name: str, shards: Sequence[np.ndarray]) -> np.ndarray:
        """The whole tensor from every tensor-parallel rank's part, in rank order (shard's inverse)."""
        if len(shards) != self.tp:
            raise LayoutError(f"{name}: {len(shards)} tensor-parallel shards for --tensor-model-parallel-size "
                              f"{self.tp}")
        kind = self.split_kind(name)
        if kind == REPLICATED or self.tp == 1:
            return shards[0]
        if kind == GLU:
            halves = [np.split(s, 2, axis=0) for s in shards]
            return np.concatenate([h[0] for h in halves] + [h[1] for h in halves], axis=0)
        return np.concatenate(shards, axis=self.partition_dim(name))

    # ------------------------------------------------------------------ one rank's tensors

    def rank_state(self, read_mm: Callable[[str], np.ndarray], tp_rank: int, pp_rank: int,
                   vp_stage: int | None = None) -> dict[str, np.ndarray]:
        """Rank (tp_rank, pp_rank)'s tensors from whole global tensors (`read_mm(global name)`); with `vp_stage`,
        only that virtual chunk's, named inside the chunk (no `model{v}.` prefix: what the chunk's module holds)."""
        out = {}
        for local in self.rank_shapes(tp_rank, pp_rank):
            chunk, inner = self.split_chunk(local)
            if vp_stage is not None and chunk != vp_stage:
                continue
            source = WORD_EMBEDDINGS if (inner == OUTPUT_LAYER and self.ties_output_copy) else \
                self.global_name(pp_rank, local)
            out[local if vp_stage is None else inner] = self.shard(local, read_mm(source), tp_rank)
        return out


def _fused_shape(recipe: Recipe, hf: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    first = hf[recipe.sources[0]]
    if recipe.fuse == "expert":
        return first[1:]
    if recipe.fuse == "copy" or len(recipe.sources) == 1:
        return first
    if recipe.fuse == "qkv_zero_k":
        return (3 * first[0],) + first[1:]
    return (sum(hf[s][0] for s in recipe.sources),) + first[1:]


def mm_reader(config: Any, read_hf: Callable[[str], np.ndarray]) -> Callable[[str], np.ndarray]:
    """read_mm(global MindSpeed-MM name) over a Hugging Face model's tensors (`read_hf(hf name)`): each call
    reads and fuses only the HF tensors that one MM tensor is made of."""
    recipes = _recipes(config)
    return lambda name: _fuse(recipes[name], [read_hf(s) for s in recipes[name].sources])


def rank_state_from_hf(layout: VLMLayout, read_hf: Callable[[str], np.ndarray], tp_rank: int,
                       pp_rank: int, vp_stage: int | None = None) -> dict[str, np.ndarray]:
    """Rank (tp_rank, pp_rank)'s tensors (one virtual chunk's with `vp_stage`, see rank_state) from a Hugging Face
    model's (`read_hf(hf name)`), e.g. --load of an HF directory under tensor/pipeline parallelism."""
    return layout.rank_state(mm_reader(layout.config, read_hf), tp_rank, pp_rank, vp_stage)


def initial_value(name: str, shape: Sequence[int], seed: int, std: float) -> np.ndarray:
    """The initial value of HF tensor `name`: models/vlm/blocks.py's init_weights rule (norm weights 1,
    biases 0, others N(0, std) drawn by numpy from (seed, name)), so every framework and layout starts equal."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in _HF_NORM_MODULES:
        return np.ones(tuple(shape), np.float32)
    if name.endswith(".bias"):
        return np.zeros(tuple(shape), np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return (std * rng.standard_normal(tuple(shape))).astype(np.float32)


def initial_state(layout: VLMLayout, seed: int, tp_rank: int, pp_rank: int,
                  std: float | None = None, vp_stage: int | None = None) -> dict[str, np.ndarray]:
    """Rank (tp_rank, pp_rank)'s initial tensors: exactly the one-process model's init_weights(model, seed, std)
    values, fused and sharded, so a tensor/pipeline-parallel run starts from the data-parallel run's weights."""
    std = layout.config.text.initializer_range if std is None else std
    shapes = hf_shapes(layout.config)
    return rank_state_from_hf(layout, lambda name: initial_value(name, shapes[name], seed, std), tp_rank, pp_rank,
                              vp_stage)


# ------------------------------------------------------------------------------------------ expert parallelism

def expert_place(name: str, num_experts: int, ep: int) -> tuple[int, str] | None:
    """(expert-parallel rank, name there) of an expert's tensor (global expert number in `name`): rank r holds
    experts r * num_experts / ep ... numbered from 0, as megatron-core numbers local experts; None for every
    other tensor (each expert-parallel rank holds them all)."""
    match = _EXPERT.search(name)
    if match is None:
        return None
    per_rank = num_experts // ep
    rank, local = divmod(int(match.group(1)), per_rank)
    return rank, f"{name[:match.start(1)]}{local}{name[match.end(1):]}"


def keep_expert_rank(state: Mapping[str, Any], num_experts: int, ep: int, ep_rank: int) -> dict[str, Any]:
    """A rank's tensors with every expert (global numbers; optimizer state `<name>.<key>` too) -> expert-parallel
    rank `ep_rank`'s experts, numbered from 0 (the other ranks' dropped); every other tensor kept."""
    if ep == 1:
        return dict(state)
    out = {}
    for name, value in state.items():
        place = expert_place(name, num_experts, ep)
        if place is None:
            out[name] = value
        elif place[0] == ep_rank:
            out[place[1]] = value
    return out


def expert_global_name(name: str, num_experts: int, ep: int, ep_rank: int) -> str:
    """expert_place's inverse: a name in expert-parallel rank `ep_rank`'s numbering -> the global number."""
    match = _EXPERT.search(name)
    if match is None:
        return name
    return f"{name[:match.start(1)]}{ep_rank * (num_experts // ep) + int(match.group(1))}{name[match.end(1):]}"
