"""The canonical reduction: exact mode is order- and topology-free; ordered mode is the report's Algorithm 1."""
import itertools
from fractions import Fraction

import pytest
import torch

from training.config import Topology
from training.errors import ConfigError
from training.reduction import Coord, ExactSum, mesh_order, reduce_gradients
from kernels.digest import bits_equal
from kernels.ref import philox


def _draw(i: int, n: int = 257, scale_exp: int = 0) -> torch.Tensor:
    """Partial i: Philox normals with magnitudes spread over 2^-30 .. 2^10 (stress for reduction order)."""
    z = philox.normal(7, 100 + i, (n,))
    e = (philox.random_bits(7, 200 + i, n) % 41).to(torch.int64) - 30 + scale_exp
    return (z.to(torch.float64) * torch.ldexp(torch.ones(n, dtype=torch.float64), e)).to(torch.float32)


def test_exact_sum_is_the_correctly_rounded_sum_in_every_order():
    parts = [_draw(i, 9) for i in range(6)]
    ref = [sum(Fraction(float(p[j])) for p in parts) for j in range(9)]
    outs = []
    for perm in itertools.islice(itertools.permutations(range(6)), 0, 720, 97):
        s = ExactSum((9,), "cpu")
        for i in perm:
            s.add(parts[i])
        outs.append(s.result())
    for o in outs[1:]:
        assert bits_equal(o, outs[0])
    for j in range(9):
        assert float(outs[0][j]) == float(torch.tensor(float(ref[j]), dtype=torch.float32))


@pytest.mark.parametrize("k", [1, 2, 4, 5, 8, 9])
def test_every_count_of_partials_around_the_pending_batch(k):
    """Partials wait in batches before they enter the limbs: a sum read with 1 partial, a full batch, a batch and
    one more (the limbs and a lone pending partial), two batches, ... is the correctly rounded sum each time."""
    parts = [_draw(i, 9) for i in range(k)]
    s = ExactSum((9,), "cpu")
    for p in parts:
        s.add(p)
    got = s.result()
    for j in range(9):
        assert float(got[j]) == float(torch.tensor(float(sum(Fraction(float(p[j])) for p in parts)),
                                                   dtype=torch.float32)), (k, j)


def test_exact_sum_merge_equals_one_accumulator_and_cancels_exactly():
    a, b, c = _draw(1), _draw(2), _draw(3)
    one = ExactSum(a.shape, "cpu")
    for t in (a, b, c, -a):
        one.add(t)
    left, right = ExactSum(a.shape, "cpu"), ExactSum(a.shape, "cpu")
    left.add(a), left.add(b)
    right.add(c), right.add(-a)
    right.merge(left)
    assert bits_equal(one.result(), right.result())
    assert bits_equal(one.result(), (ExactSum_of(b, c)))


def ExactSum_of(*ts):  # noqa: N802
    s = ExactSum(ts[0].shape, "cpu")
    for t in ts:
        s.add(t)
    return s.result()


def test_exact_sum_propagates_non_finite_and_out_of_range():
    s = ExactSum((4,), "cpu")
    s.add(torch.tensor([float("nan"), float("inf"), 2.0 ** 25, 1.0]))
    s.add(torch.tensor([1.0, 1.0, 1.0, float("-inf")]))
    out = s.result()
    assert torch.isnan(out[0]) and out[1] == float("inf") and out[2] == float("inf") and out[3] == float("-inf")


def test_a_cpu_sum_taken_in_chunks_has_the_bits_of_one_taken_whole(monkeypatch):
    """A CPU accumulation goes a chunk of elements at a time; where the chunks end changes no bit, with
    out-of-range and non-finite elements in several chunks."""
    from kernels.ref import chunks

    x = philox.normal(3, 0, (4, 301))
    parts = [x * 1e6, x.flip(1) * 1e-30, x.roll(7)]
    parts[0][0, 5], parts[1][2, 200], parts[2][3, 300] = float("inf"), float("nan"), 2.0 ** 25
    parts[2][1, 0] = float("-inf")

    def total() -> torch.Tensor:
        s = ExactSum((4, 301), "cpu")
        for p in parts:
            s.add(p)
        return s.result(1 / 3)

    whole = total()
    monkeypatch.setattr(chunks, "CPU_CHUNK", 7)
    assert bits_equal(total(), whole) and torch.isnan(whole[2, 200]) and whole[3, 300] == float("inf")


def test_every_nan_sum_is_the_one_quiet_nan():
    """inf - inf in float64 is a negative NaN on x86 and a positive one on ARM and CUDA, and a NaN partial keeps
    its own payload: in any order of the adds, every NaN element of a sum has NAN_BITS."""
    from collectives.limbs import NAN_BITS

    odd = torch.tensor([-1], dtype=torch.int32).view(torch.float32)  # a NaN with sign and payload set
    parts = [torch.tensor([float("inf"), 1.0, float("inf")]), torch.tensor([float("-inf"), odd.item(), 2.0]),
             torch.cat([odd, torch.tensor([3.0, float("-inf")])])]
    for order in ([0, 1, 2], [2, 1, 0], [1, 0, 2]):
        out = ExactSum_of(*(parts[i] for i in order))
        assert out.view(torch.int32).tolist() == [NAN_BITS] * 3, order


def _partials(topo: Topology, accum: int, per_window: list[torch.Tensor]):
    """Partials in mesh order, window m of the step owned by rank m % world (single-window microbatches)."""
    world = topo.world
    for c in mesh_order(topo, accum):
        rank = c.replica * topo.dp_shard + c.shard
        yield c, {"w": per_window[rank + c.micro * world]}


