"""mmrun's GPT <-> megatron-core's GPTModel: parameter names, the fused QKV layout, and TP/PP shards (numpy only).

Both models are the same network (learned absolute positions, pre-LayerNorm blocks, GELU MLP, biases,
multi-head attention, tied or untied output layer); only names and two layouts differ:

    mmrun (models/gpt.py)              megatron-core (GPTModel, local or TE layer spec)
    wte.weight                         embedding.word_embeddings.weight            rows split over TP
    wpe.weight                         embedding.position_embeddings.weight        whole on every TP rank
    h.N.ln_1.{weight,bias}             decoder.layers.N.input_layernorm.{weight,bias}
    h.N.attn.c_attn.{weight,bias}      decoder.layers.N.self_attention.linear_qkv.{weight,bias}   rows split
    h.N.attn.c_proj.weight / .bias     ...self_attention.linear_proj.weight (columns split) / .bias (whole)
    h.N.ln_2.{weight,bias}             decoder.layers.N.pre_mlp_layernorm.{weight,bias}
    h.N.mlp.c_fc.{weight,bias}         decoder.layers.N.mlp.linear_fc1.{weight,bias}               rows split
    h.N.mlp.c_proj.weight / .bias      ...mlp.linear_fc2.weight (columns split) / .bias (whole)
    ln_f.{weight,bias}                 decoder.final_layernorm.{weight,bias}
    lm_head.weight (untied only)       output_layer.weight                                          rows split

QKV: mmrun's c_attn rows are [Q | K | V], each heads x head_dim; megatron-core's linear_qkv rows are per
head [q_h k_h v_h] (query groups = heads), so a tensor-parallel rank's contiguous rows are whole heads.

Pipeline stages (megatron-core's even split): pipeline rank p, virtual stage v of V holds global layers
[(v * pp + p) * L', (v * pp + p + 1) * L'), L' = num_layers / (pp * V), numbered from 0 on each stage; the
embeddings live on the first stage, the final LayerNorm and output layer on the last. With tied
embeddings and more than one stage the last stage holds `output_layer.weight`, a copy of the word
embeddings (Megatron keeps the two equal by all-reducing their gradients). With V > 1 each virtual
stage's names get the prefix `model<v>.` (Megatron's checkpoint keys model0, model1, ...).

Optimizer state named after parameters (`<param>.exp_avg`, `.exp_avg_sq`, `.main_param`) converts and
shards the same way: every function takes such names.

    full = mmrun_to_mcore(mmrun_state, GPTShape.of(mmrun_state, num_attention_heads=4))
    shards = split(full, shape, Layout(tp=2, pp=2))      # {(tp_rank, pp_rank): state}
    assert all((join(shards, shape, Layout(2, 2))[k] == v).all() for k, v in full.items())

A command on checkpoints: `python -m mmrun.checkpoint.gpt --help`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

import numpy as np

# Optimizer-state suffixes that travel with a parameter name (backend/optimizer_params.py's keys).
STATE_SUFFIXES = (".exp_avg_sq", ".exp_avg", ".main_param")


class ConversionError(ValueError):
    """A state dict does not fit the shape or layout it is converted for (one line)."""


@dataclass(frozen=True)
class GPTShape:
    """What the conversion needs to know about the model beyond the tensors themselves."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    tied: bool = True  # output layer shares the word embeddings (Megatron's default)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def of(cls, state: Mapping[str, np.ndarray], num_attention_heads: int) -> "GPTShape":
        """The shape of an mmrun or full (unsharded) megatron-core state dict."""
        names = [_split_suffix(n)[0] for n in state]
        word = "wte.weight" if "wte.weight" in names else "embedding.word_embeddings.weight"
        if word not in names:
            raise ConversionError(f"no word embeddings (wte.weight or embedding.word_embeddings.weight) among "
                                  f"{len(names)} tensors; pass a whole (unsharded) GPT state dict")
        layers = {int(m.group(1)) for n in names if (m := re.match(r"(?:h|decoder\.layers)\.(\d+)\.", n))}
        tied = "lm_head.weight" not in names and "output_layer.weight" not in names
        hidden = int(state[word if word in state else next(k for k in state if k.startswith(word))].shape[1])
        if hidden % num_attention_heads:
            raise ConversionError(f"hidden size {hidden} is not divisible by {num_attention_heads} attention heads")
        return cls(len(layers), hidden, num_attention_heads, tied)


