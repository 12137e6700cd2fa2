"""Triton twin of kernels/ref/contraction.py: the BR int8-sliced high-precision matmul (hp_matmul).

`split` cuts each row of an operand (its contracted elements, at any strides) into `slices` int8 slices
exactly as ref.split_rows: the row's exponent e of its largest finite magnitude, r = x 2^(6 - e), then
q = round(r), r = (r - q) 128, all exact in float64. `hp_tile` multiplies the slices of a row tile and a
column tile: the products with i + j = t add in one int32 accumulator per t (|slice| <= 64, so 4 products
of at most 2^16 K-steps stay below 2^31; longer contractions flush to int64 every 2^16), the int64 total is
sum_t acc_t << 7 (2 (slices - 1) - t), converted once to float64 and scaled by the two exact powers of two
in the reference's order, NaN on non-finite rows/columns, one rounding to float32.
Integer sums are exact in any order, so the tiles, the split over K and the MMA order cannot change a bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ref import contraction as ref
from kernels.ref.checks import expect, same_device
from kernels.triton.fixedpoint import finite_abs
from kernels.triton.ieee import INF, frexp_exponent, isfinite, nan_f64, pow2, rint
from kernels.triton.intmm import MAX_BATCH
from kernels.triton.launch import BR_OPTIONS, INTERPRET, cdiv, on_triton, pow2_at_least

F32 = torch.float32
KS = tl.constexpr(65536)  # K-steps per int32 accumulation: 4 * 64 * 64 * 2^16 = 2^30 < 2^31
SPLIT_R, SPLIT_K, SPLIT_WARPS = 32, 64, 8  # a split's tile and warps: free for the bits (max and slices per element);
# 32 x 64 ran 1.33x faster than 32 x 128 on the H200 (tile sweep, commit eea27bf; `git show 0106f46:docs/perf.md`)
SPLIT_PROGRAMS = 1024  # programs worth launching for a split (~8 per H200 SM): K is cut into segments to reach it


@triton.jit
def _split_load(base, b, k, live, K, lim, s_col):
    """[R, BK] of the operand's rows as float64 (0 past K or lim)."""
    m = live[:, None] & (k < K)[None, :] & ((b * K)[:, None] + k[None, :] < lim)
    return tl.load(base[:, None] + k[None, :].to(tl.int64) * s_col, mask=m, other=0.0).to(tl.float64)


@triton.jit
def _split_stats(base, b, live, k_lo, k_hi, K, lim, s_col, R: tl.constexpr, BK: tl.constexpr):
    """(largest finite |x|, any non-finite) per row over elements [k_lo, k_hi)."""
    amax = tl.zeros([R, BK], tl.float64)
    bad = tl.zeros([R], tl.int32)
    for k0 in range(k_lo, k_hi, BK):
        x = _split_load(base, b, k0 + tl.arange(0, BK), live, K, lim, s_col)
        amax = tl.maximum(amax, finite_abs(x))
        bad = bad | tl.max(tl.where(isfinite(x), 0, 1), axis=1)
    return tl.max(amax, 1), bad


# K and lim are specialized (a multiple of 16 is the common case: d, a vocabulary, a token block): masks and
# offsets built from them are then visibly 16-aligned, and the loads along a row run 16 bytes wide
@triton.jit(do_not_specialize=["rows", "RB", "SEG"])
def _split_stats_kernel(x_ptr, s_batch, RB, s_row, s_col, rows, K, lim, SEG, part_ptr, badp_ptr,
                        R: tl.constexpr, BK: tl.constexpr):
    """The statistics of segment program_id(1) (SEG blocks of BK) of R rows -> part, badp [segments, rows]."""
    r = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    seg = tl.program_id(1)
    live = r < rows
    b = r // RB
    base = x_ptr + b * s_batch + (r % RB) * s_row
    lo = seg * SEG * BK  # SEG blocks of BK: a multiple of BK the compiler can see (aligned, vector loads)
    amax, bad = _split_stats(base, b, live, lo, tl.minimum(lo + SEG * BK, K), K, lim, s_col, R, BK)
    tl.store(part_ptr + seg * rows + r, amax, mask=live)
    tl.store(badp_ptr + seg * rows + r, bad, mask=live)


@triton.jit(do_not_specialize=["rows", "RB", "SEG", "NSEG"])  # K and lim specialized: as _split_stats_kernel
def _split_kernel(x_ptr, s_batch, RB, s_row, s_col, rows, K, lim, Kp, SEG, NSEG, part_ptr, badp_ptr, q_ptr, e_ptr,
                  bad_ptr, STATS: tl.constexpr, SLICES: tl.constexpr, R: tl.constexpr, BK: tl.constexpr):
    """Row r = (batch b, row i) of an operand, element k at x + b s_batch + i s_row + k s_col, valid for
    k < K and b K + k < lim -> slices [SLICES, rows, Kp] int8 (zero beyond K), exponent e [rows], bad [rows].

    Program (tile, seg) writes the seg-th SEG blocks of BK elements; with STATS the rows' statistics are the max
    and OR over the segments of _split_stats_kernel (order-free), else (one segment) they are taken here."""
    r = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    seg = tl.program_id(1)
    live = r < rows
    b = r // RB
    base = x_ptr + b * s_batch + (r % RB) * s_row
    if STATS:
        amax = tl.zeros([R], tl.float64)
        bad = tl.zeros([R], tl.int32)
        for s in range(0, NSEG):
            amax = tl.maximum(amax, tl.load(part_ptr + s * rows + r, mask=live, other=0.0))
            bad = bad | tl.load(badp_ptr + s * rows + r, mask=live, other=0)
    else:
        amax, bad = _split_stats(base, b, live, 0, K, K, lim, s_col, R, BK)
    e = frexp_exponent(amax)
    scale = pow2(6 - e)[:, None]
    plane = rows.to(tl.int64) * Kp  # one slice: may pass 2^31 bytes for a large head
    lo = seg * SEG * BK if STATS else 0  # one segment: the plain loop, as aligned as before segments existed
    hi = tl.minimum(lo + SEG * BK, Kp) if STATS else Kp
    for k0 in range(lo, hi, BK):
        k = k0 + tl.arange(0, BK)
        x = _split_load(base, b, k, live, K, lim, s_col)
        store_slices(x, scale, q_ptr + r[:, None] * Kp + k[None, :], plane, live[:, None] & (k < Kp)[None, :],
                     SLICES)
    if seg == 0:
        tl.store(e_ptr + r, e, mask=live)
        tl.store(bad_ptr + r, bad, mask=live)


