"""Counter-based Philox4x32-10 in integer ops: a draw is a function of (seed, stream, index) only.

uint32 words live in int64 tensors; the 32x32 -> 64-bit products are split into 16-bit halves so no
intermediate leaves int64. Element i of a draw uses counter block (i // lanes, i_hi, stream, round),
so slicing, sharding or the device never changes which numbers an element gets.
"""
from __future__ import annotations

import torch

from kernels.ref.chunks import spans
from kernels.ref.elementary import log64, sincos64, sqrt64_of_f32
from kernels.ref.fixed import pow2

MASK32 = 0xFFFFFFFF
M0, M1 = 0xD2511F53, 0xCD9E8D57  # Philox multipliers (Salmon et al., Random123)
W0, W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments
ROUNDS = 10
TWO_PI = 6.28318530717958647692


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit words of a * m for uint32 a (in int64) and a 32-bit constant m."""
    p_lo = (a & 0xFFFF) * m          # < 2^48
    p_hi = (a >> 16) * m             # < 2^48
    q = p_hi + (p_lo >> 16)          # a*m = q*2^16 + (p_lo & 0xFFFF), q < 2^49
    return q >> 16, ((q & 0xFFFF) << 16) | (p_lo & 0xFFFF)


def philox4x32(counter: torch.Tensor, key: tuple[int, int], rounds: int = ROUNDS) -> torch.Tensor:
    """Philox4x32-R of counters [..., 4] (uint32 values in int64) under a 2-word key -> [..., 4]."""
    c0, c1, c2, c3 = (counter[..., i] for i in range(4))
    k0, k1 = key[0] & MASK32, key[1] & MASK32
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
        hi0, lo0 = _mulhilo(c0, M0)
        hi1, lo1 = _mulhilo(c2, M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack([c0, c1, c2, c3], dim=-1)


def _key(seed: int) -> tuple[int, int]:
    if not 0 <= seed < 2**64:
        raise ValueError(f"philox: argument 'seed' must be in [0, 2^64), got {seed}")
    return seed & MASK32, seed >> 32


def _stream(stream: int) -> int:
    if not 0 <= stream <= MASK32:
        raise ValueError(f"philox: argument 'stream' must be a uint32, got {stream}")
    return stream


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _blocks(seed: int, stream: int, first_block: int, nblocks: int, rnd: int, device) -> torch.Tensor:
    """Philox output words [nblocks, 4] for blocks first_block.. under (seed, stream, round)."""
    idx = torch.arange(first_block, first_block + nblocks, dtype=torch.int64, device=device)
    ctr = torch.stack([idx & MASK32, idx >> 32, torch.full_like(idx, _stream(stream)),
                       torch.full_like(idx, rnd)], dim=-1)
    return philox4x32(ctr, _key(seed))


def random_bits(seed: int, stream: int, n: int, offset: int = 0, device=None) -> torch.Tensor:
    """n uint32 words (int64 tensor) for element indices offset..offset+n-1: lane i % 4 of block i // 4."""
    if n == 0:
        return torch.zeros(0, dtype=torch.int64, device=device)
    first, last = offset // 4, (offset + n - 1) // 4
    words = _blocks(seed, stream, first, last - first + 1, 0, device).reshape(-1)
    return words[offset - 4 * first: offset - 4 * first + n]


def uniform(seed: int, stream: int, shape, offset: int = 0, device=None) -> torch.Tensor:
    """float32 uniforms in [0, 1): the top 24 bits of each word times 2^-24 (exact)."""
    u = random_bits(seed, stream, _numel(shape), offset, device)
    return ((u >> 8).to(torch.float64) * pow2(torch.tensor(-24))).to(torch.float32).reshape(shape)


def _box_muller(words: torch.Tensor) -> torch.Tensor:
    """float64 standard normals from word pairs [..., 2]: sqrt(-2 log u1) cos(2 pi u2), u1 in (0, 1]."""
    two32 = pow2(torch.tensor(-32, device=words.device))
    u1 = (words[..., 0] + 1).to(torch.float64) * two32
    u2 = words[..., 1].to(torch.float64) * two32
    r2 = -2.0 * log64(u1)
    # float64 sqrt by one Newton step from the correctly rounded float32 sqrt (no libm, no torch.sqrt64)
    y0 = sqrt64_of_f32(r2.to(torch.float32))
    y = torch.where(r2 > 0, 0.5 * (y0 + r2 / torch.where(y0 > 0, y0, torch.ones_like(y0))), torch.zeros_like(r2))
    return y * sincos64(TWO_PI * u2)[1]


def _normal64(seed: int, stream: int, n: int, offset: int, rnd: int, device) -> torch.Tensor:
    """n float64 standard normals for indices offset..: element i uses words (2(i%2), 2(i%2)+1) of block i // 2."""
    if n == 0:
        return torch.zeros(0, dtype=torch.float64, device=device)
    first, last = offset // 2, (offset + n - 1) // 2
    words = _blocks(seed, stream, first, last - first + 1, rnd, device).reshape(-1, 2)
    return _box_muller(words)[offset - 2 * first: offset - 2 * first + n]


def normal(seed: int, stream: int, shape, offset: int = 0, std: float = 1.0, device=None) -> torch.Tensor:
    """float32 normals N(0, std^2) (Box-Muller in float64, one rounding)."""
    z = _normal64(seed, stream, _numel(shape), offset, 0, device)
    return (z * std).to(torch.float32).reshape(shape)


def trunc_normal(seed: int, stream: int, shape, offset: int = 0, std: float = 0.02, bound: float = 2.0,
                 device=None, max_rounds: int = 64) -> torch.Tensor:
    """float32 N(0, std^2) truncated at +-bound*std by rejection: round r of element i uses counter word 3 = r.

    An element's value depends on its own index alone (rounds are per element), never on the tensor's size.
    """
    parts = [_trunc_normal(seed, stream, b - a, offset + a, std, bound, device, max_rounds)
             for a, b in spans(_numel(shape), device)]  # elementwise: the cut changes no bit
    return (torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float32, device=device)).reshape(shape)


def _trunc_normal(seed: int, stream: int, n: int, offset: int, std: float, bound: float, device,
                  max_rounds: int) -> torch.Tensor:
    """trunc_normal's n elements from index `offset`, flat."""
    z = _normal64(seed, stream, n, offset, 0, device)
    idx = torch.arange(n, dtype=torch.int64, device=device)
    for rnd in range(1, max_rounds):
        bad = z.abs() > bound
        if not bool(bad.any()):
            break
        redo = idx[bad]
        # redraw only rejected elements, each from its own counter in this round
        z = z.index_put((redo,), _redraw(seed, stream, offset, redo, rnd, device))
    else:
        raise RuntimeError(f"trunc_normal: rejection did not finish in {max_rounds} rounds")
    return (z * std).to(torch.float32)


def _redraw(seed: int, stream: int, offset: int, redo: torch.Tensor, rnd: int, device) -> torch.Tensor:
    """Normals of round `rnd` for the element indices in `redo` (vectorized gather from their blocks)."""
    gi = redo + offset
    blocks = gi >> 1
    ctr = torch.stack([blocks & MASK32, blocks >> 32, torch.full_like(blocks, _stream(stream)),
                       torch.full_like(blocks, rnd)], dim=-1)
    words = philox4x32(ctr, _key(seed)).reshape(-1, 2, 2)
    lane = (gi & 1)
    pair = torch.where(lane.unsqueeze(-1) == 0, words[:, 0, :], words[:, 1, :])
    return _box_muller(pair)
