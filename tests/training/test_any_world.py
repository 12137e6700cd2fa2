"""Any world size: rank r owns the windows m with m mod R == r, whatever their count, so ranks may own different
numbers of windows or none. With micro_batch = 1 the tiny preset (2, then 4 windows a step from step 64) writes the
one-process hash log on every virtual topology R x 1 for R in 1..8 and on R x S meshes, record for record but for
the topology: the same state and chain hashes through the batch ramp.

One run changes its topology at every step, cycling through the worlds, so that each world runs steps of 2 windows
(R above 2 leaves ranks idle) and of 4, from states the others made: one divergent bit anywhere breaks the chain."""
from __future__ import annotations

from dataclasses import replace

import pytest

from training.config import Topology
from training.rundir import HASHLOG, read_jsonl
from training.train import TrainOptions, Trainer

pytestmark = pytest.mark.slow
STEPS = 80
MESHES = [Topology(r, 1) for r in range(1, 9)] + [Topology(3, 2), Topology(1, 3)]


def _log(cfg, out, topologies: list[Topology]) -> list[dict]:
    opts = TrainOptions(STEPS, checkpoint_every=0, eval_every=0, progress=False)
    t = Trainer(cfg, out, opts)
    for step in range(STEPS):
        t.opts = replace(opts, topology=topologies[step % len(topologies)])
        t.one_step()
    t.log.close()
    return read_jsonl(out / HASHLOG)


def test_every_world_size_writes_the_one_process_log(tiny1, tmp_path, one_thread):
    cfg = tiny1.replace(**{"train.heldout_windows": 0})  # no held-out set: nothing here evaluates
    want = _log(cfg, tmp_path / "1x1", [Topology(1, 1)])
    got = _log(cfg, tmp_path / "cycled", MESHES)
    assert [r["accum"] for r in want[1:]] == [2] * 64 + [4] * (STEPS - 64)  # the ramp; a microbatch a window
    assert [r["topology"] for r in got[1:]] == [MESHES[s % len(MESHES)].label() for s in range(STEPS)]
    for a, b in zip(want, got):
        assert {k: v for k, v in a.items() if k != "topology"} == {k: v for k, v in b.items() if k != "topology"}, \
            f"step {a['step']} on {b.get('topology')} differs from 1x1"
