"""The hp contraction's plain case (kernels/triton/contraction._hp_kernel without a mask, band or flags) with
its int8 slice tiles brought in by TMA descriptors, so that Triton's Hopper warp specialization can take the
K loop (its pass needs descriptor loads: with pointer loads it stops on an assertion in WSLowerToken).

Slices q [SLICES, rows, Kp] are read through one descriptor over q.view(SLICES * rows, Kp): slice i of row r
is descriptor row i * rows + r. A tile's rows past its batch read the next rows (never stored, each output row
depending on its own A row only); K past Kp reads TMA's zero fill, as the pointer kernel's masked loads read 0.
The slice products are integer dots, exact, so the loads' route cannot change a bit. An experiment run by
benchmarks/hp_tma.py, not a production path (docs/perf.md says what it measured).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.triton.contraction import KS, Sliced, _combine, _tile_value, tile_rows
from kernels.triton.launch import BR_OPTIONS, cdiv


@triton.jit
def _tma_dots(a_desc, b_desc, a0, b0, RA, RB, k0, k1, c0, c1, c2, WS: tl.constexpr, BK: tl.constexpr,
              STAGES: tl.constexpr):
    """The three slices' products of K-steps [k0, k1) into c_t (t = i + j), as contraction._dot_step."""
    for k in tl.range(k0, k1, BK, num_stages=STAGES, warp_specialize=WS):
        x0 = a_desc.load([a0, k])
        y0 = b_desc.load([b0, k])
        c0 = tl.dot(x0, tl.trans(y0), c0, out_dtype=tl.int32)
        x1 = a_desc.load([a0 + RA, k])
        y1 = b_desc.load([b0 + RB, k])
        c1 = tl.dot(x0, tl.trans(y1), c1, out_dtype=tl.int32)
        c1 = tl.dot(x1, tl.trans(y0), c1, out_dtype=tl.int32)
        x2 = a_desc.load([a0 + 2 * RA, k])
        y2 = b_desc.load([b0 + 2 * RB, k])
        c2 = tl.dot(x0, tl.trans(y2), c2, out_dtype=tl.int32)
        c2 = tl.dot(x1, tl.trans(y1), c2, out_dtype=tl.int32)
        c2 = tl.dot(x2, tl.trans(y0), c2, out_dtype=tl.int32)
    return c0, c1, c2


@triton.jit
def _hp_tma_kernel(a_desc, b_desc, ea_ptr, eb_ptr, bada_ptr, badb_ptr, out_ptr, M, N, Kp, RA, RB,
                   LONG_K: tl.constexpr, WS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   GROUP_M: tl.constexpr, STAGES: tl.constexpr):
    """out[b] [M, N] = A[b] . B[b]^T from three slices; LONG_K: int32 sums flushed to int64 every KS steps."""
    batch = tl.program_id(1).to(tl.int64)
    rm, rn = tile_rows(tl.program_id(0), M, N, BM, BN, GROUP_M)
    a_live, b_live = rm < M, rn < N
    a_rows = batch * M + tl.where(a_live, rm, 0)
    b_rows = batch * N + tl.where(b_live, rn, 0)
    a0 = (batch * M + tl.min(rm, 0)).to(tl.int32)
    b0 = (batch * N + tl.min(rn, 0)).to(tl.int32)
    c0 = tl.zeros([BM, BN], tl.int32)
    c1 = tl.zeros([BM, BN], tl.int32)
    c2 = tl.zeros([BM, BN], tl.int32)
    if LONG_K:
        acc = tl.zeros([BM, BN], tl.int64)
        for k1 in range(0, Kp, KS):
            c0, c1, c2 = _tma_dots(a_desc, b_desc, a0, b0, RA, RB, k1, tl.minimum(k1 + KS, Kp), c0 * 0, c1 * 0,
                                   c2 * 0, WS, BK, STAGES)
            acc += _combine(c0, c1, c2, c2, 3)
    else:
        c0, c1, c2 = _tma_dots(a_desc, b_desc, a0, b0, RA, RB, 0, Kp, c0, c1, c2, WS, BK, STAGES)
        acc = _combine(c0, c1, c2, c2, 3)
    y = _tile_value(acc, a_rows, b_rows, ea_ptr, eb_ptr, bada_ptr, badb_ptr, a_live, b_live, 3)
    tl.store(out_ptr + (batch * M + rm[:, None]) * N + rn[None, :], y, mask=a_live[:, None] & b_live[None, :])


def hp_gemm_tma(a: Sliced, b: Sliced, batch: int, m: int, n: int, *, ws: bool = False, warps: int = 8,
                stages: int = 3, bm: int = 128, bn: int = 64, bk: int = 128) -> torch.Tensor:
    """contraction.hp_gemm(a, b, batch, m, n) (3 slices, no post factor, mask, band or flags) via TMA loads."""
    slices, rows_a, kp = a.q.shape
    if slices != 3 or b.q.shape[0] != 3 or b.q.shape[2] != kp:
        raise ValueError(f"hp_gemm_tma: arguments 'a', 'b' must be 3-slice operands over one K, got "
                         f"{tuple(a.q.shape)} and {tuple(b.q.shape)}")
    out = torch.empty((batch, m, n), dtype=torch.float32, device=a.q.device)
    if out.numel() == 0:
        return out
    ad = TensorDescriptor.from_tensor(a.q.view(-1, kp), [bm, bk])
    bd = TensorDescriptor.from_tensor(b.q.view(-1, kp), [bn, bk])
    _hp_tma_kernel[(cdiv(m, bm) * cdiv(n, bn), batch)](
        ad, bd, a.e, b.e, a.bad, b.bad, out, m, n, kp, rows_a, b.q.shape[1], LONG_K=kp > KS.value, WS=ws, BM=bm,
        BN=bn, BK=bk, GROUP_M=8, STAGES=stages, num_warps=warps, **BR_OPTIONS)
    return out
