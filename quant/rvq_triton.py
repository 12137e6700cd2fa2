"""rvq256_256x8 on the GPU in Triton: decode an expert's weight from its codes, and y = x W^T with W decoded
tile by tile inside the GEMM (never written out whole).

Per weight, the same two float32 operations as quant.format.decode_parts, in the same order:
    v = c0[a][j] + c1[b][j]          exact (FP4 atoms add exactly)
    w = v * s                        s = e4m3(scale) * global, computed once per block on the host as the CPU does
so `decode` gives the CPU decoder's bits (tests/gpu/test_rvq_triton.py compares raw bits); `linear` then
multiplies with tl.dot in IEEE float32 (its summation order is the GPU's: equal to x @ W^T within float32
rounding, not bit for bit). Indices are read from the in-memory layout [N, K/8, 2] (quant.format), atoms
as float32 [2, 256, 8] and scales as float32 [N, K/128].
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton.launch import BR_OPTIONS
from quant.format import GROUP, SCALE_BLOCK
from quant.fp_formats import fp4_decode, from_float8_e4m3

F32 = torch.float32
ATOMS_PER_BOOK = 256 * GROUP


@triton.jit
def _weight_tile(idx_ptr, atoms_ptr, scale_ptr, rn, rk, N, K):
    """W[rn, rk] decoded: [BLOCK_N, BLOCK_K] float32 (rows past N read as 0)."""
    g = rk // 8
    j = rk % 8
    row_ok = (rn < N)[:, None]
    pair = rn[:, None] * ((K // 8) * 2) + g[None, :] * 2
    a = tl.load(idx_ptr + pair, mask=row_ok, other=0).to(tl.int32)
    b = tl.load(idx_ptr + pair + 1, mask=row_ok, other=0).to(tl.int32)
    v = tl.load(atoms_ptr + a * 8 + j[None, :]) + tl.load(atoms_ptr + 2048 + b * 8 + j[None, :])
    s = tl.load(scale_ptr + rn[:, None] * (K // 128) + (rk // 128)[None, :], mask=row_ok, other=0.0)
    return v * s


@triton.jit
def _decode_kernel(idx_ptr, atoms_ptr, scale_ptr, out_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    w = _weight_tile(idx_ptr, atoms_ptr, scale_ptr, rn, rk, N, K)
    tl.store(out_ptr + rn[:, None] * K + rk[None, :], w, mask=(rn < N)[:, None])


@triton.jit
def _linear_kernel(x_ptr, idx_ptr, atoms_ptr, scale_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=(rm < M)[:, None], other=0.0)
        w = _weight_tile(idx_ptr, atoms_ptr, scale_ptr, rn, rk, N, K)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc, mask=(rm < M)[:, None] & (rn < N)[None, :])


def operands(codebooks: torch.Tensor, indices: torch.Tensor, scales: torch.Tensor,
             global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One expert's codes (uint8 [2, 256, 8], uint8 [N, K/8, 2], e4m3 [N, K/128], float32 []) as the kernels
    read them: (indices, atoms float32 [2, 256, 8], block scales float32 [N, K/128])."""
    s = from_float8_e4m3(scales) * global_scale          # the CPU decoder's one rounding, on the same values
    return indices.contiguous(), fp4_decode(codebooks).contiguous(), s.contiguous()


def decode(codebooks, indices, scales, global_scale, block_n: int = 16, block_k: int = 128) -> torch.Tensor:
    """float32 W [N, K] of one expert, decoded by the Triton kernel."""
    idx, atoms, s = operands(codebooks, indices, scales, global_scale)
    n, k = idx.shape[0], idx.shape[1] * GROUP
    out = torch.empty(n, k, dtype=F32, device=idx.device)
    _decode_kernel[(triton.cdiv(n, block_n), k // block_k)](idx, atoms, s, out, n, k, BLOCK_N=block_n,
                                                            BLOCK_K=block_k, **BR_OPTIONS)
    return out


def linear(x: torch.Tensor, codebooks, indices, scales, global_scale, block_m: int = 16, block_n: int = 32,
           block_k: int = 64) -> torch.Tensor:
    """y [M, N] = x [M, K] @ W^T, W decoded tile by tile in the kernel (float32 in and out)."""
    idx, atoms, s = operands(codebooks, indices, scales, global_scale)
    n, k = idx.shape[0], idx.shape[1] * GROUP
    if x.shape[-1] != k or k % SCALE_BLOCK or k % block_k:
        raise ValueError(f"rvq linear: x has {x.shape[-1]} columns, the weight {k} (a multiple of {SCALE_BLOCK})")
    x = x.to(F32).contiguous()
    m = x.shape[0]
    y = torch.empty(m, n, dtype=F32, device=x.device)
    _linear_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n))](
        x, idx, atoms, s, y, m, n, k, x.stride(0), y.stride(0), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        **BR_OPTIONS)
    return y
