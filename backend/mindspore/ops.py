"""Functional ops on the mindspore backend: torch's names, signatures and semantics.

Same public names as `mmrun.backend.torch.ops`. Every function here runs in PyNative and under
`mindspore.jit` on CPU: several `mint` ops have no CPU kernel in MindSpore 2.10 (measured, see
docs/portable-api.md), so each op below uses the spelling that does. `like=` arguments exist for torch's
devices; MindSpore has one global device and ignores them.

Mixed precision as on torch (see there): fp16/bf16 inputs of `softmax` and `layer_norm` are computed in
fp32 and returned in their own dtype; `cross_entropy` works on fp32 logits and returns an fp32 loss.
"""
from __future__ import annotations

import math
import os
from typing import Sequence

import mindspore as ms
import numpy as np
from mindspore import mint
from mindspore import ops as _ops

from mmrun.backend import dropout_hash, varlen
from mmrun.backend.mindspore import device as _device
from mmrun.backend.mindspore import kernels, seeding

Tensor = ms.Tensor

_softmax = mint.nn.functional.softmax
HALF_DTYPES = (ms.float16, ms.bfloat16)
# MindSpore's device is process-wide and set when the backend is imported: module constants, which code
# compiled by mindspore.jit reads as constants (it cannot run device.detect()).
_ON_ASCEND = _device.detect().kind == "npu"
_NATIVE_DROPOUT = dropout_hash.native_impls(_device.detect().kind)
# On a CPU, masked_fill and softmax's backward give MindSpore's kernels operands of one shape (below; the memory
# it saves: docs/memory-and-speed.md). MMRUN_MS_CPU_BROADCAST=1 keeps MindSpore's broadcasting ops (to measure).
BROADCAST_VAR = "MMRUN_MS_CPU_BROADCAST"
_SAME_SHAPE_OPERANDS = _device.detect().kind == "cpu" and os.environ.get(BROADCAST_VAR) != "1"


_INV_SQRT2 = 1.0 / math.sqrt(2.0)


def _fp32(x: Tensor | None) -> Tensor | None:
    # dtype is known when a graph is compiled, so under jit this branch costs nothing.
    return x if x is None or x.dtype not in HALF_DTYPES else _ops.cast(x, ms.float32)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    return mint.matmul(a, b)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias, weight shaped (out_features, in_features) as in torch."""
    # As nn.Dense does: a 2-D MatMul(transpose_b) and BiasAdd. On CPU this is 1.7x faster forward than
    # mint.nn.functional.linear on (4, 256, 256) x (768, 256), and faster forward + backward (measured).
    shape = x.shape
    y = _ops.MatMul(transpose_b=True)(mint.reshape(x, (-1, shape[-1])), weight)
    if bias is not None:
        y = _ops.BiasAdd()(y, bias)
    return mint.reshape(y, shape[:-1] + (weight.shape[0],))


class _CpuSoftmax(ms.nn.Cell):
    """softmax along `dim` with MindSpore's own backward, out * (dout - sum(out * dout, dim)), the sum broadcast
    to dout's shape before the subtraction. MindSpore 2.10's expanded backward subtracts the (..., 1) sum
    directly, and the CPU kernel of a broadcasting Sub keeps two size_t index arrays over its output (16 bytes an
    element) for as long as the kernel lives: in a compiled graph, the whole run, once per softmax (64 MiB a
    layer for 2 x 8 heads x 512^2 attention probabilities). The same ops in the same order: gradients
    bit-identical (docs/memory-and-speed.md)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.sum = _ops.ReduceSum(keep_dims=True)

    def construct(self, x):
        return _softmax(x, dim=self.dim)

    def bprop(self, x, out, dout):
        return (out * (dout - _ops.broadcast_to(self.sum(out * dout, self.dim), dout.shape)),)


# one per dim, made when the backend imports (mindspore.jit reads them as constants)
_CPU_SOFTMAX = {dim: _CpuSoftmax(dim) for dim in (-1, -2, -3, -4)} if _SAME_SHAPE_OPERANDS else {}


