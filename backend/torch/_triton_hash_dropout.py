"""The hash dropout as one Triton kernel (imported by kernels.py only when Triton is installed).

x * (keep * scale), keep[i] = hash32(i * multiplier + offset) >= threshold: backend/dropout_hash.py's
mask, bit for bit. Triton reads only constexpr globals, hence the annotations.
"""
import triton
import triton.language as tl

from mmrun.backend import dropout_hash

SHIFT0: tl.constexpr = tl.constexpr(dropout_hash.XORSHIFTS[0])
SHIFT1: tl.constexpr = tl.constexpr(dropout_hash.XORSHIFTS[1])
SHIFT2: tl.constexpr = tl.constexpr(dropout_hash.XORSHIFTS[2])
MULT0: tl.constexpr = tl.constexpr(dropout_hash.MULTIPLIERS[0])
MULT1: tl.constexpr = tl.constexpr(dropout_hash.MULTIPLIERS[1])


# The keys arrive as int32 bit patterns (kernels._as_int32): one specialisation whatever their values.
@triton.jit(do_not_specialize=["multiplier", "offset", "threshold"])
def hash_dropout_kernel(x_ptr, out_ptr, numel, multiplier, offset, threshold, scale, BLOCK: tl.constexpr):
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = index < numel
    # uint32 arithmetic wraps modulo 2**32, exactly the reference's (dropout_hash.random_words).
    h = index.to(tl.uint32) * multiplier.to(tl.uint32, bitcast=True) + offset.to(tl.uint32, bitcast=True)
    h = h ^ (h >> SHIFT0)
    h = h * MULT0
    h = h ^ (h >> SHIFT1)
    h = h * MULT1
    h = h ^ (h >> SHIFT2)
    keep = h >= threshold.to(tl.uint32, bitcast=True)
    x = tl.load(x_ptr + index, mask=inside)
    # x * (keep * scale) rather than where(keep, x * scale, 0): the same -0.0 and NaN as the eager path.
    factor = tl.where(keep, scale, 0.0).to(x.dtype)
    tl.store(out_ptr + index, x * factor, mask=inside)


def launch(x, out, numel: int, multiplier: int, offset: int, threshold: int, scale: float, block: int) -> None:
    hash_dropout_kernel[(triton.cdiv(numel, block),)](x, out, numel, multiplier, offset, threshold, scale,
                                                      BLOCK=block)
