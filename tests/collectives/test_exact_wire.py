"""The compact exact wire (collectives/exact_wire.py) gives a single-process ExactSum's bits on R = 1..8 gloo ranks,
and so does its reduce-scatter (collectives/exact_scatter.py) to the owners of a mesh's slices.

Eight processes are forked once, their inputs (each rank's ExactSum limbs) built here before the fork; for each R
the first R ranks run the wire in a torch.distributed.new_group of their own, and this process compares what they
return with ExactSum over every rank's partials, raw bits, NaN included: however the ranks' stand-ins are added,
every NaN result is the one quiet NaN (collectives/limbs.py's NAN_BITS)."""
from __future__ import annotations

import json
import math
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from collectives import CollectiveGroup, free_port, shard_bounds
from collectives.exact_scatter import compact_exact_reduce_scatter
from collectives.exact_wire import (WORD, _floor_shift, _low, _settled, _shifted, _top, _word, WireStats,
                                    compact_exact_sum)
from collectives.limbs import combine, normalize, scaled, value
from training.reduction import ExactSum

WORLD = 8
MESHES = ((1, 3), (2, 2), (3, 2), (2, 4))  # replicas x shards: the reduce-scatter's meshes
MESH_CASES = ("mixed", "edge3", "tiny")
I32, I64, F32, F64 = torch.int32, torch.int64, torch.float32, torch.float64
DIGITS = (1 << 40) - 1


# -- inputs ----------------------------------------------------------------------------------------------------
def mixed(rng: np.random.Generator, n: int) -> np.ndarray:
    """Magnitudes 2^-100..2^30 (1% past the 2^24 range limit), zeros, subnormals, values at +-(2^24 - 1), +-2^24,
    NaN and +-inf."""
    x = rng.uniform(1, 2, n) * rng.choice([-1.0, 1.0], n) * np.exp2(rng.integers(-100, 24, n))
    wide = rng.random(n) < 0.01
    x[wide] = np.exp2(rng.integers(24, 31, int(wide.sum()))) * rng.choice([-1.0, 1.0], int(wide.sum()))
    kind, sign = rng.random(n), rng.choice([-1.0, 1.0], n)
    x[kind < 0.05] = 0.0
    sub = (kind >= 0.05) & (kind < 0.08)
    x[sub] = np.ldexp(rng.uniform(1, 2, int(sub.sum())), rng.integers(-149, -126, int(sub.sum())))
    x[(kind >= 0.08) & (kind < 0.10)] = ((2.0 ** 24 - 1) * sign)[(kind >= 0.08) & (kind < 0.10)]
    x[(kind >= 0.10) & (kind < 0.105)] = (2.0 ** 24 * sign)[(kind >= 0.10) & (kind < 0.105)]
    x[(kind >= 0.105) & (kind < 0.107)] = np.nan
    x[(kind >= 0.107) & (kind < 0.109)] = np.inf
    x[(kind >= 0.109) & (kind < 0.111)] = -np.inf
    return x.astype(np.float32)


def mixed_case(world: int, seed: int) -> dict:
    """Tensors of several shapes (one empty); rank r holds 1 + r % 3 partials (the last of 3+ ranks none); on half
    the elements rank 1's first partial cancels rank 0's but for a part in 2^10..2^40 of it."""
    rng = np.random.Generator(np.random.Philox(seed))
    shapes = {"a": (1000,), "b": (37, 29), "c": (0,), "d": (1,)}
    counts = [0 if (world >= 3 and r == world - 1) else 1 + r % 3 for r in range(world)]
    ranks = [{k: [mixed(rng, math.prod(s)).reshape(s) for _ in range(c)] for k, s in shapes.items()} for c in counts]
    if world >= 2:
        for k in shapes:
            a, b = ranks[0][k][0].reshape(-1), ranks[1][k][0].reshape(-1)
            near = rng.random(a.size) < 0.5
            rest = np.ldexp(a.astype(np.float64), -rng.integers(10, 41, a.size))
            with np.errstate(invalid="ignore"):  # inf - inf: NaN, as good a partial as any
                b[near] = (-a.astype(np.float64) + rest)[near].astype(np.float32)
    return {"ranks": ranks, "scale": 1.0 / max(1, sum(counts)), "block": 64, "chunk": 256}