def _softmax_fp32(x: Tensor, dim: int) -> Tensor:
    back = dim - x.ndim if dim >= 0 else dim
    return _CPU_SOFTMAX[back](x) if back in _CPU_SOFTMAX else _softmax(x, dim=dim)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    if x.dtype in HALF_DTYPES:
        return _ops.cast(_softmax_fp32(_fp32(x), dim), x.dtype)
    return _softmax_fp32(x, dim)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    # mint.nn.functional.log_softmax has no CPU kernel (LogSoftmaxExt).
    return _ops.log_softmax(x, dim)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """Exact (erf) GELU by default, as torch; approximate="tanh" for the GPT-2 tanh form."""
    # mint.nn.functional.gelu has no CPU kernel; ops.gelu does, with torch's `approximate` names.
    if _SAME_SHAPE_OPERANDS and approximate == "none":
        # ops.gelu's own formula, x * (erf(x / sqrt 2) + 1) * 0.5, with the division a multiplication by
        # 1/sqrt 2: MindSpore 2.10's CPU Div kernel keeps a 16-byte-an-element index table even for one shape
        # (forward and backward: 2 x 16 bytes x tokens x ffn a layer, for the whole compiled run); Mul by a
        # one-element operand does not. Rounds x / sqrt 2 differently by at most one ulp (docs/memory-and-speed.md).
        return x * (_ops.erf(x * _INV_SQRT2) + 1.0) * 0.5
    return _ops.gelu(x, approximate=approximate)


