"""Triton twin of kernels/ref/embedding.py: the gather forward and the exact int64 scatter-add backward.

Backward, as the reference: one scale for the whole gradient from its largest finite magnitude (split
programs report theirs; the scatter takes the max), headroom ceil(log2 N) bits for N tokens, every element
rounded once to int64 and added into its row with integer atomics (exact and order-free, so the atomics'
arbitrary order cannot change a bit), then one conversion back. Non-finite elements, when there are any,
OR their kind into a per-entry flag buffer: the IEEE sum of only those addends, as ref._nonfinite_rows.
Whether there are any is read on the device (the largest of the split programs' flags), not by the host: the
backward runs at the end of the step's backward pass, and a host wait there left the GPU idle while the host then
queued the gradient reduction, the global norm and the clip (docs/perf.md). The flag buffer is cleared and
written only then.
The forward is torch's index_select: a gather copies bits, exact on every device.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from kernels.ref import embedding as ref, fixed as ref_fixed
from kernels.ref.checks import expect, same_device
from kernels.triton.fixedpoint import flags_of, from_fixed, nonfinite_sum, scale_shift, span_stats, to_fixed
from kernels.triton.launch import BR_OPTIONS, cdiv, on_triton, pow2_at_least, split_spans

F32 = torch.float32
BLOCK = 1024
TARGET_PROGRAMS = 1024
TOKENS, COLS = 8, 256  # scatter tile


@triton.jit(do_not_specialize=["total", "span"])
def _stats_kernel(g_ptr, amax_ptr, flags_ptr, total, span, BLOCK: tl.constexpr):
    """Largest finite |g| and the non-finite kinds over one split of the flat gradient."""
    part = tl.program_id(0)
    amax, fl = span_stats(g_ptr, part.to(tl.int64) * span, span, total, False, BLOCK)
    tl.store(amax_ptr + part, amax)
    tl.store(flags_ptr + part, fl)


@triton.jit
def _shift(amax_ptr, S, top, S_POW2: tl.constexpr):
    j = tl.arange(0, S_POW2)
    return scale_shift(tl.max(tl.load(amax_ptr + j, mask=j < S, other=0.0), 0), top)


@triton.jit(do_not_specialize=["total", "span"])
def _clear_kernel(any_ptr, buf_ptr, total, span, BLOCK: tl.constexpr):
    """Zeros over the program's span of the per-entry flag buffer, only when there is a non-finite element
    (any_ptr: the largest of the split programs' flags; else the buffer is never read, and this launch costs no
    pass over it)."""
    if tl.load(any_ptr) != 0:
        lo = tl.program_id(0).to(tl.int64) * span
        for start in range(0, span, BLOCK):
            idx = lo + start + tl.arange(0, BLOCK)
            tl.store(buf_ptr + idx, tl.zeros([BLOCK], tl.int32), mask=idx < total)


@triton.jit(do_not_specialize=["N", "D", "S", "top"])
def _scatter_kernel(g_ptr, ids_ptr, amax_ptr, any_ptr, acc_ptr, flag_ptr, N, D, S, top,
                    S_POW2: tl.constexpr, R: tl.constexpr, BD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    m = (t < N)[:, None] & (d < D)[None, :]
    s = _shift(amax_ptr, S, top, S_POW2)
    g = tl.load(g_ptr + t[:, None] * D + d[None, :], mask=m, other=0.0).to(tl.float64)
    row = tl.load(ids_ptr + t, mask=t < N, other=0).to(tl.int64)
    dst = row[:, None] * D + d[None, :]
    # int64 atomics: integer addition is associative, so their order never shows in the sum
    tl.atomic_add(acc_ptr + dst, to_fixed(g, s), mask=m, sem="relaxed")
    if tl.load(any_ptr) != 0:
        f = flags_of(g)
        tl.atomic_or(flag_ptr + dst, f, mask=m & (f != 0), sem="relaxed")


@triton.jit(do_not_specialize=["total", "S", "top"])
def _finish_kernel(acc_ptr, flag_ptr, amax_ptr, any_ptr, out_ptr, total, S, top,
                   S_POW2: tl.constexpr, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = idx < total
    out = from_fixed(tl.load(acc_ptr + idx, mask=m, other=0), _shift(amax_ptr, S, top, S_POW2))
    if tl.load(any_ptr) != 0:
        f = tl.load(flag_ptr + idx, mask=m, other=0)
        out = tl.where(f != 0, nonfinite_sum(f), out)
    tl.store(out_ptr + idx, out.to(tl.float32), mask=m)


def embedding_grad(ids: torch.Tensor, g: torch.Tensor, rows: int) -> torch.Tensor:
    """dW [rows, D] float32 of the gather weight[ids] for output gradient g: the bits of ref.embedding_grad."""
    if not (on_triton(ids, g) and g.dtype in ref.WEIGHT_DTYPES and g.dim() >= 1):
        return ref.embedding_grad(ids, g, rows)
    d = g.shape[-1]
    idx = ids.reshape(-1).contiguous()
    n = idx.numel()
    dev = g.device
    if n == 0 or d == 0 or rows == 0:
        return torch.zeros((rows, d), dtype=F32, device=dev)
    g2 = g.reshape(-1, d).contiguous()
    s, span = split_spans(n * d, BLOCK, TARGET_PROGRAMS)
    amax = torch.empty(s, dtype=torch.float64, device=dev)
    flags = torch.empty(s, dtype=torch.int32, device=dev)
    _stats_kernel[(s,)](g2, amax, flags, n * d, span, BLOCK=BLOCK, **BR_OPTIONS)
    top = ref_fixed.TOP_BIT - ref_fixed.headroom_bits(n)
    sp = pow2_at_least(s)
    acc = torch.zeros((rows, d), dtype=torch.int64, device=dev)
    # the per-entry flags, cleared and used only when a split met a non-finite element: read as one word on the
    # device (kinds are non-negative: the max is non-zero iff one is), no host wait to know
    nonfinite = torch.amax(flags)
    fl = torch.empty((rows, d), dtype=torch.int32, device=dev)
    parts, part_span = split_spans(rows * d, BLOCK, TARGET_PROGRAMS)
    _clear_kernel[(parts,)](nonfinite, fl, rows * d, part_span, BLOCK=BLOCK, **BR_OPTIONS)
    _scatter_kernel[(cdiv(n, TOKENS), cdiv(d, COLS))](g2, idx, amax, nonfinite, acc, fl, n, d, s, top, S_POW2=sp,
                                                      R=TOKENS, BD=COLS, **BR_OPTIONS)
    out = torch.empty((rows, d), dtype=F32, device=dev)
    _finish_kernel[(cdiv(rows * d, BLOCK),)](acc, fl, amax, nonfinite, out, rows * d, s, top, S_POW2=sp,
                                             BLOCK=BLOCK, **BR_OPTIONS)
    return out


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, weight):
        ctx.save_for_backward(ids)
        ctx.rows = weight.shape[0]
        return weight.index_select(0, ids.reshape(-1)).reshape(*ids.shape, weight.shape[1])

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (ids,) = ctx.saved_tensors
        dw = embedding_grad(ids, g, ctx.rows)
        return None, dw.to(g.dtype)  # bf16: float32 -> bf16, round to nearest even, as the reference


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """weight[ids] for integer ids [...] and weight [V, D] (float32 or bf16): the bits of ref.embedding."""
    expect("embedding", "ids", ids, dtype=(torch.int64, torch.int32))
    expect("embedding", "weight", weight, dtype=ref.WEIGHT_DTYPES, ndim=2)
    same_device("embedding", ids=ids, weight=weight)
    if not on_triton(ids, weight):
        return ref.embedding(ids, weight)
    if ids.numel():
        lo, hi = (int(v) for v in torch.aminmax(ids))  # one wait for the host, not one per bound
        if lo < 0 or hi >= weight.shape[0]:
            raise ValueError(f"embedding: argument 'ids' must lie in [0, {weight.shape[0]}), "
                             f"got values in [{lo}, {hi}]")
    return _Embedding.apply(ids, weight)


def __getattr__(name: str):
    return getattr(ref, name)
