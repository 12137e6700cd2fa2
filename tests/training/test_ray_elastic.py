"""The fault test on ray.cluster_utils.Cluster: 4 simulated nodes with one `trainslot` each, 4 workers; one node
is removed mid-run; Ray Train restarts the group with 3 workers from the last checkpoint and the run finishes.

Every step (12 windows: a multiple of 4 and 3) is bit-identical to the undisturbed one-process run, the
windows are consecutive (none skipped or repeated), and every record names the world size that ran it."""
import json
import os
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from training.train import TrainOptions, train  # noqa: E402

pytestmark = pytest.mark.slow
# The node goes once step REMOVE_AFTER - 1 is logged. Checkpoints fall every 3 steps (after steps 2, 5, 8), and the
# trainer logs a step while it runs the next one (training/train.py), so step 3's record is the first one past the
# checkpoint after step 2, and the next checkpoint is two steps away: the node goes with steps logged past the
# last checkpoint, which the smaller group must redo.
STEPS, WINDOWS, REMOVE_AFTER = 12, 12, 4


def _records(run: Path) -> list[dict]:
    p = run / "hashlog.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def test_node_loss_resumes_with_fewer_workers(tiny, tmp_path):
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from training.ray_train import train_ray

    cfg = tiny.replace(**{"train.micro_batch": 1, "train.batch_phases": ((1 << 50, WINDOWS),)})
    opts = dict(steps=STEPS, checkpoint_every=3, eval_every=0, progress=False)
    ref = tmp_path / "ref"
    train(cfg, ref, TrainOptions(**opts))

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes = [cluster.add_node(num_cpus=1, resources={"trainslot": 1}) for _ in range(4)]
    ray.init(address=cluster.address, log_to_driver=False)
    run = tmp_path / "elastic"
    result: dict = {}

    def go():
        try:
            result["summary"] = train_ray(cfg, run, TrainOptions(**opts), (2, 4), max_failures=3, threads=1,
                                          step_delay_s=0.5, resources_per_worker={"CPU": 1, "trainslot": 1})
        except BaseException as e:  # noqa: BLE001 - reported below
            result["error"] = e

    th = threading.Thread(target=go)
    try:
        th.start()
        deadline = time.time() + 240
        while time.time() < deadline and len(_records(run)) < 1 + REMOVE_AFTER:
            time.sleep(0.2)
        assert len(_records(run)) >= 1 + REMOVE_AFTER, "the run did not get going"
        cluster.remove_node(nodes[-1])
        th.join(timeout=300)
        assert not th.is_alive(), "the run did not finish"
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert "error" not in result, result.get("error")
    assert result["summary"]["steps"] == STEPS

    got, want = _records(run), _records(ref)
    assert len(got) == len(want) == STEPS + 1
    assert [r["windows"] for r in got[1:]] == [[WINDOWS * s, WINDOWS * (s + 1)] for s in range(STEPS)]
    topo = [r["topology"] for r in got[1:]]
    assert topo[0] == "4x1" and topo[-1] == "3x1" and set(topo) == {"4x1", "3x1"}, topo
    for x, y in zip(want, got):
        x, y = dict(x), dict(y)
        for k in ("topology", "accum"):
            x.pop(k, None), y.pop(k, None)
        assert x == y, x["step"]  # the same bits as the undisturbed run, before and after the failure
    events = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    worlds = [(e["world"], e["from_step"]) for e in events if e["event"] == "workers"]
    assert worlds[0] == (4, 0) and worlds[-1][0] == 3 and worlds[-1][1] % 3 == 0, worlds
    # steps logged by the 4 workers after their last checkpoint were kept aside, recomputed by 3, and re-checked
    before = [json.loads(x) for x in (run / "hashlog.before-resume-1.jsonl").read_text().splitlines()]
    redone = [r for r in before if r["step"] >= worlds[-1][1]]
    assert redone and all(r["topology"] == "4x1" for r in redone)
    assert all(r["chain_hash"] == got[r["step"] + 1]["chain_hash"] for r in redone)
    print("worker groups (world, resumed at step):", worlds, "topologies:", topo)
