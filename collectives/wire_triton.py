"""The compact wire's passes on CUDA tensors as Triton kernels, with the eager passes' bits (collectives/exact_wire.py
has the definition; collectives/wire_cpu.cpp is the CPU twin).

`scan`: one program a block (normalize in place, E, the stand-in flag); `encode` and `decode`: one program a tile
of elements, each element's shift gathered from its block's. Every integer step is the eager one's (int64, shifts
clamped to 0..63, wrapping adds) or exact by the same argument (the floor as _floor_shift's three terms); every
float64 step is one rounding as in eager torch (no FMA contraction), and the float32 rounding is to nearest even.
"""
from __future__ import annotations

import os
import struct

import torch
import triton
import triton.language as tl

# TRITON_INTERPRET=1 runs the kernels on the CPU with numpy: a logic check, never evidence of GPU bits
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# bit-relevant: as kernels/triton/launch.BR_OPTIONS (collectives import no kernels): no FMA contraction of the
# settle test's products and sums, no flushed subnormals
BR_OPTIONS = {"enable_fp_fusion": False, "enable_reflect_ftz": False}
TILE = 1024
DIGIT = tl.constexpr(40)
LOW40 = tl.constexpr((1 << 40) - 1)
# powers of two: float32 constants exactly, widened exactly
M80, M40 = tl.constexpr(float(1 << 80)), tl.constexpr(float(1 << 40))
DOWN, MARGIN = tl.constexpr(2.0 ** -96), tl.constexpr(2.0 ** -40)


def takes(*tensors: torch.Tensor | None) -> bool:
    """True where these kernels can take the tensors: all on CUDA (on the CPU under the interpreter), rows
    contiguous."""
    present = [t for t in tensors if t is not None]
    on = (lambda t: t.device.type == "cpu") if INTERPRET else (lambda t: t.is_cuda)
    return bool(present) and all(on(t) and t.stride(-1) == 1 for t in present)


@triton.jit
def _bits(x):
    """bit_length of int64 x >= 1 from float64's exponent field, as exact_wire._bits (frexp's exponent)."""
    return ((x.to(tl.float64).to(tl.int64, bitcast=True) >> 52) & 2047) - 1022


@triton.jit
def _fold(v):
    """v for v >= 0, -v - 1 for v < 0: the largest over a block is exact_wire._span's max(max v, -min v - 1)."""
    return v ^ (v >> 63)


@triton.jit
def _sh(x, k):
    """x << k for k in 0..63 (int64, wrapping)."""
    return x << tl.minimum(tl.maximum(k, 0), 63)


@triton.jit
def _shr(x, k):
    """x >> k (arithmetic) for k clamped to 0..63."""
    return x >> tl.minimum(tl.maximum(k, 0), 63)


@triton.jit
def _mask(k):
    """2^k - 1 (0 for k <= 0), for k <= 62 (exact_wire._mask)."""
    return (tl.full(k.shape, 1, tl.int64) << tl.minimum(tl.maximum(k, 0), 62)) - 1


