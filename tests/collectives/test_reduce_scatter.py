import pytest
import torch

from collectives.reduce_scatter import shard_bounds, simulate_all_gather, simulate_reduce_scatter


@pytest.mark.parametrize("world,n", [(1, 5), (2, 7), (3, 100), (4, 1001), (5, 3), (7, 64), (9, 1000)])
def test_reduce_scatter_is_the_ascending_sum_of_matching_slices(world, n, h):
    ps = h.partials(world, n, seed=n + world)
    out = simulate_reduce_scatter(ps)
    bounds = shard_bounds(n, world)
    assert [x.numel() for x in out] == [b - a for a, b in bounds]
    for r, (a, b) in enumerate(bounds):
        assert h.same_bits(out[r], h.left_to_right([p[a:b] for p in ps]))


def test_reduce_scatter_takes_given_sizes(h):
    ps = h.partials(3, 10, seed=4)
    out = simulate_reduce_scatter(ps, [6, 0, 4])
    assert [x.numel() for x in out] == [6, 0, 4]
    assert h.same_bits(out[2], h.left_to_right([p[6:] for p in ps]))
    with pytest.raises(ValueError, match="sizes"):
        simulate_reduce_scatter(ps, [6, 5, -1])


def test_reduce_scatter_order_matters(h):
    """Summing the same slices in descending rank order gives other bits (the check has teeth)."""
    ps = h.partials(6, 3000, seed=3)
    out = simulate_reduce_scatter(ps)
    a, b = shard_bounds(3000, 6)[0]
    assert not h.same_bits(out[0], h.left_to_right([p[a:b] for p in reversed(ps)]))


@pytest.mark.parametrize("world,n", [(1, 4), (3, 10), (4, 1001), (6, 5)])
def test_all_gather_reassembles(world, n, h):
    full = h.partials(1, n, seed=9)[0]
    shards = [full[a:b] for a, b in shard_bounds(n, world)]
    for x in simulate_all_gather(shards):
        assert h.same_bits(x, full)


def test_shard_bounds_follow_tensor_split():
    for n, world in [(10, 3), (3, 5), (0, 2), (16, 4)]:
        sizes = [b - a for a, b in shard_bounds(n, world)]
        assert sizes == [c.numel() for c in torch.tensor_split(torch.arange(n), world)]
    with pytest.raises(ValueError):
        shard_bounds(4, 0)
