"""Fused device kernels behind `ops` on the mindspore backend: attention and the hash dropout.

Same public names as `mmrun.backend.torch.kernels`. Each function returns None when no fused kernel
serves the input on this device, and `ops` then runs its explicit (composite) path.

- `fused_attention`: `ops.flash_attention_score` on Ascend (Atlas A2 and later; fp16/bf16 only, as
  MindSpore documents it). It has no CPU kernel in MindSpore 2.10 (measured) and no GPU kernel, so on
  CPU and GPU the explicit attention runs. Its dropout draws MindSpore's RNG. Not run here (no Ascend).
- `hash_dropout`: MindSpore compiles the hash (ops.py's `_random_words`) into its graph already; there
  is no separate fused kernel, so this is always None.
"""
from __future__ import annotations

from typing import Any

import mindspore as ms
from mindspore import mint
from mindspore import ops as _ops

from mmrun.backend.mindspore import device

_HALF = (ms.float16, ms.bfloat16)
# A module constant (mindspore.jit reads it as one; it cannot run device.detect()).
_ON_ASCEND = device.detect().kind == "npu"


def fused_attention(q: Any, k: Any, v: Any, causal: bool, dropout_p: float, scale: float) -> Any:
    """softmax(q k^T * scale [causal]) v with dropout_p on the probabilities, q/k/v (B, heads, T, head_dim);
    None where no fused kernel applies (the caller computes it explicitly)."""
    if not _ON_ASCEND or q.dtype not in _HALF:
        return None
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    # attn_mask: 1 where a position must NOT be attended, (S1, S2) layout with sparse_mode 0.
    mask = mint.triu(mint.ones((seq_q, seq_k), dtype=ms.uint8), 1) if causal else None
    return _ops.flash_attention_score(q, k, v, q.shape[1], attn_mask=mask, keep_prob=1.0 - dropout_p,
                                      scalar_value=scale, input_layout="BNSD")


def varlen_attention(q: Any, k: Any, v: Any, cu_seqlens: Any, scale: float) -> Any:
    """None on MindSpore: no variable-length kernel is wired (flash_attention_score's TND layout on Ascend is not
    used yet); ops.varlen_attention then runs one attention per run of equal-length segments, as on torch."""
    return None


def hash_dropout(x: Any, multiplier: int, offset: int, threshold: int, scale: float) -> Any:
    """Always None on MindSpore: the hash is compiled into the graph by ops.dropout (no separate kernel)."""
    return None


def has_fused_hash_dropout(device: str) -> bool:
    """False: see `hash_dropout`."""
    return False


def grouped_linear(x: Any, weight: Any, offsets: Any) -> Any:
    """torch's grouped GEMM twin: None here (MindSpore's grouped_matmul runs on Ascend only; not built), so
    `ops.grouped_linear` runs one linear per expert."""
    return None


# ------------------------------------------------------------------------------------- fused Ascend kernels
# MindSpeed's --use-fused-rmsnorm / --use-fused-swiglu / --use-fused-rotary-pos-emb: the training entry switches
# them on (use_fused); on Ascend each function below calls MindSpore's fused op, elsewhere it returns None and
# `ops` runs the unfused math. Documented signatures (MindSpore API, Supported Platforms: Ascend):
#   mindspore.ops.rms_norm(x, gamma, epsilon=1e-6) -> (y, rstd)
#   mindspore.ops.swiglu(input, dim=-1) -> Swish(first half of input) * second half
#   mindspore.ops.rotary_position_embedding(x, cos, sin, mode=0) -> rotate_half style, 4-D x
# Not run on Ascend hardware here (no NPU): unverified there. The switches are read when a graph is compiled.
FUSED: dict[str, bool] = {"rms_norm": False, "swiglu": False, "rotary": False}


def use_fused(**switches: bool) -> None:
    """Switch the fused Ascend kernels on or off by name (rms_norm, swiglu, rotary)."""
    unknown = sorted(set(switches) - set(FUSED))
    if unknown:
        raise ValueError(f"unknown fused kernel(s) {unknown}; use some of {sorted(FUSED)}")
    FUSED.update({name: bool(on) for name, on in switches.items()})


def fused_rms_norm(x: Any, weight: Any, eps: float) -> Any:
    if not _ON_ASCEND or not FUSED["rms_norm"]:
        return None
    return _ops.rms_norm(x, _ops.cast(weight, x.dtype), eps)[0]


def fused_swiglu(gate: Any, up: Any) -> Any:
    if not _ON_ASCEND or not FUSED["swiglu"]:
        return None
    return _ops.swiglu(mint.cat([gate, up], dim=-1), -1)


def fused_rotary(x: Any, cos: Any, sin: Any) -> Any:
    if not _ON_ASCEND or not FUSED["rotary"] or x.ndim != 4:
        return None
    return _ops.rotary_position_embedding(x, _ops.cast(cos, x.dtype), _ops.cast(sin, x.dtype), 0)
