"""Walsh-Hadamard transforms from fixed-order butterflies (only elementwise + and -).

H_n (n a power of two, Sylvester order) is symmetric with entries +-1, so H H^T = n I and a contraction
    G W = (G H)(H^T W) / n,
where 1/n is a power of two: multiplying by it is exact. The transform is unnormalized on purpose: every
output is a fixed tree of float32 additions of the inputs (exact for integer inputs below 2^24 / n),
so it has one set of bits on every device; scaling by 1/sqrt(n) would need a rounded constant.

Lengths that are not powers of two use the block-diagonal B = diag(H_b, ..., H_b): the dim is zero-padded
to a multiple of b (zeros add nothing, so padding is exact) and each block of b is transformed alone.
B B^T = b I as well, so the identity above holds with n replaced by b.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.ref.checks import expect

DEFAULT_BLOCK = 256
FLOATS = (torch.float32, torch.float64)


def is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def block_size(n: int, block: int = DEFAULT_BLOCK) -> int:
    """The Hadamard block used for a dim of length n: `block`, or next_pow2(n) when n is smaller."""
    if not is_pow2(block):
        raise ValueError(f"block_hadamard: argument 'block' must be a power of two, got {block}")
    return min(block, next_pow2(n))


def padded_length(n: int, block: int = DEFAULT_BLOCK) -> int:
    """Length of a dim of n after zero padding to a multiple of its Hadamard block."""
    b = block_size(n, block)
    return -(-n // b) * b


def _fwht_last(x: torch.Tensor) -> torch.Tensor:
    """Unnormalized WHT of the last dim (a power of two): stage h pairs element j with j + h, h = 1, 2, 4..."""
    n = x.shape[-1]
    lead = x.shape[:-1]
    if n == 1:
        return x.clone()  # H_1 = [1]; a copy, so the result never aliases the input
    h = 1
    while h < n:
        # bit-relevant: one fixed pairing and order per stage; each output is exactly (a + b) or (a - b)
        v = x.reshape(*lead, n // (2 * h), 2, h)
        a, b = v[..., 0, :], v[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2).reshape(*lead, n)
        h *= 2
    return x


def fwht(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x H_n along `dim` (length n a power of two), unnormalized: fwht(fwht(x)) == n * x up to rounding."""
    expect("fwht", "x", x, dtype=FLOATS)
    if x.dim() == 0:
        raise ValueError("fwht: argument 'x' must have at least one dim, got a 0-dim tensor")
    d = dim % x.dim()
    n = x.shape[d]
    if not is_pow2(n):
        raise ValueError(f"fwht: dim {dim} of argument 'x' must have a power-of-two length, got {n}")
    return _fwht_last(x.movedim(d, -1)).movedim(-1, d).contiguous()


def block_hadamard(x: torch.Tensor, dim: int = -1, block: int = DEFAULT_BLOCK) -> torch.Tensor:
    """x B along `dim`: zero-pad to padded_length(n, block), then an unnormalized WHT per block of b.

    The result keeps the padded length (a contraction needs both operands padded alike); B B^T = b I.
    """
    expect("block_hadamard", "x", x, dtype=FLOATS)
    if x.dim() == 0:
        raise ValueError("block_hadamard: argument 'x' must have at least one dim, got a 0-dim tensor")
    d = dim % x.dim()
    n = x.shape[d]
    b = block_size(n, block)
    t = x.movedim(d, -1)
    pad = padded_length(n, block) - n
    if pad:
        t = F.pad(t, (0, pad))  # zeros: exact, and they add nothing to any butterfly
    lead = t.shape[:-1]
    t = _fwht_last(t.reshape(*lead, -1, b)).reshape(*lead, -1)
    return t.movedim(-1, d).contiguous()


def inverse_block_scale(n: int, block: int = DEFAULT_BLOCK, dtype=torch.float32, device=None) -> torch.Tensor:
    """1/b for the block of a dim of length n, as a 0-dim tensor: a power of two, so multiplying is exact."""
    b = block_size(n, block)
    return torch.tensor(1.0 / b, dtype=dtype, device=device)  # exact: 1/b = 2^-log2(b)