def pieces(t: int) -> list[int]:
    """t as a sum of integers of at most 24 significant bits: float32 partials times 2^96 (|t| < 2^120)."""
    out = []
    while t:
        m = abs(t)
        cut = max(0, m.bit_length() - 24)
        p = (m >> cut) << cut if t > 0 else -((m >> cut) << cut)
        out.append(p)
        t -= p
    return out


def limbs_of(ints: list[int]) -> torch.Tensor:
    return torch.tensor([[i & DIGITS for i in ints], [(i >> 40) & DIGITS for i in ints], [i >> 80 for i in ints]],
                        dtype=I64)


def result_bits(ints: list[int], scale: float) -> torch.Tensor:
    """ExactSum's float32 result bits for exact integer sums (grid units)."""
    return ExactSum.of_shared(limbs_of(ints), torch.zeros(len(ints), dtype=F64)).result(scale).view(I32)


def crossings(scale: float, values: list[float]) -> list[int]:
    """Integers where the result's bits change (bisection), one above each value (float32s)."""
    lo = [int(Fraction(v) / Fraction(scale) * 2 ** 96) - (1 << 40) for v in values]
    hi = [int(Fraction(float(np.nextafter(np.float32(v), np.float32(np.inf)))) / Fraction(scale) * 2 ** 96)
          + (1 << 40) for v in values]
    base = result_bits(lo, scale)
    assert not bool((result_bits(hi, scale) == base).any())
    while any(b - a > 1 for a, b in zip(lo, hi)):
        mid = [(a + b) // 2 for a, b in zip(lo, hi)]
        same = (result_bits(mid, scale) == base).tolist()
        lo = [m if s else a for a, m, s in zip(lo, mid, same)]
        hi = [b if s else m for b, m, s in zip(hi, mid, same)]
    return hi


def targets(scale: float) -> list[int]:
    """Exact sums (grid units) next to result rounding boundaries and limb carries, both signs."""
    vals = [float(np.float32(v)) for v in (2.0 ** -40 * 1.37, 2.0 ** -9 * 1.61, 1.2345678, -3.75, 2.0 ** 20 * 1.11,
                                           -(2.0 ** 17) * 1.9)]
    out = [c + d for c in crossings(scale, vals) for d in (-2, -1, 0, 1, 2, 1 << 20)]
    for m in (1 << 40, 1 << 80, 1 << 93, 1 << 100):
        out += [sg * (m + d) for sg in (1, -1) for d in (-2, -1, 0, 1)]
    return out


def edge_case(world: int, scale: float) -> dict:
    """One element per (target, y): the target split into 24-bit pieces over the ranks, and +y on rank 0, -y on
    rank 1 (mod R), which set the block's top bit far above the pieces, so their bits land in the low parts."""
    ts = targets(scale)
    ys = [0, 1 << 60, 1 << 80, 3 << 99, 1 << 115]
    cols = [(t, y) for t in ts for y in ys]
    per = [[] for _ in range(world)]  # per rank, per element: its integer partials
    for t, y in cols:
        mine = [[] for _ in range(world)]
        for i, p in enumerate(pieces(t)):
            mine[i % world].append(p)
        if y:
            mine[0].append(y)
            mine[1 % world].append(-y)
        for r in range(world):
            per[r].append(mine[r])
    ranks = []
    for r in range(world):
        depth = max(len(c) for c in per[r])
        rows = [[math.ldexp(c[i], -96) if i < len(c) else 0.0 for c in per[r]] for i in range(depth)]
        ranks.append({"e": [np.array(row, dtype=np.float32) for row in rows]})
    return {"ranks": ranks, "scale": scale, "block": 16, "chunk": 64}


def grad_case(world: int, seed: int) -> dict:
    """Gradient-like: normals times 1e-3 times a log-normal scale per row of 256, 4 partials a rank."""
    rng = np.random.Generator(np.random.Philox(seed))
    n = 1 << 16
    ranks = [{"g": [(rng.standard_normal(n) * 1e-3 * np.repeat(np.exp(rng.standard_normal(n // 256)), 256))
                    .astype(np.float32) for _ in range(4)]} for _ in range(world)]
    return {"ranks": ranks, "scale": 1.0 / (4 * world), "block": 1024, "chunk": 1 << 16}


def tiny_case(world: int, seed: int) -> dict:
    """Blocks whose sums lie below 2^80 and 2^40 on the grid (|g| ~ 2^-30 and 2^-70), and all-zero blocks."""
    rng = np.random.Generator(np.random.Philox(seed))
    scale = np.repeat(np.array([2.0 ** -30, 2.0 ** -70, 0.0, 2.0 ** -30 * 3]), 256)
    ranks = [{"t": [(rng.standard_normal(1024) * scale).astype(np.float32) for _ in range(2)]} for _ in range(world)]
    return {"ranks": ranks, "scale": 1.0 / (2 * world), "block": 256, "chunk": 512}


def aligned_case(world: int) -> dict:
    """The words' worst case: every rank holds the same values at the top of their block, one sign per block, so
    that the summed words come nearest the wire's bound (2^54 + 2^K; past 7 bytes with a wider word)."""
    top = np.float32(2.0 ** 24 - 1)
    blocks = [top * np.float32(2.0 ** e) * np.float32(sign) for e in (-40, -7, 0, 6) for sign in (1, -1)]
    t = np.repeat(np.array(blocks, dtype=np.float32), 32)
    return {"ranks": [{"a": [t.copy()]} for _ in range(world)], "scale": 1.0 / world, "block": 32, "chunk": 64}


def sums_of(case: dict, ranks: range) -> dict[str, ExactSum]:
    """ExactSum per tensor over the partials of `ranks`, rank by rank."""
    first = case["ranks"][0]
    out = {}
    for k in first:
        shape = next((p.shape for r in case["ranks"] for p in r[k]), None) or (0,)
        out[k] = ExactSum(tuple(shape), "cpu")
        for r in ranks:
            for p in case["ranks"][r][k]:
                out[k].add(torch.from_numpy(p))
    return out


def build() -> dict:
    """{(R, name): case} with each rank's limbs and the reference bits."""
    cases = {}
    for world in range(1, WORLD + 1):
        for name, case in (("mixed", mixed_case(world, 10 + world)), ("edge", edge_case(world, 1.0)),
                           ("edge3", edge_case(world, 1.0 / 3)), ("grad", grad_case(world, 20 + world)),
                           ("tiny", tiny_case(world, 30 + world)), ("aligned", aligned_case(world))):
            ref = sums_of(case, range(world))
            case["ref"] = {k: s.result(case["scale"]).reshape(-1) for k, s in ref.items()}
            case["wire"] = [{k: s.wire() for k, s in sorted(sums_of(case, range(r, r + 1)).items())}
                            for r in range(world)]
            cases[(world, name)] = case
    return cases


# -- the forked ranks ------------------------------------------------------------------------------------------
def _rank(rank: int, port: int, cases: dict, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        groups = {w: dist.new_group(list(range(w))) for w in range(1, WORLD + 1)}  # every rank, in one order

        def refuse(*a, **kw):
            raise AssertionError("the compact wire called torch.distributed.all_reduce, not the group's schedule")

        # a mesh's replica groups (ranks r*S .. r*S + S-1) and shard groups (s, S + s, ...), made in one order
        meshes = {(nr, ns): ([dist.new_group([r * ns + i for i in range(ns)]) for r in range(nr)],
                             [dist.new_group([r * ns + i for r in range(nr)]) for i in range(ns)]) for nr, ns in MESHES}
        dist.all_reduce = refuse  # the exact wire's sums go through collectives' recursive doubling only
        for (nr, ns), (replicas, shards) in meshes.items():
            if rank >= nr * ns:
                continue
            replica, shard = CollectiveGroup(replicas[rank // ns]), CollectiveGroup(shards[rank % ns])
            for name in MESH_CASES:
                case = cases[(nr * ns, name)]
                parts = [[(lb[:, a:b], None if bad is None else bad[a:b])
                          for lb, bad in case["wire"][rank].values() for a, b in [shard_bounds(lb.shape[1], ns)[o]]]
                         for o in range(ns)]
                got, stats = compact_exact_reduce_scatter(parts, replica, shard, case["scale"], case["block"],
                                                          case["chunk"])
                stem = f"mesh{nr}x{ns}-{name}-{rank}"
                np.save(Path(out, f"{stem}.npy"), torch.cat([g.view(I32) for g in got]).numpy())
                Path(out, f"{stem}.json").write_text(json.dumps(vars(stats)))
        for (world, name), case in cases.items():
            if rank >= world:
                continue
            parts = case["wire"][rank]
            got, stats = compact_exact_sum(list(parts.values()), CollectiveGroup(groups[world]), case["scale"],
                                           case["block"], case["chunk"])
            bits = torch.cat([g.view(I32) for g in got]).numpy()
            np.save(Path(out, f"{world}-{name}-{rank}.npy"), bits)
            Path(out, f"{world}-{name}-{rank}.json").write_text(json.dumps(vars(stats)))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ran(tmp_path_factory, one_thread) -> tuple[dict, Path]:
    cases = build()
    out = tmp_path_factory.mktemp("exact-wire")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # fork: the ranks inherit `cases` (no pickling) and this test module's functions
    mp.start_processes(_rank, args=(free_port(), cases, str(out)), nprocs=WORLD, join=True, start_method="fork")
    return cases, out


def same_bits(got: np.ndarray, want: torch.Tensor) -> np.ndarray:
    return got == want.view(I32).numpy()


@pytest.mark.parametrize("world", range(1, WORLD + 1))
@pytest.mark.parametrize("name", ["mixed", "edge", "edge3", "grad", "tiny", "aligned"])
def test_every_rank_gets_the_single_process_bits(ran, world, name):
    cases, out = ran
    case = cases[(world, name)]
    want = torch.cat([case["ref"][k] for k in sorted(case["ref"])])
    for r in range(world):
        got = np.load(Path(out, f"{world}-{name}-{r}.npy"))
        ok = same_bits(got, want)
        assert ok.all(), f"R={world} {name} rank {r}: {int((~ok).sum())} elements differ, first at {np.argmin(ok)}"


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("name", MESH_CASES)
def test_each_owner_gets_the_single_process_bits_of_its_slice(ran, mesh, name):
    """The reduce-scatter over replicas x shards: rank r * S + s gets slice s (shard_bounds of every tensor)."""
    cases, out = ran
    nr, ns = mesh
    case = cases[(nr * ns, name)]
    for rank in range(nr * ns):
        o = rank % ns
        want = torch.cat([ref[slice(*shard_bounds(ref.numel(), ns)[o])] for _, ref in sorted(case["ref"].items())])
        got = np.load(Path(out, f"mesh{nr}x{ns}-{name}-{rank}.npy"))
        ok = same_bits(got, want)
        assert ok.all(), f"{nr}x{ns} {name} rank {rank}: {int((~ok).sum())} elements differ"
    stats = [json.loads(Path(out, f"mesh{nr}x{ns}-{name}-{r}.json").read_text()) for r in range(nr * ns)]
    if name == "edge3":  # not vacuous: owners resend unsettled elements, and the range limit flags blocks
        assert sum(st["unsettled"] for st in stats) > 0
    if name == "mixed":
        assert all(st["flagged_blocks"] > 0 for st in stats)


@pytest.mark.parametrize("world", range(2, WORLD + 1))
def test_the_edge_cases_reach_every_phase(ran, world):
    """Not vacuous: the adversarial sums need the interval test and the resend, and the range limit flags blocks."""
    _, out = ran
    edge = json.loads(Path(out, f"{world}-edge3-0.json").read_text())
    mixed = json.loads(Path(out, f"{world}-mixed-0.json").read_text())
    assert edge["unsettled"] > 0 and edge["interval"] > edge["unsettled"]
    assert mixed["flagged_blocks"] > 0


@pytest.mark.parametrize("world", range(1, WORLD + 1))
def test_gradients_rarely_need_the_resend(ran, world):
    _, out = ran
    stats = WireStats(**json.loads(Path(out, f"{world}-grad-0.json").read_text()))
    assert stats.unsettled <= 1e-4 * stats.elements and stats.interval <= 1e-2 * stats.elements
    assert stats.flagged_blocks == 0


# -- the pieces, in one process --------------------------------------------------------------------------------
def _random_ints(n: int, seed: int, top: int) -> list[int]:
    """n integers below 2^top, both signs, and the neighbours of the limb boundaries."""
    rng = np.random.Generator(np.random.Philox(seed))
    out = []
    for _ in range(n):
        m, bits = int(rng.integers(1 << 61, 1 << 62)), int(rng.integers(1, top + 1))
        out.append(m << (bits - 62) if bits > 62 else m >> (62 - bits))
    out += [(1 << k) + d for k in (40, 80, 100) if k < top for d in (-1, 0, 1)]
    return [v if i % 2 else -v for i, v in enumerate(out)]


def _ints(limbs) -> list[int]:
    return [a + (b << 40) + (c << 80) for a, b, c in torch.stack(limbs).T.tolist()]


def test_shifts_and_low_parts_are_exact_integers(one_thread):
    ls = _random_ints(400, 1, 138)
    limbs = normalize(*limbs_of(ls))
    hs = _random_ints(400, 2, 53)
    for s in (0, 1, 17, 39, 40, 41, 63, 64, 79, 80, 81, 100, 114):
        st = torch.full((len(ls),), s, dtype=I64)
        fits = [-(1 << 62) <= v >> s < 1 << 62 for v in ls]  # where the floor fits int64 (the wire's case)
        h = _floor_shift(*limbs, st).tolist()
        assert [a for a, k in zip(h, fits) if k] == [v >> s for v, k in zip(ls, fits) if k]
        low = _low(*limbs, st)
        assert _ints(low) == [v % (1 << s) for v in ls]
        assert all(bool((t >= 0).all() and (t <= DIGITS).all()) for t in low)
        if s <= 88:  # h 2^s within the limbs' range
            back = _shifted(torch.tensor(hs, dtype=I64), torch.full((len(hs),), s, dtype=I64))
            assert _ints(back) == [x << s for x in hs]
            assert all(bool((t >= 0).all() and (t <= DIGITS).all()) for t in back[:2])


def test_block_tops_bound_every_sum_within_a_bit():
    """E per row: |L| < 2^E, and E at most one more than the row's largest bit length, on rows decided by l2, by l1
    (sums below 2^80) and by l0 (below 2^40), both signs, the boundaries and zeros."""
    rows = [_random_ints(64, 3, 138)[-64:], _random_ints(64, 4, 79)[-64:], _random_ints(64, 5, 39), [0] * 64,
            [-(1 << 80)] + [0] * 63, [-(1 << 40)] + [-1] * 63, [(1 << 80) - 1] * 64, [-1] * 64]
    e = _top(*(t.view(len(rows), 64) for t in normalize(*limbs_of([v for r in rows for v in r])))).tolist()
    for r, got in zip(rows, e):
        top = max(abs(v) for v in r).bit_length()
        assert all(abs(v) < 1 << got for v in r) and got <= top + 1, (top, got)


@pytest.mark.parametrize("shifts", [(0,), (23,), (40,), (41,), (77,), (80,), (3, 45), (12, 40, 57), (39, 90),
                                    (60, 114)])
def test_words_pack_the_floor_and_the_low_flag(shifts):
    """Every shift regime of `_word` (all shifts of a chunk up to 40, within 40..80, on both sides of 40 with every
    |L| < 2^103 (the two-shift path, up to its bound), or else), on sums that keep the wire's bound
    |L| < 2^(s + WORD - 2K)."""
    k = 4
    s = [shifts[i % len(shifts)] for i in range(600)]
    tops = [min(x + WORD - 2 * k, 138) for x in s]  # within the limbs' range
    rng = np.random.Generator(np.random.Philox(sum(shifts)))
    ls = []
    for t in tops:
        v = int(rng.integers(1 << 61, 1 << 62))
        v = v << (t - 62) if t > 62 else v >> int(rng.integers(62 - t, 62))
        ls.append(v if rng.random() < 0.5 else -v)
    ls[:4] = [0, -1, 1 << 20, -(1 << 20)]
    st = torch.tensor(s, dtype=I64)
    hk, flag = _word(*normalize(*limbs_of(ls)), st, k)
    assert hk.tolist() == [(v >> x) << k for v, x in zip(ls, s)]
    assert flag.tolist() == [int(v % (1 << x) != 0) for v, x in zip(ls, s)]


def test_the_chain_is_not_monotone_and_the_widened_test_catches_it():
    """At -2^93 - 1 the chain gives -2^93 + 2^40, at -2^93 -2^93. With scale 1 - 2^-25 that dip shows in the
    float32 result: [lo, hi] = [-2^93 - 2^40, -2^93 + 2^39 - 3] has lo's result at both ends and another inside.
    The wire never forms this interval (|h| = 2^54 + 2 > 2^53), but `_settled` holds without that bound."""
    a, b = value(limbs_of([-(1 << 93) - 1])), value(limbs_of([-(1 << 93)]))
    assert float(a) > float(b)
    scale = 1 - 2.0 ** -25
    h, f, s = -(1 << 54) - 2, 3, 39
    lo, hi = h << s, ((h + f) << s) - f
    ends = result_bits([lo, hi], scale).tolist()
    assert ends[0] == ends[1] != result_bits([-(1 << 93) - 1], scale).item()
    ht = torch.tensor([h], dtype=I64)
    w_lo = scaled(value(limbs_of([lo])), scale)
    assert not _settled(ht, torch.tensor([f]), torch.tensor([s]), w_lo, scale).item()


@pytest.mark.parametrize("scale", [1.0, 1.0 / 3, 1.0 / 7])
def test_settled_intervals_hold_one_result(scale, one_thread):
    """Around result boundaries, limb carries and the non-monotone point: where the test says settled, the
    boundary's integers inside [lo, hi] have lo's bits; and intervals clear of boundaries do settle. As on the
    wire, |h| <= 2^53: the shift leaves 53 - `spare` bits of each centre."""
    centres = targets(scale)
    checked = settled = 0
    for spare in (0, 5, 15, 25, 30):
        s = [max(0, c.bit_length() - 53 + spare) for c in centres]
        for f in (1, 3, 8):
            for back in (0, 1, 2, f + 2, 1 << 12):
                h = [(c >> k) - back for c, k in zip(centres, s)]
                lo = [x << k for x, k in zip(h, s)]
                hi = [((x + f) << k) - f for x, k in zip(h, s)]
                ht, st = torch.tensor(h, dtype=I64), torch.tensor(s, dtype=I64)
                w_lo = scaled(combine(*_shifted(ht, st)), scale)
                ok = _settled(ht, torch.full_like(ht, f), st, w_lo, scale).tolist()
                want = result_bits(lo, scale).tolist()
                for o, wl, c, a, b in zip(ok, want, centres, lo, hi):
                    inside = [c + d for d in (-1, 0) if a <= c + d <= b]
                    if o and inside:
                        assert result_bits(inside, scale).tolist() == [wl] * len(inside)
                        checked += 1
                settled += sum(ok)
    assert settled > 0 and checked > 0


def test_wire_bytes_and_refusals(one_thread):
    """One rank: phase 2's word per element and phase 1's byte per block go through the group, nothing else; a flagged
    block costs one more byte."""
    sent = []

    class Solo:
        world = 1

        def all_reduce_sum_(self, t, width=None):
            sent.append(("sum", t.numel() * (width or t.element_size())))

        def all_reduce_max_(self, t):
            sent.append(("max", t.numel() * t.element_size()))

    x = ExactSum((5000,), "cpu")
    x.add(torch.linspace(-1, 1, 5000))
    x.add(torch.linspace(1, 3, 5000))
    got, stats = compact_exact_sum([x.wire()], Solo(), 0.5)
    assert torch.equal(got[0].view(I32), x.result(0.5).view(I32))
    assert sent == [("max", 5), ("sum", 7 * 5000)] and stats.unsettled == 0
    sent.clear()
    y = ExactSum((5000,), "cpu")
    y.add(torch.linspace(-1, 1, 5000))
    y.add(torch.linspace(1, 3, 5000).index_fill(0, torch.tensor([3000]), float("inf")))
    got, stats = compact_exact_sum([y.wire()], Solo(), 0.5)
    assert torch.equal(got[0].view(I32), y.result(0.5).view(I32)) and stats.flagged_blocks == 1
    assert sent == [("max", 5), ("max", 1), ("sum", 7 * 5000), ("sum", 8 * 1024)]
    with pytest.raises(ValueError):
        compact_exact_sum([(torch.zeros(3, 4, dtype=torch.int32), None)], Solo(), 1.0)
    with pytest.raises(ValueError):
        compact_exact_sum([x.wire()], Solo(), 0.0)
