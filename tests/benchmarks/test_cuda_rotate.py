"""benchmarks/cuda_rotate.cu's butterfly schedules in torch on the CPU: the row kernel's (in-lane stages, then lane
exchanges by XOR shuffles) and the column kernel's (the other way round) give the reference's Hadamard bits, so
CUDA kernels with these pairings can give them too."""
from __future__ import annotations

import torch

from benchmarks.cuda_rotate import lane_schedule_fwht
from kernels.ref import philox
from kernels.ref.hadamard import block_hadamard
from kernels.ref.fixed import pow2


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_the_lane_schedule_gives_the_reference_bits():
    n = 64
    x = philox.normal(3, 0, (n, 256))
    x = x * pow2(philox.random_bits(3, 1, n * 256).reshape(n, 256) % 41 - 20).to(torch.float32)  # rounding in every stage
    x[0, :] = 3.0e38  # overflow to inf, then inf - inf: NaN where the reference has it
    x[1, :] = -0.0
    assert _bits_equal(lane_schedule_fwht(x), block_hadamard(x, dim=1, block=256))


def test_the_upper_lane_takes_partner_minus_own():
    """A schedule that took own - partner on the upper lane flips signs: the test above would see it."""
    x = torch.zeros(1, 256)
    x[0, 0] = 1.0  # H e_0 = all ones
    assert torch.equal(lane_schedule_fwht(x), torch.ones(1, 256))
    x = torch.zeros(1, 256)
    x[0, 255] = 1.0  # H e_255 = the last row of H: signs (-1)^popcount(j)
    signs = torch.tensor([(-1.0) ** bin(j).count("1") for j in range(256)])
    assert torch.equal(lane_schedule_fwht(x)[0], signs)


def test_the_column_kernels_schedule_gives_the_reference_bits():
    from benchmarks.cuda_rotate import column_schedule_fwht

    n = 64
    x = philox.normal(4, 0, (n, 256))
    x = x * pow2(philox.random_bits(4, 1, n * 256).reshape(n, 256) % 41 - 20).to(torch.float32)
    x[0, :] = 3.0e38
    assert _bits_equal(column_schedule_fwht(x), block_hadamard(x, dim=1, block=256))