@dataclass(frozen=True)
class Layout:
    """Tensor-, pipeline-parallel sizes and virtual stages per pipeline rank."""

    tp: int = 1
    pp: int = 1
    vpp: int = 1

    def ranks(self) -> list[tuple[int, int]]:
        return [(t, p) for p in range(self.pp) for t in range(self.tp)]

    def check(self, shape: GPTShape) -> None:
        if min(self.tp, self.pp, self.vpp) < 1:
            raise ConversionError(f"parallel sizes must be at least 1. Received: {self}")
        if shape.num_layers % (self.pp * self.vpp):
            raise ConversionError(f"{shape.num_layers} layers cannot be split evenly into {self.pp} pipeline stages x "
                                  f"{self.vpp} virtual stages; pick sizes that divide the layer count")
        if shape.num_attention_heads % self.tp:
            raise ConversionError(f"{shape.num_attention_heads} attention heads cannot be split over tensor-parallel "
                                  f"size {self.tp}; pick a size that divides the head count")

    def layers_per_stage(self, shape: GPTShape) -> int:
        return shape.num_layers // (self.pp * self.vpp)

    def stage_of_layer(self, shape: GPTShape, layer: int) -> tuple[int, int, int]:
        """(pipeline rank, virtual stage, local layer number) of a global layer."""
        per = self.layers_per_stage(shape)
        chunk, local = divmod(layer, per)
        vstage, pp_rank = divmod(chunk, self.pp)
        return pp_rank, vstage, local

    def global_layer(self, shape: GPTShape, pp_rank: int, vstage: int, local: int) -> int:
        return (vstage * self.pp + pp_rank) * self.layers_per_stage(shape) + local


def _split_suffix(name: str) -> tuple[str, str]:
    for suffix in STATE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)], suffix
    return name, ""


# ------------------------------------------------------------------------------ mmrun <-> megatron-core

# mmrun's block-local names -> megatron-core's layer-local names.
_LAYER_NAMES = {
    "ln_1.weight": "input_layernorm.weight",
    "ln_1.bias": "input_layernorm.bias",
    "attn.c_attn.weight": "self_attention.linear_qkv.weight",
    "attn.c_attn.bias": "self_attention.linear_qkv.bias",
    "attn.c_proj.weight": "self_attention.linear_proj.weight",
    "attn.c_proj.bias": "self_attention.linear_proj.bias",
    "ln_2.weight": "pre_mlp_layernorm.weight",
    "ln_2.bias": "pre_mlp_layernorm.bias",
    "mlp.c_fc.weight": "mlp.linear_fc1.weight",
    "mlp.c_fc.bias": "mlp.linear_fc1.bias",
    "mlp.c_proj.weight": "mlp.linear_fc2.weight",
    "mlp.c_proj.bias": "mlp.linear_fc2.bias",
}
_TOP_NAMES = {
    "wte.weight": "embedding.word_embeddings.weight",
    "wpe.weight": "embedding.position_embeddings.weight",
    "ln_f.weight": "decoder.final_layernorm.weight",
    "ln_f.bias": "decoder.final_layernorm.bias",
    "lm_head.weight": "output_layer.weight",
}
_LAYER_NAMES_BACK = {v: k for k, v in _LAYER_NAMES.items()}
_TOP_NAMES_BACK = {v: k for k, v in _TOP_NAMES.items()}


def _qkv_to_mcore(a: np.ndarray, shape: GPTShape) -> np.ndarray:
    """[Q | K | V] rows -> per-head [q_h k_h v_h] rows (weights [3H, H] and biases [3H])."""
    rest = a.shape[1:]
    return a.reshape(3, shape.num_attention_heads, shape.head_dim, *rest).swapaxes(0, 1).reshape(a.shape)


