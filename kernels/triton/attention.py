"""Triton twin of kernels/ref/attention.py: causal / sliding-window GQA attention with int8 P.V, same bits.

The reference's steps, each on its twin: logits = hp_matmul_(q, k^T) (kernels/triton/contraction) times
the float32 scale, masked with -inf (both in the contraction's epilogue, which skips the tiles wholly masked
and, for a window that softmax.causal_band_fits, leaves them unwritten), softmax_ (kernels/triton/softmax; such
a row is read over its window only: the unseen keys' -inf are known without reading them), then P.V in int8
here: V is cut
once per key block (step amax|v|/127 per block and column, codes stored K-contiguous) with the column's
fixed-point shift from its whole-T amax; one program per tile of query rows quantizes each P block per row
(step max p / 127), multiplies on int8 tensor cores, dequantizes ((float32(acc) * s_p) * s_v) and adds the
block's int64 fixed-point value, so the block order cannot show. Blocks wholly above the causal diagonal
(or before the window) are skipped: their P is exactly 0 (our exp of -inf), which adds 0.
Backward: the reference's straight-through contractions, all through the hp_matmul_ and softmax twins; in a
causal layer whose T is a multiple of contraction.BAND_ALIGN, P^T, dS and dS^T are split and multiplied over
their bands only: a sliding window's, or a global layer's causal triangle (_product says why that is exact);
a sliding window's dP is computed over the tiles its windows reach (contraction.hp_window_matmul_).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.ref import attention as ref, fixed as ref_fixed
from kernels.triton import contraction as hp, softmax as t_soft
from kernels.triton.fixedpoint import from_fixed, scale_shift, to_fixed
from kernels.triton.ieee import INF, div_rn, isfinite, nan_f64
from kernels.triton.intmm import MAX_BATCH
from kernels.triton.launch import BR_OPTIONS, INTERPRET, cdiv, constant, on_triton, pow2_at_least, upload
from kernels.triton.rotated_mm import code8

F32 = torch.float32
MAX_KEYS = 256   # P.V blocks up to this many keys run here (larger pv_block: the reference)
V_T = 32         # keys per step of the V pass
# P.V's tile: rows and V columns per program, warps (free choices: the blocks' products are summed exactly).
# 16 x 128 at 8 warps: 1.37x 64 x 64 (docs/perf.md): each P block is quantized once for all of D, and at 128
# registers two programs share an SM
PV_BM = 16
PV_BD = 128      # at most: the int64 [PV_BM, PV_BD] accumulator stays in registers
PV_WARPS = 8


@triton.jit(do_not_specialize=["T", "D", "NB", "top"])
def _v_kernel(v_ptr, qv_ptr, sv_ptr, s_ptr, bad_ptr, T, D, NB, top,
              BLK: tl.constexpr, BLKP: tl.constexpr, BD: tl.constexpr, TT: tl.constexpr):
    """One (batch, column tile) of V [T, D]: the shift s, bad columns, per-block steps and codes [NB, D, BLKP]."""
    b = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    dm = d < D
    base = v_ptr + b * T * D
    amax = tl.zeros([BD], tl.float32)
    bad = tl.zeros([BD], tl.int32)
    for t0 in range(0, T, TT):
        t = t0 + tl.arange(0, TT)
        x = tl.load(base + t[:, None].to(tl.int64) * D + d[None, :], mask=(t < T)[:, None] & dm[None, :], other=0.0)
        bad = bad | tl.max(tl.where(isfinite(x), 0, 1), axis=0)
        amax = tl.maximum(amax, tl.max(tl.abs(tl.where(isfinite(x), x, 0.0)), axis=0))
    # the reference's fixed-point shift for sums of T terms, one bit lower (the dequantization's roundings)
    s = scale_shift(amax.to(tl.float64), top) - 1
    tl.store(s_ptr + b * D + d, s, mask=dm)
    tl.store(bad_ptr + b * D + d, bad, mask=dm)
    j = tl.arange(0, BLKP)
    for kb in range(0, NB):
        t = kb * BLK + j
        m = ((j < BLK) & (t < T))[:, None] & dm[None, :]
        x = tl.load(base + t[:, None].to(tl.int64) * D + d[None, :], mask=m, other=0.0)
        x = tl.where(isfinite(x), x, 0.0)
        sv = div_rn(tl.max(tl.abs(x), axis=0), tl.full([BD], 127.0, tl.float32))  # amax / 127, tensor division
        safe = tl.where(sv > 0, sv, 1.0)
        q = code8(div_rn(x, tl.broadcast_to(safe[None, :], x.shape)))
        row = (b * NB + kb) * D + d
        tl.store(sv_ptr + row, sv, mask=dm)  # the step itself (0 for an all-zero column), as quantize_int8
        tl.store(qv_ptr + row[None, :] * BLKP + j[:, None], q.to(tl.int8), mask=dm[None, :])  # [D, BLKP]: K-major


@triton.jit(do_not_specialize=["M", "T", "D", "NB", "window"])
def _pv_kernel(p_ptr, qv_ptr, sv_ptr, s_ptr, vbad_ptr, out_ptr, M, T, D, NB, window,
               CAUSAL: tl.constexpr, WINDOW: tl.constexpr, BLK: tl.constexpr, BLKP: tl.constexpr,
               BM: tl.constexpr, BD: tl.constexpr):
    """out [BM rows, BD columns] of P [M, T] @ V for one batch: int8 per key block, exact int64 fixed-point sum."""
    b = tl.program_id(1).to(tl.int64)
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    live = rm < M
    d = tl.program_id(2) * BD + tl.arange(0, BD)
    dm = d < D
    j = tl.arange(0, BLKP)
    s = tl.load(s_ptr + b * D + d, mask=dm, other=0)
    prow = p_ptr + (b * M + tl.where(live, rm, 0).to(tl.int64)) * T
    lo = 0
    hi = NB
    if CAUSAL:
        i = rm % T  # the query position of each row (rows are (query head, position) pairs)
        hi = tl.max(tl.where(live, i, 0), 0) // BLK + 1  # later blocks hold only P == 0 for these rows
        if WINDOW:
            lo = tl.maximum(tl.min(tl.where(live, i, T), 0) - window + 1, 0) // BLK
    acc = tl.zeros([BM, BD], tl.int64)
    bad = tl.zeros([BM], tl.int32)
    for kb in range(lo, hi):
        t = kb * BLK + j
        cm = (j < BLK) & (t < T)
        p = tl.load(prow[:, None] + t[None, :], mask=live[:, None] & cm[None, :], other=0.0)
        bad = bad | tl.max(tl.where(isfinite(p), 0, 1), axis=1)
        p = tl.where(isfinite(p), p, 0.0)
        sp = div_rn(tl.max(tl.where(cm[None, :], p, -INF), axis=1), tl.full([BM], 127.0, tl.float32))  # max p / 127
        safe = tl.where(sp > 0, sp, 1.0)
        qp = code8(div_rn(p, tl.broadcast_to(safe[:, None], p.shape))).to(tl.int8)
        qv = tl.load(qv_ptr + ((b * NB + kb) * D + d)[:, None] * BLKP + j[None, :], mask=dm[:, None], other=0)
        c = tl.dot(qp, tl.trans(qv), out_dtype=tl.int32)  # exact; |c| <= 127 * 127 * 1024 < 2^24
        sv = tl.load(sv_ptr + (b * NB + kb) * D + d, mask=dm, other=0.0)
        c = (c.to(tl.float32) * sp[:, None]) * sv[None, :]  # the reference's dequantization order
        acc += to_fixed(c.to(tl.float64), s[None, :])  # integer adds: any block order, same sum
    out = from_fixed(acc, s[None, :]).to(tl.float32)
    vbad = tl.load(vbad_ptr + b * D + d, mask=dm, other=0)
    out = tl.where((bad[:, None] | vbad[None, :]) != 0, nan_f64().to(tl.float32), out)
    tl.store(out_ptr + (b * M + rm[:, None].to(tl.int64)) * D + d[None, :], out, mask=live[:, None] & dm[None, :])


def pv_int8(p: torch.Tensor, v: torch.Tensor, block: int, causal: bool = False,
            window: int | None = None) -> torch.Tensor:
    """ref.pv_int8 for P [B, M, T] (float32, rows of queries at positions row % T) and V [B, T, D].

    causal/window only let the kernel skip key blocks whose P is 0 for every row of a tile.
    """
    bsz, m, t = p.shape
    d = v.shape[-1]
    dev = p.device
    nb = cdiv(t, block)
    blkp = max(32, pow2_at_least(block))  # the int8 MMA's K: zero-padded, exact
    bd = min(max(16, pow2_at_least(d)), PV_BD)
    qv = torch.empty((bsz, nb, d, blkp), dtype=torch.int8, device=dev)
    sv = torch.empty((bsz, nb, d), dtype=F32, device=dev)
    s = torch.empty((bsz, d), dtype=torch.int64, device=dev)
    vbad = torch.empty((bsz, d), dtype=torch.int32, device=dev)
    top = ref_fixed.TOP_BIT - ref_fixed.headroom_bits(t)
    _v_kernel[(bsz, cdiv(d, bd))](v, qv, sv, s, vbad, t, d, nb, top, BLK=block, BLKP=blkp, BD=bd, TT=V_T,
                                   num_warps=4, **BR_OPTIONS)
    out = torch.empty((bsz, m, d), dtype=F32, device=dev)
    bm = 32 if INTERPRET else PV_BM
    _pv_kernel[(cdiv(m, bm), bsz, cdiv(d, bd))](p, qv, sv, s, vbad, out, m, t, d, nb, window or 0, CAUSAL=causal,
                                   WINDOW=window is not None, BLK=block, BLKP=blkp, BM=bm, BD=bd, num_warps=PV_WARPS,
                                   **BR_OPTIONS)
    return out


def _logits(qg: torch.Tensor, k: torch.Tensor, allowed, scale: torch.Tensor, window: int | None,
            store_unseen: bool):
    """The reference's hp_matmul_(q, k^T) * scale, masked with -inf where `allowed` is False: with the scale and
    the mask in the contraction's epilogue (no pass over [B, H, T, T] of their own), and the key tiles that no
    query of a row tile sees not multiplied at all (most of a sliding-window layer's)."""
    b, hkv, m, _ = qg.shape
    t = k.shape[2]
    if b * hkv > MAX_BATCH:  # the contraction's grid cannot take it: the reference's three steps
        logits = hp.hp_matmul_(qg, k.transpose(-1, -2)) * scale
        if allowed is None:
            return logits
        neg = torch.full((), -math.inf, dtype=F32, device=qg.device)
        return torch.where(allowed, logits.view(b, hkv, m // t, t, t), neg).view(b, hkv, m, t)
    sq = hp.operand_rows(qg, hp.DEFAULT_SLICES, transpose=False)
    sk = hp.operand_rows(k, hp.DEFAULT_SLICES, transpose=False)  # k's rows are k^T's columns: hp_matmul_'s B^T
    mask = (t, window) if allowed is not None else None
    return hp.hp_gemm(sq, sk, b * hkv, m, t, post=scale, causal=mask, store_unseen=store_unseen
                      ).reshape(b, hkv, m, t)


def _probabilities(logits: torch.Tensor, causal: bool, window: int | None,
                   row_nan: torch.Tensor | None = None) -> torch.Tensor:
    """softmax_ of the logits; a windowed row's unseen keys (left unwritten by _logits) are not read (and its
    NaN rows flagged in row_nan)."""
    return t_soft.softmax_causal_(logits, window, row_nan) if causal else t_soft.softmax_(logits, -1)


def _scores_grad(gog: torch.Tensor, v: torch.Tensor, p: torch.Tensor, window: int | None, flagged: bool):
    """(dS, flags): dS = softmax_backward(P, dP = hp_matmul_(dO, V^T)). With `flagged`, flags (int32 per row)
    marks dP's rows that hold a non-finite entry (from the contraction), and given a `window` (a sliding one, or
    T for a global layer's causal rows; softmax.causal_backward_fits) each row of P and dP is read over its
    window only, unless flagged, and dP's tiles that no window reaches are not computed
    (contraction.hp_window_matmul_); else every row in full, and flags None."""
    if not flagged:
        return t_soft.softmax_backward(p, hp.hp_matmul_(gog, v.transpose(-1, -2)), -1), None
    flags = torch.zeros(gog.shape[:-1].numel(), dtype=torch.int32, device=gog.device)
    vt = v.transpose(-1, -2)
    dp = hp.hp_matmul_(gog, vt, row_flags=flags) if window is None else \
        hp.hp_window_matmul_(gog, vt, v.shape[-2], window, flags)
    return t_soft.softmax_causal_backward(p, dp, window, flags), flags  # window None: softmax_backward


def _nan_rows(p: torch.Tensor) -> torch.Tensor:
    """int32 per row of softmax_'s P [..., T]: 1 where the row is NaN. A row is NaN in every entry or in none
    (y = e * (1 / s), and s is NaN when any e is, else at least the max's e = 1), so its first entry tells."""
    return torch.isnan(p[..., 0]).reshape(-1).to(torch.int32)


def _product(a: torch.Tensor, b: torch.Tensor, band: tuple | None, kind: int,
             batch_bad: torch.Tensor | None = None) -> torch.Tensor:
    """hp_matmul_(a, b); with band = (T, window), a (P^T, dS or dS^T of a causal layer; window T for a global
    one) is split and multiplied over its band only (contraction.band_split, `kind` its rows). Exact: outside a
    key's or a query's band P is +0, and dS +-0 (both cut to zero slices), except in rows that are non-finite
    throughout: a NaN row of P (from the forward) makes every entry of that row of P and of dS non-finite, and so
    does a flagged row of dP (a non-finite g makes <g, y> non-finite: dS = y (g - d) is then inf or NaN
    everywhere; d is a float64 sum of float32 products, finite when they are).
    Such a row shows in every query row's own band, and for the key rows (P^T, dS^T) it sets every key of its
    batch bad: batch_bad."""
    if band is None:
        return hp.hp_matmul_(a, b)
    return hp.hp_band_matmul_(a, b, kind, *band, batch_bad)


def dp_window(t: int, band_window: int | None, banded: bool, reach: int | None) -> int | None:
    """The window over which the backward computes dP's tiles and reads dS's rows (None: every tile and entry):
    a sliding window whose softmax rows are read over it (band_window), or on the band path a global layer's
    causal prefix (window T: the rows of P above the diagonal are +0 too)."""
    if band_window is not None:
        return band_window
    return reach if banded and t_soft.causal_backward_fits(t, reach) else None


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, allowed, scale, pv_block, causal, window):
        b, hq, t, d = q.shape
        hkv = k.shape[1]
        g = hq // hkv
        qg = q.reshape(b, hkv, g * t, d)
        # a sliding window whose rows both softmax passes read over the window only (the logits' unseen tiles
        # left unwritten), or None
        band_window = window if causal and t_soft.causal_band_fits(t, window) else None
        # the backward's splits and contractions over the keys a causal row can see (_product), given P's NaN
        # rows: flagged by the windowed softmax, else read off P
        reach = min(window or t, t) if causal else None
        banded = reach is not None and hp.band_fits(t, g * t, reach) and b * hkv <= MAX_BATCH
        p_nan = torch.empty(b * hkv * g * t, dtype=torch.int32, device=q.device) \
            if banded and band_window is not None else None
        p = _probabilities(_logits(qg, k, allowed, scale, window, band_window is None), causal, window, p_nan)
        if banded and p_nan is None:
            p_nan = _nan_rows(p)
        ctx.save_for_backward(qg, k, v, p, scale, p_nan)
        ctx.dp_window = dp_window(t, band_window, banded, reach)
        ctx.band = (t, reach) if banded else None
        out = pv_int8(p.reshape(b * hkv, g * t, t), v.reshape(b * hkv, t, d).contiguous(), pv_block, causal, window)
        return out.reshape(b, hq, t, d)

    @staticmethod
    def backward(ctx, go):
        qg, k, v, p, scale, p_nan = ctx.saved_tensors
        b, hkv, gt, d = qg.shape
        gog = go.contiguous().reshape(b, hkv, gt, d)
        band = ctx.band
        p_bad = p_nan.view(b * hkv, gt).amax(1) if band else None
        dq = dk = dv = None
        if ctx.needs_input_grad[2]:
            dv = _product(p.transpose(-1, -2), gog, band, hp.KEY_ROWS, p_bad)
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            # straight-through: the unquantized softmax backward
            ds, flags = _scores_grad(gog, v, p, ctx.dp_window, ctx.dp_window is not None or band is not None)
            if ctx.needs_input_grad[0]:
                dq = (_product(ds, k, band, hp.QUERY_ROWS) * scale).reshape(go.shape)
            if ctx.needs_input_grad[1]:
                ds_bad = flags.view(b * hkv, gt).amax(1) | p_bad if band else None
                dk = _product(ds.transpose(-1, -2), qg, band, hp.KEY_ROWS, ds_bad) * scale
        return dq, dk, dv, None, None, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
              window: int | None = None, scale: float | None = None, pv_block: int = 64) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v with int8 P.V: the bits of kernels.ref.attention.attention."""
    ref._check(q, k, v, causal, window, scale, pv_block)
    d = q.shape[-1]
    if not on_triton(q, k, v) or pv_block > MAX_KEYS or d > hp.MAX_K or q.shape[2] > hp.MAX_K:
        return ref.attention(q, k, v, causal=causal, window=window, scale=scale, pv_block=pv_block)
    sc = constant(ref.default_scale, d, q.device) if scale is None else upload(float(scale), q.device)
    allowed = constant(ref.allowed_keys, q.shape[2], causal, window, q.device)
    return _Attention.apply(q, k, v, allowed, sc, pv_block, causal, window)


def __getattr__(name: str):
    """default_scale, allowed_keys, quantize_int8 and the constants are the reference's."""
    return getattr(ref, name)
