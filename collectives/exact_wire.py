"""The compact wire of the exact sum: ExactSum's float32 bits for about 7 bytes an element instead of 32.

Each rank holds per element the integer L_r of its exact partial sum, three int64 limbs (collectives/limbs.py),
and a float64 non-finite stand-in `bad` (0 unless inf/NaN). The limb wire all-reduces all four words; this one
runs up to four all-reduces, each exact in any order (integer sums, a max); CollectiveGroup runs them on its
recursive-doubling schedule (collectives/allreduce.py), over gloo or NCCL point to point:

1. MAX of one byte a block of `block` elements: E with |L_r| < 2^E for every element and rank of the block
   (E < 144), or 255 where the rank's `bad` is non-zero there; the flagged blocks' E (rare) follow in one more
   byte MAX (`agree_tops`).
2. SUM of one word an element: with K = bit_length(R) and s = max(0, E + K - min(53, 54 - K)) for its block,
   each rank sends (floor(L_r / 2^s) << K) + [L_r mod 2^s != 0]. |floor(L_r / 2^s)| <= 2^(E-s), so any partial
   sum of R words stays below 2^(E-s+2K) + 2^K <= 2^54 + 2^K < 2^55: no overflow in any order, and every
   partial sum fits 56-bit two's complement, so a word travels as the low 7 bytes of its int64. The total is
   (H << K) + F, H the sum of the floors (|H| < 2^(E-s+K) <= 2^53), 0 <= F <= R < 2^K the ranks with low bits
   (H = total >> K, F = total & (2^K - 1)). The exact sum L lies in [lo, hi] = [H 2^s, H 2^s + F (2^s - 1)];
   where F = 0, L = lo, a float64 (|H| <= 2^53), whose chain result is lo itself (collectives/limbs.py).
3. Where F > 0 and the results at both ends, widened (`_settled`), round to different float32 bits: SUM of
   every rank's L_r mod 2^s as three 40-bit limbs, and then L itself. These elements follow from the summed
   words by the same ops, so every rank picks the same ones. On gradients they are rare: an element has
   F > 0 only where a rank's sum has bits more than 54 - 2K below its block's top bit, and then the interval
   is still far narrower than a float32 ulp of the result, except near zero or near a rounding boundary.
4. SUM of the flagged blocks' `bad` values (float64, as the limb wire sends them; rare).

Each element then gets the limb format's result (collectives/limbs.py: float64 chain, times `scale`, one
float32 rounding) of the exact sum, or of lo where every integer of [lo, hi] has that result's bits.
Int64 shifts and adds wrap modulo 2^64 (torch's two's complement); where a term below wraps, the sum it
enters fits, so the wrap cancels.

The passes over every element here are eager torch, the reference; `fused_passes` picks their fused twins
(collectives/wire_cpu.py on a CPU, collectives/wire_triton.py on CUDA), which give the same bits.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from .limbs import DIGIT, F32, F64, GRID, combine, normalize, normalize_, scaled, to_float32

I32, I64, U8 = torch.int32, torch.int64, torch.uint8
FLAGGED = 255  # phase 1's byte for a block with a non-finite stand-in (a block's E is below 144)
WORD = 54  # bit-relevant: every partial sum of words stays below 2^54 + 2^K < 2^55 in magnitude,
WIRE_BYTES = 7  # so a word travels as its low 7 bytes (56-bit two's complement)
MANT = 53  # bit-relevant: |H| <= 2^53, so lo = H 2^s is a float64
FITS = 3 * DIGIT - 17  # |L| < 2^103: floor(L / 2^40) fits an int64 (the encode's two-shift path)
MARGIN = float.fromhex("0x1p-40")  # bit-relevant: the settle test's outward widening (the chain's error < 2^-49.9)
MAX_WORLD = 1 << 16  # keeps s - 80 < 40: a rank's low part fits three 40-bit limbs
LOW40 = (1 << DIGIT) - 1


class SumGroup(Protocol):
    """What the wire needs of a group: its size and in-place all-reduces (integer SUM, MAX; float64 SUM), e.g.
    CollectiveGroup's (the recursive-doubling schedule)."""

    world: int

    def all_reduce_sum_(self, t: torch.Tensor, width: int | None = None) -> object: ...

    def all_reduce_max_(self, t: torch.Tensor) -> object: ...


