"""A CollectiveGroup formed by Ray actors (gloo on localhost) gives TreeFold's bits."""

import pytest

ray = pytest.importorskip("ray")

from collectives import treefold  # noqa: E402
from collectives.selftest import GangMember, digest, make_inputs  # noqa: E402


def test_actor_gang_all_reduce_equals_treefold(ray_session):
    world, n = 3, 1001
    Member = ray.remote(num_cpus=1)(GangMember)
    gang = [Member.remote() for _ in range(world)]
    try:
        port = ray.get(gang[0].port.remote())
        info = ray.get([m.join.remote(r, world, "127.0.0.1", port) for r, m in enumerate(gang)], timeout=180)
        assert all(i["deterministic"] and i["world"] == world for i in info)
        ps = make_inputs(world, n, seed=11)
        outs = ray.get([m.all_reduce.remote(p) for m, p in zip(gang, ps)], timeout=120)
        ref = digest(treefold(ps))
        assert [digest(o) for o in outs] == [ref] * world
        checks = ray.get([m.check.remote(513, 3) for m in gang], timeout=120)
        assert all(all(c["ok"].values()) for c in checks)
    finally:
        ray.get([m.leave.remote() for m in gang], timeout=60)
        for m in gang:
            ray.kill(m)
