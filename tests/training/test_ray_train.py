"""Training on Ray Train V2 workers: a 2-worker run's hash log equals the one-process run's; `ordered` reduction
on 3 workers equals the virtual 3 x 1 run.

With exact reduction and micro_batch = 1 a step's bits do not depend on the world size, so the 2-worker
log is byte-identical to the one-process run on the virtual topology 2x1, and equal to the 1x1 run in every
field but `topology` (the chain of state hashes included)."""
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")

from training.config import Topology  # noqa: E402
from training.train import TrainOptions, train  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 8


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def cfg1(tiny):
    return tiny.replace(**{"train.micro_batch": 1})


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "hashlog.jsonl").read_text().splitlines()]


def test_two_workers_equal_one_process(cfg1, ray_local, one_thread, tmp_path):
    from training.ray_train import train_ray

    opts = dict(steps=STEPS, checkpoint_every=4, eval_every=0, progress=False)
    one = tmp_path / "one"
    virt = tmp_path / "virt"
    real = tmp_path / "real"
    train(cfg1, one, TrainOptions(**opts))
    train(cfg1, virt, TrainOptions(**opts, topology=Topology(2, 1)))
    s = train_ray(cfg1, real, TrainOptions(**opts), (2, 2), threads=1)
    assert s["steps"] == STEPS
    assert (real / "hashlog.jsonl").read_bytes() == (virt / "hashlog.jsonl").read_bytes()
    a, b = _records(one), _records(real)
    assert len(a) == len(b) == STEPS + 1
    for x, y in zip(a, b):
        if x["step"] >= 0:
            assert (x["topology"], y["topology"]) == ("1x1", "2x1")
            x, y = dict(x), dict(y)
            x.pop("topology"), y.pop("topology")
        assert x == y  # the bits (state and chain hashes, digests) do not depend on the world size
    events = [json.loads(x) for x in (real / "metrics.jsonl").read_text().splitlines()]
    assert [e["world"] for e in events if e["event"] == "workers"] == [2]
    assert any(p.name.startswith("checkpoint") for p in (real / "ray").rglob("*") if p.is_dir())


def test_ordered_reduction_on_three_workers_is_the_virtual_3x1_run(cfg1, ray_local, one_thread, tmp_path):
    """`ordered`: each rank folds its 2 microbatches in order, the ranks meet in collectives' recursive doubling
    (float32 on the wire): the bits of the one-process run on the virtual topology 3 x 1, which a replay rebuilds
    from the log's topology."""
    from replay.core import replay_segment
    from training.ray_train import train_ray

    cfg = cfg1.replace(**{"train.reduction": "ordered", "train.batch_phases": ((1 << 50, 6),)})
    opts = dict(steps=3, checkpoint_every=0, eval_every=0, progress=False)
    virt, real = tmp_path / "virt", tmp_path / "real"
    train(cfg, virt, TrainOptions(**opts, topology=Topology(3, 1)))
    train_ray(cfg, real, TrainOptions(**opts), (3, 3), threads=1)
    assert (real / "hashlog.jsonl").read_bytes() == (virt / "hashlog.jsonl").read_bytes()
    assert {r["accum"] for r in _records(real)[1:]} == {6}
    assert replay_segment(real, 0, 3).verdict == "MATCH"


def test_workers_option_and_refusals(cfg1, one_thread):
    """--workers parsing; a real group refuses `ordered` reduction where its ranks run different numbers of
    microbatches or under HSDP, and a topology of another world size (exact HSDP, dp_shard > 1, is accepted:
    tests/training/test_ray_hsdp.py); train_ray refuses --workers not multiples of --dp-shard."""
    import torch

    from training.errors import ConfigError
    from training.init import init_params
    from training.ray_train import parse_workers, train_ray
    from training.step import StepContext, TrainState, run_step
    from training.train import TrainOptions

    assert parse_workers("2") == (2, 2) and parse_workers("2:4") == (2, 4)
    for bad in ("0", "3:2", "a:b"):
        with pytest.raises(ConfigError):
            parse_workers(bad)

    class Group:  # rank 0 of a (pretend) group: the refusals come before any collective
        def __init__(self, world: int) -> None:
            self.rank, self.world = 0, world

    tokens = torch.zeros((2, cfg1.model.seq_len + 1), dtype=torch.int64)  # step 0: 2 windows
    ordered = cfg1.replace(**{"train.reduction": "ordered"})
    for cfg, topo, word in ((ordered, Topology(3, 1), "same number on every rank"),  # 1, 1 and 0 microbatches
                            (ordered, Topology(1, 2), "HSDP"),
                            (cfg1, Topology(1, 1), "has 1 ranks, the group 2")):
        ctx = StepContext.build(cfg)
        state = TrainState.fresh(init_params(cfg.model, cfg.train.seed))
        with pytest.raises(ConfigError, match=word):
            run_step(state, tokens, topo, ctx, Group(2 if topo.world < 3 else 3))
    for workers, shard in (((2, 3), 2), ((3, 3), 2), ((2, 2), 0)):
        with pytest.raises(ConfigError, match="--dp-shard"):
            train_ray(cfg1, "/nonexistent/run", TrainOptions(1, progress=False), workers, dp_shard=shard)


def test_group_of_one_exchanges_nothing(cfg1, one_thread):
    """One worker's group is the whole topology: its step calls no collective and has the one-process step's
    bits (the Ray Train path on one GPU pays no encode, exchange or host round trip)."""
    import torch

    from kernels.digest import digest_many
    from training.init import init_params
    from training.step import StepContext, TrainState, run_step

    class Group:
        rank, world = 0, 1

        def __getattr__(self, name):
            raise AssertionError(f"a group of one called {name}")

    ctx = StepContext.build(cfg1)
    tokens = torch.randint(0, cfg1.model.vocab_size, (2, cfg1.model.seq_len + 1), dtype=torch.int64,
                           generator=torch.Generator().manual_seed(3))
    states = [TrainState.fresh(init_params(cfg1.model, cfg1.train.seed)) for _ in range(2)]
    results = [run_step(states[0], tokens, Topology(1, 1), ctx), run_step(states[1], tokens, Topology(1, 1), ctx, Group())]
    assert results[0].digests == results[1].digests and results[0].digests
    assert digest_many(states[0].params) == digest_many(states[1].params)