@triton.jit(do_not_specialize=["n", "block", "stride"])
def _scan_kernel(l_ptr, stride, bad_ptr, top_ptr, flag_ptr, n, block, HAS_BAD: tl.constexpr, TILE: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    a = b * block
    e = tl.minimum(a + block, n)
    m = tl.zeros([TILE], tl.int64)  # masked lanes add 0: the span is at least 0
    flagged = tl.zeros([TILE], tl.int32)
    for off in range(0, block, TILE):
        idx = a + off + tl.arange(0, TILE)
        on = idx < e
        y0 = tl.load(l_ptr + idx, mask=on, other=0)
        y1 = tl.load(l_ptr + stride + idx, mask=on, other=0)
        y2 = tl.load(l_ptr + 2 * stride + idx, mask=on, other=0)
        x1 = y1 + (y0 >> DIGIT)  # limbs.normalize_
        x0 = y0 & LOW40
        x2 = y2 + (x1 >> DIGIT)
        x1 = x1 & LOW40
        tl.store(l_ptr + idx, x0, mask=on & (x0 != y0))  # only the words that change
        tl.store(l_ptr + stride + idx, x1, mask=on & (x1 != y1))
        tl.store(l_ptr + 2 * stride + idx, x2, mask=on & (x2 != y2))
        m = tl.maximum(m, tl.where(on, _fold(x2), 0))
        if HAS_BAD:
            flagged = flagged | (on & (tl.load(bad_ptr + idx, mask=on, other=0.0) != 0.0)).to(tl.int32)
    m = tl.max(m, axis=0)
    top = _bits(m + 1) + 2 * DIGIT
    if m == 0:  # l2 in {0, -1} on the block: on with v = l2 2^40 + l1, then L (exact_wire._top)
        tl.debug_barrier()  # the normalized limbs, stored above, are read back
        mv = tl.zeros([TILE], tl.int64)
        for off in range(0, block, TILE):
            idx = a + off + tl.arange(0, TILE)
            on = idx < e
            v = (tl.load(l_ptr + 2 * stride + idx, mask=on, other=0) << DIGIT) + tl.load(l_ptr + stride + idx,
                                                                                          mask=on, other=0)
            mv = tl.maximum(mv, _fold(v))
        m = tl.max(mv, axis=0)
        top = _bits(m + 1) + DIGIT
        if m == 0:
            mv = tl.zeros([TILE], tl.int64)
            for off in range(0, block, TILE):
                idx = a + off + tl.arange(0, TILE)
                on = idx < e
                v = (tl.load(l_ptr + 2 * stride + idx, mask=on, other=0) << DIGIT) + tl.load(
                    l_ptr + stride + idx, mask=on, other=0)
                v = (v << DIGIT) + tl.load(l_ptr + idx, mask=on, other=0)
                mv = tl.maximum(mv, _fold(v))  # masked lanes load 0: _fold(0) = 0
            top = _bits(tl.max(mv, axis=0) + 1)
    tl.store(top_ptr + b, top.to(tl.int32))
    if HAS_BAD:
        tl.store(flag_ptr + b, tl.max(flagged, axis=0))


@triton.jit(do_not_specialize=["n", "block", "stride"])
def _encode_kernel(l_ptr, stride, s_ptr, w_ptr, n, block, K: tl.constexpr, TILE: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    on = idx < n
    s = tl.load(s_ptr + idx // block, mask=on, other=0)
    l0 = tl.load(l_ptr + idx, mask=on, other=0)
    l1 = tl.load(l_ptr + stride + idx, mask=on, other=0)
    l2 = tl.load(l_ptr + 2 * stride + idx, mask=on, other=0)
    # floor(L / 2^s) as exact_wire._floor_shift: each term the floor of its limb's part, wrapping terms cancel
    k2 = 80 - s
    t2 = tl.where(k2 < 64, _shr(_sh(l2, k2), -k2), 0)
    h = t2 + _shr(_sh(l1, -s + DIGIT), s - DIGIT) + _shr(l0, s)
    low = (l0 & _mask(s)) | (l1 & _mask(s - DIGIT)) | (l2 & _mask(s - 2 * DIGIT))
    tl.store(w_ptr + idx, (h << K) | (low != 0).to(tl.int64), mask=on)


@triton.jit(do_not_specialize=["n", "block", "scale_bits"])
def _decode_kernel(w_ptr, s_ptr, out_ptr, state_ptr, n, block, scale_bits, K: tl.constexpr, TILE: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    on = idx < n
    s = tl.load(s_ptr + idx // block, mask=on, other=0)
    w = tl.load(w_ptr + idx, mask=on, other=0)
    scale = scale_bits.to(tl.int64).to(tl.float64, bitcast=True)  # the host double, bit for bit
    h = w >> K
    f = w & ((1 << K) - 1)
    lo = h.to(tl.float64) * (((s - 96 + 1023) << 52).to(tl.float64, bitcast=True) * scale)
    tl.store(out_ptr + idx, lo.to(tl.float32), mask=on)
    # exact_wire._settled: the normalized limbs of (h + f) 2^s - f, the chain, the widened ends' float32 bits
    hf = h + f
    n0 = _sh(hf, tl.minimum(s, DIGIT)) & LOW40
    n1 = _shr(_sh(hf, tl.minimum(s - DIGIT, DIGIT)), -s + DIGIT) & LOW40
    n2 = _shr(_sh(hf, s - 2 * DIGIT), -s + 2 * DIGIT)
    n0 = n0 - f
    n1 = n1 + (n0 >> DIGIT)
    n0 = n0 & LOW40
    n2 = n2 + (n1 >> DIGIT)
    n1 = n1 & LOW40
    v = (n2.to(tl.float64) * M80 + n1.to(tl.float64) * M40) + n0.to(tl.float64)
    w_hi = (v * DOWN) * scale
    down = (lo - tl.abs(lo) * MARGIN).to(tl.float32)
    up = (w_hi + tl.abs(w_hi) * MARGIN).to(tl.float32)
    late = down.to(tl.int32, bitcast=True) != up.to(tl.int32, bitcast=True)
    tl.store(state_ptr + idx, tl.where(f != 0, 1 + late.to(tl.int8), 0).to(tl.int8), mask=on)


def _tile(block: int) -> int:
    return min(TILE, 1 << max(block - 1, 0).bit_length())


def scan(limbs: torch.Tensor, bad: torch.Tensor | None, block: int, top: torch.Tensor, flag: torch.Tensor) -> None:
    """Phase 1 on one part: normalize limbs (3, n) in place; per block E into top and the bad flag into flag."""
    n = limbs.shape[1]
    if n:
        _scan_kernel[(triton.cdiv(n, block),)](limbs, limbs.stride(0), bad if bad is not None else limbs, top, flag,
                                               n, block, HAS_BAD=bad is not None, TILE=_tile(block), **BR_OPTIONS)


def encode(limbs: torch.Tensor, s: torch.Tensor, k: int, block: int, words: torch.Tensor) -> None:
    """Phase 2's words of one part (normalized limbs (3, n), s per block int64) into words (n,)."""
    n = limbs.shape[1]
    if n:
        _encode_kernel[(triton.cdiv(n, TILE),)](limbs, limbs.stride(0), s, words, n, block, K=k, TILE=TILE,
                                                **BR_OPTIONS)


def decode(s: torch.Tensor, k: int, words: torch.Tensor, scale: float, out: torch.Tensor,
           block: int) -> tuple[torch.Tensor, int]:
    """out = the result at lo of one part's summed words; (its elements that need phase 3, how many had F > 0)."""
    n = words.numel()
    state = torch.zeros(n, dtype=torch.int8, device=words.device)  # 0: F = 0, 1: settled, 2: phase 3
    if n:
        bits = struct.unpack("<q", struct.pack("<d", float(scale)))[0]
        _decode_kernel[(triton.cdiv(n, TILE),)](words, s, out, state, n, block, bits, K=k, TILE=TILE, **BR_OPTIONS)
    return (state == 2).nonzero().squeeze(1), int(torch.count_nonzero(state))
