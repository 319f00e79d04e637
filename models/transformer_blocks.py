"""Transformer pieces shared by mmrun's Hugging Face-style models (Qwen2 text decoder, Qwen2-VL ViT),
written once against the portable API (`mmrun.backend`), so they run on PyTorch and on MindSpore.

Each piece computes what its transformers counterpart does, op for op where rounding matters (rotary
embeddings in the input's dtype, vision rotary in fp32, RMSNorm through `ops.rms_norm`), and names its
parameters as the Hugging Face checkpoints do (`q_proj`, `gate_proj`, ...), so checkpoints load by name.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from mmrun.backend import nn, ops, tensors


def quick_gelu(x: Any) -> Any:
    """x * sigmoid(1.702 x): CLIP's and Qwen2-VL's ViT activation (transformers' QuickGELUActivation)."""
    return x * ops.sigmoid(1.702 * x)


def gelu(x: Any) -> Any:
    return ops.gelu(x)


def gelu_tanh(x: Any) -> Any:
    return ops.gelu(x, approximate="tanh")


def silu(x: Any) -> Any:
    return ops.silu(x)


# transformers' ACT2FN names -> function (named functions, not lambdas: mindspore.jit parses their source)
ACTIVATIONS: dict[str, Callable[[Any], Any]] = {
    "quick_gelu": quick_gelu,
    "gelu": gelu,
    "gelu_pytorch_tanh": gelu_tanh,
    "silu": silu,
    "swish": silu,
}


def activation(name: str) -> Callable[[Any], Any]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"activation {name!r} is not implemented; use one of {sorted(ACTIVATIONS)}") from None


# ------------------------------------------------------------------------------------------ rotary

def rotary_inv_freq(dim: int, theta: float) -> np.ndarray:
    """1 / theta^(2i/dim) for i < dim/2, float32, computed as transformers does (fp32 arange / dim)."""
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (np.float32(1.0) / (np.float32(theta) ** exponent)).astype(np.float32)


