"""Triton twin of kernels/ref/int8_linear.py: the int8 W8A8 QAT linear, forward and backward, same bits.

Forward: one program per weight row takes the exact fixed-point mean |w| (two passes, as ref exact_mean),
the re-pinned step s_w, the channel product s_x * s_w and the codes of w / s_w; one kernel quantizes x / s_x;
the int8 GEMM (kernels/triton/intmm.gemm, K-contiguous operands) dequantizes in its epilogue:
float32(acc) * (s_x * s_w[n]), NaN on non-finite rows/columns. Backward: both gradient GEMMs through the
rotated int8 product (kernels/triton/rotated_mm), w_hat and x_hat rebuilt inside the quantizing kernel;
dw's straight-through gate in the GEMM epilogue; dx's gate and the LSQ step gradient (an exact int64
fixed-point dot over every element of x) in one elementwise kernel pair.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ref import fixed as ref_fixed, int8_linear as ref
from kernels.ref.hadamard import DEFAULT_BLOCK
from kernels.triton.fixedpoint import (finite_abs, flags_of, from_fixed, nonfinite_sum, or_reduce, scale_shift,
                                       to_fixed)
from kernels.triton.ieee import div_rn, isfinite
from kernels.triton.intmm import gemm
from kernels.triton.launch import BR_OPTIONS, cdiv, constant, on_triton, pow2_at_least, split_spans
from kernels.triton.reduce import _double_bits, _finish_kernel
from kernels.triton.rotated_mm import code8, padded16, rotated_product, supported

F32 = torch.float32
QMAX = tl.constexpr(127.0)
ROW_BLOCK = 1024
TILE_R, TILE_K = 2, 512      # activation quantizer tile: 1.21x 16 x 128 with one layer's LSQ passes (docs/perf.md's
                             # history)
LSQ_BLOCK = 1024
TARGET_PROGRAMS = 1024


@triton.jit(do_not_specialize=["N", "K", "Kp", "top", "inv_bits"])
def _weight_kernel(w_ptr, N, K, Kp, top, inv_bits, repin, sx_ptr, sw_ptr, cs_ptr, bad_ptr, q_ptr,
                   QUANT: tl.constexpr, R: tl.constexpr, BK: tl.constexpr):
    """Rows of w: s_w = where(s > 0, s, 1) for s = float32(exact mean |w|) * repin; s_x * s_w; bad; codes."""
    n = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    live = n < N
    rows = w_ptr + n[:, None] * K
    amax = tl.zeros([R, BK], tl.float64)
    fl = tl.zeros([R, BK], tl.int32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        a = tl.abs(tl.load(rows + k[None, :], mask=live[:, None] & (k < K)[None, :], other=0.0).to(tl.float64))
        amax = tl.maximum(amax, finite_abs(a))
        fl = fl | flags_of(a)
    s = scale_shift(tl.max(amax, 1), top)
    acc = tl.zeros([R, BK], tl.int64)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        a = tl.abs(tl.load(rows + k[None, :], mask=live[:, None] & (k < K)[None, :], other=0.0).to(tl.float64))
        acc += to_fixed(a, s[:, None])  # exact: any order of these integer adds gives the same sum
    f = or_reduce(fl, 1)
    # ref exact_mean: the int64 total to float64, times the host double 1/K, one rounding to float32
    total = from_fixed(tl.sum(acc, 1), s)
    mean = (total * inv_bits.to(tl.int64).to(tl.float64, bitcast=True)).to(tl.float32)
    mean = tl.where(f != 0, nonfinite_sum(f).to(tl.float32), mean)
    step = mean * repin
    step = tl.where(step > 0, step, 1.0)  # NaN > 0 is false: NaN steps become 1, as the reference
    sx = tl.load(sx_ptr)
    tl.store(sw_ptr + n, step, mask=live)
    tl.store(cs_ptr + n, sx * step, mask=live)  # the forward's per-channel product s_x * s_w[n], rounded once
    sx_bad = tl.where(isfinite(sx), 0, 1)  # a non-finite s_x makes every output NaN
    tl.store(bad_ptr + n, tl.where(f != 0, 1, sx_bad), mask=live)
    if QUANT:
        for k0 in range(0, Kp, BK):
            k = k0 + tl.arange(0, BK)
            w = tl.load(rows + k[None, :], mask=live[:, None] & (k < K)[None, :], other=0.0).to(tl.float32)
            q = code8(div_rn(w, tl.broadcast_to(step[:, None], [R, BK])))
            tl.store(q_ptr + n[:, None] * Kp + k[None, :], q.to(tl.int8), mask=live[:, None] & (k < Kp)[None, :])


@triton.jit(do_not_specialize=["M", "K", "Kp"])
def _activation_kernel(x_ptr, sx_ptr, q_ptr, bad_ptr, M, K, Kp, R: tl.constexpr, BK: tl.constexpr):
    """Codes of x / s_x (tensor division, correctly rounded) [M, Kp] and the non-finite rows of x."""
    r = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    live = r < M
    sx = tl.load(sx_ptr)
    bad = tl.zeros([R], tl.int32)
    for k0 in range(0, Kp, BK):
        k = k0 + tl.arange(0, BK)
        x = tl.load(x_ptr + r[:, None] * K + k[None, :], mask=live[:, None] & (k < K)[None, :], other=0.0)
        bad = bad | tl.max(tl.where(isfinite(x), 0, 1), axis=1)
        q = code8(div_rn(x, tl.broadcast_to(sx, [R, BK])))  # never 0 + s_x: that loses a -0.0
        tl.store(q_ptr + r[:, None] * Kp + k[None, :], q.to(tl.int8), mask=live[:, None] & (k < Kp)[None, :])
    tl.store(bad_ptr + r, bad, mask=live)


@triton.jit
def _lsq_terms(dxh_ptr, x_ptr, sx, idx, n):
    """(dx_hat, float64 product dx_hat * lsq_step_factor(v, q), v) for v = x / s_x."""
    m = idx < n
    d = tl.load(dxh_ptr + idx, mask=m, other=0.0)
    x = tl.load(x_ptr + idx, mask=m, other=0.0)
    v = div_rn(x, tl.broadcast_to(sx, x.shape))
    f = tl.where(v >= QMAX, QMAX, tl.where(v <= -QMAX, -QMAX, code8(v) - v))  # round(v) - v inside the range
    return d, d.to(tl.float64) * f.to(tl.float64), v  # float32 products are exact in float64


@triton.jit(do_not_specialize=["n", "span"])
def _lsq_stats_kernel(dxh_ptr, x_ptr, sx_ptr, dx_ptr, amax_ptr, flags_ptr, n, span,
                      NEED_X: tl.constexpr, BLOCK: tl.constexpr):
    part = tl.program_id(0)
    lo = part.to(tl.int64) * span
    sx = tl.load(sx_ptr)
    amax = tl.zeros([BLOCK], tl.float64)
    fl = tl.zeros([BLOCK], tl.int32)
    for start in range(0, span, BLOCK):
        idx = lo + start + tl.arange(0, BLOCK)
        d, p, v = _lsq_terms(dxh_ptr, x_ptr, sx, idx, n)
        amax = tl.maximum(amax, finite_abs(p))
        fl = fl | flags_of(p)
        if NEED_X:
            tl.store(dx_ptr + idx, tl.where(tl.abs(v) <= QMAX, d, 0.0), mask=idx < n)  # straight-through gate
    tl.store(amax_ptr + part, tl.max(amax, 0))
    tl.store(flags_ptr + part, or_reduce(fl, 0))


@triton.jit(do_not_specialize=["n", "span", "S", "top"])
def _lsq_sum_kernel(dxh_ptr, x_ptr, sx_ptr, amax_ptr, part_ptr, n, span, S, top,
                    S_POW2: tl.constexpr, BLOCK: tl.constexpr):
    part = tl.program_id(0)
    j = tl.arange(0, S_POW2)
    s = scale_shift(tl.max(tl.load(amax_ptr + j, mask=j < S, other=0.0), 0), top)
    lo = part.to(tl.int64) * span
    sx = tl.load(sx_ptr)
    acc = tl.zeros([BLOCK], tl.int64)
    for start in range(0, span, BLOCK):
        idx = lo + start + tl.arange(0, BLOCK)
        _, p, _ = _lsq_terms(dxh_ptr, x_ptr, sx, idx, n)
        acc += to_fixed(p, s)  # integer adds: any order, any split, same sum
    tl.store(part_ptr + part, tl.sum(acc, 0))


_REPIN: dict[str, float] = {}


def _repin() -> float:
    """float32(2 / sqrt(127)) from the reference (computed once on the CPU; a float32 passes exactly)."""
    if "c" not in _REPIN:
        _REPIN["c"] = float(ref.repin_constant())
    return _REPIN["c"]


def _weight(w: torch.Tensor, s_x: torch.Tensor, quant: bool):
    """(s_w [N], s_x * s_w [N], bad [N] int32, codes [N, Kp] int8 or None)."""
    n, k = w.shape
    dev = w.device
    kp = padded16(k)
    sw = torch.empty(n, dtype=F32, device=dev)
    cs = torch.empty(n, dtype=F32, device=dev)
    bad = torch.empty(n, dtype=torch.int32, device=dev)
    q = torch.empty((n, kp), dtype=torch.int8, device=dev) if quant else None
    top = ref_fixed.TOP_BIT - ref_fixed.headroom_bits(k)
    bk = min(pow2_at_least(k), ROW_BLOCK)
    r = max(1, ROW_BLOCK // bk)
    _weight_kernel[(cdiv(n, r),)](w, n, k, kp, top, _double_bits(1.0 / k), _repin(), s_x, sw, cs, bad,
                                  q if quant else sw, QUANT=quant, R=r, BK=bk, num_warps=4, **BR_OPTIONS)
    return sw, cs, bad, q


def weight_step(w: torch.Tensor) -> torch.Tensor:
    """Re-pinned per-output-channel step s_w [N] of w [N, K]: the bits of ref.weight_step."""
    if not (on_triton(w) and w.dim() == 2 and w.dtype in (F32, torch.bfloat16) and w.shape[1] > 0):
        return ref.weight_step(w)
    one = torch.ones((), dtype=F32, device=w.device)
    return _weight(w.contiguous(), one, quant=False)[0]


def _activation(x2: torch.Tensor, s_x: torch.Tensor):
    m, k = x2.shape
    kp = padded16(k)
    q = torch.empty((m, kp), dtype=torch.int8, device=x2.device)
    bad = torch.empty(m, dtype=torch.int32, device=x2.device)
    _activation_kernel[(cdiv(m, TILE_R),)](x2, s_x, q, bad, m, k, kp, R=TILE_R, BK=TILE_K, num_warps=4,
                                           **BR_OPTIONS)
    return q, bad


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).contiguous()


def _usable(x, w, s_x) -> bool:
    return (on_triton(x, w, s_x) and x.dtype == F32 and w.dtype in (F32, torch.bfloat16) and s_x.dtype == F32
            and s_x.dim() == 0 and w.dim() == 2 and x.dim() >= 1 and x.numel() > 0 and x.shape[-1] == w.shape[1]
            and w.shape[0] > 0)


def _forward(x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [..., N], s_w [N]) for usable operands: the backward takes the same s_w (w has not changed)."""
    x2 = _flat(x)
    s_w, cs, bad_w, q_w = _weight(w.contiguous(), s_x, quant=True)
    q_x, bad_x = _activation(x2, s_x)
    y = gemm(q_x, q_w, out_dtype=F32, col_scale=cs, bad_rows=bad_x, bad_cols=bad_w)
    return y.reshape(*x.shape[:-1], w.shape[0]), s_w