def cross_entropy(logits: Tensor, target: Tensor, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """logits (N, C), integer target (N,); reduction "mean" | "sum" | "none" (per-item, 0 where ignored)."""
    # mint.nn.functional.cross_entropy has no CPU kernel; ops.cross_entropy has torch's semantics.
    if _SAME_SHAPE_OPERANDS and logits.ndim == 2 and target.dtype in (ms.int32, ms.int64):
        # ops.cross_entropy is nll_loss(x - logsumexp(x)): two Subs of an (N, 1) column and the max's
        # broadcasting backward, each a 16-byte-an-element index table over (N, C) in MindSpore 2.10's CPU
        # kernels, kept for the compiled run. The LogSoftmax primitive (with its own backward) has none.
        return _ops.nll_loss(_ops.log_softmax(_fp32(logits), 1), target, ignore_index=ignore_index,
                             reduction=reduction)
    return _ops.cross_entropy(_fp32(logits), target, ignore_index=ignore_index, reduction=reduction)


def causal_mask(seq_len: int, like: Tensor | None = None) -> Tensor:
    """Bool (seq_len, seq_len), True above the diagonal: the future positions a token must not see."""
    return mint.triu(mint.ones((seq_len, seq_len), dtype=ms.bool_), 1)


def _full(t: Tensor, like: Tensor) -> Tensor:
    """t broadcast to like's shape on a CPU (the operand of an elementwise op with `like`), t itself elsewhere: see
    masked_fill. The shapes are known when a graph compiles, so under jit this costs one BroadcastTo or nothing."""
    if _SAME_SHAPE_OPERANDS and tuple(t.shape) != tuple(like.shape):
        return _ops.broadcast_to(t, like.shape)
    return t


def masked_fill(x: Tensor, mask: Tensor, value: float) -> Tensor:
    # mint has no masked_fill in 2.10. The mask is broadcast to x's shape first: MindSpore 2.10's CPU kernel
    # for a broadcasting mask keeps two size_t index arrays over the output (16 bytes an element) for as long
    # as the kernel lives, which in a compiled graph is the whole run, once per node (the attention's causal
    # mask: 64 MiB a layer at 2 x 8 heads x 512^2, forward and backward). Same values; docs/memory-and-speed.md.
    return _ops.masked_fill(x, _full(mask, x), value)


# Dropout draws its mask from seeding.DROPOUT_GENERATOR, whose state a checkpoint can save and restore.
# Not ops.dropout: that primitive keeps its generator inside the kernel, out of reach, so a resumed run
# drew other masks. Not the Generator-based mint ops (dropout_ext, rand_like, bernoulli_): no CPU kernel
# in 2.10. The mask is a counter-based hash of (seed, call number, element index) in uint32 arithmetic,
# which wraps modulo 2**32 by definition, so PyNative and jit draw the same masks. The hash and its
# constants are backend/dropout_hash.py's, which torch's dropout draws too: same seed, same masks.
# The key is derived in the graph, not on the host as on torch, because under jit the generator's
# (seed, offset) is only known when the graph runs.
_ONE = Tensor(1, ms.int64)
_TWO_POW_32 = Tensor(1 << 32, ms.int64)
_SHIFTS = tuple(Tensor(bits, ms.uint32) for bits in dropout_hash.XORSHIFTS)
_MULTIPLIERS = tuple(Tensor(m, ms.uint32) for m in dropout_hash.MULTIPLIERS)
_SALTS = tuple(Tensor(salt, ms.uint32) for salt in dropout_hash.SALTS)
_ODD = Tensor(1, ms.uint32)
_right_shift = _ops.RightShift()


def _xorshift(h: Tensor, bits: Tensor) -> Tensor:
    return _ops.bitwise_xor(h, _right_shift(h, bits))


def _hash32(h: Tensor) -> Tensor:
    """dropout_hash.hash32 on uint32 tensors."""
    h = _xorshift(h, _SHIFTS[0]) * _MULTIPLIERS[0]
    h = _xorshift(h, _SHIFTS[1]) * _MULTIPLIERS[1]
    return _xorshift(h, _SHIFTS[2])


def _words(value: Tensor) -> tuple[Tensor, Tensor]:
    """The low and high 32 bits of an int64 scalar, as uint32."""
    return _ops.cast(value, ms.uint32), _ops.cast(_ops.floor_div(value, _TWO_POW_32), ms.uint32)


# Compiled even in PyNative: there its ~40 small dependent ops cost ~60 ms a call, as a graph ~2 ms
# (measured on 2048 elements, loaded 2-core CPU). Under an outer jit it is inlined; each new shape compiles once.
@ms.jit
def _random_words(shape: tuple[int, ...], numel: int) -> Tensor:
    """Uniform uint32 values, one per element; one step of DROPOUT_GENERATOR per call."""
    # _step is how mint's random functions draw from a Generator too: (seed, offset), then offset += 1.
    seed, call = seeding.DROPOUT_GENERATOR._step(_ONE)
    call_low, call_high = _words(call)
    seed_low, seed_high = _words(seed)
    key = _hash32(_ops.bitwise_xor(_hash32(_ops.bitwise_xor(call_low, call_high)), seed_low))
    key = _hash32(_ops.bitwise_xor(key, seed_high))
    # An odd multiplier makes index -> index * multiplier + offset a bijection mod 2**32: within a call no
    # two elements hash the same word.
    multiplier = _ops.bitwise_or(_hash32(_ops.bitwise_xor(key, _SALTS[0])), _ODD)
    offset = _hash32(_ops.bitwise_xor(key, _SALTS[1]))
    index = _ops.arange(0, numel, dtype=ms.uint32)
    return mint.reshape(_hash32(index * multiplier + offset), shape)


def _native_dropout(x: Tensor, p: float) -> Tensor:
    # mint's dropout draws MindSpore's default Generator (saved by seeding.get_rng_state) but has kernels on
    # Ascend only; ops.dropout (the Dropout primitive, its generator inside the kernel) runs on CPU and GPU.
    if _ON_ASCEND:
        return mint.nn.functional.dropout(x, p, training=True)
    return _ops.dropout(x, p=p, training=True)


def dropout(x: Tensor, p: float, training: bool, impl: str = "auto") -> Tensor:
    """torch's dropout: zero each element with probability p, scale the rest by 1/(1-p); identity when
    not training or p == 0.

    impl (backend/dropout_hash.py): "hash" draws from DROPOUT_GENERATOR (reproducible from
    seeding.get_rng_state; the same masks as torch's hash dropout for the same seed and sequence of
    calls); "native" is MindSpore's own dropout; "auto": the hash on CPU, native on GPU and Ascend."""
    dropout_hash.check_probability(p)
    # The early return also keeps p=0 free under jit.
    if not training or p == 0.0:
        return x
    if impl in _NATIVE_DROPOUT:
        return _native_dropout(x, p)
    if p == 1.0:
        return x * 0.0
    numel = dropout_hash.check_size(int(x.size), x.shape)
    threshold = Tensor(dropout_hash.threshold(p), ms.uint32)
    keep = _random_words(tuple(x.shape), numel) >= threshold
    # torch divides the 0/1 mask by 1-p in fp32 and rounds once to x's dtype; a half-precision division
    # here would round 1-p first (one ulp off in fp16 at p=0.3). The same factor, made on the host:
    scale = _ops.cast(Tensor(float(np.float32(1.0) / np.float32(1.0 - p)), ms.float32), x.dtype)
    return x * (_ops.cast(keep, x.dtype) * scale)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, dropout_p: float = 0.0,
                                 scale: float | None = None, dropout_impl: str = "auto") -> Tensor:
    """softmax(q @ k^T * scale, causal mask) @ v with dropout on the probabilities; q, k, v shaped
    (batch, heads, seq, head_dim), scale 1/sqrt(head_dim) by default. Pass dropout_p=0 when not training.

    On Ascend with fp16/bf16 inputs `flash_attention_score` computes it (kernels.fused_attention) unless
    the hash dropout must draw the mask; elsewhere (CPU, GPU, fp32) the explicit matmul/softmax/dropout/
    matmul, whose masks torch's hash dropout draws too.

    Grouped-query attention: k and v may have fewer heads than q (heads divisible by kv heads); each kv
    head serves heads // kv_heads consecutive query heads, as torch's `enable_gqa=True`. The kv heads are
    repeated first (repeat_kv) on every path."""
    dropout_hash.check_probability(dropout_p)
    check_gqa_heads(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k, v = repeat_kv(k, q.shape[-3] // k.shape[-3]), repeat_kv(v, q.shape[-3] // v.shape[-3])
    if dropout_p == 0.0 or dropout_impl in _NATIVE_DROPOUT:
        fused = kernels.fused_attention(q, k, v, causal, dropout_p, scale)
        if fused is not None:
            return fused
    return _explicit_attention(q, k, v, causal, dropout_p, scale, dropout_impl)


def _explicit_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, dropout_p: float, scale: float,
                        dropout_impl: str) -> Tensor:
    """The composite path (and the reference the fused kernels are tested against)."""
    # On a CPU (fp32), BatchMatMul with its transpose flags: its backward multiplies with the flags too, where
    # mint.matmul's transposes the probabilities and q, k, v, and MindSpore 2.10's CPU Transpose kernel keeps a
    # size_t per element (8 bytes x batch x heads x seq^2 a layer) for the whole compiled run.
    flags = _SAME_SHAPE_OPERANDS and q.dtype == ms.float32 and q.ndim == 4
    att = (_BMM_NT(q, k) if flags else matmul(q, transpose(k, -2, -1))) * scale
    if causal:
        att = masked_fill(att, causal_mask(q.shape[-2], like=q), float("-inf"))
    att = dropout(softmax(att, dim=-1), dropout_p, True, dropout_impl)
    return _BMM(att, v) if flags else matmul(att, v)


_BMM, _BMM_NT = _ops.BatchMatMul(), _ops.BatchMatMul(transpose_b=True)


def check_gqa_heads(q: Tensor, k: Tensor, v: Tensor) -> None:
    """One clear error unless k and v have the same head count and it divides q's (dim -3)."""
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if v.shape[-3] != kv_heads or kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"attention heads: q has {heads}, k {kv_heads}, v {v.shape[-3]}; k and v need the same "
                         "count, one that divides q's (grouped-query attention)")


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """(batch, kv_heads, seq, d) -> (batch, kv_heads * groups, seq, d), each head repeated `groups` times in
    place (head h serves query heads h*groups ... h*groups+groups-1), as torch's enable_gqa."""
    if groups == 1:
        return x
    b, h, s, d = x.shape
    # mint.repeat_interleave has no CPU kernel (RepeatInterleaveInt); broadcast_to + reshape is the same copy.
    return mint.reshape(mint.broadcast_to(mint.reshape(x, (b, h, 1, s, d)), (b, h, groups, s, d)),
                        (b, h * groups, s, d))