@dataclass
class WireStats:
    """What one call did: elements, blocks, those that needed the interval test, those resent, flagged blocks."""

    elements: int = 0
    blocks: int = 0
    interval: int = 0
    unsettled: int = 0
    flagged_blocks: int = 0


@dataclass
class _Piece:
    limbs: torch.Tensor  # (3, n) int64; phase 1 carry-normalizes it in place (the same integers)
    bad: torch.Tensor | None  # (n,) float64; None: all +0.0
    at: int  # its first word in the flat word buffer
    first: int  # its first block
    n: int
    nb: int

    @property
    def blocks(self) -> slice:
        return slice(self.first, self.first + self.nb)


def compact_exact_sum(parts: Sequence[tuple[torch.Tensor, torch.Tensor | None]], group: SumGroup, scale: float,
                      block: int = 1024, chunk: int | None = None,
                      fused: bool = True) -> tuple[list[torch.Tensor], WireStats]:
    """Per part (limbs (3, n) int64, bad (n,) float64 or None) of this rank, the float32 result that the sum over
    the group's ranks gives (`limbs.to_float32(limbs.scaled(value, scale), bad)`), in one flat exchange for all
    parts (same order and sizes on every rank). Carry-normalizes the limbs in place. `block` is a free choice
    (the bits never depend on it); `chunk`: elements per eager pass (default: 2^16 on a CPU, whose caches it fits,
    else 2^24). `fused`: the hot passes as one loop each where they can run (`fused_passes`), else eager torch."""
    dev = parts[0][0].device if parts else torch.device("cpu")
    chunk = chunk or (1 << 16 if dev.type == "cpu" else 1 << 24)
    pieces = _layout(parts, block, group.world, scale, chunk)
    stats = WireStats(sum(p.n for p in pieces), sum(p.nb for p in pieces))
    outs = [torch.empty(p.n, dtype=F32, device=dev) for p in pieces]
    if stats.elements == 0:
        return outs, stats
    k = group.world.bit_length()
    fast = fused_passes(pieces) if fused else None
    info = torch.zeros((2, stats.blocks), dtype=I32, device=dev)
    for p in pieces:
        scan_part(p, info[:, p.blocks], block, chunk, fast)
    top, flagged = agree_tops(info, [group])
    s = (top + (k - min(MANT, WORD - k))).clamp_(min=0)
    words = torch.empty(stats.elements, dtype=I64, device=dev)
    for p in pieces:
        encode_part(p, s[p.blocks], k, words[p.at:p.at + p.n], block, chunk, fast)
    group.all_reduce_sum_(words, width=WIRE_BYTES)
    late = []
    for p, out in zip(pieces, outs):
        idx, tested = decode_part(s[p.blocks], k, words[p.at:p.at + p.n], scale, out, block, chunk, fast)
        late.append(idx)
        stats.interval += tested
    stats.unsettled = sum(int(i.numel()) for i in late)
    if stats.unsettled:
        _resend(pieces, late, s, k, words, scale, outs, block, group)
    stats.flagged_blocks = int(flagged.numel())
    if stats.flagged_blocks:
        _non_finite(pieces, flagged, outs, block, group)
    return outs, stats


def fused_passes(pieces: Sequence[_Piece]):
    """The module of fused passes (scan, encode, decode) that takes these parts: collectives/wire_cpu.py on a CPU
    where its library builds, collectives/wire_triton.py on CUDA where Triton imports; else None (eager torch).
    Either gives the eager passes' bits."""
    tensors = [t for p in pieces for t in (p.limbs, p.bad)]
    dev = pieces[0].limbs.device if pieces else torch.device("cpu")
    if dev.type == "cpu":
        from . import wire_cpu
        return wire_cpu if wire_cpu.takes(*tensors) else None
    try:
        from . import wire_triton
    except ImportError:
        return None
    return wire_triton if wire_triton.takes(*tensors) else None


