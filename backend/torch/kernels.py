"""Fused device kernels behind `ops` on the torch backend: attention, the hash dropout and the grouped GEMM.

Same public names as `mmrun.backend.mindspore.kernels`. Each function returns None when no fused kernel
serves the input on this device, and `ops` then runs its explicit (composite) path; so every kernel is
an optimisation with an exact or tested-equal fallback, never a requirement.

- `fused_attention`: torch_npu's `npu_fusion_attention` on an Ascend NPU, else
  `F.scaled_dot_product_attention` (flash / memory-efficient kernels on CUDA, a fused CPU kernel or the
  math path on CPU). Its dropout draws the framework's RNG (see backend/dropout_hash.py for the choice).
- `varlen_attention`: torch's `torch.nn.attention.varlen.varlen_attn` (flash / cuDNN) on CUDA for
  fp16/bf16 packed segments (the ViT's images and frames); None elsewhere.
- `hash_dropout`: the cross-framework hash dropout (backend/dropout_hash.py) as ONE Triton kernel on
  CUDA: the mask is recomputed from (multiplier, offset) in the backward pass instead of being saved, so
  it costs one read and one write per element each way, as `F.dropout` does. The eager path in `ops`
  needs ~30 int64 passes (6.70 ms against 0.24 ms for 67M elements on an H100).
- `grouped_linear`: torch's grouped GEMM (`F.grouped_mm` / `torch._grouped_mm`, CPU and CUDA sm80+) for the
  mixture-of-experts layers: every expert's rows in one call, the weight's gradient written in place.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mmrun.backend import dropout_hash
from mmrun.backend.errors import warn_once

# Elements per Triton program: the kernel module's BLOCK (8 warps x 32 lanes x 16 elements) unless set here (tests).
_BLOCK: int | None = None
_HALF = (torch.float16, torch.bfloat16)
_kernel_failed = False  # set once when the Triton kernel cannot be built here; the eager path takes over


# ------------------------------------------------------------------------------------- attention

def _npu_fusion_attention() -> Any:
    """torch_npu.npu_fusion_attention when torch_npu is imported and has it (Atlas A2 and later)."""
    module = sys.modules.get("torch_npu")  # imported by device detection when an NPU is usable
    return getattr(module, "npu_fusion_attention", None)


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, dropout_p: float,
                    scale: float) -> torch.Tensor | None:
    """softmax(q k^T * scale [causal]) v with dropout_p on the probabilities, q/k/v (B, heads, T, head_dim);
    None where no fused kernel applies (the caller computes it explicitly). k/v may have fewer heads
    than q (grouped-query attention, see ops.scaled_dot_product_attention)."""
    gqa = k.shape[1] != q.shape[1]
    if q.device.type == "npu":
        if gqa:  # repeated here rather than trusting every torch_npu release's N1 != N2 support
            from mmrun.backend.torch.ops import repeat_kv
            k, v = repeat_kv(k, q.shape[1] // k.shape[1]), repeat_kv(v, q.shape[1] // v.shape[1])
        fusion = _npu_fusion_attention()
        if fusion is None or q.dtype not in _HALF:
            return None  # fp32 and older torch_npu: the explicit path
        seq_q, seq_k = q.shape[-2], k.shape[-2]
        # atten_mask: True where a position must NOT be attended (torch_npu's convention), SS layout, sparse_mode 0.
        mask = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).triu_(1) if causal else None
        out = fusion(q, k, v, q.shape[1], "BNSD", atten_mask=mask, scale=scale, keep_prob=1.0 - dropout_p)
        return out[0]
    if gqa:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale,
                                              enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale)


@functools.lru_cache(maxsize=1)
def _torch_varlen_attn() -> Any:
    """torch.nn.attention.varlen.varlen_attn (torch >= 2.9, CUDA flash/cuDNN kernels), or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: np.ndarray,
                     scale: float) -> torch.Tensor | None:
    """torch's own varlen flash attention over packed segments, q/k/v (total, heads, head_dim): on CUDA with
    fp16/bf16 and equal head counts only; None elsewhere (the caller runs one fused attention per run of
    equal-length segments)."""
    kernel = _torch_varlen_attn()
    if kernel is None or q.device.type != "cuda" or q.dtype not in _HALF or k.shape[1] != q.shape[1]:
        return None
    bounds = torch.as_tensor(cu_seqlens, dtype=torch.int32).to(q.device, non_blocking=True)
    longest = int(np.diff(cu_seqlens).max()) if len(cu_seqlens) > 1 else 0
    return kernel(q, k, v, bounds, bounds, longest, longest, scale=scale)


# --------------------------------------------------------------------------------- hash dropout

@functools.lru_cache(maxsize=1)
def _triton_kernel() -> Any:
    """The Triton kernel's module (compiled on first launch), or None when Triton is not installed."""
    if importlib.util.find_spec("triton") is None:
        return None
    from mmrun.backend.torch import _triton_hash_dropout
    return _triton_hash_dropout


def _as_int32(word: int) -> int:
    """A uint32 as the int32 with the same bits (Triton types Python ints by their range)."""
    return word - (1 << 32) if word >= 1 << 31 else word