def layer_norm(x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    # ops.layer_norm and mint's LayerNorm dispatch to LayerNormExt, which has no CPU kernel; the LayerNorm
    # primitive (what nn.LayerNorm uses) has one. eps is explicit: nn.LayerNorm's default is 1e-7, torch's 1e-5.
    begin_axis = -len(normalized_shape)
    norm = _ops.LayerNorm(begin_norm_axis=begin_axis, begin_params_axis=begin_axis, epsilon=eps)
    # The primitive needs both affine tensors; torch's None means weight 1, bias 0.
    shape = tuple(normalized_shape)
    weight = mint.ones(shape, dtype=ms.float32) if weight is None else _fp32(weight)
    bias = mint.zeros(shape, dtype=ms.float32) if bias is None else _fp32(bias)
    y, _, _ = norm(_fp32(x), weight, bias)
    return y if x.dtype == ms.float32 else _ops.cast(y, x.dtype)


def embedding(ids: Tensor, weight: Tensor) -> Tensor:
    """Rows of `weight` (num_embeddings, dim) picked by integer `ids`."""
    # mint.nn.functional.embedding / mint.index_select have no CPU kernel; gather does.
    return _ops.gather(weight, ids, 0)


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int = 1, padding: int = 0) -> Tensor:
    """NCHW input, weight (out_channels, in_channels, kh, kw), zero padding on every side."""
    # mint.nn.functional.conv2d has no CPU kernel (Conv2DExt). ops.conv2d needs pad_mode="pad" for padding.
    if padding == 0:
        return _ops.conv2d(x, weight, bias, stride=stride, pad_mode="valid")
    return _ops.conv2d(x, weight, bias, stride=stride, pad_mode="pad", padding=padding)


