"""Triton twin of kernels/ref/intmm.py: exact int8 x int8 -> int32 GEMMs, and the GEMM every int8 twin shares.

Integer products and sums are exact, so any tile shape, split or accumulation order gives the reference's
integers. Both operands are read K-contiguous ([M, K] and [N, K]): Hopper's int8 wgmma takes only K-major
operands, so B is transposed once in memory rather than in shared memory per tile.
The shared GEMM (`gemm`) takes an optional float32 epilogue, applied per element in the references' order:
((float32(acc) * row_scale[m]) * col_scale[n]) * inv, then a zero mask, then NaN on flagged rows/columns.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ref import intmm as ref
from kernels.ref.checks import expect, same_device
from kernels.triton.ieee import div_rn, nan_f64
from kernels.triton.launch import BR_OPTIONS, INTERPRET, cdiv, on_triton

QMAX = tl.constexpr(127.0)
MAX_BATCH = 65535  # CUDA's grid y limit: the batch index of a batched GEMM


@triton.jit
def _epilogue(acc, rm, rn, M, N, rs_ptr, cs_ptr, inv, badr_ptr, badc_ptr, msrc_ptr, mscale_ptr, mscale_stride,
              HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr, HAS_INV: tl.constexpr, HAS_BAD: tl.constexpr,
              HAS_MASK: tl.constexpr):
    """float32 [BM, BN] from the int32 tile, each step one rounded float32 op (no FMA: BR_OPTIONS)."""
    y = acc.to(tl.float32)  # int32 -> float32, round to nearest: as torch's .to(float32)
    if HAS_ROW:
        y = y * tl.load(rs_ptr + rm, mask=rm < M, other=1.0)[:, None]
    if HAS_COL:
        y = y * tl.load(cs_ptr + rn, mask=rn < N, other=1.0)[None, :]
    if HAS_INV:
        y = y * inv  # a power of two: exact
    if HAS_BAD:
        bad = (tl.load(badr_ptr + rm, mask=rm < M, other=0)[:, None]
               | tl.load(badc_ptr + rn, mask=rn < N, other=0)[None, :])
        y = tl.where(bad != 0, nan_f64().to(tl.float32), y)
    if HAS_MASK:
        # the straight-through gate: keep y where |src / scale[m]| <= 127 (a NaN ratio drops it, as the reference)
        m2 = (rm[:, None] < M) & (rn[None, :] < N)
        src = tl.load(msrc_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], mask=m2, other=0.0).to(tl.float32)
        sc = tl.load(mscale_ptr + rm * mscale_stride, mask=rm < M, other=1.0)
        v = div_rn(src, tl.broadcast_to(sc[:, None], src.shape))
        y = tl.where(tl.abs(v) <= QMAX, y, 0.0)
    return y


@triton.jit  # sizes specialized: a K divisible by 16 lets the K-tail mask keep 16-byte async copies
def _gemm_kernel(a_ptr, b_ptr, out_ptr, M, N, K, s_ab, s_am, s_ak, s_bb, s_bn, s_bk, s_ob, s_om,
                 rs_ptr, cs_ptr, inv, badr_ptr, badc_ptr, msrc_ptr, mscale_ptr, mscale_stride,
                 FLOAT_OUT: tl.constexpr, HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr, HAS_INV: tl.constexpr,
                 HAS_BAD: tl.constexpr, HAS_MASK: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    """out[b] = A[b] [M, K] . B[b] [N, K]^T, int8 operands, exact int32 accumulation; the last dim of out is N."""
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    # grouped tile order: GROUP_M row tiles share each B column tile while it is in L2 (no effect on bits)
    grid_m = tl.cdiv(M, BM)
    grid_n = tl.cdiv(N, BN)
    width = GROUP_M * grid_n
    first_m = (pid // width) * GROUP_M
    gm = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % gm
    pid_n = (pid % width) // gm
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    # rows past the edge read a valid row (their results are never stored): no row mask in the K loop
    am = tl.where(rm < M, rm, 0).to(tl.int64)
    bn = tl.where(rn < N, rn, 0).to(tl.int64)
    a_ptrs = a_ptr + batch * s_ab + am[:, None] * s_am + rk[None, :] * s_ak
    b_ptrs = b_ptr + batch * s_bb + bn[:, None] * s_bn + rk[None, :] * s_bk
    acc = tl.zeros([BM, BN], tl.int32)
    for k0 in range(0, K, BK):
        kin = (k0 + rk) < K
        a = tl.load(a_ptrs, mask=kin[None, :], other=0)  # zero padding along K adds nothing: exact
        b = tl.load(b_ptrs, mask=kin[None, :], other=0)
        acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
        a_ptrs += BK * s_ak
        b_ptrs += BK * s_bk
    out_m = (rm[:, None] < M) & (rn[None, :] < N)
    o_ptrs = out_ptr + batch * s_ob + rm[:, None].to(tl.int64) * s_om + rn[None, :]
    if FLOAT_OUT:
        y = _epilogue(acc, rm, rn, M, N, rs_ptr, cs_ptr, inv, badr_ptr, badc_ptr, msrc_ptr, mscale_ptr,
                      mscale_stride, HAS_ROW, HAS_COL, HAS_INV, HAS_BAD, HAS_MASK)
        tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=out_m)  # bf16 out: round to nearest even
    else:
        tl.store(o_ptrs, acc, mask=out_m)


# Tile shape and pipeline depth: free choices, since integer results do not depend on them (the alternatives
# timed at the linears' shapes: tile sweep, commit eea27bf; `git show 0106f46:docs/perf.md`).
TILE = dict(BM=128, BN=128, BK=64, GROUP_M=8, num_warps=4, num_stages=5)  # 1.04-1.15x 128 x 128 x 128 (docs/perf.md)
# with the straight-through gate's epilogue (a float32 read and a division per output): 1.04x TILE for these
MASK_TILE = dict(BM=128, BN=128, BK=128, GROUP_M=8, num_warps=8, num_stages=4)
SMALL_M_TILE = dict(BM=64, BN=128, BK=128, GROUP_M=8, num_warps=4, num_stages=4)  # at most 64 rows
INTERPRET_TILE = dict(BM=64, BN=64, BK=64, GROUP_M=8, num_warps=4, num_stages=1)


def _config(m: int, n: int, masked: bool) -> dict:
    if INTERPRET:
        return INTERPRET_TILE
    return SMALL_M_TILE if m <= 64 else MASK_TILE if masked else TILE


def k_major(b: torch.Tensor) -> torch.Tensor:
    """b [..., K, N] as a K-contiguous [..., N, K] (a view when b is already column-major)."""
    bt = b.transpose(-1, -2)
    return bt if bt.stride(-1) == 1 else bt.contiguous()


def gemm(a: torch.Tensor, bt: torch.Tensor, *, out_dtype=torch.int32, row_scale=None, col_scale=None,
         inv: float | None = None, bad_rows=None, bad_cols=None, mask_src=None, mask_scale=None,
         config: dict | None = None) -> torch.Tensor:
    """a [(B,) M, K] int8 . bt [(B,) N, K] int8 -> [(B,) M, N]: int32, or float32/bf16 through the epilogue.

    Operands may be strided views with a unit K stride. row_scale [M] / col_scale [N] float32, inv a power of
    two, bad_rows [M] / bad_cols [N] int32 (NaN where either is set); mask_src [M, N] (contiguous) and
    mask_scale [M] (or a 0-dim tensor) gate the result to 0 where |mask_src / mask_scale| > 127.
    """
    batched = a.dim() == 3
    a3 = a if batched else a.unsqueeze(0)
    b3 = bt if batched else bt.unsqueeze(0)
    nb, m, k = a3.shape
    n = b3.shape[1]
    out = torch.empty((nb, m, n), dtype=out_dtype, device=a.device)
    if out.numel() == 0:
        return out if batched else out[0]
    floating = out_dtype != torch.int32
    dummy = out  # stands in for absent optional pointers (never read: their flags are off)
    ms = mask_scale
    cfg = dict(config or _config(m, n, mask_src is not None))
    grid = (cdiv(m, cfg["BM"]) * cdiv(n, cfg["BN"]), nb)
    _gemm_kernel[grid](
        a3, b3, out, m, n, k, a3.stride(0), a3.stride(1), a3.stride(2), b3.stride(0), b3.stride(1), b3.stride(2),
        out.stride(0), out.stride(1),
        row_scale if row_scale is not None else dummy, col_scale if col_scale is not None else dummy,
        float(inv or 1.0), bad_rows if bad_rows is not None else dummy, bad_cols if bad_cols is not None else dummy,
        mask_src if mask_src is not None else dummy, ms if ms is not None else dummy,
        (0 if ms.dim() == 0 else ms.stride(0)) if ms is not None else 0,
        FLOAT_OUT=floating, HAS_ROW=row_scale is not None, HAS_COL=col_scale is not None,
        HAS_INV=inv is not None, HAS_BAD=bad_rows is not None, HAS_MASK=mask_src is not None,
        **cfg, **BR_OPTIONS)
    return out if batched else out[0]


def int8_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] int8 @ b [K, N] int8 -> int32 [M, N], exact: the integers of kernels.ref.intmm.int8_mm."""
    expect("int8_mm", "a", a, dtype=torch.int8, ndim=2)
    expect("int8_mm", "b", b, dtype=torch.int8, ndim=2)
    same_device("int8_mm", a=a, b=b)
    if not on_triton(a, b) or a.shape[1] != b.shape[0]:
        return ref.int8_mm(a, b)
    a = a if a.stride(-1) == 1 else a.contiguous()
    return gemm(a, k_major(b))


def int8_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched int8_mm over leading dims: a [..., M, K] @ b [..., K, N] -> int32 [..., M, N]."""
    if a.dim() == 2:
        return int8_mm(a, b)
    if not on_triton(a, b) or a.dim() < 2 or b.dim() != a.dim() or b.shape[:-2] != a.shape[:-2] \
            or a.dtype != torch.int8 or b.dtype != torch.int8 or a.shape[-1] != b.shape[-2]:
        return ref.int8_bmm(a, b)
    lead = a.shape[:-2]
    a3 = a.reshape(-1, *a.shape[-2:])
    if not 0 < a3.shape[0] <= MAX_BATCH:
        return ref.int8_bmm(a, b)
    b3 = k_major(b.reshape(-1, *b.shape[-2:]))
    a3 = a3 if a3.stride(-1) == 1 else a3.contiguous()
    return gemm(a3, b3).reshape(*lead, a.shape[-2], b.shape[-1])


def __getattr__(name: str):
    return getattr(ref, name)