def int8_linear_forward(x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor) -> torch.Tensor:
    """y [..., N] float32 without autograd: the bits of ref.int8_linear_forward."""
    if not _usable(x, w, s_x):
        return ref.int8_linear_forward(x, w, s_x)
    return _forward(x, w, s_x)[0]


def _lsq(dx_hat: torch.Tensor, x2: torch.Tensor, s_x: torch.Tensor, need_x: bool, need_s: bool,
         dx: torch.Tensor | None = None):
    """(dx = dx_hat gated by |x / s_x| <= 127, exact float32 sum of dx_hat * lsq_step_factor) as needed; `dx`:
    a contiguous tensor like x2 to write the gated dx into (else a new one)."""
    n = x2.numel()
    dev = x2.device
    s, span = split_spans(n, LSQ_BLOCK, TARGET_PROGRAMS)
    dx = (torch.empty_like(x2) if dx is None else dx) if need_x else None
    amax = torch.empty(s, dtype=torch.float64, device=dev)
    flags = torch.empty(s, dtype=torch.int32, device=dev)
    _lsq_stats_kernel[(s,)](dx_hat, x2, s_x, dx if need_x else x2, amax, flags, n, span, NEED_X=need_x,
                            BLOCK=LSQ_BLOCK, **BR_OPTIONS)
    total = None
    if need_s:
        top = ref_fixed.TOP_BIT - ref_fixed.headroom_bits(n)
        parts = torch.empty(s, dtype=torch.int64, device=dev)
        sp = pow2_at_least(s)
        _lsq_sum_kernel[(s,)](dx_hat, x2, s_x, amax, parts, n, span, s, top, S_POW2=sp, BLOCK=LSQ_BLOCK,
                              **BR_OPTIONS)
        total = torch.empty(1, dtype=F32, device=dev)
        _finish_kernel[(1,)](amax, flags, parts, total, s, top, 0, HAS_SCALE=False, S_POW2=sp, **BR_OPTIONS)
        total = total[0]
    return dx, total


