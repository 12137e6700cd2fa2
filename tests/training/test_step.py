"""The step on virtual topologies, and the spike protocol."""
import pytest
import torch

import stream
from training.config import Topology, TrainConfig
from training.errors import ConfigError
from training.init import init_params
from training.optim import SpikeState, spike_decision
from training.state_hash import state_entries, state_hash
from training.reduction import window_coords
from training.step import StepContext, TrainState, microbatch_plan, run_step

SHAPES = [(1, 1), (2, 1), (1, 2), (2, 2), (4, 2)]


def _run(cfg, topo: Topology, steps: int = 2) -> list[tuple[dict, str]]:
    """(stage digests and scalars, state hash) per step on `topo`."""
    ctx = StepContext.build(cfg)
    st = TrainState.fresh(init_params(cfg.model, cfg.train.seed))
    s = stream.open_stream(cfg.train.corpus, seq_len=cfg.model.seq_len, seed=cfg.train.seed)
    out = []
    for _ in range(steps):
        lo, hi = ctx.batch.window_range(st.step)
        r = run_step(st, torch.from_numpy(s.windows(lo, hi)).to(torch.int64), topo, ctx)
        rec = {k: v for k, v in r.__dict__.items() if k not in ("topology", "accum", "digest_seconds", "memo")}
        out.append((rec, state_hash(state_entries(st, "{}", "c", {})).hex()))
    return out


@pytest.fixture(scope="module")
def eight(tiny):
    """tiny with single-window microbatches and 8 windows per step: every shape in SHAPES divides it."""
    return tiny.replace(**{"train.micro_batch": 1, "train.batch_phases": ((1 << 40, 8),)})


@pytest.mark.slow
def test_exact_reduction_gives_the_same_bits_on_every_topology(eight):
    ref = _run(eight, Topology(1, 1), 1)
    for shape in SHAPES[1:]:
        assert _run(eight, Topology(*shape), 1) == ref, shape


@pytest.mark.slow
def test_ordered_reduction_matches_where_the_fold_is_the_same(eight):
    cfg = eight.replace(**{"train.reduction": "ordered"})
    a, b, one = _run(cfg, Topology(2, 1), 1), _run(cfg, Topology(1, 2), 1), _run(cfg, Topology(1, 1), 1)
    assert a == b  # replicas folded by TreeFold or shards added in order: the same single pair
    assert a[0][1] != one[0][1]  # 1x1 sums the 8 windows in another order
    assert a[0][0]["digests"]["forward"] == one[0][0]["digests"]["forward"]  # ...the forward passes are the same
    assert a[0][0]["digests"]["backward"] == one[0][0]["digests"]["backward"]  # ...and so are the partials


def test_microbatch_plan_follows_window_ownership(eight):
    batch = stream.BatchSchedule(64, (stream.BatchPhase(1 << 40, 8),))
    plan = microbatch_plan(3, Topology(2, 2), 2, batch)
    assert [(c.replica, c.shard, c.micro, w) for c, w in plan] == [
        (0, 0, 0, [24, 28]), (0, 1, 0, [25, 29]), (1, 0, 0, [26, 30]), (1, 1, 0, [27, 31])]
    assert [(c.replica, c.shard, c.micro) for c in window_coords(plan)] == [  # a partial per window
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    # any world: 8 windows on 3 ranks own 3, 3 and 2; cut by 2, rank 0 and 1 run a full and a short microbatch
    plan = microbatch_plan(0, Topology(3, 1), 2, batch)
    assert [(c.replica, c.micro, w) for c, w in plan] == [(0, 0, [0, 3]), (0, 2, [6]), (1, 0, [1, 4]), (1, 2, [7]),
                                                          (2, 0, [2, 5])]
    assert [(c.replica, c.micro) for c in window_coords(plan)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2),
                                                                   (2, 0), (2, 1)]
    # more ranks than windows: ranks 8 and 9 own none and run nothing
    plan = microbatch_plan(0, Topology(10, 1), 1, batch)
    assert [(c.replica, w) for c, w in plan] == [(r, [r]) for r in range(8)]


def test_spike_protocol_skips_the_trigger_and_four_more():
    cfg = TrainConfig()
    sp = SpikeState()
    norms = [0.5, 6.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, float("nan"), 0.5, 7.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    applied = [spike_decision(n, sp, cfg)[0] for n in norms]
    assert applied == [True, False, False, False, False, False, True, True, False, False, False, False, False, False,
                       False, True, True]  # a trigger inside the window (step 10) re-arms it to five
    assert (sp.events, sp.skipped, sp.remaining) == (3, 12, 0)
    assert spike_decision(5.0, SpikeState(), cfg)[0]  # "exceeds": 5.0 itself is applied


def test_training_refuses_to_reach_the_held_out_slice(tiny, tmp_path):
    from training.train import TrainOptions, train

    with pytest.raises(ConfigError, match="heldout_window"):
        train(tiny, tmp_path / "r", TrainOptions(steps=2000, progress=False))