def conv3d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int | Sequence[int] = 1,
           padding: int | Sequence[int] = 0) -> Tensor:
    """NCTHW input, weight (out_channels, in_channels, kt, kh, kw); stride and zero padding an int or one per
    dimension (t, h, w), as torch's."""
    # ops.conv3d has a CPU kernel in 2.10 (values and gradients equal torch's, tests/backend_api); mint's conv3d
    # is Ascend-only. Its padding takes (t, h, w) with pad_mode="pad", as torch's.
    padding = (padding,) * 3 if isinstance(padding, int) else tuple(padding)
    stride = (stride,) * 3 if isinstance(stride, int) else tuple(stride)
    if not any(padding):
        return _ops.conv3d(x, weight, bias, stride=stride, pad_mode="valid")
    return _ops.conv3d(x, weight, bias, stride=stride, pad_mode="pad", padding=padding)


def pad(x: Tensor, pad: Sequence[int], value: float = 0.0) -> Tensor:
    """Constant padding in torch's order: (last dim before, last dim after, the one before it ...)."""
    # mint.nn.functional.pad has no CPU kernel (ConstantPadND) in 2.10; ops.pad has, with torch's order.
    return _ops.pad(x, tuple(pad), mode="constant", value=value)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    return mint.cat(tuple(tensors), dim)