def _qkv_to_mmrun(a: np.ndarray, shape: GPTShape) -> np.ndarray:
    rest = a.shape[1:]
    return a.reshape(shape.num_attention_heads, 3, shape.head_dim, *rest).swapaxes(0, 1).reshape(a.shape)


def mmrun_name_to_mcore(name: str) -> str:
    """One mmrun GPT parameter (or optimizer-state) name -> megatron-core's full-model name."""
    base, suffix = _split_suffix(name)
    if base in _TOP_NAMES:
        return _TOP_NAMES[base] + suffix
    m = re.fullmatch(r"h\.(\d+)\.(.+)", base)
    if m and m.group(2) in _LAYER_NAMES:
        return f"decoder.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}{suffix}"
    raise ConversionError(f"{name!r} is not a parameter of mmrun's GPT (models/gpt.py names: wte.weight, "
                          "h.N.attn.c_attn.weight, ...)")


def mcore_name_to_mmrun(name: str) -> str:
    """One megatron-core full-model name -> mmrun's GPT name."""
    base, suffix = _split_suffix(name)
    if base in _TOP_NAMES_BACK:
        return _TOP_NAMES_BACK[base] + suffix
    m = re.fullmatch(r"decoder\.layers\.(\d+)\.(.+)", base)
    if m and m.group(2) in _LAYER_NAMES_BACK:
        return f"h.{m.group(1)}.{_LAYER_NAMES_BACK[m.group(2)]}{suffix}"
    raise ConversionError(f"{name!r} is not a parameter of megatron-core's GPTModel as mmrun builds it (local "
                          "spec names: embedding.word_embeddings.weight, decoder.layers.N.self_attention."
                          "linear_qkv.weight, ...)")


def _is_qkv(name: str) -> bool:
    base = _split_suffix(name)[0]
    return base.endswith(("attn.c_attn.weight", "attn.c_attn.bias", "linear_qkv.weight", "linear_qkv.bias"))


def mmrun_to_mcore(state: Mapping[str, np.ndarray], shape: GPTShape) -> dict[str, np.ndarray]:
    """mmrun GPT state dict -> megatron-core GPTModel state dict of the whole model (TP = PP = 1)."""
    out = {}
    for name, a in state.items():
        out[mmrun_name_to_mcore(name)] = _qkv_to_mcore(a, shape) if _is_qkv(name) else a
    return out


def mcore_to_mmrun(state: Mapping[str, np.ndarray], shape: GPTShape) -> dict[str, np.ndarray]:
    """megatron-core GPTModel state dict of the whole model -> mmrun GPT state dict."""
    out = {}
    for name, a in state.items():
        out[mcore_name_to_mmrun(name)] = _qkv_to_mmrun(a, shape) if _is_qkv(name) else a
    return out


# ------------------------------------------------------------------------------------ TP/PP shards

# Which dimension tensor parallelism splits, by the layer-local name (None: every TP rank holds it whole).
_TP_DIM = {
    "embedding.word_embeddings.weight": 0,
    "output_layer.weight": 0,
    "self_attention.linear_qkv.weight": 0,
    "self_attention.linear_qkv.bias": 0,
    "self_attention.linear_proj.weight": 1,
    "mlp.linear_fc1.weight": 0,
    "mlp.linear_fc1.bias": 0,
    "mlp.linear_fc2.weight": 1,
}


def _tp_dim(base: str) -> int | None:
    m = re.fullmatch(r"decoder\.layers\.\d+\.(.+)", base)
    return _TP_DIM.get(m.group(1) if m else base)


def tp_partition_dim(name: str) -> int | None:
    """The dim tensor parallelism splits a megatron-core tensor (or its optimizer state) on; None: whole on every rank."""
    return _tp_dim(_split_suffix(name)[0])


def _tp_slice(a: np.ndarray, dim: int | None, tp: int, rank: int) -> np.ndarray:
    if dim is None or tp == 1:
        return a
    if a.shape[dim] % tp:
        raise ConversionError(f"a dimension of size {a.shape[dim]} cannot be split over tensor-parallel size {tp}")
    return np.ascontiguousarray(np.split(a, tp, axis=dim)[rank])


