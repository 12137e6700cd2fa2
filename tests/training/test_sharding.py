"""HSDP without Ray: the flat layout, the sharded norm, and whole sharded steps on ranks simulated by threads (and
whole unsharded steps, whose exact sums meet on the compact wire, on the same threads).

The threads' collectives are the collectives package's one-process simulations (the same sums in the same
order as its gloo versions), so a step run by R x S threads must give the one-process bits on topology RxS."""
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
import torch

import stream
from training.config import Topology
from training.errors import ConfigError
from training.init import init_params
from training.sharding import FlatLayout, Shard, sharded_l2_norm
from training.state_hash import state_entries, state_hash
from training.step import StepContext, TrainState, run_step
from collectives import shard_bounds, simulate_allreduce, simulate_reduce_scatter
from collectives.allreduce import narrow, widen
from kernels.ref.reduce import global_l2_norm


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def fits(t: torch.Tensor, width: int | None) -> torch.Tensor:
    """t, after checking that a packed wire of `width` bytes an element carries it unchanged (what a sum's inputs and
    result must do; CollectiveGroup's wire assumes it, tests/collectives/test_allreduce.py checks the wire)."""
    if width is not None:
        assert torch.equal(widen(narrow(t, width)), t), f"values outside {width}-byte two's complement"
    return t


class Hub:
    """k threads meet: each gives a value, each gets every value (in rank order)."""

    def __init__(self, k: int) -> None:
        self.k, self.slots = k, [None] * k
        self.barrier = threading.Barrier(k, timeout=120)

    def swap(self, rank: int, value) -> list:
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


class Sub:
    """A CollectiveGroup stand-in for one thread: the collectives package's simulations over a Hub."""

    def __init__(self, hub: Hub, rank: int) -> None:
        self.hub, self.rank, self.world = hub, rank, hub.k

    def _all(self, t: torch.Tensor) -> list[torch.Tensor]:
        return self.hub.swap(self.rank, t.detach().clone())

    def reduce_scatter(self, t, sizes=None):
        return simulate_reduce_scatter(self._all(t), sizes)[self.rank]

    def all_gather(self, shard, numel):
        return torch.cat([x.reshape(-1) for x in self._all(shard)])

    def gather(self, shard, numel, dst=0):
        full = self.all_gather(shard, numel)
        return full if self.rank == dst else None

    def all_reduce_(self, t):
        return t.copy_(simulate_allreduce(self._all(t))[self.rank])

    def all_reduce_sum_(self, t, width=None):
        return fits(self.all_reduce_(fits(t, width)), width)

    def all_reduce_max_(self, t):
        return t.copy_(torch.stack(self._all(t)).amax(0))


class Rank:
    """run_step's group protocol (rank, world, all_reduce_sum_, all_reduce_max_, all_gather, mesh) for one thread of
    R x S."""

    def __init__(self, rank: int, hubs: dict) -> None:
        self.rank, self.world, self.hubs = rank, hubs["world"].k, hubs

    def all_reduce_sum_(self, t, width=None):
        parts = self.hubs["world"].swap(self.rank, fits(t, width).clone())
        fits(t.copy_(simulate_allreduce(parts)[self.rank]), width)

    def all_reduce_max_(self, t):
        t.copy_(torch.stack(self.hubs["world"].swap(self.rank, t.clone())).amax(0))

    def all_gather(self, obj) -> list:
        return self.hubs["world"].swap(self.rank, obj)

    def mesh(self, dp_shard: int):
        r, s = divmod(self.rank, dp_shard)
        return Sub(self.hubs["replica"][r], s), Sub(self.hubs["shard"][s], r)


def run_threads(world: int, body, hubs: list[Hub]) -> list:
    """body(rank) on `world` threads; the first error aborts every barrier and is raised."""
    def guarded(rank):
        try:
            return body(rank)
        except BaseException:
            for h in hubs:
                h.barrier.abort()
            raise

    with ThreadPoolExecutor(world) as pool:
        futures = [pool.submit(guarded, r) for r in range(world)]
        return [f.result() for f in futures]