def int8_linear_backward(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor, *,
                         rotate: bool = True, block: int = DEFAULT_BLOCK,
                         needs: tuple[bool, bool, bool] = (True, True, True), s_w: torch.Tensor | None = None,
                         ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(dx like x, dw float32 [N, K], ds_x 0-dim float32): the bits of ref.int8_linear_backward.
    s_w: w's step (weight_step(w)) when the caller has it from the forward, else it is taken here."""
    return ref.as_one_window(int8_linear_backward_windows, g, x, w, s_x, rotate=rotate, block=block, needs=needs,
                             s_w=s_w)


def int8_linear_backward_windows(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor, *,
                                 rotate: bool = True, block: int = DEFAULT_BLOCK,
                                 needs: tuple[bool, bool, bool] = (True, True, True),
                                 s_w: torch.Tensor | None = None,
                                 ) -> tuple[torch.Tensor | None, list[torch.Tensor | None], list[torch.Tensor | None]]:
    """(dx like x, [dw of window i], [ds_x of window i]) for a batch of windows: the bits of
    ref.int8_linear_backward_windows. dx_hat is one GEMM over every window's rows; dw and ds_x per window."""
    windows = x.shape[0]
    n_out, k = w.shape if w.dim() == 2 else (0, 0)
    m = x.numel() // k if k else 0
    rows = m // windows if windows else 0
    if not (_usable(x, w, s_x) and on_triton(g) and g.dtype == F32 and g.shape[-1] == n_out
            and supported(n_out, rotate, block) and supported(rows, rotate, block)):
        return ref.int8_linear_backward_windows(g, x, w, s_x, rotate=rotate, block=block, needs=needs, s_w=s_w)
    need_x, need_w, need_s = needs
    g2, x2, w = _flat(g), _flat(x), w.contiguous()
    part = [slice(i * rows, (i + 1) * rows) for i in range(windows)]
    if s_w is None:
        s_w = _weight(w, s_x, quant=False)[0]
    dx, dws, dss = None, [None] * windows, [None] * windows
    if need_x or need_s:
        dx_hat = rotated_product(g2, (n_out, 1), w, (1, k), m, k, n_out, rotate=rotate, block=block, b_pre=s_w)
        if need_s:  # per window: the gate and the window's exact sum in its one pass over dx_hat
            dx2 = torch.empty_like(x2) if need_x else None
            scale = constant(ref.lsq_grad_scale, rows * k, x.device)
            dss = [_lsq(dx_hat[p], x2[p], s_x, need_x, True, None if dx2 is None else dx2[p])[1] * scale
                   for p in part]
        else:
            dx2 = _lsq(dx_hat, x2, s_x, True, False)[0]
        dx = None if dx2 is None else dx2.reshape(x.shape)
    if need_w:
        dws = [rotated_product(g2[p], (1, n_out), x2[p], (1, k), n_out, k, rows, rotate=rotate, block=block,
                               b_pre=s_x, mask_src=w, mask_scale=s_w) for p in part]
    return dx, dws, dss


class _Int8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, s_x, rotate, block):
        y, s_w = _forward(x, w, s_x)
        ctx.save_for_backward(x, w, s_x, s_w)  # s_w [N]: one pass over w fewer in the backward
        ctx.rotate, ctx.block = rotate, block
        return y

    @staticmethod
    def backward(ctx, g):
        x, w, s_x, s_w = ctx.saved_tensors
        dx, dw, ds = int8_linear_backward(g.contiguous(), x, w, s_x, rotate=ctx.rotate, block=ctx.block,
                                          needs=tuple(ctx.needs_input_grad[:3]), s_w=s_w)
        if dw is not None:
            dw = dw.to(w.dtype)  # a bf16 weight's gradient is bf16 (round to nearest even, as the reference)
        return dx, dw, ds, None, None


def int8_linear(x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor, *, rotate: bool = True,
                block: int = DEFAULT_BLOCK) -> torch.Tensor:
    """int8 W8A8 QAT linear x [..., K] float32, w [N, K] float32/bf16, s_x 0-dim: the bits of ref.int8_linear."""
    ref.validate(x, w, s_x, block)
    if not _usable(x, w, s_x):
        return ref.int8_linear(x, w, s_x, rotate=rotate, block=block)
    return _Int8Linear.apply(x, w, s_x, rotate, block)


def __getattr__(name: str):
    """repin_constant, quantize_weight, quantize_activation, lsq_step_factor, lsq_grad_scale: the reference's."""
    return getattr(ref, name)