def _placements(name: str, shape: GPTShape, layout: Layout) -> list[tuple[int, str]]:
    """Where one full-model tensor goes: [(pipeline rank, name on that rank)], usually one place."""
    base, suffix = _split_suffix(name)
    first, last = (0, 0), (layout.pp - 1, layout.vpp - 1)

    def named(stage: tuple[int, int], local: str) -> tuple[int, str]:
        prefix = f"model{stage[1]}." if layout.vpp > 1 else ""
        return stage[0], prefix + local + suffix

    m = re.fullmatch(r"decoder\.layers\.(\d+)\.(.+)", base)
    if m:
        layer = int(m.group(1))
        if layer >= shape.num_layers:
            raise ConversionError(f"{name} is beyond the model's {shape.num_layers} layers")
        pp_rank, vstage, local = layout.stage_of_layer(shape, layer)
        return [named((pp_rank, vstage), f"decoder.layers.{local}.{m.group(2)}")]
    if base.startswith("embedding."):
        places = [named(first, base)]
        if base == "embedding.word_embeddings.weight" and shape.tied and layout.pp * layout.vpp > 1:
            places.append(named(last, "output_layer.weight"))  # the last stage's copy of the tied embeddings
        return places
    if base.startswith("decoder.final_layernorm.") or base == "output_layer.weight":
        return [named(last, base)]
    raise ConversionError(f"{name!r} is not a megatron-core GPTModel tensor this converter knows")


def shard(full: Mapping[str, np.ndarray], shape: GPTShape, layout: Layout, tp_rank: int,
          pp_rank: int) -> dict[str, np.ndarray]:
    """The tensors one (tensor, pipeline) rank holds, with the names its GPTModel chunks use.

    Tensors of other pipeline stages are skipped, so `full` may also be part of a model (one parameter
    at a time, as the trainer streams its initial weights)."""
    layout.check(shape)
    out = {}
    for name, a in full.items():
        dim = _tp_dim(_split_suffix(name)[0])
        for p, local in _placements(name, shape, layout):
            if p == pp_rank:
                out[local] = _tp_slice(a, dim, layout.tp, tp_rank)
    return out


def split(full: Mapping[str, np.ndarray], shape: GPTShape, layout: Layout) -> dict[tuple[int, int], dict[str, np.ndarray]]:
    """A whole megatron-core state dict -> {(tp_rank, pp_rank): that rank's state dict}."""
    return {(t, p): shard(full, shape, layout, t, p) for t, p in layout.ranks()}


def _global_name(local: str, shape: GPTShape, layout: Layout, pp_rank: int) -> str | None:
    """A rank's name -> the whole model's name; None for the last stage's copy of tied embeddings."""
    base, suffix = _split_suffix(local)
    vstage = 0
    m = re.fullmatch(r"model(\d+)\.(.+)", base)
    if layout.vpp > 1:
        if not m:
            raise ConversionError(f"{local!r} lacks the virtual-stage prefix model<v>. that {layout.vpp} virtual "
                                  "stages give every name")
        vstage, base = int(m.group(1)), m.group(2)
    m = re.fullmatch(r"decoder\.layers\.(\d+)\.(.+)", base)
    if m:
        return f"decoder.layers.{layout.global_layer(shape, pp_rank, vstage, int(m.group(1)))}.{m.group(2)}{suffix}"
    if base == "output_layer.weight" and shape.tied:
        return None
    return base + suffix


def join(shards: Mapping[tuple[int, int], Mapping[str, np.ndarray]], shape: GPTShape,
         layout: Layout) -> dict[str, np.ndarray]:
    """{(tp_rank, pp_rank): state} -> the whole megatron-core state dict (inverse of `split`)."""
    layout.check(shape)
    missing = [r for r in layout.ranks() if r not in shards]
    if missing:
        raise ConversionError(f"shards of ranks {missing} (tensor, pipeline) are missing; a {layout.tp} x {layout.pp} "
                              "layout needs all of them")
    pieces: dict[str, list[np.ndarray | None]] = {}
    for (t, p), state in shards.items():
        for local, a in state.items():
            name = _global_name(local, shape, layout, p)
            if name is None:
                continue
            pieces.setdefault(name, [None] * layout.tp)[t] = a
    out = {}
    for name, parts in pieces.items():
        dim = _tp_dim(_split_suffix(name)[0])
        if dim is None or layout.tp == 1:
            out[name] = parts[0] if parts[0] is not None else next(x for x in parts if x is not None)
            continue
        if any(x is None for x in parts):
            raise ConversionError(f"{name} is missing on tensor-parallel rank {parts.index(None)}")
        out[name] = np.concatenate(parts, axis=dim)
    return out


