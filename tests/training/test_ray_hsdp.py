"""HSDP on Ray Train workers: a 2x2 (4 workers, --dp-shard 2) and a 1x2 run's hash logs are byte-identical to
the one-process runs on the virtual topologies 2x2 and 1x2, and their chain of state hashes is the 1x1 run's.

Four steps of four single-window microbatches; a checkpoint after step 2 (rank 0 writes it from the full
state it gathered) and at the end."""
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.3")  # the controller's poll (2 s): start and end sooner

from training.config import Topology  # noqa: E402
from training.train import TrainOptions, train  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 4


@pytest.fixture(scope="module")
def four(tiny):
    return tiny.replace(**{"train.micro_batch": 1, "train.batch_phases": ((1 << 50, 4),)})


OPTS = dict(steps=STEPS, checkpoint_every=2, eval_every=0, progress=False)


@pytest.fixture(scope="module")
def one(four, tmp_path_factory, one_thread):
    """The plain one-process 1x1 run."""
    out = tmp_path_factory.mktemp("hsdp") / "one"
    train(four, out, TrainOptions(**OPTS))
    return out


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "hashlog.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("shape", [(2, 2), (1, 2)])
def test_hsdp_workers_equal_one_process(four, one, shape, ray_session, one_thread, tmp_path):
    from training.ray_train import train_ray

    topo = Topology(*shape)
    virt, real = tmp_path / "virt", tmp_path / "real"
    train(four, virt, TrainOptions(**OPTS, topology=topo))
    s = train_ray(four, real, TrainOptions(**OPTS), (topo.world, topo.world), threads=1, dp_shard=topo.dp_shard)
    assert s["steps"] == STEPS
    assert (real / "hashlog.jsonl").read_bytes() == (virt / "hashlog.jsonl").read_bytes()
    recs = _records(real)
    assert [r["topology"] for r in recs[1:]] == [topo.label()] * STEPS
    assert [r["chain_hash"] for r in recs] == [r["chain_hash"] for r in _records(one)]
    assert sorted(p.name for p in (real / "checkpoints").iterdir()) == [f"step-{n:012d}" for n in (0, 2, 4)]
