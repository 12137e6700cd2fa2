"""The bucketed reduction of real groups (training/overlap.py): buckets in the backward's order, handed over while
the last local backward still runs, and the one-process bits. Claims about order read the recorded events, never
their times."""
import threading
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

BUCKET = 1 << 16  # the tiny model in a dozen buckets


class One:
    """A real group of one rank (run_step's group protocol): every collective is the identity."""

    rank, world = 0, 1

    def all_reduce_sum_(self, t):
        return t

    def all_reduce_max_(self, t):
        return t

    def all_gather(self, obj) -> list:
        return [obj]


def test_buckets_cut_whole_tensors_in_the_given_order():
    numel = {"a": 5, "b": 3, "c": 10, "d": 1, "e": 1}
    assert bucket_plan(numel, ["e", "c", "b", "a", "d"], 4) == [("e", "c"), ("b", "a"), ("d",)]
    assert bucket_plan(numel, "abcde", 100) == [tuple("abcde")]
    assert bucket_plan(numel, "abcde", 1) == [(k,) for k in "abcde"]
    with pytest.raises(ConfigError, match="bucket_elements"):
        bucket_plan(numel, "abcde", 0)


@pytest.fixture(scope="module")
def two(tiny):
    """Two single-window microbatches a step on one rank: the hooks act on the second one's backward only."""
    return tiny.replace(**{"train.micro_batch": 1})


def test_buckets_are_reduced_while_the_backward_runs(two, one_thread):
    """Deep in the last backward (a gradient of the third bucket or later) the hook waits until the communication
    thread has started bucket 0: a reduction that waited for the whole backward never starts it, and this fails."""
    ctx = StepContext.build(two)
    s = stream.open_stream(two.train.corpus, seq_len=two.model.seq_len, seed=two.train.seed)
    tokens = torch.from_numpy(s.windows(*ctx.batch.window_range(0))).to(torch.int64)
    started, events, waited = threading.Event(), [], []

    def observe(event: str, bucket: int) -> None:
        events.append((event, bucket))
        if event == "start" and bucket == 0:
            started.set()
        if event == "gradient" and bucket >= 2 and not waited:
            waited.append(started.wait(timeout=60))

    one = TrainState.fresh(init_params(two.model, two.train.seed))
    run_step(one, tokens, Topology(1, 1), ctx)
    st = TrainState.fresh(init_params(two.model, two.train.seed))
    run_step(st, tokens, Topology(1, 1), replace(ctx, bucket_elements=BUCKET, observer=observe), One())

    assert waited == [True]
    names = [e for e, _ in events]
    buckets = max(b for e, b in events if e == "ready") + 1
    assert buckets > 4
    assert [b for e, b in events if e == "backward_end"] == [0, 1]
    assert events.index(("start", 0)) < events.index(("backward_end", 1))  # bucket 0 began inside the last backward
    assert [b for e, b in events if e == "ready"] == list(range(buckets))  # handed over in order, once each
    assert [b for e, b in events if e == "start"] == list(range(buckets))
    for b in range(buckets):  # each bucket after its last gradient, reduced after it was handed over
        last_grad = max(i for i, ev in enumerate(events) if ev == ("gradient", b))
        assert last_grad < events.index(("ready", b)) < events.index(("start", b)) < events.index(("done", b))
    assert names.count("gradient") == len(st.params)  # only the last microbatch's backward, each leaf once
    assert state_hash(state_entries(st, "{}", "c", {})) == state_hash(state_entries(one, "{}", "c", {}))