def split(x: Tensor, split_size: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    # Not mint.split: it returns views, and in PyNative a transpose/permute of such a view gets a wrong
    # gradient (MindSpore 2.10, CPU; measured, see docs/portable-api.md). ops.split copies.
    return _ops.split(x, split_size, dim)


def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    return mint.reshape(x, tuple(shape))


def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    # Under jit, Tensor.transpose(-1, -2) fails; mint.transpose takes torch's (dim0, dim1).
    return mint.transpose(x, dim0, dim1)


def permute(x: Tensor, dims: Sequence[int]) -> Tensor:
    return mint.permute(x, tuple(dims))


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return mint.flatten(x, start_dim, end_dim)


def arange(n: int, dtype=ms.int64, like: Tensor | None = None) -> Tensor:
    # mint.arange has no CPU kernel.
    return _ops.arange(0, n, dtype=dtype)


def zeros(shape: Sequence[int], dtype=ms.float32, like: Tensor | None = None) -> Tensor:
    return mint.zeros(tuple(shape), dtype=dtype)


def ones(shape: Sequence[int], dtype=ms.float32, like: Tensor | None = None) -> Tensor:
    return mint.ones(tuple(shape), dtype=dtype)


def sum(x: Tensor, dim: int | None = None) -> Tensor:  # noqa: A001 - torch's name, on purpose
    if dim is None:
        return mint.sum(x)
    return mint.sum(x, dim)


def mean(x: Tensor, dim: int | None = None) -> Tensor:
    if dim is None:
        return mint.mean(x)
    return mint.mean(x, dim)


def sqrt(x: Tensor) -> Tensor:
    return mint.sqrt(x)


def tanh(x: Tensor) -> Tensor:
    return mint.tanh(x)


def exp(x: Tensor) -> Tensor:
    return mint.exp(x)


def clamp(x: Tensor, min: float | None = None, max: float | None = None) -> Tensor:  # noqa: A002 - torch's names
    return mint.clamp(x, min=min, max=max)


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """Qwen2/Llama RMSNorm: weight * (x * rsqrt(mean(x^2, -1) + eps)), normalised in fp32 and rounded to
    x's dtype before the weight multiplies (Hugging Face's Qwen2RMSNorm, op for op)."""
    # Not ops.rms_norm: no CPU kernel in 2.10 (and it rounds differently); mint.mean/rsqrt have kernels.
    # With --use-fused-rmsnorm on Ascend, it is (kernels.fused_rms_norm).
    fused = kernels.fused_rms_norm(x, weight, eps)
    if fused is not None:
        return fused
    x32 = x if x.dtype == ms.float32 else _ops.cast(x, ms.float32)
    normed = x32 * _full(mint.rsqrt(mint.mean(x32 * x32, -1, keepdim=True) + eps), x32)
    normed = normed if x.dtype == ms.float32 else _ops.cast(normed, x.dtype)
    return _full(weight, normed) * normed


def silu(x: Tensor) -> Tensor:
    return _ops.silu(x)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up (the SwiGLU MLP's middle); with --use-fused-swiglu on Ascend, MindSpore's ops.swiglu."""
    fused = kernels.fused_swiglu(gate, up)
    if fused is not None:
        return fused
    return _ops.silu(gate) * up


def rotary_mul(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x * cos + rotate_half(x) * sin (rotate_half: (x1, x2) -> (-x2, x1) over the last dimension's halves);
    with --use-fused-rotary-pos-emb on Ascend, MindSpore's ops.rotary_position_embedding for 4-D x."""
    fused = kernels.fused_rotary(x, cos, sin)
    if fused is not None:
        return fused
    x1, x2 = split(x, x.shape[-1] // 2, dim=-1)  # a copying split (see split)
    return x * _full(cos, x) + mint.cat([-x2, x1], dim=-1) * _full(sin, x)


def sigmoid(x: Tensor) -> Tensor:
    return mint.sigmoid(x)


def cos(x: Tensor) -> Tensor:
    return mint.cos(x)


def sin(x: Tensor) -> Tensor:
    return mint.sin(x)


def cumsum(x: Tensor, dim: int) -> Tensor:
    # mint.cumsum has no CPU kernel (CumsumExt) in 2.10; ops.cumsum does.
    return _ops.cumsum(x, dim)


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens, scale: float | None = None) -> Tensor:
    """Bidirectional attention inside each segment of a packed sequence, never across segments (the
    images and frames of a ViT batch). q (total, heads, head_dim), k/v (total, kv_heads, head_dim);
    `cu_seqlens` are the host-side segment boundaries [0, l0, l0+l1, ..., total]. Returns (total, heads, head_dim).

    No (total x total) mask is built: each run of equal-length consecutive segments is one batched
    scaled_dot_product_attention (varlen.equal_length_runs), the results concatenated."""
    bounds = varlen.check_cu_seqlens(cu_seqlens, q.shape[0])
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    runs = varlen.equal_length_runs(bounds)
    sizes = [length * count for length, count in runs]
    if len(sizes) == 1:
        pieces = [(q, k, v)]
    else:
        pieces = list(zip(*(split(t, sizes, 0) for t in (q, k, v))))
    out = []
    for (length, count), (qs, ks, vs) in zip(runs, pieces):
        # (count * length, heads, d) -> (count, heads, length, d): the segments of a run are a batch.
        qs, ks, vs = (transpose(mint.reshape(t, (count, length, t.shape[1], t.shape[2])), 1, 2) for t in (qs, ks, vs))
        o = scaled_dot_product_attention(qs, ks, vs, causal=False, scale=scale)
        out.append(mint.reshape(transpose(o, 1, 2), (count * length, o.shape[1], o.shape[3])))
    return out[0] if len(out) == 1 else cat(out, 0)


def segment_attention(q: Tensor, k: Tensor, v: Tensor, segment_ids: Tensor, scale: float | None = None) -> Tensor:
    """Bidirectional attention of each token with the tokens of its own segment only, the segments given as a
    device tensor of ids (total,) instead of host boundaries: varlen_attention's result with shapes that do
    not depend on the segments, so one compiled graph serves every batch of that size (padding is a segment
    of its own that nothing else sees). q (total, heads, head_dim), k/v (total, kv_heads, head_dim); builds
    a (total x total) mask, so it fits a padded ViT batch, not long sequences. Returns (total, heads, head_dim)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    qs, ks, vs = (mint.unsqueeze(transpose(t, 0, 1), 0) for t in (q, k, v))  # (1, heads, total, d)
    ks, vs = repeat_kv(ks, qs.shape[1] // ks.shape[1]), repeat_kv(vs, qs.shape[1] // vs.shape[1])
    apart = mint.unsqueeze(segment_ids, 1) != mint.unsqueeze(segment_ids, 0)  # True: another segment
    att = masked_fill(matmul(qs, transpose(ks, -2, -1)) * scale, apart, float("-inf"))
    out = matmul(softmax(att, dim=-1), vs)
    return transpose(mint.squeeze(out, 0), 0, 1)


def grouped_linear(x: Tensor, weight: Tensor, counts: Sequence[int] | np.ndarray) -> Tensor:
    """Mixture-of-experts GEMM, as torch's `ops.grouped_linear`: one linear per expert with rows (kernels has no
    grouped GEMM here), each on a split of the weight (one gradient write, not one per expert)."""
    counts = np.asarray(counts, dtype=np.int64)
    fused = kernels.grouped_linear(x, weight, np.cumsum(counts))
    if fused is not None:
        return fused
    hit = [int(e) for e in np.flatnonzero(counts)]
    pieces = split(weight, 1, dim=0)
    rows = split(x, [int(counts[e]) for e in hit], dim=0) if len(hit) > 1 else (x,)
    out = [linear(r, mint.squeeze(pieces[e], 0)) for e, r in zip(hit, rows)]
    return cat(out, dim=0) if len(out) > 1 else out[0]