def _launch(x: torch.Tensor, key: tuple[int, int, int], scale: float) -> torch.Tensor:
    # Called once forward and once backward per dropout: kept to the few host operations a launch needs.
    x = x.contiguous()
    out = torch.empty_like(x)
    kernel = _triton_kernel()
    kernel.launch(x, out, x.numel(), *key, scale, _BLOCK or kernel.BLOCK)
    return out


class _HashDropout(torch.autograd.Function):
    """y = x * keep * scale; dy/dx is the same mask, redrawn from the key in backward (nothing saved)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, key: tuple[int, int, int], scale: float) -> torch.Tensor:
        ctx.key, ctx.scale = key, scale  # three ints and a float: the mask is redrawn, never stored
        return _launch(x, key, scale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _launch(grad, ctx.key, ctx.scale), None, None


def _triton_usable(x: torch.Tensor) -> bool:
    # TRITON_INTERPRET=1 runs Triton kernels on CPU tensors with numpy: how the CPU-only tests check the kernel.
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return not _kernel_failed and (x.device.type == "cuda" or interpreted) and _triton_kernel() is not None


def hash_dropout(x: torch.Tensor, multiplier: int, offset: int, threshold: int, scale: float) -> torch.Tensor | None:
    """x * (keep * scale) with keep the hash mask of (multiplier, offset, threshold), in one fused kernel;
    None where none runs (no Triton, not CUDA, or the kernel failed to build: then once a warning)."""
    global _kernel_failed
    if not _triton_usable(x):
        return None
    try:
        return _HashDropout.apply(x, (_as_int32(multiplier), _as_int32(offset), _as_int32(threshold)), scale)
    except Exception as exc:  # noqa: BLE001  a Triton/driver mismatch must cost speed, never the run
        warn_once(f"the fused hash-dropout kernel failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                  "using the eager hash dropout, which is slower; --dropout-impl native avoids it")
        _kernel_failed = True
        return None


def has_fused_hash_dropout(device: str) -> bool:
    """Whether `hash_dropout` runs a fused kernel on this device kind ("cuda" with Triton installed)."""
    return not _kernel_failed and device.split(":")[0] == "cuda" and _triton_kernel() is not None


# ------------------------------------------------------------------------------------- grouped matmul

def grouped_linear(x: torch.Tensor, weight: torch.Tensor, offsets: np.ndarray) -> torch.Tensor | None:
    """x (N, in) rows grouped by expert, weight (E, out, in), offsets (E,) the groups' cumulative ends: torch's
    grouped GEMM (`F.grouped_mm`, `torch._grouped_mm`: CPU, CUDA sm80+) as one call, or None where it does not
    serve (no such op, an NPU, an older GPU, widths whose rows are not 16-byte multiples, unaligned storage)."""
    grouped = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
    if grouped is None or x.dtype != weight.dtype or x.device.type not in ("cpu", "cuda"):
        return None
    if x.device.type == "cuda" and torch.cuda.get_device_capability(x.device) < (8, 0):
        return None
    size = x.element_size()
    if any(d * size % 16 for d in weight.shape[1:]) or x.data_ptr() % 16 or weight.data_ptr() % 16:
        return None
    ends = torch.from_numpy(np.asarray(offsets, dtype=np.int32)).to(x.device)
    return grouped(x.contiguous(), weight.transpose(1, 2), offs=ends)


# ------------------------------------------------------------------------------------- fused Ascend kernels
# MindSpeed's --use-fused-rmsnorm / --use-fused-swiglu / --use-fused-rotary-pos-emb: the training entry switches
# them on (use_fused); each function below calls torch_npu's kernel for an NPU tensor and returns None
# everywhere else, where `ops` runs the unfused math. Documented signatures (torch_npu's API reference):
#   torch_npu.npu_rms_norm(x, gamma, epsilon=1e-6) -> (y, rstd)
#   torch_npu.npu_swiglu(x, dim=-1) -> silu(first half of x) * second half
#   torch_npu.npu_rotary_mul(x, r1, r2) -> x * r1 + rotate_half(x) * r2
# Not run on Ascend hardware here (no NPU): unverified there.
FUSED: dict[str, bool] = {"rms_norm": False, "swiglu": False, "rotary": False}


def use_fused(**switches: bool) -> None:
    """Switch the fused Ascend kernels on or off by name (rms_norm, swiglu, rotary)."""
    unknown = sorted(set(switches) - set(FUSED))
    if unknown:
        raise ValueError(f"unknown fused kernel(s) {unknown}; use some of {sorted(FUSED)}")
    FUSED.update({name: bool(on) for name, on in switches.items()})


def _npu_kernel(name: str, x: torch.Tensor, switch: str) -> Any:
    if not FUSED[switch] or x.device.type != "npu":
        return None
    return getattr(sys.modules.get("torch_npu"), name, None)


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    kernel = _npu_kernel("npu_rms_norm", x, "rms_norm")
    return None if kernel is None else kernel(x, weight.to(x.dtype), epsilon=eps)[0]


def fused_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
    kernel = _npu_kernel("npu_swiglu", gate, "swiglu")
    return None if kernel is None else kernel(torch.cat([gate, up], dim=-1), dim=-1)


def fused_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    kernel = _npu_kernel("npu_rotary_mul", x, "rotary")
    return None if kernel is None or x.dim() != 4 else kernel(x, cos.to(x.dtype), sin.to(x.dtype))
