"""Triton twin of kernels/ref/loss.py: fused, chunked cross-entropy + z-loss over the LM head, same bits.

Per chunk, as the reference: logits from the sliced int8 contraction (kernels/triton/contraction, the head's
row slices cut once per call), then one program per token row: the NaN-propagating max, e = float32
exp64(x - m) parked over the logits, the exact fixed-point sum s of e (float64), lse = float32(m + log64(s)),
ce and z, and the gradient row g = (e * (1 / float32(s))) * (1 + z2 lse), minus 1 at the target, written
over e; the same program cuts g's int8 slices for dh (a row's exponent is its own largest |g|, so the row
that computes g can take it: one launch and one pass over the logits fewer). dh = hp(g, W) * (1/n) and, per block of TOKEN_BLOCK tokens, dW += float64(hp(g_blk^T, h_blk)) in
ascending block order inside one kernel (the float64 adds are the only order-sensitive step, and their
order is the reference's). The means use the exact sums of kernels/triton/reduce.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ref import fixed as ref_fixed, loss as ref
from kernels.triton import contraction as hp, reduce as t_reduce
from kernels.triton.elementary import exp64, log64
from kernels.triton.fixedpoint import finite_abs, flags_of, from_fixed, nonfinite_sum, or_reduce, scale_shift, to_fixed
from kernels.triton.ieee import INF, div_rn, frexp_exponent, isfinite, nan_f64, pow2
from kernels.triton.launch import BR_OPTIONS, cdiv, on_triton, pow2_at_least, upload
from kernels.triton.reduce import _double_bits

F32 = torch.float32
F64 = torch.float64
ROW_BLOCK, ROW_WARPS = 2048, 8  # the row kernel's elements per step and warps: free for the bits (a sweep's knobs)


@triton.jit(do_not_specialize=["V", "top", "ignore_index"])
def _row_kernel(buf_ptr, targets_ptr, ce_ptr, z_ptr, V, top, ignore_index, z2, q_ptr, e_ptr, bad_ptr, plane, Kp,
                NEED_G: tl.constexpr, SPLIT_G: tl.constexpr, SLICES: tl.constexpr, BLOCK: tl.constexpr):
    """Token row: logits in buf -> ce, z; with NEED_G, buf ends holding the row's unscaled gradient g, and with
    SPLIT_G also its int8 slices for dh = hp(g, W) (q, e, bad: hp.split's bits, without a pass of its own).

    Fusing the sum into the exp pass and the slices into the g pass (the shift and the largest |g| can be
    known in advance when every e is finite) saved two of the five passes' bytes and gained under 1% of the
    loss at its best block on the H200 (docs/perf.md): the passes' bytes are not what this kernel waits on.
    The warps never outnumber a block's elements (see _chunk)."""
    row = tl.program_id(0).to(tl.int64)
    base = buf_ptr + row * V
    tgt = tl.load(targets_ptr + row)
    valid = tgt != ignore_index
    idx = tl.where(valid, tgt, 0)
    logit_t = tl.load(base + idx)  # read before e overwrites the logits
    mx = tl.full([BLOCK], -INF, tl.float32)
    nan = tl.zeros([BLOCK], tl.int32)
    for start in range(0, V, BLOCK):
        i = start + tl.arange(0, BLOCK)
        x = tl.load(base + i, mask=i < V, other=-INF)
        mx = tl.maximum(mx, x)
        nan = nan | (x != x).to(tl.int32)
    m = tl.where(tl.max(nan, 0) != 0, nan_f64().to(tl.float32), tl.max(mx, 0))  # torch.amax propagates NaN
    m64 = m.to(tl.float64)
    tl.debug_barrier()  # every thread has read its logits (and logit_t) before e overwrites them in place
    amax = tl.zeros([BLOCK], tl.float64)
    fl = tl.zeros([BLOCK], tl.int32)
    for start in range(0, V, BLOCK):
        i = start + tl.arange(0, BLOCK)
        x = tl.load(base + i, mask=i < V, other=0.0)
        e = exp64(x.to(tl.float64) - m64).to(tl.float32)  # x - m exact in float64; one rounding of exp
        tl.store(base + i, e, mask=i < V)
        e64 = tl.where(i < V, e, 0.0).to(tl.float64)
        amax = tl.maximum(amax, finite_abs(e64))
        fl = fl | flags_of(e64)
    tl.debug_barrier()  # the row's e is visible to every thread of this program
    sh = scale_shift(tl.max(amax, 0), top)
    acc = tl.zeros([BLOCK], tl.int64)
    for start in range(0, V, BLOCK):
        i = start + tl.arange(0, BLOCK)
        acc += to_fixed(tl.load(base + i, mask=i < V, other=0.0).to(tl.float64), sh)
    f = or_reduce(fl, 0)
    s = tl.where(f != 0, nonfinite_sum(f), from_fixed(tl.sum(acc, 0), sh))  # ref exact_sum(..., out_dtype=F64)
    lse = (m64 + log64(s)).to(tl.float32)
    tl.store(ce_ptr + row, tl.where(valid, lse - logit_t, 0.0))
    tl.store(z_ptr + row, tl.where(valid, lse * lse, 0.0))
    if NEED_G:
        r = div_rn(tl.full([BLOCK], 1.0, tl.float32), tl.broadcast_to(s.to(tl.float32), [BLOCK]))  # reciprocal_
        coef = 1.0 + z2 * lse  # separate * and +: no FMA
        gmax = tl.zeros([BLOCK], tl.float64)
        gbad = tl.zeros([BLOCK], tl.int32)
        tl.debug_barrier()
        for start in range(0, V, BLOCK):
            i = start + tl.arange(0, BLOCK)
            g = (tl.load(base + i, mask=i < V, other=0.0) * r) * coef  # p = e * (1/s) is softmax_'s bits
            g = tl.where(i == idx, g - 1.0, g)
            g = tl.where(valid & (i < V), g, 0.0)
            tl.store(base + i, g, mask=i < V)
            if SPLIT_G:
                g64 = g.to(tl.float64)
                gmax = tl.maximum(gmax, finite_abs(g64))
                gbad = gbad | tl.where(isfinite(g64), 0, 1)
        if SPLIT_G:  # hp.split of the stored row: exponent of its largest finite |g|, then the slices
            eg = frexp_exponent(tl.max(gmax, 0))
            scale = pow2(6 - eg)
            tl.debug_barrier()
            for start in range(0, Kp, BLOCK):
                i = start + tl.arange(0, BLOCK)
                g64 = tl.load(base + i, mask=i < V, other=0.0).to(tl.float64)
                hp.store_slices(g64, scale, q_ptr + row * Kp + i, plane.to(tl.int64), i < Kp, SLICES)
            tl.store(e_ptr + row, eg)
            tl.store(bad_ptr + row, tl.max(gbad, 0))


@triton.jit(do_not_specialize=["inv_bits"])
def _dw_kernel(ga_ptr, hb_ptr, ea_ptr, eb_ptr, bada_ptr, badb_ptr, dw_ptr, dw32_ptr, inv_bits, V, D, NB, Kp, sa, sb,
               FIRST: tl.constexpr, LAST: tl.constexpr, SLICES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, GROUP_M: tl.constexpr):
    """dw64 [V, D] += float64(hp(g_blk^T, h_blk)) for the chunk's token blocks, in ascending order.

    The float64 running sum is read and written around each block's contraction, so the tile carries only the
    int32 slice accumulators (holding the sum in registers across blocks measured 0.86x on the H200). The
    first chunk's first block adds to 0.0 without reading (the reference's zeros: nothing to fill or read);
    the last chunk's last block writes the reference's float32(dw64 * (1/n)) into dw32 instead of dw64 (no
    float64 pass of its own over [V, D])."""
    rm, rn = hp.tile_rows(tl.program_id(0), V, D, BM, BN, GROUP_M)
    a_live, b_live = rm < V, rn < D
    am, bn = tl.where(a_live, rm, 0).to(tl.int64), tl.where(b_live, rn, 0).to(tl.int64)
    at = rm[:, None].to(tl.int64) * D + rn[None, :]
    om = a_live[:, None] & b_live[None, :]
    inv = inv_bits.to(tl.int64).to(tl.float64, bitcast=True)
    for blk in range(0, NB):
        y = hp.hp_tile(ga_ptr, hb_ptr, blk * V + am, blk * D + bn, sa, sb, Kp, ea_ptr, eb_ptr, bada_ptr, badb_ptr,
                       a_live, b_live, False, SLICES, BM, BN, BK)  # K = one token block
        read = (blk > 0) if FIRST else (blk >= 0)
        final = (blk == NB - 1) if LAST else (blk < 0)
        acc = tl.load(dw_ptr + at, mask=om & read, other=0.0)
        total = acc + y.to(tl.float64)  # the block's float32 product, added in float64 in order
        tl.store(dw_ptr + at, total, mask=om & (final == 0))
        tl.store(dw32_ptr + at, (total * inv).to(tl.float32), mask=om & final)  # 1/n in float64, one rounding


def _chunk(h, w_rows, w_cols, targets, ignore_index, z2, ce, z, dh, dw64, dw, inv_n, inv_n32, c0, c1, need_h,
           need_w, slices):
    """Tokens [c0, c1): ce, z, dh rows (scaled by 1/n) and the chunk's dW blocks into dw64 (into dw, scaled
    and rounded, at the last chunk)."""
    n_c = c1 - c0
    v, d = w_rows.q.shape[1], h.shape[1]
    hc = h[c0:c1]
    hs = hp.split(hc, n_c, d, hc.stride(0), hc.stride(1), slices)
    buf = hp.hp_gemm(hs, w_rows, 1, n_c, v, use="head")[0]  # logits [n_c, V]
    need_g = need_h or need_w
    top = ref_fixed.TOP_BIT - ref_fixed.headroom_bits(v)
    gs = hp.empty_sliced(n_c if need_h else 0, v, slices, h.device)  # dh's g slices, cut in place
    block = min(pow2_at_least(v), ROW_BLOCK)
    # no more threads than a block's elements: a replicated element could be overwritten in place before a
    # sibling thread had read it
    warps = max(1, min(ROW_WARPS, block // 32))
    _row_kernel[(n_c,)](buf, targets[c0:c1], ce[c0:c1], z[c0:c1], v, top, ignore_index, z2, gs.q, gs.e, gs.bad,
                        gs.q.shape[1] * gs.q.shape[2], gs.q.shape[2], NEED_G=need_g, SPLIT_G=need_h,
                        SLICES=gs.q.shape[0], BLOCK=block, num_warps=warps, **BR_OPTIONS)
    if need_h:
        dh[c0:c1] = hp.hp_gemm(gs, w_cols, 1, n_c, d, post=inv_n32, use="head")[0]
    if need_w:
        _dw(buf, hc, dw64, dw, inv_n, slices, first=c0 == 0, last=c1 == h.shape[0])


def _dw(g: torch.Tensor, h: torch.Tensor, dw64, dw, inv_n: float, slices: int, first: bool, last: bool) -> None:
    """dW's token blocks of g [n, V] (the gradient rows) and h [n, D], in ascending order, into dw64 (into dw,
    times 1/n and rounded, when `last`); `first`: dw64 holds nothing yet."""
    n, v = g.shape
    d = h.shape[1]
    tb = ref.TOKEN_BLOCK
    nb = cdiv(n, tb)
    if dw64 is None and not (first and last and nb == 1):
        raise RuntimeError(f"cross_entropy_zloss: dW over {nb} token blocks (first {first}, last {last}) needs "
                           f"its float64 running sum, none was allocated")  # the kernel would write float64 into dw
    # g^T and h per token block: row v (or d) of block b holds tokens b*TB..
    ga = hp.split(g, nb * v, tb, 1, v, slices, batch_rows=v, s_batch=tb * v, lim=n)
    hb = hp.split(h, nb * d, tb, h.stride(1), h.stride(0), slices, batch_rows=d, s_batch=tb * h.stride(0), lim=n)
    cfg = hp.config(ga.q.shape[0], "dw")
    grid = (cdiv(v, cfg["BM"]) * cdiv(d, cfg["BN"]),)
    _dw_kernel[grid](ga.q, hb.q, ga.e, hb.e, ga.bad, hb.bad, dw64 if dw64 is not None else dw, dw, _double_bits(inv_n),
                     v, d, nb, ga.q.shape[2], ga.q.stride(0), hb.q.stride(0), FIRST=first, LAST=last,
                     SLICES=ga.q.shape[0], **cfg, **BR_OPTIONS)


class _CrossEntropyZLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, targets, z_weight, chunk, ignore_index, slices):
        n, d = h.shape
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dev = h.device
        valid_all = targets != ignore_index
        count = int(torch.count_nonzero(valid_all))
        inv_n = 1.0 / count if count else 0.0  # br-ok: host double division, IEEE on every host
        inv_n32 = upload(inv_n, dev)
        z2 = float(torch.tensor(2.0 * z_weight, dtype=F32))  # the reference's float32 2 z_weight, passed exactly
        ce = torch.zeros(n, dtype=F32, device=dev)
        z = torch.zeros(n, dtype=F32, device=dev)
        dh = torch.zeros_like(h) if need_h else None
        # dW: a float64 running sum unless all tokens are one token block (chunks are whole blocks, and a chunk
        # may hold several), float32 from the last block's kernel (zeros if no target). Keeping g for all tokens
        # for one dW launch measured 0.85x (docs/perf.md).
        dw64 = torch.empty(w.shape, dtype=F64, device=dev) if need_w and count and n > ref.TOKEN_BLOCK else None
        dw = (torch.empty if count else torch.zeros)(w.shape, dtype=F32, device=dev) if need_w else None
        if count:
            hc = h.contiguous()
            w_rows = hp.split(w, w.shape[0], d, w.stride(0), w.stride(1), slices)  # logits: W's rows over D
            w_cols = hp.split(w, d, w.shape[0], w.stride(1), w.stride(0), slices) if need_h else None  # dh: over V
            for c0 in range(0, n, chunk):
                _chunk(hc, w_rows, w_cols, targets, ignore_index, z2, ce, z, dh, dw64, dw, inv_n, inv_n32, c0,
                       min(c0 + chunk, n), need_h, need_w, slices)
        ce_mean = t_reduce.exact_sum(ce, 0, scale=inv_n)
        z_mean = t_reduce.exact_sum(z, 0, scale=inv_n)
        loss = ce_mean + upload(z_weight, dev) * z_mean
        ctx.save_for_backward(dh, dw)
        ctx.mark_non_differentiable(ce_mean, z_mean)
        return loss, ce_mean, z_mean

    @staticmethod
    def backward(ctx, g_loss, g_ce, g_z):
        dh, dw = ctx.saved_tensors
        return (None if dh is None else dh * g_loss, None if dw is None else dw * g_loss,
                None, None, None, None, None)


def cross_entropy_zloss(h: torch.Tensor, w_head: torch.Tensor, targets: torch.Tensor, *,
                        z_weight: float = 1e-4, chunk: int = 1024, ignore_index: int = -100,
                        slices: int = ref.DEFAULT_SLICES) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, ce_mean, z_mean) for h [N, D], w_head [V, D], targets [N]: the bits of ref.cross_entropy_zloss."""
    ref._check(h, w_head, targets, z_weight, chunk, ignore_index, slices)
    if not on_triton(h, w_head, targets) or h.shape[1] > hp.MAX_K or w_head.shape[0] > hp.MAX_K:
        return ref.cross_entropy_zloss(h, w_head, targets, z_weight=z_weight, chunk=chunk,
                                       ignore_index=ignore_index, slices=slices)
    return _CrossEntropyZLoss.apply(h, w_head, targets.contiguous(), float(z_weight), chunk, ignore_index, slices)


def __getattr__(name: str):
    return getattr(ref, name)