# --------------------------------------------------------------------------- mmrun's initial weights

def mmrun_parameter_shapes(shape: GPTShape, vocab_size: int, max_position_embeddings: int,
                           ffn_hidden_size: int) -> dict[str, tuple[int, ...]]:
    """The parameters of mmrun's GPT (models/gpt.py) by name, as its state_dict() lists them."""
    h, f = shape.hidden_size, ffn_hidden_size
    out: dict[str, tuple[int, ...]] = {"wte.weight": (vocab_size, h), "wpe.weight": (max_position_embeddings, h)}
    for i in range(shape.num_layers):
        p = f"h.{i}."
        out.update({p + "ln_1.weight": (h,), p + "ln_1.bias": (h,), p + "attn.c_attn.weight": (3 * h, h),
                    p + "attn.c_attn.bias": (3 * h,), p + "attn.c_proj.weight": (h, h), p + "attn.c_proj.bias": (h,),
                    p + "ln_2.weight": (h,), p + "ln_2.bias": (h,), p + "mlp.c_fc.weight": (f, h),
                    p + "mlp.c_fc.bias": (f,), p + "mlp.c_proj.weight": (h, f), p + "mlp.c_proj.bias": (h,)})
    out.update({"ln_f.weight": (h,), "ln_f.bias": (h,)})
    if not shape.tied:
        out["lm_head.weight"] = (vocab_size, h)
    return out


def mmrun_initial_weights(shapes: Mapping[str, tuple[int, ...]], seed: int, std: float, num_layers: int,
                          dtype: np.dtype = np.float32) -> Iterator[tuple[str, np.ndarray]]:
    """Megatron's init of mmrun's GPT, drawn with numpy, one parameter at a time in name order:
    N(0, std) for weights, N(0, std / sqrt(2 * num_layers)) for the two output projections of each
    block, zero biases, LayerNorm weight 1 and bias 0. The same seed gives bit-identical weights on
    PyTorch, MindSpore and in megatron-core's GPTModel (through `mmrun_to_mcore` and `shard`)."""
    rng = np.random.default_rng(seed)
    for name in sorted(shapes):
        size = shapes[name]
        if name.startswith("ln_") or ".ln_" in name:
            yield name, (np.ones if name.endswith("weight") else np.zeros)(size, dtype=dtype)
        elif name.endswith("bias"):
            yield name, np.zeros(size, dtype=dtype)
        else:
            scale = std / np.sqrt(2.0 * num_layers) if name.endswith(("attn.c_proj.weight", "mlp.c_proj.weight")) else std
            yield name, (rng.standard_normal(size) * scale).astype(dtype)


def initial_shard(shape: GPTShape, layout: Layout, tp_rank: int, pp_rank: int, *, vocab_size: int,
                  max_position_embeddings: int, ffn_hidden_size: int, seed: int, std: float) -> dict[str, np.ndarray]:
    """mmrun's initial GPT weights as one (tp, pp) rank's megatron-core state dict, drawn one parameter at
    a time (memory: this rank's shard plus the largest parameter)."""
    shapes = mmrun_parameter_shapes(shape, vocab_size, max_position_embeddings, ffn_hidden_size)
    out: dict[str, np.ndarray] = {}
    for name, a in mmrun_initial_weights(shapes, seed, std, shape.num_layers):
        out.update(shard(mmrun_to_mcore({name: a}, shape), shape, layout, tp_rank, pp_rank))
    return out


def names_without_state_suffix(names: Iterable[str]) -> set[str]:
    return {_split_suffix(n)[0] for n in names}