@triton.jit
def store_slices(x, scale, out, plane, mask, SLICES: tl.constexpr):
    """The int8 slices of float64 x (non-finite as 0) at its row's scale 2^(6 - e), `plane` bytes apart."""
    v = tl.where(isfinite(x), x, 0.0) * scale  # |v| < 64, exact
    for i in tl.static_range(SLICES):
        q = rint(v)  # |q| <= 64: fits int8
        tl.store(out + i * plane, q.to(tl.int8), mask=mask)
        v = (v - q) * 128.0  # exact: q is v's nearest integer


BAND_ALIGN = tl.constexpr(128)  # a banded operand's K ranges start and end at multiples of this
KEY_ROWS, QUERY_ROWS = 1, 2  # the two banded operands (band_span's KBAND)


@triton.jit
def band_span(row0, T, K, window, KBAND: tl.constexpr):
    """(lo, hi, nseg): the K ranges [s T + lo, s T + hi), s < nseg, that hold every entry a sliding-`window`
    attention row of the aligned rows around row0 (its BAND_ALIGN rows) can see. KEY_ROWS: rows are keys j of
    P^T or dS^T, K the G T (query head, query) pairs, and query i sees key j iff j <= i < j + window;
    QUERY_ROWS: rows are queries (position row % T) of dS, K the T keys, seen iff i - window < j <= i."""
    a0 = (row0 % T) // BAND_ALIGN * BAND_ALIGN
    wspan = tl.cdiv(window - 1, BAND_ALIGN) * BAND_ALIGN  # window - 1 rounded up: the band past the rows' range
    if KBAND == 1:  # KEY_ROWS
        lo = a0
        hi = tl.minimum(a0 + BAND_ALIGN + wspan, T)
        nseg = K // T
    else:
        lo = tl.maximum(a0 - wspan, 0)
        hi = a0 + BAND_ALIGN
        nseg = 1
    return lo, hi, nseg


