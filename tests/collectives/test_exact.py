import pytest
import torch

from collectives.exact import exact_sum
from collectives.treefold import treefold


@pytest.mark.parametrize("block", [1, 7, 1024])
def test_exact_sum_ignores_order_and_grouping(block, h):
    ps = h.partials(7, 3001, seed=block)
    ref = exact_sum(ps, block=block)
    for perm in ([6, 5, 4, 3, 2, 1, 0], [3, 0, 6, 1, 5, 2, 4]):
        assert h.same_bits(exact_sum([ps[i] for i in perm], block=block), ref)
    # the tree order matters for the float fold, not here
    assert not h.same_bits(treefold(ps), treefold([ps[i] for i in [6, 5, 4, 3, 2, 1, 0]]))


def test_exact_sum_is_within_its_bound(h):
    """Per-block grid 2^-46 of the block max: the result is the float64 sum rounded, to float32 precision."""
    ps = h.partials(9, 5000, seed=4)
    exact = torch.stack([p.double() for p in ps]).sum(0)
    got = exact_sum(ps, block=64)
    amax = torch.nn.functional.pad(torch.stack([p.abs() for p in ps]).amax(0), (0, 64 - 5000 % 64))
    blockmax = amax.view(-1, 64).amax(1).repeat_interleave(64)[:5000].double()
    ulp = torch.finfo(torch.float32).eps * exact.abs()
    assert bool(((got.double() - exact).abs() <= 0.5 * ulp + 9 * 2.0 ** -46 * blockmax * 2).all())


def test_exact_sum_keeps_zeros_and_shapes():
    z = torch.zeros(3, 5)
    out = exact_sum([z, z, z])
    assert out.shape == (3, 5) and bool((out == 0).all())


def test_non_finite_inputs_raise():
    x = torch.zeros(10)
    x[3] = float("inf")
    with pytest.raises(ValueError):
        exact_sum([x, torch.zeros(10)])
    with pytest.raises(ValueError):
        exact_sum([torch.zeros(2)] * 3, headroom=1)
