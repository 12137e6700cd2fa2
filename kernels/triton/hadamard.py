"""Triton twin of kernels/ref/hadamard.py: fwht and block_hadamard, the same butterflies in the same order.

Every output of the reference is a fixed tree of rounded float additions: stage h = 1, 2, 4, ... maps the
pair (j, j + h) of each group of 2h to (a + b, a - b). `butterfly` runs those stages on a register tile
[R, L]; a stage's a + b and a - b are single rounded IEEE ops, so any device that runs the same stages in
the same order gets the same bits. Lengths above MAX_L run as several passes: the first covers stages
h < MAX_L inside contiguous runs, the next the stages h = MAX_L, 2 MAX_L, ... on elements MAX_L apart.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ref import hadamard as ref
from kernels.triton.launch import BR_OPTIONS, cdiv, on_triton

MAX_L = 1024  # the longest butterfly held in registers
TILE = 4096   # elements per program (rows x L)


@triton.jit
def _stage(x, R: tl.constexpr, L: tl.constexpr, H: tl.constexpr):
    """One butterfly stage of half-width H on [R, L]: (a, b) -> (a + b, a - b) for a = x[j], b = x[j + H]."""
    v = tl.reshape(x, [R, L // (2 * H), 2, H])
    first = tl.arange(0, 2)[None, None, :, None] == 0
    plus = tl.sum(v, axis=2)                           # a + b: one rounded add (a 2-term sum has no other order)
    minus = tl.sum(tl.where(first, v, -v), axis=2)     # a + (-b) is IEEE's a - b, bit for bit
    out = tl.where(first, plus[:, :, None, :], minus[:, :, None, :])
    return tl.reshape(out, [R, L])


@triton.jit
def butterfly(x, R: tl.constexpr, L: tl.constexpr, LOG_L: tl.constexpr):
    """x H_L along axis 1 of [R, L] (unnormalized, Sylvester order), stages h = 1, 2, ..., L/2 in order."""
    for i in tl.static_range(LOG_L):
        x = _stage(x, R, L, 1 << i)
    return x


@triton.jit(do_not_specialize=["rows", "n_in", "n_out", "C", "Q"])
def _pass_kernel(x_ptr, y_ptr, rows, n_in, n_out, C, Q,
                 L: tl.constexpr, LOG_L: tl.constexpr, R: tl.constexpr):
    """Butterflies of length L along N of a [A, N, C] tensor, on elements Q apart: n = o L Q + l Q + q.

    Input positions n >= n_in read as +0.0 (the reference's F.pad zeros); the output has n_out positions.
    """
    r = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    c = r % C
    t = r // C
    q = t % Q
    t = t // Q
    o_count = n_out // (L * Q)
    o = t % o_count
    a = t // o_count
    l = tl.arange(0, L)
    n = (o * L * Q + q)[:, None] + l[None, :].to(tl.int64) * Q
    live = (r < rows)[:, None]
    x = tl.load(x_ptr + (a[:, None] * n_in + n) * C + c[:, None], mask=live & (n < n_in), other=0.0)
    y = butterfly(x, R, L, LOG_L)
    tl.debug_barrier()  # later passes run in place: the whole tile is read before any of it is written
    tl.store(y_ptr + (a[:, None] * n_out + n) * C + c[:, None], y, mask=live)


def _transform(x: torch.Tensor, d: int, b: int) -> torch.Tensor:
    """Blocks of b (a power of two) along dim d, zero-padded to a multiple of b, each transformed by H_b."""
    x = x.contiguous()
    n = x.shape[d]
    n_out = cdiv(n, b) * b
    a = 1
    for s in x.shape[:d]:
        a *= s
    c = x.numel() // (a * n) if a * n else 0
    shape = list(x.shape)
    shape[d] = n_out
    y = torch.empty(shape, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    if b == 1:
        return y.copy_(x)  # H_1 = [1]
    src, n_in, q = x, n, 1
    while q < b:  # passes: stages [q, q L) of the block's butterfly, in order
        length = min(MAX_L, b // q)
        r = max(1, TILE // length)
        rows = a * (n_out // length) * c
        _pass_kernel[(cdiv(rows, r),)](src, y, rows, n_in, n_out, c, q, L=length, LOG_L=length.bit_length() - 1,
                                       R=r, num_warps=8, **BR_OPTIONS)
        src, n_in, q = y, n_out, q * length  # later passes in place: programs own disjoint tiles
    return y


def _usable(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in ref.FLOATS and x.dim() >= 1 and on_triton(x)


def fwht(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x H_n along `dim` (n a power of two), unnormalized: the bits of kernels.ref.hadamard.fwht."""
    if not _usable(x) or not isinstance(dim, int) or not ref.is_pow2(x.shape[dim % x.dim()]):
        return ref.fwht(x, dim)
    d = dim % x.dim()
    return _transform(x, d, x.shape[d])


def block_hadamard(x: torch.Tensor, dim: int = -1, block: int = ref.DEFAULT_BLOCK) -> torch.Tensor:
    """x B along `dim` (zero-padded to whole blocks): the bits of kernels.ref.hadamard.block_hadamard."""
    if not _usable(x) or not isinstance(dim, int) or not isinstance(block, int) or not ref.is_pow2(block):
        return ref.block_hadamard(x, dim, block)
    d = dim % x.dim()
    return _transform(x, d, ref.block_size(x.shape[d], block))


def __getattr__(name: str):
    """is_pow2, next_pow2, block_size, padded_length, inverse_block_scale are the reference's."""
    return getattr(ref, name)
