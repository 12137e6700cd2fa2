"""The fault test on ray.cluster_utils.Cluster: 4 simulated nodes with one `trainslot` each, `--workers 2:4`; a
node is removed mid-run, then another: Ray Train restarts the group with 3 workers, then 2, each time from the last
checkpoint, and the run finishes. The tiny preset runs 2 windows a step, so ranks past the second own none: any
world size runs any step.

Every record is the undisturbed one-process run's but for `topology` (the same state and chain hashes), the
windows are consecutive (none skipped or repeated), every record names the world size that ran it, and a batch
audit of every step on the same cluster certifies MATCH."""
import json
import os
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")

from training.train import TrainOptions, train  # noqa: E402

pytestmark = pytest.mark.slow
# Checkpoints every 3 steps; the trainer logs a step while it runs the next one (training/train.py), so a node that
# goes once step k is logged leaves steps past the last checkpoint for the smaller group to redo.
STEPS, NODES, EVERY = 18, 4, 3


def _records(run: Path) -> list[dict]:
    p = run / "hashlog.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def _wait(cond, what: str, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and not cond():
        time.sleep(0.2)
    assert cond(), what


def test_two_node_losses_resume_with_fewer_workers_and_the_audit_matches(tiny1, tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    # Right after a loss Ray Train still counts the lost node's slot and asks for the old size once; its placement
    # group then waits this long (60 s by default) before the group restarts smaller. Only the placement waits for it
    # (not the workers' start), and ours is ready in well under a second when the slots exist. The nodes started
    # below, and so Ray Train's controller, inherit it.
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "5")
    from ray.cluster_utils import Cluster

    from replay.batch import BatchOptions, run_batch
    from replay.coverage import coverage_of
    from training.ray_train import train_ray

    cfg = tiny1.replace(**{"train.heldout_windows": 0})
    opts = dict(steps=STEPS, checkpoint_every=EVERY, eval_every=0, progress=False)
    ref = tmp_path / "ref"
    train(cfg, ref, TrainOptions(**opts))

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=1, resources={"trainslot": 1}) for _ in range(NODES)]
    ray.init(address=cluster.address, log_to_driver=False)
    run = tmp_path / "elastic"
    result: dict = {}

    def go():
        try:
            result["summary"] = train_ray(cfg, run, TrainOptions(**opts), (2, 4), max_failures=4, threads=1,
                                          step_delay_s=0.5, resources_per_worker={"CPU": 1, "trainslot": 1})
        except BaseException as e:  # noqa: BLE001 - reported below
            result["error"] = e

    th = threading.Thread(target=go)
    try:
        th.start()
        _wait(lambda: len(_records(run)) >= 1 + 4, "the run did not get going")
        cluster.remove_node(nodes.pop())
        # past a checkpoint of the 3 workers' (EVERY steps, then one logged while the next runs): the 2 resume there
        _wait(lambda: sum(r.get("topology") == "3x1" for r in _records(run)) > EVERY, "3 workers made no checkpoint")
        cluster.remove_node(nodes.pop())
        th.join(timeout=300)
        assert not th.is_alive(), "the run did not finish"
        assert "error" not in result, result.get("error")
        job = run_batch(run, BatchOptions(progress=False))  # every step, on the 2 nodes left
        cov = coverage_of(run)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert result["summary"]["steps"] == STEPS

    got, want = _records(run), _records(ref)
    assert len(got) == len(want) == STEPS + 1
    assert [r["windows"] for r in got[1:]] == [[2 * s, 2 * (s + 1)] for s in range(STEPS)]
    topo = [r["topology"] for r in got[1:]]
    assert topo[0] == "4x1" and topo[-1] == "2x1" and "3x1" in topo, topo
    assert topo == sorted(topo, reverse=True), topo  # 4, then 3, then 2: never back
    for x, y in zip(want, got):
        assert {k: v for k, v in x.items() if k != "topology"} == {k: v for k, v in y.items() if k != "topology"}
    events = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    worlds = [(e["world"], e["from_step"]) for e in events if e["event"] == "workers"]
    assert worlds[0] == (4, 0) and [w for w, _ in worlds][-1] == 2 and all(s % EVERY == 0 for _, s in worlds), worlds
    kept = sorted(run.glob("hashlog.before-resume-*.jsonl"))  # the logs as they were before each resume
    assert kept and all(r["chain_hash"] == got[r["step"] + 1]["chain_hash"]
                        for f in kept for r in map(json.loads, f.read_text().splitlines()))  # every step re-checked
    assert {r["verdict"] for r in job.rows} == {"MATCH"} and cov.certified == STEPS and cov.first_mismatch is None
    print("worker groups (world, resumed at step):", worlds, "topologies:", topo)