# -- the layout ------------------------------------------------------------------------------------------------
def test_layout_pieces_cover_the_flat_vector_in_sorted_order():
    ts = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.arange(10.0, 14.0), "c": torch.arange(20.0, 27.0)}
    lay = FlatLayout.of(ts)
    assert lay.names == ("a", "b", "c") and lay.offsets == (0, 4, 10, 17) and lay.numel == 17
    flat = torch.cat([ts[k].reshape(-1) for k in lay.names])
    for world in (1, 2, 3, 5, 17, 20):
        got = []
        for s in range(world):
            lo, hi = lay.bounds(s, world)
            assert (lo, hi) == shard_bounds(17, world)[s]
            ps = lay.pieces(lo, hi)
            assert sum(p.hi - p.lo for p in ps) == hi - lo and [p.at for p in ps] == sorted(p.at for p in ps)
            piece = lay.take(ts, lo, hi)
            assert torch.equal(piece, flat[lo:hi])
            got.append(piece)
        assert torch.equal(torch.cat(got), flat)
    assert [(p.name, p.lo, p.hi, p.at) for p in lay.pieces(3, 12)] == [("a", 3, 4, 0), ("b", 0, 6, 1),
                                                                       ("c", 0, 2, 7)]


def test_layout_round_trips_bf16_through_float32():
    g = torch.Generator().manual_seed(1)
    ts = {"w": torch.randn(5, 7, generator=g).to(torch.bfloat16), "s": torch.randn(3, generator=g)}
    lay = FlatLayout.of(ts)
    flat = lay.take(ts, 0, lay.numel)
    back = {k: torch.zeros_like(v) for k, v in ts.items()}
    lay.put(flat, back)
    assert all(same(back[k], ts[k]) for k in ts)
    split = lay.split(flat)
    assert list(split) == ["s", "w"] and split["w"].shape == (5, 7) and split["w"].dtype == torch.float32
    assert same(split["w"].to(torch.bfloat16), ts["w"])


# -- the sharded norm ------------------------------------------------------------------------------------------
def _tensors(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 5), (1,), (64,), (7, 9), (2, 2, 3)]
    # magnitudes from 2^-30 to 2^20: the one fixed-point scale comes from the largest square of all tensors
    return [torch.randn(s, generator=g) * torch.exp2(torch.randint(-30, 20, s, generator=g).float()) for s in shapes]


