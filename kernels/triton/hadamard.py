"""Triton twin of kernels/ref/hadamard.py: fwht and block_hadamard, the same butterflies in the same order.

Every output of the reference is a fixed tree of rounded float additions: stage h = 1, 2, 4, ... maps the
pair (j, j + h) of each group of 2h to (a + b, a - b). `butterfly_parts` runs those stages across a tuple
of register tensors; a stage's a + b and a - b are single rounded IEEE ops, so any device that runs the same
stages in the same order gets the same bits. Lengths above MAX_L run as several passes: the first covers stages
h < MAX_L inside contiguous runs, the next the stages h = MAX_L, 2 MAX_L, ... on elements MAX_L apart.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ref import hadamard as ref
from kernels.triton.launch import BR_OPTIONS, cdiv, on_triton

MAX_L = 1024  # the longest butterfly held in registers
PASS_TILE = 2048  # elements per program (rows x L) of a standalone pass (fastest on the H200: docs/perf.md)


@triton.jit
def butterfly_parts(parts, P: tl.constexpr, LOG_P: tl.constexpr):
    """H_P across a tuple of P same-shape tensors, part j holding index j of every length-P group: stages
    h = 1, 2, ..., P/2 in order, each pair (a, b) -> (a + b, a - b), elementwise between registers.

    A stage on one register tile needs its pairs in one thread, which a reshape only gets through shared
    memory (a layout change per stage: such butterflies ran ~30x behind their bytes, docs/perf.md); parts
    never move between threads."""
    for s in tl.static_range(LOG_P):
        out = ()
        for j in tl.static_range(P):
            if (j >> s) & 1 == 0:
                out = out + (parts[j] + parts[j + (1 << s)],)  # a + b: one rounded add
            else:
                out = out + (parts[j - (1 << s)] - parts[j],)  # a - b: one rounded subtract
        parts = out
    return parts


@triton.jit
def deal(x, R: tl.constexpr, S: tl.constexpr, P: tl.constexpr, LOG_P: tl.constexpr):
    """The P parts of x [R, S, P] along its last dim (part i = x[:, :, i], [R, S]), by log2 P rounds of tl.split:
    a round splits each part's elements into the even and the odd ones, and the parts stay in index order."""
    parts = (x,)
    for lvl in tl.static_range(LOG_P):
        evens = ()
        odds = ()
        for k in tl.static_range(1 << lvl):
            if (P >> lvl) == 2:
                a, b = tl.split(parts[k])
            else:
                a, b = tl.split(tl.reshape(parts[k], [R, S, (P >> lvl) // 2, 2]))
            evens = evens + (a,)
            odds = odds + (b,)
        parts = evens + odds  # part k + 2^lvl holds the odd elements of part k: index k + 2^lvl
    if LOG_P == 0:
        parts = (tl.reshape(x, [R, S]),)
    return parts


@triton.jit
def gather(parts, R: tl.constexpr, S: tl.constexpr, P: tl.constexpr, LOG_P: tl.constexpr):
    """deal's inverse: P parts [R, S] back into one [R, S, P] tile, part i at x[:, :, i]."""
    if LOG_P == 0:
        x = tl.reshape(parts[0], [R, S, 1])
    else:
        for lvl in tl.static_range(LOG_P - 1, -1, -1):
            out = ()
            for k in tl.static_range(1 << lvl):
                j = tl.join(parts[k], parts[k + (1 << lvl)])
                if (P >> lvl) == 2:
                    out = out + (j,)
                else:
                    out = out + (tl.reshape(j, [R, S, P >> lvl]),)
            parts = out
        x = parts[0]
    return x


def split_length(length: int) -> tuple[int, int]:
    """(P, S) with P * S = length (a power of two), P >= S: a butterfly's stages h < P run across P parts of
    S elements (index j P + i in part i), the stages h >= P across S parts of P (index j P + i in part j)."""
    log = length.bit_length() - 1
    p = 1 << ((log + 1) // 2)
    return p, length // p


@triton.jit(do_not_specialize=["rows", "n_in", "n_out", "C", "Q"])
def _pass_kernel(x_ptr, y_ptr, rows, n_in, n_out, C, Q, P: tl.constexpr, LOG_P: tl.constexpr, S: tl.constexpr,
                 LOG_S: tl.constexpr, R: tl.constexpr):
    """Butterflies of length L = P S along N of a [A, N, C] tensor, on elements Q apart: n = o L Q + l Q + q.

    Input positions n >= n_in read as +0.0 (the reference's F.pad zeros); the output has n_out positions.
    The tile is dealt into P parts for the stages h < P, then read back from y as S parts for the rest.
    """
    r = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    c = r % C
    t = r // C
    q = t % Q
    t = t // Q
    o_count = n_out // (P * S * Q)
    o = t % o_count
    a = t // o_count
    first = (o * P * S * Q + q)[:, None]
    live = (r < rows)[:, None]
    n = first + tl.arange(0, P * S)[None, :].to(tl.int64) * Q
    x = tl.load(x_ptr + (a[:, None] * n_in + n) * C + c[:, None], mask=live & (n < n_in), other=0.0)
    parts = butterfly_parts(deal(tl.reshape(x, [R, S, P]), R, S, P, LOG_P), P, LOG_P)
    tl.debug_barrier()  # later passes run in place: the whole tile is read before any of it is written
    tl.store(y_ptr + (a[:, None] * n_out + n) * C + c[:, None], tl.reshape(gather(parts, R, S, P, LOG_P), [R, P * S]),
             mask=live)
    tl.debug_barrier()  # the tile is read back laid over other threads than those that stored it
    i = tl.arange(0, P)
    parts = ()
    for j in tl.static_range(S):
        n = first + (j * P + i)[None, :].to(tl.int64) * Q
        parts = parts + (tl.load(y_ptr + (a[:, None] * n_out + n) * C + c[:, None], mask=live),)
    parts = butterfly_parts(parts, S, LOG_S)
    tl.debug_barrier()  # in place: a part held by several threads is read by all of them before any writes it
    for j in tl.static_range(S):
        n = first + (j * P + i)[None, :].to(tl.int64) * Q
        tl.store(y_ptr + (a[:, None] * n_out + n) * C + c[:, None], parts[j], mask=live)


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
        r = max(1, PASS_TILE // length)
        rows = a * (n_out // length) * c
        p, s = split_length(length)
        _pass_kernel[(cdiv(rows, r),)](src, y, rows, n_in, n_out, c, q, P=p, LOG_P=p.bit_length() - 1, S=s,
                                       LOG_S=s.bit_length() - 1, R=r, num_warps=8, **BR_OPTIONS)
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
