"""Triton twin of softmax in kernels/ref/softmax.py: forward and backward along any dim.

One program per row. Forward: the max (NaN-propagating, as torch.amax), e = float32 exp64(x - m)
parked in the output, the exact fixed-point sum of e, y = e * (1 / s) with a correctly rounded division.
Backward: dx = float32(y (g - <g, y>)) in float64, the dot an exact fixed-point sum. In the forward, a row
of at most 2048 entries (attention's rows) stays in registers: one read and one write instead of a pass per
step (1.56 vs 1.98 ms a layer of the open-1b proxy on the H200). Sliding-window attention rows have their own
forward and backward (softmax_causal_, softmax_causal_backward), which read a row's window only.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ref import fixed as ref_fixed, softmax as ref
from kernels.triton.elementary import exp64
from kernels.triton.fixedpoint import finite_abs, flags_of, from_fixed, nonfinite_sum, or_reduce, scale_shift, to_fixed
from kernels.triton.ieee import INF, div_rn, nan_f64
from kernels.triton.launch import BR_OPTIONS, on_triton, pow2_at_least

F32 = torch.float32


@triton.jit
def _exp_shifted(x_row, idx, n, m64):
    """float32 exp64(x - m) (0 outside the row): the difference is exact in float64."""
    x = tl.load(x_row + idx, mask=idx < n, other=0.0)
    e = exp64(x.to(tl.float64) - m64).to(tl.float32)
    return tl.where(idx < n, e, 0.0)


@triton.jit
def _forward_row(x_row, y_row, n, top, BLOCK: tl.constexpr):
    """A row of at most BLOCK entries, held in registers: one read and one write, the passes' exact ops."""
    idx = tl.arange(0, BLOCK)
    x = tl.load(x_row + idx, mask=idx < n, other=-INF)
    m = tl.where(tl.max((x != x).to(tl.int32), 0) != 0, nan_f64().to(tl.float32), tl.max(x, 0))
    e = tl.where(idx < n, exp64(x.to(tl.float64) - m.to(tl.float64)).to(tl.float32), 0.0)
    e64 = e.to(tl.float64)
    s = scale_shift(tl.max(finite_abs(e64), 0), top)
    f = or_reduce(flags_of(e64), 0)
    total = tl.where(f != 0, nonfinite_sum(f), from_fixed(tl.sum(to_fixed(e64, s), 0), s))
    r = div_rn(tl.full([BLOCK], 1.0, tl.float32), tl.broadcast_to(total.to(tl.float32), [BLOCK]))
    tl.store(y_row + idx, e * r, mask=idx < n)


