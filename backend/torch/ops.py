"""Functional ops on the torch backend: the small set our models use, torch's own semantics.

Same public names and signatures as `mmrun.backend.mindspore.ops`. `like=` arguments put a new tensor
on the same device as an existing one (MindSpore has one global device and ignores them).

Mixed precision, as Megatron does it: fp16/bf16 inputs of `softmax` and `layer_norm` are computed in
fp32 and returned in their own dtype (attention_softmax_in_fp32, apex's mixed-dtype LayerNorm), and
`cross_entropy` works on fp32 logits (Megatron's `logits.float()`), so the loss is fp32.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

Tensor = torch.Tensor
HALF_DTYPES = (torch.float16, torch.bfloat16)


def _fp32(x: Tensor | None) -> Tensor | None:
    return x if x is None or x.dtype not in HALF_DTYPES else x.float()


def matmul(a: Tensor, b: Tensor) -> Tensor:
    return torch.matmul(a, b)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias, weight shaped (out_features, in_features) as in torch."""
    return F.linear(x, weight, bias)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    if x.dtype in HALF_DTYPES:
        return torch.softmax(x, dim=dim, dtype=torch.float32).to(x.dtype)
    return torch.softmax(x, dim=dim)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    return torch.log_softmax(x, dim=dim)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """Exact (erf) GELU by default; approximate="tanh" for the GPT-2 tanh form."""
    return F.gelu(x, approximate=approximate)


def cross_entropy(logits: Tensor, target: Tensor, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """logits (N, C), integer target (N,); reduction "mean" | "sum" | "none" (per-item, 0 where ignored)."""
    return F.cross_entropy(_fp32(logits), target, ignore_index=ignore_index, reduction=reduction)


def causal_mask(seq_len: int, like: Tensor | None = None) -> Tensor:
    """Bool (seq_len, seq_len), True above the diagonal: the future positions a token must not see."""
    device = None if like is None else like.device
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu_(1)


def masked_fill(x: Tensor, mask: Tensor, value: float) -> Tensor:
    return x.masked_fill(mask, value)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    return F.dropout(x, p=p, training=training)


def layer_norm(x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    if x.dtype in HALF_DTYPES:
        return F.layer_norm(x.float(), tuple(normalized_shape), _fp32(weight), _fp32(bias), eps).to(x.dtype)
    return F.layer_norm(x, tuple(normalized_shape), weight, bias, eps)


def embedding(ids: Tensor, weight: Tensor) -> Tensor:
    """Rows of `weight` (num_embeddings, dim) picked by integer `ids`."""
    return F.embedding(ids, weight)


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int = 1, padding: int = 0) -> Tensor:
    """NCHW input, weight (out_channels, in_channels, kh, kw), zero padding on every side."""
    return F.conv2d(x, weight, bias, stride=stride, padding=padding)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    return torch.cat(tuple(tensors), dim=dim)


def split(x: Tensor, split_size: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    return torch.split(x, split_size, dim=dim)


def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    return torch.reshape(x, tuple(shape))


def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    return torch.transpose(x, dim0, dim1)


def permute(x: Tensor, dims: Sequence[int]) -> Tensor:
    return torch.permute(x, tuple(dims))


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return torch.flatten(x, start_dim, end_dim)


def arange(n: int, dtype: torch.dtype = torch.int64, like: Tensor | None = None) -> Tensor:
    return torch.arange(n, dtype=dtype, device=None if like is None else like.device)


def zeros(shape: Sequence[int], dtype: torch.dtype = torch.float32, like: Tensor | None = None) -> Tensor:
    return torch.zeros(tuple(shape), dtype=dtype, device=None if like is None else like.device)


def ones(shape: Sequence[int], dtype: torch.dtype = torch.float32, like: Tensor | None = None) -> Tensor:
    return torch.ones(tuple(shape), dtype=dtype, device=None if like is None else like.device)


def sum(x: Tensor, dim: int | None = None) -> Tensor:  # noqa: A001 - torch's name, on purpose
    return torch.sum(x) if dim is None else torch.sum(x, dim=dim)


def mean(x: Tensor, dim: int | None = None) -> Tensor:
    return torch.mean(x) if dim is None else torch.mean(x, dim=dim)


def sqrt(x: Tensor) -> Tensor:
    return torch.sqrt(x)


def tanh(x: Tensor) -> Tensor:
    return torch.tanh(x)
