"""Triton twin of kernels/ref/rotated_mm.py: int8 GEMM with a block Walsh-Hadamard rotation along C.

One kernel per operand rotates and quantizes in two passes over its rows (the row's int8 step needs the
largest rotated magnitude first): the first zeroes non-finite values, runs the reference's butterflies
(kernels/triton/hadamard.butterfly_parts, through a float32 scratch between the low and the high stages),
takes |max| and leaves the rotated rows in the scratch; the second reads them back and divides by the step
(div_rn, as the reference's tensor division), rounds half to even and clamps. Both codes land K-contiguous
and zero-padded to a multiple of 16 (zeros add nothing), and the shared int8 GEMM (kernels/triton/intmm.gemm)
dequantizes in the reference's order ((float32(acc) * step_a[r]) * step_b[s]) * (1/b).

For blocks of 256 with C or the rows contiguous, rotate_quantize launches CUDA kernels instead
(kernels/cuda/rotate.py): the same bits, with the butterflies' layout changes done by warp shuffles, which
Triton 3.6 lacks; the scratch row is what this kernel's time goes to.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.cuda import rotate as cuda_rotate
from kernels.ref import hadamard as ref_had, rotated_mm as ref
from kernels.triton.hadamard import MAX_L, butterfly_parts, deal, gather, split_length
from kernels.triton.ieee import div_rn, isfinite, nan_f64, rint
from kernels.triton.intmm import gemm
from kernels.triton.launch import BR_OPTIONS, cdiv, on_triton

F32 = torch.float32
QMAX = tl.constexpr(127.0)
PLAIN_L = 128  # tile width along C when nothing is rotated
TILE = 4096  # elements per program (rows x L) of rotate_quantize (fastest on the H200: docs/perf.md)


@triton.jit
def code8(v):
    """ref.to_int8 of float32 v, as float32: round half to even, clamp to [-127, 127], NaN -> 0."""
    r = rint(v.to(tl.float64))  # exact widening; the rounded value is an integer, exact in float32
    r = tl.minimum(tl.maximum(r, -QMAX), QMAX)
    return tl.where(v != v, 0.0, r).to(tl.float32)  # NaN tested on v: Triton's max/min may drop a NaN


@triton.jit
def _operand_values(src_ptr, r, live, c, C, s_row, s_col, pre_ptr, pre_stride, PRE: tl.constexpr):
    """The operand at rows r and C indices c, [R, n]: (values, non-finite as +0.0; 1 where non-finite)."""
    m = live[:, None] & (c < C)[None, :]
    v = tl.load(src_ptr + r[:, None] * s_row + c[None, :].to(tl.int64) * s_col, mask=m, other=0.0).to(tl.float32)
    if PRE:
        # the reference's dequantized operand q * s (w_hat per C index, x_hat with one step): rebuilt, not read
        sc = tl.load(pre_ptr + c * pre_stride, mask=c < C, other=1.0)[None, :]
        sc = tl.broadcast_to(sc, v.shape)
        v = code8(div_rn(v, sc)) * sc
    return tl.where(isfinite(v), v, 0.0), tl.where(isfinite(v), 0, 1)  # finite_or_zero: +0.0, as torch.zeros_like


@triton.jit
def _rotate_block(src_ptr, r, live, c0, C, Kp, s_row, s_col, pre_ptr, pre_stride, tmp_ptr, PRE: tl.constexpr,
                  P: tl.constexpr, LOG_P: tl.constexpr, S: tl.constexpr, LOG_S: tl.constexpr, R: tl.constexpr):
    """Hadamard block [c0, c0 + P S) of rows r, rotated into tmp [rows, Kp]: (largest |rotated| per row, flags,
    1 where a rotated value is NaN: finite inputs can overflow to inf in a stage and give inf - inf next).

    Index c0 + j P + i: the block is loaded as one tile and dealt into P parts (i) in registers for the stages
    h < P; the stages h >= P run across S parts (j) read back from tmp: butterfly's stages, in its order.
    (Loading each part on its own, strided, measured 2-3x slower on the H200: docs/perf.md.)"""
    rows = tmp_ptr + r[:, None] * Kp
    c = c0 + tl.arange(0, P * S)
    v, f = _operand_values(src_ptr, r, live, c, C, s_row, s_col, pre_ptr, pre_stride, PRE)
    parts = butterfly_parts(deal(tl.reshape(v, [R, S, P]), R, S, P, LOG_P), P, LOG_P)
    tl.store(rows + c[None, :], tl.reshape(gather(parts, R, S, P, LOG_P), [R, P * S]),
             mask=live[:, None] & (c < Kp)[None, :])
    tl.debug_barrier()  # the block is read back laid over other threads than those that stored it
    i = tl.arange(0, P)
    parts = ()
    for j in tl.static_range(S):
        c = c0 + j * P + i
        parts = parts + (tl.load(rows + c[None, :], mask=live[:, None] & (c < Kp)[None, :], other=0.0),)
    parts = butterfly_parts(parts, S, LOG_S)
    tl.debug_barrier()  # in place: a part held by several threads is read by all of them before any writes it
    big = tl.zeros([R, P], tl.float32)
    nan = tl.zeros([R, P], tl.int32)
    for j in tl.static_range(S):
        c = c0 + j * P + i
        big = tl.maximum(big, tl.abs(parts[j]))
        nan = nan | (parts[j] != parts[j]).to(tl.int32)  # max on the GPU drops a NaN (maxNum); torch.amax keeps it
        tl.store(rows + c[None, :], parts[j], mask=live[:, None] & (c < Kp)[None, :])
    return tl.max(big, axis=1), tl.max(f, axis=1), tl.max(nan, axis=1)


@triton.jit(do_not_specialize=["rows", "C"])
def _rotate_quantize_kernel(src_ptr, s_row, s_col, rows, C, Kp, pre_ptr, pre_stride, q_ptr, step_ptr, bad_ptr, tmp_ptr,
                            PRE: tl.constexpr, ROTATE: tl.constexpr, P: tl.constexpr, LOG_P: tl.constexpr,
                            S: tl.constexpr, LOG_S: tl.constexpr, L: tl.constexpr, R: tl.constexpr):
    """Rows of an operand (elements along C at src + r s_row + c s_col) -> int8 codes [rows, Kp], step, bad.

    ROTATE: blocks of P S are rotated into tmp [rows, Kp] (float32, contiguous) and the codes are cut from it;
    else the codes are cut from the operand, read again (one load away)."""
    r = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    live = r < rows
    amax = tl.zeros([R], tl.float32)
    bad = tl.zeros([R], tl.int32)
    if ROTATE:
        nan = tl.zeros([R], tl.int32)
        for c0 in range(0, Kp, P * S):
            m, b, n = _rotate_block(src_ptr, r, live, c0, C, Kp, s_row, s_col, pre_ptr, pre_stride, tmp_ptr, PRE,
                                    P, LOG_P, S, LOG_S, R)
            amax = tl.maximum(amax, m)
            bad = bad | b
            nan = nan | n
        # the reference's amax of a row holding a NaN is NaN, so its step is 1 (symmetric_step)
        amax = tl.where(nan != 0, nan_f64().to(tl.float32), amax)
        tl.debug_barrier()  # the codes' loads below may lay the rows over other threads than the stores did
    else:
        for c0 in range(0, Kp, L):
            v, f = _operand_values(src_ptr, r, live, c0 + tl.arange(0, L), C, s_row, s_col, pre_ptr, pre_stride, PRE)
            amax = tl.maximum(amax, tl.max(tl.abs(v), axis=1))
            bad = bad | tl.max(f, axis=1)
    step = div_rn(amax, tl.full([R], 127.0, tl.float32))  # amax / 127: a tensor division, correctly rounded
    step = tl.where(step > 0, step, 1.0)
    for c0 in range(0, Kp, L):
        c = c0 + tl.arange(0, L)
        if ROTATE:
            v = tl.load(tmp_ptr + r[:, None] * Kp + c[None, :], mask=live[:, None] & (c < Kp)[None, :], other=0.0)
        else:
            v, b = _operand_values(src_ptr, r, live, c, C, s_row, s_col, pre_ptr, pre_stride, PRE)
        q = code8(div_rn(v, tl.broadcast_to(step[:, None], v.shape)))
        tl.store(q_ptr + r[:, None] * Kp + c[None, :], q.to(tl.int8), mask=live[:, None] & (c < Kp)[None, :])
    tl.store(step_ptr + r, step, mask=live)
    tl.store(bad_ptr + r, bad, mask=live)


def padded16(n: int) -> int:
    return cdiv(n, 16) * 16


def rotate_quantize(src: torch.Tensor, rows: int, c: int, s_row: int, s_col: int, *, block: int | None,
                    pre: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes [rows, Kp] int8, step [rows] float32, bad [rows] int32) of an operand's rows along C.

    block: the Hadamard block (None: no rotation). pre: a step per C index ([C]) or one step (0-dim):
    the operand is then the dequantized code of src / pre, rebuilt in the kernel.
    """
    cp = ref_had.padded_length(c, block) if block else c
    kp = padded16(cp)
    dev = src.device
    q = torch.empty((rows, kp), dtype=torch.int8, device=dev)
    step = torch.empty(rows, dtype=F32, device=dev)
    bad = torch.empty(rows, dtype=torch.int32, device=dev)
    if rows == 0 or cuda_rotate.launch(src, rows, c, s_row, s_col, block, pre, q, step, bad):
        return q, step, bad  # (the CUDA kernels: warp-shuffle butterflies, the same bits; kernels/cuda/rotate.py)
    length = block if block else PLAIN_L
    p, sn = split_length(length)
    r = max(1, TILE // length)
    tmp = torch.empty((rows, kp) if block else (1,), dtype=F32, device=dev)
    _rotate_quantize_kernel[(cdiv(rows, r),)](
        src, s_row, s_col, rows, c, kp, pre if pre is not None else step,
        (0 if pre.dim() == 0 else pre.stride(0)) if pre is not None else 0, q, step, bad, tmp,
        PRE=pre is not None, ROTATE=block is not None, P=p, LOG_P=p.bit_length() - 1, S=sn, LOG_S=sn.bit_length() - 1,
        L=length, R=r, num_warps=8, **BR_OPTIONS)
    return q, step, bad


def rotated_product(a: torch.Tensor, a_strides: tuple[int, int], b: torch.Tensor, b_strides: tuple[int, int],
                    rows: int, cols: int, c: int, *, rotate: bool, block: int, b_pre: torch.Tensor | None = None,
                    mask_src=None, mask_scale=None) -> torch.Tensor:
    """float32 [rows, cols]: the rotated int8 product of operand a (rows along C) and operand b (cols along C),
    each given as (tensor, (stride per row/col, stride along C)); optional straight-through mask epilogue."""
    hb = ref_had.block_size(c, block) if rotate else None
    qa, sa, bada = rotate_quantize(a, rows, c, a_strides[0], a_strides[1], block=hb)
    qb, sb, badb = rotate_quantize(b, cols, c, b_strides[0], b_strides[1], block=hb, pre=b_pre)
    return gemm(qa, qb, out_dtype=F32, row_scale=sa, col_scale=sb, inv=1.0 / hb if rotate else None,
                bad_rows=bada, bad_cols=badb, mask_src=mask_src, mask_scale=mask_scale)


def supported(c: int, rotate: bool, block: int) -> bool:
    """The kernels hold a Hadamard block in registers: blocks up to MAX_L (else the reference runs)."""
    return not rotate or ref_had.block_size(c, block) <= MAX_L


def rotated_int8_mm(a: torch.Tensor, b: torch.Tensor, *, rotate: bool = True,
                    block: int = ref_had.DEFAULT_BLOCK) -> torch.Tensor:
    """a [R, C] float32 times b [C, S] float32 -> float32 [R, S]: the bits of ref.rotated_int8_mm."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 2
            and a.shape[1] == b.shape[0] and a.dtype == F32 and b.dtype == F32 and on_triton(a, b)
            and isinstance(block, int) and ref_had.is_pow2(block) and supported(a.shape[1], rotate, block)):
        return ref.rotated_int8_mm(a, b, rotate=rotate, block=block)
    c = a.shape[1]
    cp = ref_had.padded_length(c, block) if rotate else c
    if cp > ref.MAX_CONTRACTION:
        raise ValueError(f"rotated_int8_mm: contraction length {cp} exceeds {ref.MAX_CONTRACTION} (int32 overflow)")
    return rotated_product(a, (a.stride(0), a.stride(1)), b, (b.stride(1), b.stride(0)), a.shape[0], b.shape[1], c,
                           rotate=rotate, block=block)


def __getattr__(name: str):
    """symmetric_step, to_int8, quantize_symmetric, QMAX, MAX_CONTRACTION are the reference's."""
    return getattr(ref, name)
