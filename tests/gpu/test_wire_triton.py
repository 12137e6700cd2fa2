"""The compact wire's Triton passes (collectives/wire_triton.py) give the eager torch passes' bits: each pass alone on
limbs and words spanning every shift regime (against eager torch on the same device and on the CPU), and on CUDA
whole calls of R = 1..5 ranks (threads of this process) on data of 2^-100..2^30 with zeros, subnormals, NaN and
inf, and on sums next to rounding boundaries that reach every phase. Raw bits throughout.

    python3 -m pytest -q tests/gpu/test_wire_triton.py                      # on a CUDA GPU
    TRITON_INTERPRET=1 python3 -m pytest -q tests/gpu/test_wire_triton.py   # the logic, on the CPU
"""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
# TRITON_INTERPRET=1 runs the kernels on the CPU through Triton's interpreter: a logic check, never GPU evidence
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRET), reason="needs CUDA")]
DEV = torch.device("cpu" if INTERPRET else "cuda")

from collectives import wire_triton  # noqa: E402
from collectives.exact_wire import _decode, _encode, _Piece, _scan, fused_passes  # noqa: E402
from tests.collectives.test_exact_wire import edge_case, mixed_case, sums_of  # noqa: E402
from tests.collectives.test_wire_fused import _limbs, _run, summed_words  # noqa: E402

I32, I64, F32, F64 = torch.int32, torch.int64, torch.float32, torch.float64


def _eager(limbs, bad, s, k, block, summed, scale):
    """The eager passes on limbs' device: (normalized limbs, info, words, out bits, late, tested)."""
    n, nb = limbs.shape[1], -(-limbs.shape[1] // block)
    limbs = limbs.clone()
    info = torch.zeros((2, nb), dtype=I32, device=limbs.device)
    _scan(_Piece(limbs, bad, 0, 0, n, nb), info, block, 4 * block)
    words = torch.empty(n, dtype=I64, device=limbs.device)
    _encode(_Piece(limbs, None, 0, 0, n, nb), s, k, words, block, 4 * block)
    out = torch.empty(n, dtype=F32, device=limbs.device)
    late, tested = _decode(s, k, summed, scale, out, block, 4 * block)
    return limbs, info, words, out.view(I32), late, tested


def _triton(limbs, bad, s, k, block, summed, scale):
    n, nb = limbs.shape[1], -(-limbs.shape[1] // block)
    limbs = limbs.clone()
    info = torch.zeros((2, nb), dtype=I32, device=limbs.device)
    wire_triton.scan(limbs, bad, block, info[0], info[1])
    words = torch.empty(n, dtype=I64, device=limbs.device)
    wire_triton.encode(limbs, s, k, block, words)
    out = torch.empty(n, dtype=F32, device=limbs.device)
    late, tested = wire_triton.decode(s, k, summed, scale, out, block)
    return limbs, info, words, out.view(I32), late, tested


@pytest.mark.parametrize("world,block", [(2, 64), (5, 100), (200, 1024)])
def test_each_pass_gives_the_eager_bits(world, block):
    n = (1 << 12) if INTERPRET else (1 << 18)
    n -= 7  # a part block at the end
    k = world.bit_length()
    limbs = _limbs(n + 7, block if block & (block - 1) == 0 else 64, world)[:, :n].contiguous()
    bad = torch.zeros(n, dtype=F64)
    bad[[5, 3000, 3001, n - 1]] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0], dtype=F64)
    norm = limbs.clone()
    info = torch.zeros((2, -(-n // block)), dtype=I32)
    _scan(_Piece(norm, bad, 0, 0, n, info.shape[1]), info, block, 4 * block)
    s = (info[0].to(I64) + (k - min(53, 62 - k))).clamp_(min=0)
    summed = summed_words(n, world, world)
    for scale in (1.0, 1.0 / world):
        args = (s, k, block, summed, scale)
        want = _eager(limbs, bad, *args)  # the CPU's eager bits
        got = _triton(limbs.to(DEV), bad.to(DEV), *(a.to(DEV) if torch.is_tensor(a) else a for a in args))
        if not INTERPRET:
            same_device = _eager(limbs.to(DEV), bad.to(DEV), *(a.to(DEV) if torch.is_tensor(a) else a for a in args))
            assert all(torch.equal(a.cpu(), b) if torch.is_tensor(a) else a == b for a, b in zip(same_device, want))
        for name, a, b in zip(("limbs", "info", "words", "out", "late", "tested"), got, want):
            assert (torch.equal(a.cpu(), b) if torch.is_tensor(a) else a == b), name
        assert 0 < want[4].numel() < want[5]


@pytest.mark.skipif(INTERPRET, reason="whole calls on CUDA tensors (under the interpreter the CPU passes run)")
@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("name", ["mixed", "edge"])
def test_whole_calls_give_the_eager_bits(world, name):
    case = mixed_case(world, 40 + world) if name == "mixed" else edge_case(world, 1.0 / 3)
    wires = [[s.wire() for _, s in sorted(sums_of(case, range(r, r + 1)).items())] for r in range(world)]
    cpu = _run(wires, case, False)
    wires = [[(lb.to(DEV), None if bad is None else bad.to(DEV)) for lb, bad in w] for w in wires]
    assert fused_passes([_Piece(lb, bad, 0, 0, lb.shape[1], 1) for lb, bad in wires[0]]) is wire_triton
    fast = _run(wires, case, True)
    for (bits, stats, limbs), (want, want_stats, want_limbs) in zip(fast, cpu):
        assert torch.equal(bits.cpu(), want) and stats == want_stats
        assert all(torch.equal(a.cpu(), b) for a, b in zip(limbs, want_limbs))
