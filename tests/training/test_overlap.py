"""The bucketed reduction of real groups (training/overlap.py): buckets in the backward's order, handed over while
the last local backward still runs, and the one-process bits. Claims about order read the recorded events, never
their times."""
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
import torch

import stream
from training.config import Topology
from training.errors import ConfigError
from training.init import init_params
from training.overlap import bucket_plan
from training.state_hash import state_entries, state_hash
from training.step import StepContext, TrainState, run_step
from collectives import simulate_allreduce

BUCKET = 1 << 16  # the tiny model in 5 buckets


class Pair:
    """Two rank threads' group (run_step's protocol): every collective is the collectives package's simulation."""

    def __init__(self, barrier: threading.Barrier, slots: list, rank: int) -> None:
        self.barrier, self.slots, self.rank, self.world = barrier, slots, rank, 2

    def _all(self, x) -> list:
        self.slots[self.rank] = x
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out

    def all_reduce_sum_(self, t, width=None):
        return t.copy_(simulate_allreduce(self._all(t.clone()))[self.rank])

    def all_reduce_max_(self, t):
        return t.copy_(torch.stack(self._all(t.clone())).amax(0))

    def all_gather(self, obj) -> list:
        return self._all(obj)


def test_buckets_cut_whole_tensors_in_the_given_order():
    numel = {"a": 5, "b": 3, "c": 10, "d": 1, "e": 1}
    assert bucket_plan(numel, ["e", "c", "b", "a", "d"], 4) == [("e", "c"), ("b", "a"), ("d",)]
    assert bucket_plan(numel, "abcde", 100) == [tuple("abcde")]
    assert bucket_plan(numel, "abcde", 1) == [(k,) for k in "abcde"]
    with pytest.raises(ConfigError, match="bucket_elements"):
        bucket_plan(numel, "abcde", 0)


@pytest.fixture(scope="module")
def four(tiny):
    """Four single-window microbatches a step: on 2 ranks, the hooks act on each rank's second backward only."""
    return tiny.replace(**{"train.micro_batch": 1, "train.batch_phases": ((1 << 50, 4),)})


def test_buckets_are_reduced_while_the_backward_runs(four, one_thread):
    """Two rank threads on 2x1. Deep in each rank's last backward (a gradient of the third bucket or later) its hook
    waits until its communication thread has started bucket 0: a reduction that waited for the whole backward never
    starts it, and the recorded order below fails."""
    ctx = StepContext.build(four)
    s = stream.open_stream(four.train.corpus, seq_len=four.model.seq_len, seed=four.train.seed)
    tokens = torch.from_numpy(s.windows(*ctx.batch.window_range(0))).to(torch.int64)
    topo = Topology(2, 1)
    barrier, slots = threading.Barrier(2, timeout=120), [None, None]

    def rank(r: int):
        started, events, waited = threading.Event(), [], []

        def observe(event: str, bucket: int) -> None:
            events.append((event, bucket))
            if event == "start" and bucket == 0:
                started.set()
            if event == "gradient" and bucket >= 2 and not waited:
                waited.append(started.wait(timeout=60))

        st = TrainState.fresh(init_params(four.model, four.train.seed))
        try:
            run_step(st, tokens, topo, replace(ctx, bucket_elements=BUCKET, observer=observe), Pair(barrier, slots, r))
        except BaseException:
            barrier.abort()
            raise
        return st, events, waited

    with ThreadPoolExecutor(2) as pool:
        out = [f.result() for f in [pool.submit(rank, r) for r in range(2)]]
    # the bits against one process: tests/training/test_sharding.py (the same buckets, 3x1 and 2x2)
    assert state_hash(state_entries(out[0][0], "{}", "c", {})) == state_hash(state_entries(out[1][0], "{}", "c", {}))
    for st, events, waited in out:
        assert waited == [True]
        names = [e for e, _ in events]
        buckets = max(b for e, b in events if e == "ready") + 1
        assert buckets > 4
        assert [b for e, b in events if e == "backward_end"] == [0, 1]
        assert events.index(("start", 0)) < events.index(("backward_end", 1))  # inside the last backward
        assert [b for e, b in events if e == "ready"] == list(range(buckets))  # handed over in order, once each
        assert [b for e, b in events if e == "start"] == list(range(buckets))
        for b in range(buckets):  # each bucket after its last gradient, reduced after it was handed over
            last_grad = max(i for i, ev in enumerate(events) if ev == ("gradient", b))
            assert last_grad < events.index(("ready", b)) < events.index(("start", b)) < events.index(("done", b))
        assert names.count("gradient") == len(st.params)  # only the last microbatch's backward, each leaf once