def rotate_half(x: Any) -> Any:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    x1, x2 = ops.split(x, x.shape[-1] // 2, dim=-1)
    return ops.cat([-x2, x1], dim=-1)


def apply_rotary(x: Any, cos: Any, sin: Any) -> Any:
    """x * cos + rotate_half(x) * sin; cos/sin broadcast against x (ops.rotary_mul: fused on an NPU when asked)."""
    return ops.rotary_mul(x, cos, sin)


def multimodal_rotary(position_ids: Any, inv_freq: np.ndarray, mrope_section: tuple[int, ...],
                      dtype: Any) -> tuple[Any, Any]:
    """Qwen2-VL's M-RoPE: cos, sin (batch, seq, head_dim) in `dtype` from position_ids (3, batch, seq)
    (rows t, h, w). The head_dim // 2 frequencies are cut into `mrope_section` chunks; chunk i takes its
    angles from position row i % 3; the result is repeated for the two halves (rotate_half's layout).
    transformers' Qwen2VLRotaryEmbedding / apply_multimodal_rotary_pos_emb."""
    rows, batch, seq = position_ids.shape
    freqs = (ops.reshape(tensors.cast(position_ids, "float32"), (rows, batch, seq, 1))
             * ops.reshape(tensors.from_numpy(inv_freq), (1, 1, 1, -1)))  # (3, B, S, head_dim // 2)
    out = []
    for table in (ops.cos(freqs), ops.sin(freqs)):
        by_row = ops.split(table, 1, dim=0)
        chunks = [ops.split(by_row[i % 3], list(mrope_section), dim=-1)[i] for i in range(len(mrope_section))]
        half = ops.reshape(ops.cat(chunks, dim=-1), (batch, seq, -1))
        out.append(tensors.cast(ops.cat([half, half], dim=-1), dtype))
    return out[0], out[1]


def interleaved_multimodal_rotary(position_ids: Any, inv_freq: np.ndarray, mrope_section: tuple[int, ...],
                                  dtype: Any) -> tuple[Any, Any]:
    """Qwen3-VL's interleaved M-RoPE: cos, sin (batch, seq, head_dim) in `dtype` from position_ids (3, batch,
    seq). Frequency j takes its angle from row h (1) when j % 3 == 1 and j < 3 * mrope_section[1], from row w
    (2) when j % 3 == 2 and j < 3 * mrope_section[2], else from row t (0); repeated for rotate_half's two
    halves. transformers' Qwen3VLTextRotaryEmbedding. Each angle is one fp32 product, as there: the rows are
    selected by 0/1 masks on the frequencies, and a sum with zeros is exact."""
    rows, batch, seq = position_ids.shape
    half = inv_freq.shape[0]
    table = interleaved_mrope_table(inv_freq, mrope_section)
    freqs = ops.sum(ops.reshape(tensors.cast(position_ids, "float32"), (rows, batch, seq, 1))
                    * ops.reshape(tensors.from_numpy(table), (3, 1, 1, half)), dim=0)  # (B, S, half)
    full = ops.cat([freqs, freqs], dim=-1)
    return tensors.cast(ops.cos(full), dtype), tensors.cast(ops.sin(full), dtype)


def interleaved_mrope_table(inv_freq: np.ndarray, mrope_section: tuple[int, ...]) -> np.ndarray:
    """(3, head_dim / 2) float32: inv_freq on the row (t, h, w) each frequency takes its angle from in Qwen3-VL's
    interleaved M-RoPE, zero on the other two (`interleaved_multimodal_rotary`'s rule)."""
    half = inv_freq.shape[0]
    index = np.arange(half)
    row = np.zeros(half, np.int64)
    for r in (1, 2):
        row[(index % 3 == r) & (index < 3 * mrope_section[r])] = r
    return np.stack([np.where(row == r, inv_freq, 0).astype(np.float32) for r in range(3)])


# ------------------------------------------------------------------------------------------ layers

class SwiGLUMLP(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x)): Qwen2's MLP (no bias) and Qwen2.5-VL's ViT MLP (bias)."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "silu", bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act = activation(hidden_act)
        self.swiglu = self.act is silu  # ops.swiglu: one fused kernel on an NPU when asked

    def forward(self, x):
        if self.swiglu:
            return self.down_proj(ops.swiglu(self.gate_proj(x), self.up_proj(x)))
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class GQASelfAttention(nn.Module):
    """Causal self-attention with grouped-query heads and rotary positions: q/k/v projections with bias,
    o_proj without (Qwen2). forward(x (B, S, hidden), cos, sin (B, S, head_dim)) -> (B, S, hidden).

    Qwen3's variant: `head_dim` given (not hidden / heads), `qk_norm_eps` set adds `q_norm` / `k_norm`, an
    RMSNorm over each head of q and k before the rotary, and `o_bias` a bias on o_proj (attention_bias)."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, attention_dropout: float = 0.0,
                 qkv_bias: bool = True, head_dim: int | None = None, qk_norm_eps: float | None = None,
                 o_bias: bool = False) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = hidden_size // num_heads if head_dim is None else head_dim
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.attention_dropout = attention_dropout
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=o_bias)
        self.qk_norm = qk_norm_eps is not None
        if self.qk_norm:  # only then: Qwen2's checkpoints have no such parameters
            self.q_norm = nn.RMSNorm(self.head_dim, eps=qk_norm_eps)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=qk_norm_eps)

    def forward(self, x, cos, sin, cache: Any = None):
        """cache (generation only): an object whose `update(k, v)` stores this call's rotated keys/values and
        returns all of them so far, (batch, kv_heads, past + seq, head_dim) (models/vlm/generation.py's
        LayerCache). The first call (the prompt) is causal; a later call brings one token, which attends to
        every cached one."""
        batch, seq, _ = x.shape
        q = ops.reshape(self.q_proj(x), (batch, seq, self.num_heads, self.head_dim))
        k = ops.reshape(self.k_proj(x), (batch, seq, self.num_kv_heads, self.head_dim))
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = ops.transpose(q, 1, 2), ops.transpose(k, 1, 2)
        v = ops.transpose(ops.reshape(self.v_proj(x), (batch, seq, self.num_kv_heads, self.head_dim)), 1, 2)
        cos, sin = ops.reshape(cos, (batch, 1, seq, self.head_dim)), ops.reshape(sin, (batch, 1, seq, self.head_dim))
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        causal = True
        if cache is not None:
            k, v = cache.update(k, v)
            causal = k.shape[2] == seq  # the prompt; else one new token (past + 1 keys), which sees them all
            if not causal and seq != 1:
                raise ValueError(f"a cached attention step takes one token; received {seq} after {k.shape[2] - seq}")
        y = ops.scaled_dot_product_attention(q, k, v, causal=causal, scale=self.scale,
                                             dropout_p=self.attention_dropout if self.training else 0.0)
        return self.o_proj(ops.reshape(ops.transpose(y, 1, 2), (batch, seq, self.num_heads * self.head_dim)))
