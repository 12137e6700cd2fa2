"""Walsh-Hadamard butterflies: exactness, agreement with the float64 matrix, block variant, orthogonality."""
from __future__ import annotations

import pytest
import torch

from kernels.digest import bits_equal
from kernels.ref import philox
from kernels.ref.hadamard import block_hadamard, block_size, fwht, inverse_block_scale, next_pow2, padded_length

U32 = 2.0 ** -24  # float32 unit roundoff


def sylvester(n: int) -> torch.Tensor:
    """float64 Sylvester Hadamard matrix H_n = H_2 kron H_{n/2}, built independently of the butterflies."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def block_matrix(n: int, block: int = 256) -> torch.Tensor:
    """float64 [n, padded] matrix of the zero-padded block-diagonal transform."""
    b, p = block_size(n, block), padded_length(n, block)
    return torch.block_diag(*[sylvester(b)] * (p // b))[:n]


def small_ints(seed: int, shape) -> torch.Tensor:
    return torch.round(philox.uniform(seed, 0, shape) * 16.0 - 8.0) + 0.0  # + 0.0: no -0 (bits compare)


@pytest.mark.parametrize("n", [1, 2, 8, 64, 256])
def test_twice_is_n_identity_exactly_for_integers(n):
    x = small_ints(1, (5, n))  # |x| <= 8: every partial sum < 8 n^2 << 2^24, so every add is exact
    assert bits_equal(fwht(fwht(x)), x * float(n))


def test_matches_float64_matrix_within_float32_rounding():
    n = 512
    x = philox.normal(2, 0, (16, n))
    got = fwht(x).double()
    ref = x.double() @ sylvester(n)
    # log2(n) rounded stages, each error <= u * (partial sum of |x|) <= u * sum|x|
    bound = 9 * U32 * x.double().abs().sum(dim=1, keepdim=True)
    assert torch.all((got - ref).abs() <= bound)


def test_any_dim_and_float64():
    x = philox.normal(3, 0, (4, 32, 3)).double()
    ref = torch.einsum("anc,nm->amc", x, sylvester(32))
    assert torch.allclose(fwht(x, dim=1), ref, rtol=0, atol=1e-12)


def test_orthogonality():
    for n in (4, 128):
        h = fwht(torch.eye(n))  # rows of H (exact: entries are +-1)
        assert bits_equal(h.double(), sylvester(n))
        assert torch.equal(h.double() @ h.double().t(), n * torch.eye(n, dtype=torch.float64))


@pytest.mark.parametrize("n,block,b,p", [(100, 256, 128, 128), (300, 256, 256, 512), (1000, 64, 64, 1024),
                                         (5632, 256, 256, 5632), (7, 256, 8, 8)])
def test_block_sizes(n, block, b, p):
    assert (block_size(n, block), padded_length(n, block)) == (b, p)
    assert inverse_block_scale(n, block).item() == 1.0 / b


@pytest.mark.parametrize("n", [100, 300, 512, 777])
def test_block_matches_float64_blockdiag(n):
    x = philox.normal(4, 0, (6, n))
    got = block_hadamard(x, dim=1)
    ref = x.double() @ block_matrix(n)
    assert got.shape == (6, padded_length(n))
    bound = 8 * U32 * x.double().abs().sum(dim=1, keepdim=True)
    assert torch.all((got.double() - ref).abs() <= bound)


def test_block_along_dim0_and_orthogonality():
    n = 300
    x = philox.normal(5, 0, (n, 3, 2))
    got = block_hadamard(x, dim=0)
    ref = torch.einsum("nab,nm->mab", x.double(), block_matrix(n))
    assert got.shape == (512, 3, 2)
    assert torch.allclose(got.double(), ref, rtol=0, atol=1e-4)
    bm = block_hadamard(torch.eye(n), dim=1).double()   # B with zero-padded columns
    assert torch.equal(bm @ bm.t(), 256 * torch.eye(n, dtype=torch.float64))


def test_contraction_identity_float64():
    g, w = philox.normal(6, 0, (5, 300)).double(), philox.normal(6, 1, (300, 7)).double()
    gr, wr = block_hadamard(g, dim=1), block_hadamard(w, dim=0)
    assert torch.allclose((gr @ wr) * (1.0 / 256), g @ w, rtol=0, atol=1e-11)


def test_zero_padding_is_exact():
    x = small_ints(7, (3, 200))
    xp = torch.cat([x, torch.zeros(3, 56)], dim=1)
    assert bits_equal(block_hadamard(x), block_hadamard(xp))


def test_errors_name_op_and_argument():
    with pytest.raises(ValueError, match=r"fwht.*'x'.*power-of-two"):
        fwht(torch.zeros(3, 12))
    with pytest.raises(ValueError, match=r"fwht.*'x'.*dtype"):
        fwht(torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"block_hadamard.*'block'"):
        block_hadamard(torch.zeros(4, 10), block=48)
    assert next_pow2(1) == 1 and next_pow2(5) == 8 and next_pow2(256) == 256