@pytest.mark.parametrize("shape", [(1, 1), (2, 1), (1, 2), (2, 2), (4, 2), (1, 8), (8, 1)])
def test_exact_mode_bits_do_not_depend_on_the_topology(shape):
    per_window = [_draw(i) for i in range(8)]
    ref = reduce_gradients(_partials(Topology(1, 1), 8, per_window), Topology(1, 1), mesh_order(Topology(1, 1), 8), "exact")["w"]
    topo = Topology(*shape)
    got = reduce_gradients(_partials(topo, 8 // topo.world, per_window), topo, mesh_order(topo, 8 // topo.world), "exact")["w"]
    assert bits_equal(got, ref)


def _algorithm_1(topo: Topology, accum: int, per_window: list[torch.Tensor]) -> torch.Tensor:
    """The report's Algorithm 1, written out independently: ordered micro sums, ascending shards, TreeFold."""
    from collectives import treefold

    world = topo.world
    inv = lambda n: torch.tensor(1.0 / n, dtype=torch.float32)  # noqa: E731
    replicas = []
    for r in range(topo.dp_replicate):
        inner = None
        for s in range(topo.dp_shard):
            rank = r * topo.dp_shard + s
            g = per_window[rank]
            for a in range(1, accum):
                g = g + per_window[rank + a * world]
            g = g * inv(accum) if accum > 1 else g
            inner = g if inner is None else inner + g
        replicas.append(inner * inv(topo.dp_shard) if topo.dp_shard > 1 else inner)
    out = treefold(replicas)
    return out * inv(topo.dp_replicate) if topo.dp_replicate > 1 else out


@pytest.mark.parametrize("shape", [(1, 1), (2, 1), (1, 2), (2, 2), (3, 1), (1, 3), (3, 2), (5, 1), (7, 1)])
def test_ordered_mode_is_algorithm_1(shape):
    topo = Topology(*shape)
    per_window = [_draw(i) for i in range(topo.world * 2)]
    got = reduce_gradients(_partials(topo, 2, per_window), topo, mesh_order(topo, 2), "ordered")["w"]
    assert bits_equal(got, _algorithm_1(topo, 2, per_window))


def test_ordered_mode_depends_on_the_topology_as_designed():
    per_window = [_draw(i) for i in range(12)]

    def red(r, s):
        topo = Topology(r, s)
        acc = 12 // topo.world
        return reduce_gradients(_partials(topo, acc, per_window), topo, mesh_order(topo, acc), "ordered")["w"]

    # a fold over replicas and one over shards add the same pair (or triple) in the same order
    assert bits_equal(red(2, 1), red(1, 2)) and bits_equal(red(3, 1), red(1, 3))
    # a different ownership changes which windows each rank sums, and the order of the adds
    assert not bits_equal(red(1, 1), red(2, 1)) and not bits_equal(red(2, 1), red(3, 1))
    exact = reduce_gradients(_partials(Topology(1, 1), 12, per_window), Topology(1, 1), mesh_order(Topology(1, 1), 12), "exact")["w"]
    for shape in [(1, 1), (2, 1), (3, 1), (2, 3)]:
        assert torch.allclose(red(*shape), exact, rtol=1e-5, atol=1e-6)


def test_partials_out_of_mesh_order_are_refused():
    per_window = [_draw(i) for i in range(4)]
    bad = [(Coord(0, 1, 0), {"w": per_window[0]}), (Coord(0, 0, 0), {"w": per_window[1]})]
    with pytest.raises(ConfigError, match="mesh order"):
        reduce_gradients(iter(bad), Topology(1, 2), mesh_order(Topology(1, 2), 1), "exact")
    with pytest.raises(ConfigError, match="partials"):
        reduce_gradients(iter(bad[1:]), Topology(1, 2), mesh_order(Topology(1, 2), 1), "ordered")


def test_one_partial_takes_the_short_path_with_the_limbs_bits():
    g = _draw(5, 4099)
    g[:6] = torch.tensor([-2.0 ** -97, 3 * 2.0 ** -98, -5 * 2.0 ** -98, 2.0 ** -120, -(2.0 ** 23), float("nan")])
    short = ExactSum(g.shape, "cpu")
    short.add(g)
    long = ExactSum(g.shape, "cpu")
    long.add(g)
    long.add(torch.zeros_like(g))  # forces the limbs
    for scale in (1.0, 1.0 / 3):
        assert bits_equal(short.result(scale), long.result(scale))


@pytest.mark.parametrize("world", [3, 5, 7, 11])
def test_uneven_ranks_and_short_microbatches_reduce_one_partial_per_window(world):
    """8 windows on `world` ranks, microbatches of up to 2 windows: ranks own different counts (or none), some
    microbatches hold one window. Every window is a partial of its own, so the result is the correctly rounded
    mean over the 8 windows, whatever the split; `ordered` needs the same count on every rank."""
    from training.reduction import window_coords
    from training.step import microbatch_plan

    import stream

    per_window = [_draw(i, 9) for i in range(8)]
    batch = stream.BatchSchedule(64, (stream.BatchPhase(1 << 40, 8),))
    topo = Topology(world, 1)
    plan = microbatch_plan(0, topo, 2, batch)
    coords = window_coords(plan)
    assert len(coords) == 8 and len(set(coords)) == 8
    parts = [(c, {"w": per_window[w]}) for c, w in zip(coords, [w for _, ws in plan for w in ws])]
    got = reduce_gradients(iter(parts), topo, coords, "exact")["w"]
    for j in range(9):
        want = sum(Fraction(float(g[j])) for g in per_window) / 8
        assert float(got[j]) == float(torch.tensor(float(want), dtype=torch.float32))
    with pytest.raises(ConfigError, match="ordered"):
        reduce_gradients(iter(parts), topo, coords, "ordered")