# K and T specialized (multiples of 128 on the band path) and K ranges stepped as block indices: loads and
# int8 stores run wide (docs/perf.md: attention ~7% faster a layer, across runs)
@triton.jit(do_not_specialize=["rows", "RB", "window"])
def _band_split_kernel(x_ptr, s_batch, RB, s_row, s_col, rows, K, Kp, T, window, bbad_ptr, q_ptr, e_ptr, bad_ptr,
                       KBAND: tl.constexpr, BATCH_BAD: tl.constexpr, SLICES: tl.constexpr, R: tl.constexpr,
                       BK: tl.constexpr):
    """_split_kernel's slices, exponents and flags for a banded operand (band_split), reading and writing only
    the K ranges of band_span (the slices elsewhere stay unwritten: the band GEMM never reads them).
    BATCH_BAD: bad[r] also |= bbad[batch of r] (the non-finite entries that can lie outside the ranges)."""
    r = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    live = r < rows
    b = r // RB
    base = x_ptr + b * s_batch + (r % RB) * s_row
    lim = (rows // RB) * K
    lo, hi, nseg = band_span((tl.program_id(0) * R) % RB, T, K, window, KBAND)  # R rows share one range
    amax = tl.zeros([R], tl.float64)
    bad = tl.zeros([R], tl.int32)
    for s in range(0, nseg):
        a, f = _split_stats(base, b, live, s * T + lo, s * T + hi, K, lim, s_col, R, BK)
        amax = tl.maximum(amax, a)
        bad = bad | f
    if BATCH_BAD:
        bad = bad | tl.load(bbad_ptr + b, mask=live, other=0)
    e = frexp_exponent(amax)
    scale = pow2(6 - e)[:, None]
    plane = rows.to(tl.int64) * Kp
    for s in range(0, nseg):
        for kb in range((s * T + lo) // BK, (s * T + hi) // BK):  # ranges are BAND_ALIGN multiples (band_split)
            k = kb * BK + tl.arange(0, BK)  # visibly a multiple of BK: aligned, wide stores
            x = _split_load(base, b, k, live, K, lim, s_col)
            store_slices(x, scale, q_ptr + r[:, None] * Kp + k[None, :], plane, live[:, None] & (k < Kp)[None, :],
                         SLICES)
    tl.store(e_ptr + r, e, mask=live)
    tl.store(bad_ptr + r, bad, mask=live)


class Sliced:
    """An operand cut into int8 slices: q [slices, rows, Kp], e [rows] int64, bad [rows] int32."""

    def __init__(self, q: torch.Tensor, e: torch.Tensor, bad: torch.Tensor):
        self.q, self.e, self.bad = q, e, bad


def split(x: torch.Tensor, rows: int, k: int, s_row: int, s_col: int, slices: int = ref.DEFAULT_SLICES, *,
          batch_rows: int | None = None, s_batch: int = 0, lim: int | None = None) -> Sliced:
    """Slices of `rows` rows of x (row i of batch b at x + b s_batch + (i % batch_rows) s_row, k s_col apart);
    `lim` masks the contracted index b K + k (for token blocks of which the last is short)."""
    out = empty_sliced(rows, k, slices, x.device)
    if not rows:
        return out
    rb = batch_rows or rows
    lim = lim if lim is not None else (rows // rb) * k
    kp = out.q.shape[2]
    tiles, blocks = cdiv(rows, SPLIT_R), cdiv(kp, SPLIT_K)
    # few long rows (the head's columns, a dW operand over tokens) would leave SMs idle: split K into segments
    seg = cdiv(blocks, min(blocks, cdiv(SPLIT_PROGRAMS, tiles)))  # blocks per segment
    nseg = cdiv(blocks, seg)
    part = torch.empty((nseg, rows) if nseg > 1 else (1,), dtype=torch.float64, device=x.device)
    badp = torch.empty((nseg, rows) if nseg > 1 else (1,), dtype=torch.int32, device=x.device)
    grid = (tiles, nseg)
    if nseg > 1:
        _split_stats_kernel[grid](x, s_batch, rb, s_row, s_col, rows, k, lim, seg, part, badp, R=SPLIT_R, BK=SPLIT_K,
                                  num_warps=SPLIT_WARPS, **BR_OPTIONS)
    _split_kernel[grid](x, s_batch, rb, s_row, s_col, rows, k, lim, kp, seg, nseg, part, badp, out.q, out.e, out.bad,
                        STATS=nseg > 1, SLICES=slices, R=SPLIT_R, BK=SPLIT_K, num_warps=SPLIT_WARPS,
                        **BR_OPTIONS)
    return out


def empty_sliced(rows: int, k: int, slices: int, device) -> Sliced:
    """Room for `rows` rows of k contracted elements; rows padded to Kp, a multiple of 16 (the GEMM's async
    copies stay wide; the zeros past k add nothing)."""
    kp = cdiv(max(k, 1), 16) * 16
    return Sliced(torch.empty((slices, rows, kp), dtype=torch.int8, device=device),
                  torch.empty(rows, dtype=torch.int64, device=device),
                  torch.empty(rows, dtype=torch.int32, device=device))


@triton.jit
def _dots(a_ptr, b_ptr, a_rows, b_rows, sa, sb, Kp, k0, k1, c0, c1, c2, c3,
          SLICES: tl.constexpr, BK: tl.constexpr):
    """Accumulate the slice products of K-steps [k0, k1) into c_t (t = i + j), int32, exact."""
    for k in range(k0, k1, BK):
        c0, c1, c2, c3 = _dot_step(a_ptr, b_ptr, a_rows, b_rows, sa, sb, Kp, k, c0, c1, c2, c3, SLICES, BK)
    return c0, c1, c2, c3


@triton.jit
def _dot_step(a_ptr, b_ptr, a_rows, b_rows, sa, sb, Kp, k, c0, c1, c2, c3, SLICES: tl.constexpr, BK: tl.constexpr):
    """The slice products of K-steps [k, k + BK) added to c_t (t = i + j)."""
    rk = tl.arange(0, BK)
    kin = (k + rk < Kp)[None, :]
    pa = a_ptr + a_rows[:, None] * Kp + (k + rk)[None, :]
    pb = b_ptr + b_rows[:, None] * Kp + (k + rk)[None, :]
    a0 = tl.load(pa, mask=kin, other=0)
    b0 = tl.load(pb, mask=kin, other=0)
    c0 = tl.dot(a0, tl.trans(b0), c0, out_dtype=tl.int32)
    if SLICES > 1:
        a1 = tl.load(pa + sa, mask=kin, other=0)
        b1 = tl.load(pb + sb, mask=kin, other=0)
        c1 = tl.dot(a0, tl.trans(b1), c1, out_dtype=tl.int32)
        c1 = tl.dot(a1, tl.trans(b0), c1, out_dtype=tl.int32)
    if SLICES > 2:
        a2 = tl.load(pa + 2 * sa, mask=kin, other=0)
        b2 = tl.load(pb + 2 * sb, mask=kin, other=0)
        c2 = tl.dot(a0, tl.trans(b2), c2, out_dtype=tl.int32)
        c2 = tl.dot(a1, tl.trans(b1), c2, out_dtype=tl.int32)
        c2 = tl.dot(a2, tl.trans(b0), c2, out_dtype=tl.int32)
    if SLICES > 3:
        a3 = tl.load(pa + 3 * sa, mask=kin, other=0)
        b3 = tl.load(pb + 3 * sb, mask=kin, other=0)
        c3 = tl.dot(a0, tl.trans(b3), c3, out_dtype=tl.int32)
        c3 = tl.dot(a1, tl.trans(b2), c3, out_dtype=tl.int32)
        c3 = tl.dot(a2, tl.trans(b1), c3, out_dtype=tl.int32)
        c3 = tl.dot(a3, tl.trans(b0), c3, out_dtype=tl.int32)
    return c0, c1, c2, c3


@triton.jit
def _shifted(c, t: tl.constexpr, SLICES: tl.constexpr):
    """The int64 value of accumulator c_t at its place: c_t << 7 (2 (slices - 1) - t)."""
    return c.to(tl.int64) << (7 * (2 * (SLICES - 1) - t))


@triton.jit
def _combine(c0, c1, c2, c3, SLICES: tl.constexpr):
    """sum_t c_t << 7 (2 (slices - 1) - t) in int64: exact (and mod 2^64 as the reference's, if ever beyond)."""
    acc = _shifted(c0, 0, SLICES)
    if SLICES > 1:
        acc += _shifted(c1, 1, SLICES)
    if SLICES > 2:
        acc += _shifted(c2, 2, SLICES)
    if SLICES > 3:
        acc += _shifted(c3, 3, SLICES)
    return acc


@triton.jit
def hp_tile(a_ptr, b_ptr, a_rows, b_rows, sa, sb, Kp, ea_ptr, eb_ptr, bada_ptr, badb_ptr, a_live, b_live,
            LONG_K: tl.constexpr, SLICES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """float32 [BM, BN] of ref.hp_matmul_ for slice rows a_rows (of A) and b_rows (of B^T).

    LONG_K (Kp > KS): the int32 accumulators flush to an int64 total every KS steps; otherwise they are
    combined once after the loop (no int64 tile held across it: fewer registers).
    """
    c0 = tl.zeros([BM, BN], tl.int32)
    c1 = tl.zeros([BM, BN], tl.int32)
    c2 = tl.zeros([BM, BN], tl.int32)
    c3 = tl.zeros([BM, BN], tl.int32)
    if LONG_K:
        acc = tl.zeros([BM, BN], tl.int64)
        for k1 in range(0, Kp, KS):
            c0, c1, c2, c3 = _dots(a_ptr, b_ptr, a_rows, b_rows, sa, sb, Kp, k1, tl.minimum(k1 + KS, Kp),
                                   c0 * 0, c1 * 0, c2 * 0, c3 * 0, SLICES, BK)
            acc += _combine(c0, c1, c2, c3, SLICES)
    else:
        c0, c1, c2, c3 = _dots(a_ptr, b_ptr, a_rows, b_rows, sa, sb, Kp, 0, Kp, c0, c1, c2, c3, SLICES, BK)
        acc = _combine(c0, c1, c2, c3, SLICES)
    return _tile_value(acc, a_rows, b_rows, ea_ptr, eb_ptr, bada_ptr, badb_ptr, a_live, b_live, SLICES)


@triton.jit
def _hp_band_tile(a_ptr, b_ptr, a_rows, b_rows, sa, sb, Kp, ea_ptr, eb_ptr, bada_ptr, badb_ptr, a_live, b_live,
                  lo, hi, nseg, stride, SLICES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """hp_tile over the K ranges [s stride + lo, s stride + hi), s < nseg, only (Kp <= KS: no int64 flushes).
    The integer sum over the K-steps left out is 0 when their slices are (band_span's operands)."""
    c0 = tl.zeros([BM, BN], tl.int32)
    c1 = tl.zeros([BM, BN], tl.int32)
    c2 = tl.zeros([BM, BN], tl.int32)
    c3 = tl.zeros([BM, BN], tl.int32)
    steps = (hi - lo) // BK  # lo and hi are multiples of BAND_ALIGN, hence of BK
    for i in range(0, nseg * steps):  # one flat loop: Triton pipelines its loads (a nested one it does not)
        k = tl.multiple_of((i // steps) * stride + lo + (i % steps) * BK, 16)  # T, lo, BK are: wide loads
        c0, c1, c2, c3 = _dot_step(a_ptr, b_ptr, a_rows, b_rows, sa, sb, Kp, k, c0, c1, c2, c3, SLICES, BK)
    acc = _combine(c0, c1, c2, c3, SLICES)
    return _tile_value(acc, a_rows, b_rows, ea_ptr, eb_ptr, bada_ptr, badb_ptr, a_live, b_live, SLICES)


@triton.jit
def _tile_value(acc, a_rows, b_rows, ea_ptr, eb_ptr, bada_ptr, badb_ptr, a_live, b_live, SLICES: tl.constexpr):
    """The float32 output of a tile's int64 slice sum: scaled by the rows' and columns' exponents, NaN on bad."""
    low = 6 + 7 * (SLICES - 1)
    ea = tl.load(ea_ptr + a_rows, mask=a_live, other=0)
    eb = tl.load(eb_ptr + b_rows, mask=b_live, other=0)
    # the reference's order: (float64(acc) * 2^(ea - low)) * 2^(eb - low), each exact, then one rounding
    out = (acc.to(tl.float64) * pow2(ea - low)[:, None]) * pow2(eb - low)[None, :]
    bad = tl.load(bada_ptr + a_rows, mask=a_live, other=0)[:, None] | tl.load(badb_ptr + b_rows, mask=b_live,
                                                                                 other=0)[None, :]
    return tl.where(bad != 0, nan_f64(), out).to(tl.float32)


@triton.jit
def tile_rows(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(rows, cols) of output tile `pid` in grouped order (L2 reuse; no effect on bits)."""
    grid_m = tl.cdiv(M, BM)
    grid_n = tl.cdiv(N, BN)
    width = GROUP_M * grid_n
    first_m = (pid // width) * GROUP_M
    gm = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % gm
    pid_n = (pid % width) // gm
    return pid_m * BM + tl.arange(0, BM), pid_n * BN + tl.arange(0, BN)


@triton.jit
def _seen(rm, rn, T, window, WINDOW: tl.constexpr):
    """[BM, BN]: query row m (query m % T of its head) sees key n: n <= m % T, and m % T - n < window when
    WINDOW (kernels/ref/attention.allowed_keys)."""
    i = (rm % T)[:, None]
    j = rn[None, :]
    ok = j <= i
    if WINDOW:
        ok = ok & (j > i - window)
    return ok


@triton.jit
def _hp_kernel(a_ptr, b_ptr, ea_ptr, eb_ptr, bada_ptr, badb_ptr, out_ptr, post_ptr, flags_ptr, force_ptr, M, N, Kp,
               sa, sb, T, window, HAS_POST: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
               MASKED: tl.constexpr, STORE_UNSEEN: tl.constexpr, ROW_FLAGS: tl.constexpr, FORCE: tl.constexpr,
               LONG_K: tl.constexpr, KBAND: tl.constexpr, SLICES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, GROUP_M: tl.constexpr):
    """out[b] [M, N] = A[b] . B[b]^T from slices (batch b: rows b M + m of A, b N + n of B^T).

    CAUSAL (attention's [queries, keys] tiles): a tile none of whose queries sees any of its keys skips the
    contraction, and without STORE_UNSEEN also its store (for a consumer that reads seen entries only); with
    MASKED (the logits) entries a query does not see are -inf, after the POST factor, as the reference's
    torch.where. FORCE: a tile holding a row with force[b M + m] != 0 is computed and stored whole.
    ROW_FLAGS: flags[b M + m] |= 1 where output row m holds a non-finite entry (an atomic OR: any order).
    KBAND (KEY_ROWS or QUERY_ROWS; A from band_split): the K-steps of band_span only, for T and window."""
    batch = tl.program_id(1).to(tl.int64)
    rm, rn = tile_rows(tl.program_id(0), M, N, BM, BN, GROUP_M)
    a_live, b_live = rm < M, rn < N
    # rows past the edge read row 0 of the batch (never stored): no row masks in the K loop
    a_rows = batch * M + tl.where(a_live, rm, 0)
    b_rows = batch * N + tl.where(b_live, rn, 0)
    store = a_live[:, None] & b_live[None, :]
    if CAUSAL:
        seen = _seen(rm, rn, T, window, WINDOW)
        any_seen = tl.max(tl.where(seen & store, 1, 0)) > 0
        if FORCE:
            any_seen = any_seen | (tl.max(tl.load(force_ptr + a_rows, mask=a_live, other=0)) != 0)
        if not STORE_UNSEEN:
            store = store & any_seen
        if any_seen:
            y = hp_tile(a_ptr, b_ptr, a_rows, b_rows, sa, sb, Kp, ea_ptr, eb_ptr, bada_ptr, badb_ptr, a_live,
                        b_live, LONG_K, SLICES, BM, BN, BK)
        else:
            y = tl.full([BM, BN], -INF, tl.float32)  # every entry is masked below: its value never shows
    elif KBAND != 0:
        lo, hi, nseg = band_span(tl.min(rm, 0), T, Kp, window, KBAND)  # BM divides BAND_ALIGN: one range a tile
        y = _hp_band_tile(a_ptr, b_ptr, a_rows, b_rows, sa, sb, Kp, ea_ptr, eb_ptr, bada_ptr, badb_ptr, a_live,
                          b_live, lo, hi, nseg, T, SLICES, BM, BN, BK)
    else:
        y = hp_tile(a_ptr, b_ptr, a_rows, b_rows, sa, sb, Kp, ea_ptr, eb_ptr, bada_ptr, badb_ptr, a_live, b_live,
                    LONG_K, SLICES, BM, BN, BK)
    if HAS_POST:
        y = y * tl.load(post_ptr)  # a float32 factor after the rounding, as the caller's eager multiply
    if CAUSAL and MASKED:
        y = tl.where(seen, y, -INF)
    tl.store(out_ptr + (batch * M + rm[:, None]) * N + rn[None, :], y, mask=store)
    if ROW_FLAGS:
        odd = tl.max(tl.where(store & ((y != y) | (tl.abs(y) == INF)), 1, 0), axis=1)
        tl.atomic_or(flags_ptr + batch * M + rm, odd, mask=a_live & (odd != 0))


@triton.jit
def _dot_b(a0, a1, a2, a3, b_ptr, b_rows, sb, Kp, c0, c1, c2, c3, SLICES: tl.constexpr, BK: tl.constexpr):
    """_dot_step's slice products for a single K-step (Kp <= BK) with A's slices a_i given (held by the caller)."""
    rk = tl.arange(0, BK)
    kin = (rk < Kp)[None, :]
    pb = b_ptr + b_rows[:, None] * Kp + rk[None, :]
    b0 = tl.load(pb, mask=kin, other=0)
    c0 = tl.dot(a0, tl.trans(b0), c0, out_dtype=tl.int32)
    if SLICES > 1:
        b1 = tl.load(pb + sb, mask=kin, other=0)
        c1 = tl.dot(a0, tl.trans(b1), c1, out_dtype=tl.int32)
        c1 = tl.dot(a1, tl.trans(b0), c1, out_dtype=tl.int32)
    if SLICES > 2:
        b2 = tl.load(pb + 2 * sb, mask=kin, other=0)
        c2 = tl.dot(a0, tl.trans(b2), c2, out_dtype=tl.int32)
        c2 = tl.dot(a1, tl.trans(b1), c2, out_dtype=tl.int32)
        c2 = tl.dot(a2, tl.trans(b0), c2, out_dtype=tl.int32)
    if SLICES > 3:
        b3 = tl.load(pb + 3 * sb, mask=kin, other=0)
        c3 = tl.dot(a0, tl.trans(b3), c3, out_dtype=tl.int32)
        c3 = tl.dot(a1, tl.trans(b2), c3, out_dtype=tl.int32)
        c3 = tl.dot(a2, tl.trans(b1), c3, out_dtype=tl.int32)
        c3 = tl.dot(a3, tl.trans(b0), c3, out_dtype=tl.int32)
    return c0, c1, c2, c3


@triton.jit
def _causal_row_tile(a0, a1, a2, a3, b_ptr, ea_ptr, eb_ptr, bada_ptr, badb_ptr, out_ptr, post_ptr, flags_ptr,
                     batch, rm, a_rows, a_live, forced, nt, N, Kp, sb, T, window, HAS_POST: tl.constexpr,
                     WINDOW: tl.constexpr, MASKED: tl.constexpr, STORE_UNSEEN: tl.constexpr,
                     ROW_FLAGS: tl.constexpr, COMPUTE: tl.constexpr, SLICES: tl.constexpr, BM: tl.constexpr,
                     BN: tl.constexpr, BK: tl.constexpr):
    """Key tile nt of _hp_kernel's CAUSAL branch for the rows rm: the same product, value, mask, store and flags.
    With COMPUTE the product is taken whether or not a query of the tile sees a key of it (and then dropped, as
    there); without it the caller knows none does and the tile is _hp_kernel's unseen one."""
    rn = nt * BN + tl.arange(0, BN)
    b_live = rn < N
    b_rows = batch * N + tl.where(b_live, rn, 0)
    store = a_live[:, None] & b_live[None, :]
    seen = _seen(rm, rn, T, window, WINDOW)
    any_seen = (tl.max(tl.where(seen & store, 1, 0)) > 0) | forced
    if not STORE_UNSEEN:
        store = store & any_seen
    if COMPUTE:
        z = tl.zeros([BM, BN], tl.int32)
        c0, c1, c2, c3 = _dot_b(a0, a1, a2, a3, b_ptr, b_rows, sb, Kp, z, z, z, z, SLICES, BK)
        y = _tile_value(_combine(c0, c1, c2, c3, SLICES), a_rows, b_rows, ea_ptr, eb_ptr, bada_ptr, badb_ptr,
                        a_live, b_live, SLICES)
        y = tl.where(any_seen, y, -INF)  # _hp_kernel's unseen tile: every entry -inf before the factor
    else:
        y = tl.full([BM, BN], -INF, tl.float32)
    if HAS_POST:
        y = y * tl.load(post_ptr)
    if MASKED:
        y = tl.where(seen, y, -INF)
    tl.store(out_ptr + a_rows[:, None] * N + rn[None, :], y, mask=store)  # a_rows: batch M + m where stored
    if ROW_FLAGS:
        odd = tl.max(tl.where(store & ((y != y) | (tl.abs(y) == INF)), 1, 0), axis=1)
        tl.atomic_or(flags_ptr + a_rows, odd, mask=a_live & (odd != 0))


@triton.jit(do_not_specialize=["M", "N", "T", "window"])
def _hp_rows_kernel(a_ptr, b_ptr, ea_ptr, eb_ptr, bada_ptr, badb_ptr, out_ptr, post_ptr, flags_ptr, force_ptr, M,
                    N, Kp, sa, sb, T, window, HAS_POST: tl.constexpr, WINDOW: tl.constexpr, MASKED: tl.constexpr,
                    STORE_UNSEEN: tl.constexpr, ROW_FLAGS: tl.constexpr, FORCE: tl.constexpr,
                    SLICES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """_hp_kernel's CAUSAL launch for a one-step contraction (Kp <= BK: attention's logits and dP), one program per
    BM rows of a batch: A's slices are loaded once, and the program walks the key tiles its queries can see
    (all of them when one of its rows is forced), B's loads pipelined across the walk; the tiles outside that
    range hold no seen entry and are stored only with STORE_UNSEEN. Every tile's bits are _hp_kernel's."""
    batch = tl.program_id(1).to(tl.int64)
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    a_live = rm < M
    a_rows = batch * M + tl.where(a_live, rm, 0)
    rk = tl.arange(0, BK)
    pa = a_ptr + a_rows[:, None] * Kp + rk[None, :]
    kin = (rk < Kp)[None, :]
    a0 = tl.load(pa, mask=kin, other=0)
    a1 = a0
    a2 = a0
    a3 = a0
    if SLICES > 1:
        a1 = tl.load(pa + sa, mask=kin, other=0)
    if SLICES > 2:
        a2 = tl.load(pa + 2 * sa, mask=kin, other=0)
    if SLICES > 3:
        a3 = tl.load(pa + 3 * sa, mask=kin, other=0)
    forced = tl.program_id(0) < 0  # no row forced
    if FORCE:
        forced = tl.max(tl.load(force_ptr + a_rows, mask=a_live, other=0)) != 0
    i = rm % T
    nt_all = tl.cdiv(N, BN)
    lo = 0
    if WINDOW:
        lo = tl.maximum(tl.min(tl.where(a_live, i, T), 0) - window + 1, 0) // BN
    hi = tl.minimum(tl.max(tl.where(a_live, i, 0), 0) // BN + 1, nt_all)
    if forced:
        lo = 0
        hi = nt_all
    for nt in range(lo, hi):
        _causal_row_tile(a0, a1, a2, a3, b_ptr, ea_ptr, eb_ptr, bada_ptr, badb_ptr, out_ptr, post_ptr, flags_ptr,
                         batch, rm, a_rows, a_live, forced, nt, N, Kp, sb, T, window, HAS_POST, WINDOW, MASKED,
                         STORE_UNSEEN, ROW_FLAGS, True, SLICES, BM, BN, BK)
    if STORE_UNSEEN:  # the tiles outside [lo, hi) hold no seen entry (nor a forced row): -inf, as _hp_kernel's
        for u in range(0, nt_all - (hi - lo)):
            nt = tl.where(u < lo, u, u + (hi - lo))  # [0, lo), then [hi, nt_all)
            _causal_row_tile(a0, a1, a2, a3, b_ptr, ea_ptr, eb_ptr, bada_ptr, badb_ptr, out_ptr, post_ptr,
                             flags_ptr, batch, rm, a_rows, a_live, forced, nt, N, Kp, sb, T, window, HAS_POST,
                             WINDOW, MASKED, STORE_UNSEEN, ROW_FLAGS, False, SLICES, BM, BN, BK)


SMEM_BYTES = 220 * 1024  # of the H200's 227 KiB per block: room left for the epilogue's scratch
# tiles per use ("head": the LM head's logits and dh, "causal": attention's logits, "dw": the head's dW,
# "short": other contractions over at most SHORT_K, one K-step: attention's dP), {"BM", "BN", "BK", "num_warps",
# "num_stages"}, over the default 128 x 64 x 128 at 8 warps. Tiles are free choices for the bits.
# Attention's two K = 128 contractions are one K-step, with nothing to pipeline: at 64 x 64, 4 warps and one
# stage two blocks fit an SM (194 registers, 48 KiB against 234 and 216 KiB), so one tile's epilogue and
# [T, T] store overlap another's loads: 1.04x a global layer's attention, 1.07x a windowed one's on the H200
# (tile sweep, commit eea27bf; `git show 0106f46:docs/perf.md`).
PRODUCTION_TILES: dict[str, dict] = {use: {"BM": 64, "BN": 64, "num_warps": 4, "num_stages": 1}
                                     for use in ("causal", "short")}
# attention's causal K-128 products (logits, dP) walk a row tile's key tiles in one program (_hp_rows_kernel):
# A's slices loaded once, B's pipelined over the walk
PRODUCTION_TILES["causal-walk"] = {"BM": 64, "BN": 64, "num_warps": 4, "num_stages": 2}
CAUSAL_WALK = True  # False: one program per tile (_hp_kernel), the previous launch (a sweep's switch)
TILES: dict[str, dict] = {}  # what a tile sweep sets over production's; empty in production
SHORT_K = 128


def config(slices: int = 3, use: str | None = None) -> dict:
    """Tiles (free choices for the bits). Three int32 accumulators per tile: BN = 64 keeps them in registers.
    Pipeline stages as many as the int8 A and B slice tiles fit in shared memory (4 slices: 2 stages)."""
    if INTERPRET:
        return dict(BM=64, BN=64, BK=64, GROUP_M=8, num_warps=4, num_stages=1)
    tile = {"BM": 128, "BN": 64, "BK": 128, "num_warps": 8, **PRODUCTION_TILES.get(use, {}),
            **TILES.get(use, {})}
    bm, bn, bk = tile["BM"], tile["BN"], tile["BK"]
    stages = tile.get("num_stages") or max(1, min(3, SMEM_BYTES // (slices * (bm + bn) * bk)))
    return dict(BM=bm, BN=bn, BK=bk, GROUP_M=8, num_warps=tile["num_warps"], num_stages=stages)


def hp_gemm(a: Sliced, b: Sliced, batch: int, m: int, n: int, post: torch.Tensor | None = None,
            causal: tuple[int, int | None] | None = None, use: str | None = None,
            store_unseen: bool = True, row_flags: torch.Tensor | None = None,
            band: tuple[int, int, int] | None = None, masked: bool = True,
            force: torch.Tensor | None = None) -> torch.Tensor:
    """float32 [batch, m, n] from sliced A (batch * m rows) and sliced B^T (batch * n rows), times the float32
    `post` if given; causal = (T, window or None): attention's mask, rows being queries (m % T) and columns keys,
    applied as -inf unless masked=False. store_unseen=False leaves the tiles that no query of theirs sees
    unwritten (softmax.softmax_causal_ reads seen entries only): most of a sliding-window layer's logits; but
    a tile holding a row with force != 0 (int32 [batch * m]) is written whole. row_flags (int32 [batch * m],
    zeros): set to non-zero for the rows that hold a non-finite entry in the tiles written. band = (KEY_ROWS or
    QUERY_ROWS, T, window): A is band_split's, and only the K-steps of its ranges are multiplied."""
    slices, _, kp = a.q.shape
    out = torch.empty((batch, m, n), dtype=F32, device=a.q.device)
    if out.numel() == 0:
        return out
    if causal is not None and band is None and CAUSAL_WALK and kp <= SHORT_K:
        _causal_walk(a, b, out, batch, m, n, post, causal, store_unseen, row_flags, masked, force)
        return out
    cfg = config(slices, use or ("causal" if causal is not None else "short" if kp <= SHORT_K else None))
    grid = (cdiv(m, cfg["BM"]) * cdiv(n, cfg["BN"]), batch)
    t, window = causal if causal is not None else (1, None)
    kband = 0
    if band is not None:
        kband, t, window = band
        if causal is not None or kp > KS.value or BAND_ALIGN.value % cfg["BM"] or BAND_ALIGN.value % cfg["BK"]:
            raise ValueError(f"hp_gemm: band {band} needs no causal mask, K <= {KS.value} and tiles dividing "
                             f"{BAND_ALIGN.value}, got K {kp}, tile {cfg['BM']} x {cfg['BK']}")
    _hp_kernel[grid](a.q, b.q, a.e, b.e, a.bad, b.bad, out, post if post is not None else out,
                     row_flags if row_flags is not None else a.bad, force if force is not None else a.bad, m, n,
                     kp, a.q.stride(0), b.q.stride(0), t, window or 0, HAS_POST=post is not None,
                     CAUSAL=causal is not None, WINDOW=causal is not None and window is not None, MASKED=masked,
                     STORE_UNSEEN=store_unseen, ROW_FLAGS=row_flags is not None, FORCE=force is not None,
                     LONG_K=kp > KS.value, KBAND=kband, SLICES=slices, **cfg, **BR_OPTIONS)
    return out


def _causal_walk(a: Sliced, b: Sliced, out: torch.Tensor, batch: int, m: int, n: int, post, causal, store_unseen,
                 row_flags, masked, force) -> None:
    """hp_gemm's causal product of a one-step contraction through _hp_rows_kernel (the same tiles' bits)."""
    slices, _, kp = a.q.shape
    cfg = config(slices, "causal-walk")
    # the per-tile kernel's K-step (128; zeros past K add nothing): a step of 16 (a head dim of 16) gave wrong
    # int8 products on the H200
    bk = max(cfg["BK"], pow2_at_least(kp))
    t, window = causal
    _hp_rows_kernel[(cdiv(m, cfg["BM"]), batch)](
        a.q, b.q, a.e, b.e, a.bad, b.bad, out, post if post is not None else out,
        row_flags if row_flags is not None else a.bad, force if force is not None else a.bad, m, n, kp,
        a.q.stride(0), b.q.stride(0), t, window or 0, HAS_POST=post is not None, WINDOW=window is not None,
        MASKED=masked, STORE_UNSEEN=store_unseen, ROW_FLAGS=row_flags is not None, FORCE=force is not None,
        SLICES=slices, BM=cfg["BM"], BN=cfg["BN"], BK=bk, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **BR_OPTIONS)


# the longest K taken here: the reference's int32 slice products are exact (64 * 64 * K < 2^31) up to it
MAX_K = (2**31 - 1) // (64 * 64)


def operand_rows(x: torch.Tensor, slices: int, transpose: bool) -> Sliced:
    """Slices of the rows of x [..., R, K] (or of x^T's rows when `transpose`, i.e. x's columns)."""
    x3 = x.reshape(-1, *x.shape[-2:])
    bsz, r0, r1 = x3.shape
    sb, s0, s1 = x3.stride()
    if transpose:
        return split(x3, bsz * r1, r0, s1, s0, slices, batch_rows=r1, s_batch=sb)
    return split(x3, bsz * r0, r1, s0, s1, slices, batch_rows=r0, s_batch=sb)


def band_fits(t: int, k: int, window: int | None) -> bool:
    """Whether band_split and hp_gemm(band=) take a sliding-`window` attention operand with T = t keys and K = k:
    T a multiple of BAND_ALIGN (so are a head's rows and every range), one int32 accumulation (K <= KS)."""
    return window is not None and t % BAND_ALIGN.value == 0 and k <= KS.value


def band_split(x: torch.Tensor, kind: int, t: int, window: int, batch_bad: torch.Tensor | None = None) -> Sliced:
    """operand_rows(x, 3, transpose=False) of a banded attention operand x [..., R, K] (rows of P^T or dS^T for
    KEY_ROWS, of dS for QUERY_ROWS; band_span), from its band only: the same exponents, flags and, inside the
    ranges, slices, when every entry outside them is +-0 or non-finite with batch_bad[batch] != 0 (int32, one per
    leading index; kernels/triton/attention.py says why its operands are). The slices outside stay unwritten."""
    x3 = x.reshape(-1, *x.shape[-2:])
    bsz, rb, k = x3.shape
    if (not band_fits(t, k, window) or rb % BAND_ALIGN.value or BAND_ALIGN.value % SPLIT_R
            or BAND_ALIGN.value % SPLIT_K or (kind == KEY_ROWS and k % t)):
        raise ValueError(f"band_split: argument 'x' {tuple(x.shape)} is not a banded operand for T {t}, "
                         f"window {window}")
    out = empty_sliced(bsz * rb, k, ref.DEFAULT_SLICES, x.device)
    sb, s_row, s_col = x3.stride()
    _band_split_kernel[(cdiv(bsz * rb, SPLIT_R),)](
        x3, sb, rb, s_row, s_col, bsz * rb, k, out.q.shape[2], t, window,
        batch_bad if batch_bad is not None else out.bad, out.q, out.e, out.bad, KBAND=kind,
        BATCH_BAD=batch_bad is not None, SLICES=ref.DEFAULT_SLICES, R=SPLIT_R, BK=SPLIT_K, num_warps=SPLIT_WARPS,
        **BR_OPTIONS)
    return out


def hp_band_matmul_(a: torch.Tensor, b: torch.Tensor, kind: int, t: int, window: int,
                    batch_bad: torch.Tensor | None = None) -> torch.Tensor:
    """hp_matmul_(a, b) (3 slices) for a banded attention operand a [B, H, M, K] (band_split, whose conditions
    give the reference's bits), with only the K-steps of a's ranges multiplied."""
    lead = a.shape[:-2]
    m, n = a.shape[-2], b.shape[-1]
    sa = band_split(a, kind, t, window, batch_bad)
    sb = operand_rows(b, ref.DEFAULT_SLICES, transpose=True)
    return hp_gemm(sa, sb, lead.numel(), m, n, band=(kind, t, window)).reshape(*lead, m, n)


def _maybe_nonfinite_rows(sa: Sliced, sb: Sliced, batch: int, m: int, n: int, k: int) -> torch.Tensor:
    """int32 [batch * m]: 1 where a row of hp(A, B^T) may hold a non-finite entry: A's row is bad, a row of B^T
    in its batch is, or the row's and the batch's largest exponents allow an overflow. Else every entry is
    finite: |a_k| < 2^ea and |b_k| < 2^eb, every slice code is at most 64 in size, so the kept slice products
    give |out| <= 1.02 k 2^(ea + eb) < 2^127 when ea + eb < 127 - ceil(log2 k), short of float32's 2^128."""
    eb_max = sb.e.view(batch, n).amax(1, keepdim=True)
    bad_b = sb.bad.view(batch, n).amax(1, keepdim=True) != 0
    big = sa.e.view(batch, m) + eb_max >= 127 - max(k - 1, 1).bit_length()
    return ((sa.bad.view(batch, m) != 0) | bad_b | big).reshape(-1).to(torch.int32)


def hp_window_matmul_(a: torch.Tensor, b: torch.Tensor, t: int, window: int,
                      row_flags: torch.Tensor) -> torch.Tensor:
    """hp_matmul_(a, b, row_flags=) (3 slices) for attention's dP = dO V^T in a sliding-`window` layer (rows:
    queries at row % t, columns the t keys): only the tiles that hold a seen (query, key) entry are computed
    and written, and whole rows where an entry may be non-finite (_maybe_nonfinite_rows). Its consumer,
    softmax.softmax_causal_backward, reads a row over its window unless row_flags marks it, and a marked row
    holds a non-finite entry, so it may: it was written whole. row_flags are exact, every non-finite entry
    lying in a written tile."""
    lead = a.shape[:-2]
    m, n, k = a.shape[-2], b.shape[-1], a.shape[-1]
    if not _usable(a, b, ref.DEFAULT_SLICES) or lead.numel() > MAX_BATCH or m % t or n != t:
        return hp_matmul_(a, b, row_flags=row_flags)
    sa = operand_rows(a, ref.DEFAULT_SLICES, transpose=False)
    sb = operand_rows(b, ref.DEFAULT_SLICES, transpose=True)
    force = _maybe_nonfinite_rows(sa, sb, lead.numel(), m, n, k)
    return hp_gemm(sa, sb, lead.numel(), m, n, causal=(t, window), masked=False, store_unseen=False,
                   row_flags=row_flags, force=force).reshape(*lead, m, n)


def _usable(a, b, slices) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and on_triton(a, b) and a.dtype == F32
            and b.dtype == F32 and a.dim() >= 2 and b.dim() == a.dim() and a.shape[:-2] == b.shape[:-2]
            and a.shape[-1] == b.shape[-2] and isinstance(slices, int) and 1 <= slices <= 4
            and a.shape[-1] <= MAX_K)


def _flag_rows(out: torch.Tensor, row_flags: torch.Tensor | None) -> torch.Tensor:
    """hp_gemm's row flags for a product computed elsewhere (the reference's fallbacks)."""
    if row_flags is not None:
        row_flags |= (~torch.isfinite(out)).any(-1).reshape(-1).to(row_flags.dtype)
    return out


def hp_matmul_(a: torch.Tensor, b: torch.Tensor, slices: int = ref.DEFAULT_SLICES, *,
               row_flags: torch.Tensor | None = None) -> torch.Tensor:
    """a [..., M, K] @ b [..., K, N] -> float32 [..., M, N] without autograd: the bits of ref.hp_matmul_.
    row_flags (int32, one per output row, zeros): set non-zero for the rows holding a non-finite entry."""
    if not _usable(a, b, slices):
        return _flag_rows(ref.hp_matmul_(a, b, slices), row_flags)
    m, n = a.shape[-2], b.shape[-1]
    lead = a.shape[:-2]
    batch = 1
    for s in lead:
        batch *= s
    if batch == 0 or m == 0 or n == 0:
        return torch.zeros((*lead, m, n), dtype=F32, device=a.device)
    if batch > MAX_BATCH:
        return _flag_rows(ref.hp_matmul_(a, b, slices), row_flags)
    sa = operand_rows(a, slices, transpose=False)
    sb = operand_rows(b, slices, transpose=True)
    return hp_gemm(sa, sb, batch, m, n, row_flags=row_flags).reshape(*lead, m, n)


class _HpMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, slices):
        ctx.save_for_backward(a, b)
        ctx.slices = slices
        return hp_matmul_(a, b, slices)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = hp_matmul_(g, b.transpose(-1, -2), ctx.slices)
        if ctx.needs_input_grad[1]:
            gb = hp_matmul_(a.transpose(-1, -2), g, ctx.slices)
        return ga, gb, None


def hp_matmul(a: torch.Tensor, b: torch.Tensor, slices: int = ref.DEFAULT_SLICES) -> torch.Tensor:
    """Differentiable BR matmul a [..., M, K] @ b [..., K, N] in float32: the bits of ref.hp_matmul."""
    if not _usable(a, b, slices):
        return ref.hp_matmul(a, b, slices)
    expect("hp_matmul", "a", a, dtype=F32)
    same_device("hp_matmul", a=a, b=b)
    return _HpMatmul.apply(a, b, slices)


def __getattr__(name: str):
    """split_rows, SLICE_BITS, DEFAULT_SLICES are the reference's."""
    return getattr(ref, name)