def scan_part(p: _Piece, info: torch.Tensor, block: int, chunk: int, fast) -> None:
    """Phase 1 on one part (`_scan`), by the fused passes `fast` where given."""
    if fast:
        fast.scan(p.limbs, p.bad, block, info[0], info[1])
    else:
        _scan(p, info, block, chunk)


def encode_part(p: _Piece, s: torch.Tensor, k: int, words: torch.Tensor, block: int, chunk: int, fast) -> None:
    """Phase 2's words of one part (`_encode`), by the fused passes `fast` where given."""
    if fast:
        fast.encode(p.limbs, s, k, block, words)
    else:
        _encode(p, s, k, words, block, chunk)


def decode_part(s: torch.Tensor, k: int, words: torch.Tensor, scale: float, out: torch.Tensor, block: int,
                chunk: int, fast) -> tuple[torch.Tensor, int]:
    """`_decode` of one part's summed words, by the fused passes `fast` where given."""
    if fast:
        return fast.decode(s, k, words, scale, out, block)
    return _decode(s, k, words, scale, out, block, chunk)


def _layout(parts, block: int, world: int, scale: float, chunk: int) -> list[_Piece]:
    if not 1 <= world <= MAX_WORLD:
        raise ValueError(f"compact exact sum: world {world} outside 1..{MAX_WORLD}")
    if not float.fromhex("0x1p-800") < scale < float.fromhex("0x1p800"):
        raise ValueError(f"compact exact sum: scale {scale} outside (2^-800, 2^800): the settle test assumes no "
                         f"float64 underflow")
    if block < 1 or chunk < block:
        raise ValueError(f"compact exact sum: need 1 <= block <= chunk, got block {block}, chunk {chunk}")
    pieces, at, first = [], 0, 0
    for limbs, bad in parts:
        n = limbs.shape[1] if limbs.dim() == 2 else -1
        if limbs.dtype != I64 or limbs.shape != (3, n) or (bad is not None and (bad.dtype != F64 or bad.shape != (n,))):
            raise ValueError(f"compact exact sum: part {len(pieces)} must be limbs (3, n) int64 and bad (n,) float64 "
                             f"or None, got {tuple(limbs.shape)} {limbs.dtype}"
                             f"{'' if bad is None else f', {tuple(bad.shape)} {bad.dtype}'}")
        nb = -(-n // block)
        pieces.append(_Piece(limbs, bad, at, first, n, nb))
        at, first = at + n, first + nb
    return pieces


def _spans(n: int, block: int, chunk: int) -> Iterator[tuple[int, int, int, int]]:
    """(a, b, rows, width): elements [a, b) as `rows` blocks of `width`, whole blocks a chunk at a time, then the
    tail."""
    full, step = n // block, max(1, chunk // block)
    for r in range(0, full, step):
        rows = min(step, full - r)
        yield r * block, (r + rows) * block, rows, block
    if n % block:
        yield full * block, n, 1, n % block


def _rows(p: _Piece, a: int, b: int, rows: int, width: int) -> tuple[torch.Tensor, ...]:
    return tuple(p.limbs[i, a:b].view(rows, width) for i in range(3))


def _scan(p: _Piece, info: torch.Tensor, block: int, chunk: int) -> None:
    """Phase 1 on one part: carry-normalize its limbs in place; per block E (info[0]) and the bad flag (info[1])."""
    for a, b, rows, width in _spans(p.n, block, chunk):
        j = a // block
        info[0, j:j + rows] = _top(*normalize_(*_rows(p, a, b, rows, width)))
        if p.bad is not None:
            info[1, j:j + rows] = (p.bad[a:b].view(rows, width) != 0).any(dim=1).to(I32)


def agree_tops(info: torch.Tensor, groups: Sequence[SumGroup]) -> tuple[torch.Tensor, torch.Tensor]:
    """Phase 1's MAX over `groups` in turn: (E per block, int64; the flagged blocks' indices) from this rank's
    `info` (E, flag) rows. One byte a block: E (< 144: |L| < 2^142), or FLAGGED where the rank's stand-ins are
    non-zero; the flagged blocks' own E follow in a second MAX, only when there are any (every rank knows)."""
    tops = torch.where(info[1] > 0, FLAGGED, info[0]).to(U8)
    for g in groups:
        g.all_reduce_max_(tops)
    flagged = (tops == FLAGGED).nonzero().squeeze(1)
    out = tops.to(I64)
    if flagged.numel():
        again = info[0, flagged].to(U8)
        for g in groups:
            g.all_reduce_max_(again)
        out[flagged] = again.to(I64)
    return out, flagged


def _top(l0: torch.Tensor, l1: torch.Tensor, l2: torch.Tensor) -> torch.Tensor:
    """Per row of normalized limbs, E with |L| < 2^E (int32). On a row, v = floor(L / 2^d) puts every L in
    [min v 2^d, (max v + 1) 2^d), so |L| <= (m + 1) 2^d with m = max(max v, -min v - 1): E = d + bit_length(m + 1).
    d = 80 (v = l2) first; rows where m = 0 (v in {0, -1}) go on with d = 40 (v = l2 2^40 + l1), then d = 0 (L)."""
    m = _span(l2)
    e = 2 * DIGIT + _bits(m + 1)
    rows = (m == 0).nonzero().squeeze(1)
    if rows.numel():
        v = (l2[rows] << DIGIT) + l1[rows]  # in [-2^40, 2^40)
        m = _span(v)
        e[rows] = DIGIT + _bits(m + 1)
        last = m == 0
        if bool(last.any()):
            e[rows[last]] = _bits(_span((v[last] << DIGIT) + l0[rows[last]]) + 1)
    return e.to(I32)


def _span(v: torch.Tensor) -> torch.Tensor:
    """Per row, max(max v, -min v - 1): |v| <= m + 1 on the row, with v = -(m + 1) possible."""
    return torch.maximum(v.amax(dim=1), -v.amin(dim=1) - 1)


def _bits(x: torch.Tensor) -> torch.Tensor:
    """bit_length of positive int64s from float64's exponent (a conversion that rounds up adds a bit: a bound)."""
    return torch.frexp(x.to(F64))[1].to(I64)


def _floor_shift(l0: torch.Tensor, l1: torch.Tensor, l2: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """floor(L / 2^s) of normalized limbs (s >= 0, broadcast per block). Terms may wrap mod 2^64; their sum fits:
    l1 < 2^40 and l0 < 2^40 drop out entirely once s reaches 80 and 40, so each term is the floor of its part."""
    k2 = 80 - s
    t2 = ((l2 << k2.clamp(0, 63)) >> (-k2).clamp(0, 63)) & -(k2 < 64).to(I64)  # l2 * 2^k2 = 0 mod 2^64 past 63
    t1 = (l1 << (40 - s).clamp(min=0)) >> (s - 40).clamp(0, 63)
    return t2 + t1 + (l0 >> s.clamp(max=63))


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """float64 2^e from the exponent bits (e in [-1022, 1023])."""
    return ((e + 1023) << 52).view(F64)


def _mask(k: torch.Tensor) -> torch.Tensor:
    """2^k - 1 (0 for k <= 0), for k <= 62."""
    return (torch.ones_like(k) << k.clamp(0, 62)) - 1


def _low(l0: torch.Tensor, l1: torch.Tensor, l2: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The limbs of L mod 2^s (normalized limbs; each result in [0, 2^40) since s - 80 < 40)."""
    return l0 & _mask(s), l1 & _mask(s - DIGIT), l2 & _mask(s - 2 * DIGIT)


def _shifted(h: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The normalized limbs of h * 2^s (s >= 0): its bits 0-39, 40-79 and the rest, signed."""
    n0 = (h << s.clamp(max=DIGIT)) & LOW40
    n1 = ((h << (s - DIGIT).clamp(0, DIGIT)) >> (DIGIT - s).clamp(0, 63)) & LOW40
    n2 = (h << (s - 2 * DIGIT).clamp(0, 63)) >> (2 * DIGIT - s).clamp(0, 63)
    return n0, n1, n2


def _encode(p: _Piece, s: torch.Tensor, k: int, words: torch.Tensor, block: int, chunk: int) -> None:
    """Phase 2's words of one part."""
    for a, b, rows, width in _spans(p.n, block, chunk):
        torch.bitwise_or(*_word(*_rows(p, a, b, rows, width), s[a // block:a // block + rows, None], k),
                         out=words[a:b].view(rows, width))


def _word(l0: torch.Tensor, l1: torch.Tensor, l2: torch.Tensor, s: torch.Tensor,
          k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(floor(L / 2^s) << K, [L mod 2^s != 0]) of normalized limbs; shortcuts where every s of the chunk is at most
    40 (then |L| < 2^93: l2 * 2^40 + l1 fits), within 40..80 (l0 lies wholly in the low part), or where every
    block's E is at most FITS (gradients: s on both sides of 40), so that floor(L / 2^40) = l2 * 2^40 + l1 fits and
    floor(L / 2^s) takes two exact shifts, by a = min(s, 40) and then by s - a."""
    lo, hi = int(s.min()), int(s.max())
    if hi <= DIGIT:
        h = (((l2 << DIGIT) + l1) << (DIGIT - s)) + (l0 >> s)
        low = l0 & _mask(s)
    elif lo >= DIGIT and hi <= 2 * DIGIT:
        h = (l2 << (2 * DIGIT - s)) + (l1 >> (s - DIGIT))
        low = l0 | (l1 & _mask(s - DIGIT))
    elif hi + min(MANT, WORD - k) - k <= FITS:  # E = s + min(53, 54 - K) - K where s > 0
        a = s.clamp(max=DIGIT)
        # floor(L / 2^a): where a = s it is floor(L / 2^s), |.| <= 2^(E - s) <= 2^53; else floor(L / 2^40)
        la = (((l2 << DIGIT) + l1) << (DIGIT - a)) + (l0 >> a)
        h = la >> (s - a)
        low = (l0 & _mask(a)) | (la & _mask(s - a))
    else:
        h = _floor_shift(l0, l1, l2, s)
        parts = _low(l0, l1, l2, s)
        low = parts[0] | parts[1] | parts[2]
    return h << k, low.clamp_(max=1)  # low >= 0: its flag as an int64 0 or 1


def _decode(s: torch.Tensor, k: int, words: torch.Tensor, scale: float, out: torch.Tensor, block: int,
            chunk: int) -> tuple[torch.Tensor, int]:
    """out = the result at lo for every element of one part; returns (its elements that need phase 3, how many
    elements had F > 0)."""
    late, tested = [], 0
    for a, b, rows, width in _spans(words.numel(), block, chunk):
        sb = s[a // block:a // block + rows, None]
        w = words[a:b].view(rows, width)
        h, f = w >> k, w & ((1 << k) - 1)
        # bit-relevant: lo = h 2^s is a float64 (|h| <= 2^53), so the chain's value is fl(h) 2^s; `scaled` takes
        # it times 2^-GRID (exact) times `scale` (one rounding): fl(h * (2^(s - GRID) * scale)), the factor exact
        lo = h.to(F64) * (_pow2(sb - GRID) * scale)
        out[a:b].view(rows, width).copy_(lo)  # the one float32 rounding (to_float32 without stand-ins), in place
        m = int(torch.count_nonzero(f))
        if m:
            hit = f != 0
            tested += m
            ok = _settled(h[hit], f[hit], sb.expand(rows, width)[hit], lo[hit], scale)
            late.append(hit.view(-1).nonzero().squeeze(1)[~ok] + a)
    return (torch.cat(late) if late else torch.empty(0, dtype=I64, device=words.device)), tested


def _settled(h: torch.Tensor, f: torch.Tensor, s: torch.Tensor, w_lo: torch.Tensor, scale: float) -> torch.Tensor:
    """Where every integer of [lo, hi] = [h 2^s, (h + f) 2^s - f] has the float32 result of lo (w_lo: lo's
    float64 before the float32 rounding).

    w(L) = fl(combine(L) * 2^-96 * scale) (the first product is exact). combine errs by at most 3.0001u |L|
    (u = 2^-53) and x - c|x| grows with x, so combine(L) >= lo - 3.0001u|lo| for L >= lo; with the rounding of
    fl(. * scale) and w_lo's own, w(L) >= w_lo - 8.001u |lo| scale 2^-96 >= w_lo - 2^-49.9 |w_lo| (and w(L) <=
    w_hi + 2^-49.9 |w_hi| alike). fl(w_lo - 2^-40 |w_lo|) lies at least (2^-40 - 2^-52.9) |w_lo| below w_lo,
    so below every w(L); likewise above. The float32 rounding is monotone: equal bits at the widened ends are
    every w(L)'s bits, lo's and the exact sum's among them. (A zero's two signs differ in bits: not settled.)"""
    hi = normalize(*_shifted(h + f, s))
    w_hi = scaled(combine(*normalize(hi[0] - f, hi[1], hi[2])), scale)
    down = (w_lo - w_lo.abs() * MARGIN).to(F32)
    up = (w_hi + w_hi.abs() * MARGIN).to(F32)
    return down.view(I32) == up.view(I32)


def _resend(pieces: list[_Piece], late: list[torch.Tensor], s: torch.Tensor, k: int, words: torch.Tensor,
            scale: float, outs: list[torch.Tensor], block: int, group: SumGroup) -> None:
    """Phase 3: every rank's low parts of the unsettled elements, summed; their exact sums' results into `outs`."""
    lows, shifts = [], []
    for p, idx in zip(pieces, late):
        se = s[p.first + idx // block]
        shifts.append(se)
        lows.append(torch.stack(_low(*(p.limbs[i, idx] for i in range(3)), se)))
    low = torch.cat(lows, dim=1)
    group.all_reduce_sum_(low)  # R limbs below 2^40 each: no overflow
    at = 0
    for p, idx, se, out in zip(pieces, late, shifts, outs):
        if idx.numel():
            n0, n1, n2 = _shifted(words[p.at + idx] >> k, se)
            sl = low[:, at:at + idx.numel()]
            out[idx] = to_float32(scaled(combine(*normalize(n0 + sl[0], n1 + sl[1], n2 + sl[2])), scale), None)
            at += idx.numel()


def _non_finite(pieces: list[_Piece], flagged: torch.Tensor, outs: list[torch.Tensor], block: int,
                group: SumGroup) -> None:
    """Phase 4: the flagged blocks' `bad` values summed over ranks (float64, as the limb wire); they override."""
    cols = torch.arange(block, device=flagged.device)
    sel, vals = [], []
    for p in pieces:
        mine = flagged[(flagged >= p.first) & (flagged < p.first + p.nb)] - p.first
        idx = (mine[:, None] * block + cols).view(-1)
        idx = idx[idx < p.n]
        sel.append(idx)
        vals.append(p.bad[idx] if p.bad is not None else torch.zeros(idx.numel(), dtype=F64, device=idx.device))
    bad = torch.cat(vals)
    group.all_reduce_sum_(bad)  # sums of 0, +-inf and NaN
    at = 0
    for idx, out in zip(sel, outs):
        out[idx] = to_float32(out[idx], bad[at:at + idx.numel()])  # float32 -> float64 -> float32 is exact
        at += idx.numel()