@triton.jit(do_not_specialize=["n", "top"])
def _forward_kernel(x_ptr, y_ptr, n, top, BLOCK: tl.constexpr, ONE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n
    if ONE:  # n <= BLOCK
        _forward_row(x_row, y_ptr + row * n, n, top, BLOCK)
        return
    mx = tl.full([BLOCK], -INF, tl.float32)
    nan = tl.zeros([BLOCK], tl.int32)
    for start in range(0, n, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + idx, mask=idx < n, other=-INF)
        mx = tl.maximum(mx, x)
        nan = nan | (x != x).to(tl.int32)
    m = tl.where(tl.max(nan, 0) != 0, nan_f64().to(tl.float32), tl.max(mx, 0))  # torch.amax propagates NaN
    m64 = m.to(tl.float64)
    # e is computed once and parked in y: the later passes re-read it from cache, not recompute exp64
    y_row = y_ptr + row * n
    amax = tl.zeros([BLOCK], tl.float64)
    fl = tl.zeros([BLOCK], tl.int32)
    for start in range(0, n, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        e = _exp_shifted(x_row, idx, n, m64)
        tl.store(y_row + idx, e, mask=idx < n)
        amax = tl.maximum(amax, finite_abs(e.to(tl.float64)))
        fl = fl | flags_of(e.to(tl.float64))
    tl.debug_barrier()  # the row's e is visible to every thread of this program
    s = scale_shift(tl.max(amax, 0), top)
    acc = tl.zeros([BLOCK], tl.int64)
    for start in range(0, n, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        acc += to_fixed(tl.load(y_row + idx, mask=idx < n, other=0.0).to(tl.float64), s)
    f = or_reduce(fl, 0)
    total = tl.where(f != 0, nonfinite_sum(f), from_fixed(tl.sum(acc, 0), s))
    r = div_rn(tl.full([BLOCK], 1.0, tl.float32), tl.broadcast_to(total.to(tl.float32), [BLOCK]))
    tl.debug_barrier()
    for start in range(0, n, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        tl.store(y_row + idx, tl.load(y_row + idx, mask=idx < n, other=0.0) * r, mask=idx < n)


@triton.jit(do_not_specialize=["n", "window", "top"])
def _causal_forward_kernel(x_ptr, y_ptr, nan_ptr, n, window, top, BAND: tl.constexpr, BLOCK: tl.constexpr):
    """A row of causal attention logits (query i = row % n of n keys, seeing keys i - window < j <= i) whose
    unseen entries are -inf: the row's bits as _forward_row's, reading only the BAND entries ending at key i.

    An unseen entry's e in the full row is exp64(-inf - m): 0, or NaN when m is -inf or NaN, and then a seen
    entry's e is NaN too (exp64(-inf - -inf), or NaN - m). So the unseen entries add nothing to the max, the
    scale, the flags or the fixed-point sum that the seen ones do not, and their y is 0 * (1 / s) (NaN exactly
    when the row's is): they need not be read (nor written by _logits: hp_gemm(..., store_unseen=False)).
    nan[row] = 1 where the row's sum is NaN, i.e. every y of the row is NaN (else every y is finite)."""
    row = tl.program_id(0).to(tl.int64)
    i = row % n
    x_row, y_row = x_ptr + row * n, y_ptr + row * n
    start = tl.maximum(i + 1 - BAND, 0)
    idx = start + tl.arange(0, BAND)
    seen = (idx <= i) & (idx > i - window)
    x = tl.load(x_row + idx, mask=seen, other=-INF)
    m = tl.where(tl.max((x != x).to(tl.int32), 0) != 0, nan_f64().to(tl.float32), tl.max(x, 0))
    e = tl.where(seen, exp64(x.to(tl.float64) - m.to(tl.float64)).to(tl.float32), 0.0)
    e64 = e.to(tl.float64)
    s = scale_shift(tl.max(finite_abs(e64), 0), top)
    f = or_reduce(flags_of(e64), 0)
    total = tl.where(f != 0, nonfinite_sum(f), from_fixed(tl.sum(to_fixed(e64, s), 0), s))
    tl.store(nan_ptr + row, (total != total).to(tl.int32))
    r = div_rn(tl.full([BAND], 1.0, tl.float32), tl.broadcast_to(total.to(tl.float32), [BAND]))
    tl.store(y_row + idx, e * r, mask=idx < n)  # in-band unseen lanes: e = 0, so 0 * r as outside
    y_out = 0.0 * div_rn(tl.full([BLOCK], 1.0, tl.float32), tl.broadcast_to(total.to(tl.float32), [BLOCK]))
    for s0 in range(0, n, BLOCK):
        j = s0 + tl.arange(0, BLOCK)
        tl.store(y_row + j, y_out, mask=(j < n) & ((j < start) | (j >= start + BAND)))


@triton.jit
def _backward_row(y_row, g_row, dx_row, n, top, BLOCK: tl.constexpr):
    """dx = float32(y (g - <g, y>)) for one row, in float64, the dot an exact fixed-point sum."""
    amax = tl.zeros([BLOCK], tl.float64)
    fl = tl.zeros([BLOCK], tl.int32)
    for start in range(0, n, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        p = tl.load(g_row + idx, mask=idx < n, other=0.0).to(tl.float64) * \
            tl.load(y_row + idx, mask=idx < n, other=0.0).to(tl.float64)
        amax = tl.maximum(amax, finite_abs(p))
        fl = fl | flags_of(p)
    s = scale_shift(tl.max(amax, 0), top)
    acc = tl.zeros([BLOCK], tl.int64)
    for start in range(0, n, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        p = tl.load(g_row + idx, mask=idx < n, other=0.0).to(tl.float64) * \
            tl.load(y_row + idx, mask=idx < n, other=0.0).to(tl.float64)
        acc += to_fixed(p, s)
    f = or_reduce(fl, 0)
    d = tl.where(f != 0, nonfinite_sum(f), from_fixed(tl.sum(acc, 0), s))
    for start in range(0, n, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        y = tl.load(y_row + idx, mask=idx < n, other=0.0).to(tl.float64)
        g = tl.load(g_row + idx, mask=idx < n, other=0.0).to(tl.float64)
        tl.store(dx_row + idx, (y * (g - d)).to(tl.float32), mask=idx < n)


@triton.jit(do_not_specialize=["n", "top"])
def _backward_kernel(y_ptr, g_ptr, dx_ptr, n, top, BLOCK: tl.constexpr):
    # no register-resident variant: at [B, H, 2048, 2048] it took 1.74 ms a layer on the H200 against 1.38
    row = tl.program_id(0).to(tl.int64)
    _backward_row(y_ptr + row * n, g_ptr + row * n, dx_ptr + row * n, n, top, BLOCK)


@triton.jit(do_not_specialize=["n", "window", "top"])
def _causal_backward_kernel(y_ptr, g_ptr, dx_ptr, flags_ptr, n, window, top, BAND: tl.constexpr,
                            BLOCK: tl.constexpr):
    """dx of a sliding-window row of _causal_forward_kernel's y, reading y and g over the row's window (keys
    i - window < j <= i, lanes of a BAND ending at key i) only, when g's row is finite (flags[row] == 0; else
    the whole row, as _backward_kernel). So g may be unwritten outside the windows of its unflagged rows.

    Outside the window y is +0 (or NaN where the whole row of y is NaN, and then the window's p are NaN too):
    there g y is +-0, which adds nothing to <g, y>'s scale, flags or sum, and dx = 0 (g - d) is a zero, or NaN
    when d is not finite, which 0 (0 - d) gives as well. The zero's sign may differ (g - d's): dS is read only
    by the hp splits, which cut +0 and -0 to the same slices, so no bit of dq or dk can show it."""
    row = tl.program_id(0).to(tl.int64)
    y_row, g_row, dx_row = y_ptr + row * n, g_ptr + row * n, dx_ptr + row * n
    if tl.load(flags_ptr + row) != 0:
        _backward_row(y_row, g_row, dx_row, n, top, BLOCK)
    else:
        i = row % n
        first = i + 1 - window  # the window's first key (may be negative)
        idx = tl.maximum(i + 1 - BAND, 0) + tl.arange(0, BAND)
        lanes = (idx >= first) & (idx <= i)  # a band that starts at key 0 runs past key i
        y = tl.load(y_row + idx, mask=lanes, other=0.0).to(tl.float64)
        g = tl.load(g_row + idx, mask=lanes, other=0.0).to(tl.float64)
        p = g * y
        s = scale_shift(tl.max(finite_abs(p), 0), top)
        f = or_reduce(flags_of(p), 0)
        d = tl.where(f != 0, nonfinite_sum(f), from_fixed(tl.sum(to_fixed(p, s), 0), s))
        tl.store(dx_row + idx, (y * (g - d)).to(tl.float32), mask=lanes)
        out = tl.broadcast_to((0.0 * (0.0 - d)).to(tl.float32), [BLOCK])
        for s0 in range(0, n, BLOCK):
            j = s0 + tl.arange(0, BLOCK)
            tl.store(dx_row + j, out, mask=(j < n) & ((j < first) | (j > i)))


def _rows(t: torch.Tensor, dim: int) -> torch.Tensor:
    """`t` with `dim` moved last, contiguous, as [rows, n]."""
    moved = t.movedim(dim, -1).contiguous()
    return moved.reshape(-1, moved.shape[-1])


def _back(t2: torch.Tensor, like: torch.Tensor, dim: int) -> torch.Tensor:
    """Undo _rows: the original layout, contiguous (as the reference returns it)."""
    shape = list(like.movedim(dim, -1).shape)
    return t2.reshape(shape).movedim(-1, dim).contiguous()


ROW_WARPS = 8  # the full-row forward's warps: free for the bits, a knob for tile sweeps


def _block(n: int) -> int:
    return min(pow2_at_least(n), 2048)


def _launch_forward(x: torch.Tensor, dim: int) -> torch.Tensor:
    x2 = _rows(x, dim)
    r, n = x2.shape
    y2 = torch.empty_like(x2)
    top = ref_fixed.TOP_BIT - ref_fixed.headroom_bits(n)
    _forward_kernel[(r,)](x2, y2, n, top, BLOCK=_block(n), ONE=n <= _block(n), num_warps=ROW_WARPS, **BR_OPTIONS)
    return _back(y2, x, dim)


def _launch_backward(y: torch.Tensor, g: torch.Tensor, dim: int) -> torch.Tensor:
    y2, g2 = _rows(y, dim), _rows(g, dim)
    r, n = y2.shape
    dx2 = torch.empty_like(y2)
    top = ref_fixed.TOP_BIT - ref_fixed.headroom_bits(n)
    _backward_kernel[(r,)](y2, g2, dx2, n, top, BLOCK=_block(n), num_warps=8, **BR_OPTIONS)
    return _back(dx2, y, dim)


MAX_BAND = 2048  # the causal row kernel's keys in registers
# warps of the causal row kernels (the forward's at most one per 64 keys of its band): free for the bits (max, or
# and int64 sums are exact in any order), so knobs for tile sweeps
CAUSAL_FORWARD_WARPS, CAUSAL_BACKWARD_WARPS = 2, 8  # forward 2: 1.05x a windowed layer (H100; docs/perf.md)


def causal_band_fits(t: int, window: int | None) -> bool:
    """Whether softmax_causal_ reads only the seen entries of [.., T, T] logits (else it reads all of them):
    for a sliding window whose band is shorter than the row. (A global causal row read up to its diagonal
    measured 0.97x of the full-row kernel on the H200: the same exp64 work over the row's lanes, and a second
    store pass; docs/perf.md.)"""
    if window is None:
        return False
    band = pow2_at_least(window)
    return band <= MAX_BAND and band < t


def causal_backward_fits(t: int, window: int | None) -> bool:
    """Whether softmax_causal_backward reads a causal row's seen keys only (else every entry): for a window of
    any length (T or more: a global row, keys 0..i) whose band of pow2_at_least(min(window, T)) lanes fits
    MAX_BAND. Unlike the forward's causal_band_fits, a band as long as the row pays here: dP need not be
    written above the diagonal (contraction.hp_window_matmul_), and its rows are read up to the diagonal only."""
    return window is not None and pow2_at_least(min(window, t)) <= MAX_BAND


def softmax_causal_(x: torch.Tensor, window: int | None, row_nan: torch.Tensor | None = None) -> torch.Tensor:
    """ref.softmax_ of causal attention logits x [..., T, T] (rows: queries at row % T) whose unseen entries are
    -inf. When causal_band_fits, those entries are not read, so a caller may leave them unwritten, and row_nan
    (int32, one per row), if given, is set to 1 where the output row is NaN, else 0; otherwise this is softmax_,
    reads every entry and leaves row_nan alone."""
    t = x.shape[-1]
    if not causal_band_fits(t, window):
        return softmax_(x, -1)
    if not (_usable(x) and x.is_contiguous() and x.shape[-2] % t == 0):
        # no fallback to a full-row read here: the caller may have left the unseen entries unwritten
        raise ValueError(f"softmax_causal_: argument 'x' must be contiguous float32 [..., G T, T] logits on a "
                         f"Triton device, got {x.dtype} {tuple(x.shape)} on {x.device}")
    band = pow2_at_least(window)
    x2 = x.reshape(-1, t)
    y2 = torch.empty_like(x2)
    nan = row_nan if row_nan is not None else torch.empty(x2.shape[0], dtype=torch.int32, device=x.device)
    top = ref_fixed.TOP_BIT - ref_fixed.headroom_bits(t)
    _causal_forward_kernel[(x2.shape[0],)](x2, y2, nan, t, window, top, BAND=band, BLOCK=_block(t),
                                           num_warps=max(1, min(CAUSAL_FORWARD_WARPS, band // 64)), **BR_OPTIONS)
    return y2.reshape(x.shape)


def softmax_causal_backward(y: torch.Tensor, g: torch.Tensor, window: int | None,
                            g_flags: torch.Tensor) -> torch.Tensor:
    """ref.softmax_backward(y, g, -1) for y = softmax_causal_(x, window) (or softmax_ of causal logits, the window
    T or more for a global layer), up to the sign of dx's zeros outside a row's window (see
    _causal_backward_kernel; hp splits cannot see it). g_flags: int32 per row of g, non-zero where that row
    holds a non-finite entry (contraction.hp_matmul_(..., row_flags=)); such rows are read in full, the others
    over their window only (contraction.hp_window_matmul_ leaves the rest of g unwritten)."""
    t = y.shape[-1]
    if not causal_backward_fits(t, window):
        return softmax_backward(y, g, -1)
    if not (_usable(y) and on_triton(g) and g.dtype == F32 and g.shape == y.shape and y.is_contiguous()
            and g.is_contiguous() and y.shape[-2] % t == 0 and g_flags.numel() == y.numel() // t):
        # no fallback to a full-row read here: g may be unwritten outside the windows (hp_window_matmul_)
        raise ValueError(f"softmax_causal_backward: arguments 'y' and 'g' must be contiguous float32 [..., G T, T] "
                         f"on a Triton device with one flag a row, got y {y.dtype} {tuple(y.shape)}, g {g.dtype} "
                         f"{tuple(g.shape)} on {g.device}, {g_flags.numel()} flags")
    dx = torch.empty_like(y)
    top = ref_fixed.TOP_BIT - ref_fixed.headroom_bits(t)
    _causal_backward_kernel[(y.numel() // t,)](y, g, dx, g_flags, t, window, top,
                                              BAND=pow2_at_least(min(window, t)), BLOCK=_block(t),
                                              num_warps=CAUSAL_BACKWARD_WARPS, **BR_OPTIONS)
    return dx


def _usable(x: torch.Tensor) -> bool:
    return on_triton(x) and x.dtype == F32 and x.dim() >= 1 and x.numel() > 0


def softmax_(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of float32 `x` along `dim`, without autograd: the bits of ref.softmax_."""
    return _launch_forward(x, dim % x.dim()) if _usable(x) else ref.softmax_(x, dim)


def softmax_backward(y: torch.Tensor, g: torch.Tensor, dim: int) -> torch.Tensor:
    """dx = y * (g - <g, y>) along `dim`: the bits of ref.softmax_backward."""
    if not (_usable(y) and on_triton(g) and g.dtype == F32 and g.shape == y.shape):
        return ref.softmax_backward(y, g, dim)
    return _launch_backward(y, g, dim % y.dim())


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        y = _launch_forward(x, dim)
        ctx.save_for_backward(y)
        ctx.dim = dim
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return _launch_backward(y, g, ctx.dim), None


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Differentiable BR softmax of float32 `x` along `dim`: the bits of kernels.ref.softmax.softmax."""
    if not _usable(x):
        return ref.softmax(x, dim)
    return _Softmax.apply(x, ref._dim("softmax", x, dim))


def __getattr__(name: str):
    """logsumexp and shifted_exp are the reference's."""
    return getattr(ref, name)
