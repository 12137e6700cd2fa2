"""The compact wire's fused CPU passes (collectives/wire_cpu.py) give its eager torch passes' bits: each pass alone
on limbs and words spanning every shift regime, and whole calls of R = 1..5 ranks (threads of this process) on
data of 2^-100..2^30 with zeros, subnormals, NaN and inf, and on sums next to rounding boundaries that reach every
phase. Raw bits throughout (NaN payloads included: both runs add the stand-ins in the same order)."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from collectives import wire_cpu
from collectives.exact_wire import MANT, WORD, _decode, _encode, _Piece, _scan, compact_exact_sum, fused_passes
from collectives.limbs import normalize
from tests.collectives.test_exact_wire import edge_case, mixed_case, sums_of
from tests.training.test_sharding import Hub, Sub

I32, I64, U8, F32, F64 = torch.int32, torch.int64, torch.uint8, torch.float32, torch.float64


def test_the_library_builds_here():
    """CI's machine has g++: the fused passes are what the wire runs there, not the eager fallback."""
    assert wire_cpu.status() == "built"


def test_without_a_compiler_the_wire_warns_and_runs_eager(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setattr(wire_cpu, "_failure", [])
    with pytest.warns(RuntimeWarning, match="runs its eager passes"):
        assert wire_cpu.library.__wrapped__() is None
    assert "no-such-compiler" in wire_cpu._failure[0]


def _run(wires: list[list[tuple]], case: dict, fused: bool) -> list[tuple]:
    """compact_exact_sum on every rank's (limbs, bad) copies, R ranks as threads: per rank (result bits, stats, limbs
    after)."""
    hub, out = Hub(len(wires)), [None] * len(wires)

    def rank(r: int) -> None:
        parts = [(lb.clone(), None if bad is None else bad.clone()) for lb, bad in wires[r]]
        try:
            got, stats = compact_exact_sum(parts, Sub(hub, r), case["scale"], case["block"], case["chunk"],
                                           fused=fused)
        except BaseException as e:  # noqa: BLE001 - raised again in the test's thread
            hub.barrier.abort()
            out[r] = e
            return
        out[r] = (torch.cat([g.view(I32) for g in got]), vars(stats), [lb for lb, _ in parts])

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(wires))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for o in out:
        if isinstance(o, BaseException):
            raise o
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("name", ["mixed", "edge"])
def test_whole_calls_give_the_eager_bits(world, name, one_thread):
    case = mixed_case(world, 40 + world) if name == "mixed" else edge_case(world, 1.0 / 3)
    wires = [[s.wire() for _, s in sorted(sums_of(case, range(r, r + 1)).items())] for r in range(world)]
    assert fused_passes([_Piece(lb, bad, 0, 0, lb.shape[1], 1) for lb, bad in wires[0]]) is wire_cpu
    fast, eager = _run(wires, case, True), _run(wires, case, False)
    for (bits, stats, limbs), (want, want_stats, want_limbs) in zip(fast, eager):
        assert torch.equal(bits, want)
        assert stats == want_stats
        assert all(torch.equal(a, b) for a, b in zip(limbs, want_limbs))
    if world > 1:  # the cases reach the phases past the words' sum
        key = "flagged_blocks" if name == "mixed" else "unsettled"
        assert fast[0][1][key] > 0 and fast[0][1]["interval"] > fast[0][1]["unsettled"]


def _limbs(n: int, block: int, seed: int) -> torch.Tensor:
    """Unnormalized limbs (sums of up to 2^22 digits) whose blocks lie below 2^b for b in 0..142, zero blocks, and
    rows in {0, -1} on l2 or on l2 and l1 (E decided by l1 or l0)."""
    rng = np.random.Generator(np.random.Philox(seed))
    nb = n // block
    tops = np.repeat(rng.integers(0, 143, nb), block)
    out = np.zeros((3, n), dtype=np.int64)
    for i in range(3):
        width = np.clip(tops - 40 * i, 0, 62 if i == 2 else 40)
        out[i] = rng.integers(0, 1 << 62, n) >> (62 - width)
        out[i] *= rng.choice([-1, 1], n)
    out[:, tops < 3] = 0  # whole zero blocks and near-zero ones
    out[:, : block * 2] = rng.integers(-(1 << 61), 1 << 61, (3, block * 2))  # needs the carries
    return torch.from_numpy(out)


def summed_words(n: int, world: int, seed: int) -> torch.Tensor:
    """Words as R ranks' sum gives them: |H| up to 2^53 (and tiny, where the interval is wide), a quarter within
    2^14 of a float32 rounding midpoint of a 53-bit H (where the settle test's margin decides), F in 0..R."""
    rng = np.random.Generator(np.random.Philox(seed))
    h = rng.integers(1 << 52, 1 << 53, n) >> rng.integers(0, 54, n)
    near = rng.random(n) < 0.25
    h[near] = ((rng.integers(1 << 23, 1 << 24, n) * 2 + 1) << 28)[near] + rng.integers(-(1 << 14), 1 << 14, n)[near]
    h *= rng.choice([-1, 1], n)
    f = np.where(rng.random(n) < 0.5, 0, rng.integers(0, world + 1, n))
    return torch.from_numpy((h << world.bit_length()) + f)


@pytest.mark.parametrize("world", [2, 4, 200])
def test_each_pass_gives_the_eager_bits(world, one_thread):
    n, block, k = 1 << 16, 256, world.bit_length()
    limbs = _limbs(n, block, world)
    bad = torch.zeros(n, dtype=F64)
    bad[[5, 3000, 3001, 60000]] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0], dtype=F64)
    mine, ref = limbs.clone(), limbs.clone()
    info, want = torch.zeros((2, n // block), dtype=I32), torch.zeros((2, n // block), dtype=I32)
    wire_cpu.scan(mine, bad, block, info[0], info[1])
    _scan(_Piece(ref, bad, 0, 0, n, n // block), want, block, 4 * block)
    assert torch.equal(mine, ref) and torch.equal(info, want)
    assert info[1].nonzero().squeeze(1).tolist() == [0, 11]  # -0.0 (block 234) is no stand-in
    s = (info[0].to(I64) + (k - min(MANT, WORD - k))).clamp_(min=0)
    assert s.max() > 80 and (s == 0).any() and ((s > 0) & (s < 40)).any()
    words, words_ref = torch.empty(n, dtype=I64), torch.empty(n, dtype=I64)
    wire_cpu.encode(ref, s, k, block, words)
    _encode(_Piece(ref, None, 0, 0, n, n // block), s, k, words_ref, block, 4 * block)
    assert torch.equal(words, words_ref)
    summed = summed_words(n, world, world + 7)
    for scale in (1.0, 1.0 / world, 2.0 ** -700):
        out, out_ref = torch.empty(n, dtype=F32), torch.empty(n, dtype=F32)
        late, tested = wire_cpu.decode(s, k, summed, scale, out, block)
        late_ref, tested_ref = _decode(s, k, summed, scale, out_ref, block, 4 * block)
        assert torch.equal(out.view(I32), out_ref.view(I32))
        assert torch.equal(late, late_ref) and tested == tested_ref
        assert late.numel() < tested and (late.numel() > 0 or scale < 1e-200)  # results below float32's range