def _sharded(tensors: list[torch.Tensor], cuts: list[int]) -> list[torch.Tensor]:
    """The norm on len(cuts) - 1 simulated ranks, rank i holding flat[cuts[i]:cuts[i + 1]]."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    hub = Hub(len(cuts) - 1)
    return run_threads(hub.k, lambda r: sharded_l2_norm(flat[cuts[r]:cuts[r + 1]], flat.numel(), Sub(hub, r)), [hub])


@pytest.mark.parametrize("case", ["finite", "inf", "nan", "inf+nan", "zeros", "one-huge"])
def test_sharded_norm_has_global_l2_norms_bits(case):
    ts = _tensors(3)
    n = sum(t.numel() for t in ts)
    if case == "inf":
        ts[3][2, 4] = float("-inf")
    elif case == "nan":
        ts[0][1, 1] = float("nan")
    elif case == "inf+nan":
        ts[1][0] = float("inf")
        ts[4][1, 1, 2] = float("nan")
    elif case == "zeros":
        ts = [torch.zeros_like(t) for t in ts]
    elif case == "one-huge":
        ts[2][5] = 3.0e38
    ref = global_l2_norm(ts)
    # shard boundaries inside tensors, on tensor edges, an empty slice, a one-element slice
    for cuts in ([0, n], [0, 7, 15, 16, 80, n], [0, 0, 44, 45, n], [0, *[b for _, b in shard_bounds(n, 3)]]):
        for got in _sharded(ts, cuts):
            assert same(got, ref), (case, cuts, got, ref)


# -- whole steps on simulated ranks ----------------------------------------------------------------------------
STEPS = 2  # the second step starts from the slices the first one left
BUCKET = 1 << 16  # the tiny model's gradients in several buckets (training/overlap.py), each reduced on its own


@pytest.fixture(scope="module")
def four(tiny):
    """Single-window microbatches, 4 windows per step: 1x2 and 2x2 both divide every step."""
    return tiny.replace(**{"train.micro_batch": 1, "train.batch_phases": ((1 << 50, 4),)})


def _tokens(cfg, ctx) -> list[torch.Tensor]:
    s = stream.open_stream(cfg.train.corpus, seq_len=cfg.model.seq_len, seed=cfg.train.seed)
    return [torch.from_numpy(s.windows(*ctx.batch.window_range(i))).to(torch.int64) for i in range(STEPS)]


def _result(r) -> dict:
    return {k: v for k, v in r.__dict__.items() if k not in ("digest_seconds", "memo")}


def _one_process(cfg, topo: Topology) -> tuple:
    """(context, tokens, end state, [(result fields, state hash)] per step) of the one-process run on `topo`."""
    ctx = StepContext.build(cfg)
    tokens = _tokens(cfg, ctx)
    one = TrainState.fresh(init_params(cfg.model, cfg.train.seed))
    want = []
    for i in range(STEPS):
        r = run_step(one, tokens[i], topo, ctx)
        want.append((_result(r), state_hash(state_entries(one, "{}", "c", {}))))
    return ctx, tokens, one, want


def test_threaded_2x2_steps_equal_the_one_process_steps(four, one_thread):
    """Four rank threads, two replicas of two shards (tests/training/test_ray_hsdp.py runs 1x2 and 2x2 on Ray)."""
    topo = Topology(2, 2)
    ctx, tokens, one, want = _one_process(four, topo)

    hubs = {"world": Hub(topo.world), "replica": [Hub(topo.dp_shard) for _ in range(topo.dp_replicate)],
            "shard": [Hub(topo.dp_replicate) for _ in range(topo.dp_shard)]}
    every = [hubs["world"], *hubs["replica"], *hubs["shard"]]

    bucketed = replace(ctx, bucket_elements=BUCKET)

    def rank(r: int):
        st = TrainState.fresh(init_params(four.model, four.train.seed))
        got = []
        for i in range(STEPS):
            res = run_step(st, tokens[i], topo, bucketed, Rank(r, hubs))
            got.append((_result(res), state_hash(state_entries(st, "{}", "c", {})) if r == 0 else None))
        return got, st

    out = run_threads(topo.world, rank, every)
    assert set(want[0][0]["digests"]) == {"forward", "backward", "reduced", "clipped", "optimizer"}
    assert out[0][0] == want  # rank 0: every result field (stage digests included) and the state hash
    for r, (got, st) in enumerate(out[1:], 1):
        assert [g["digests"] for g, _ in got] == [{}] * STEPS  # the others hold slices only: no digests
        assert [{k: v for k, v in g.items() if k != "digests"} for g, _ in got] == \
               [{k: v for k, v in w.items() if k != "digests"} for w, _ in want]
        assert isinstance(st.shard, Shard) and st.m == {} and st.grads == {}
        assert all(same(st.params[k], one.params[k]) for k in one.params)  # full parameters everywhere
        with pytest.raises(ValueError, match="slice"):
            state_entries(st, "{}", "c", {})
        with pytest.raises(ConfigError, match="slice of the optimizer state"):
            run_step(st, tokens[0], Topology(1, 1), ctx)


def test_threaded_3x1_steps_equal_the_one_process_steps(four, one_thread):
    """Three rank threads without HSDP (owning 2, 1 and 1 of each step's 4 windows): the exact sums meet on the
    compact wire, and every rank gets the one-process results and state hash of topology 3x1. The ranks run
    microbatches of 2 windows, the one process single windows: rank 0's hooks take two windows' gradients of
    every tensor in one backward, and the cut changes no bit."""
    topo = Topology(3, 1)
    ctx, tokens, _, want = _one_process(four, topo)
    hubs = {"world": Hub(topo.world)}
    bucketed = replace(ctx, cfg=four.replace(**{"train.micro_batch": 2}), bucket_elements=BUCKET)

    def rank(r: int):
        st = TrainState.fresh(init_params(four.model, four.train.seed))
        return [(_result(run_step(st, tokens[i], topo, bucketed, Rank(r, hubs))),
                 state_hash(state_entries(st, "{}", "c", {}))) for i in range(STEPS)]

    out = run_threads(topo.world, rank, [hubs["world"]])
    assert out == [want] * topo.world
