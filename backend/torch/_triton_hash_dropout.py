"""The hash dropout as one Triton kernel (imported by kernels.py only when Triton is installed).

x * (keep * scale), keep[i] = hash32(i * multiplier + offset) >= threshold: backend/dropout_hash.py's
mask, bit for bit. Triton reads only constexpr globals, hence the annotations.

Written for memory bandwidth, as F.dropout is: each element is read once and written once, its word hashed in
registers (a few integer operations, no memory), and nothing is stored for backward (kernels.py launches the same
kernel on the gradient with the same key). A program covers BLOCK elements (4096 by default: 16 per thread over
8 warps, i.e. 16-byte vector loads); the index stays 32-bit unless the tensor has 2**31 elements or more (WIDE),
and the bounds mask is dropped when BLOCK divides the size (EVEN), so the loads and stores are unpredicated.
"""
import triton
import triton.language as tl

from mmrun.backend import dropout_hash

SHIFT0: tl.constexpr = tl.constexpr(dropout_hash.XORSHIFTS[0])
SHIFT1: tl.constexpr = tl.constexpr(dropout_hash.XORSHIFTS[1])
SHIFT2: tl.constexpr = tl.constexpr(dropout_hash.XORSHIFTS[2])
MULT0: tl.constexpr = tl.constexpr(dropout_hash.MULTIPLIERS[0])
MULT1: tl.constexpr = tl.constexpr(dropout_hash.MULTIPLIERS[1])

BLOCK = 4096
WARPS = 8
INT32_LIMIT = 1 << 31


# The keys arrive as int32 bit patterns (kernels._as_int32): one specialisation whatever their values.
@triton.jit(do_not_specialize=["multiplier", "offset", "threshold"])
def hash_dropout_kernel(x_ptr, out_ptr, numel, multiplier, offset, threshold, scale, BLOCK: tl.constexpr,
                        EVEN: tl.constexpr, WIDE: tl.constexpr):
    if WIDE:
        index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        index = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # uint32 arithmetic wraps modulo 2**32, exactly the reference's (dropout_hash.random_words).
    h = index.to(tl.uint32) * multiplier.to(tl.uint32, bitcast=True) + offset.to(tl.uint32, bitcast=True)
    h = h ^ (h >> SHIFT0)
    h = h * MULT0
    h = h ^ (h >> SHIFT1)
    h = h * MULT1
    h = h ^ (h >> SHIFT2)
    keep = h >= threshold.to(tl.uint32, bitcast=True)
    # Streamed: every element is touched once, so it need not stay in L2 for anyone.
    if EVEN:
        x = tl.load(x_ptr + index, eviction_policy="evict_first")
    else:
        x = tl.load(x_ptr + index, mask=index < numel, eviction_policy="evict_first")
    # x * (keep * scale) rather than where(keep, x * scale, 0): the same -0.0 and NaN as the eager path.
    y = x * tl.where(keep, scale, 0.0).to(x.dtype)
    if EVEN:
        tl.store(out_ptr + index, y)
    else:
        tl.store(out_ptr + index, y, mask=index < numel)


def launch(x, out, numel: int, multiplier: int, offset: int, threshold: int, scale: float, block: int = BLOCK) -> None:
    hash_dropout_kernel[(-(-numel // block),)](x, out, numel, multiplier, offset, threshold, scale, BLOCK=block,
                                                EVEN=numel % block == 0, WIDE=numel >= INT32_LIMIT,
                                                num_warps=WARPS if block >= 2048 else 4)
