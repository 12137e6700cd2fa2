"""Any world size and any microbatch cut: rank r owns the windows m with m mod R == r, whatever their count, so ranks
may own different numbers of windows or none, and cuts them into microbatches of micro_batch windows; each window's
gradient is its own (training/windows.py). The tiny preset (2, then 4 windows a step from step 64) writes the
one-process hash log of micro_batch 1 on 1 x 1 on every virtual topology R x 1 for R in 1..8 and on R x S meshes,
with micro_batch 1, 2 and 4, record for record but for the topology: the same state and chain hashes through the
batch ramp.

One run changes its topology and micro_batch at every step, cycling through every pair (11 meshes by 3 cuts, 33
steps), so that each runs steps of 2 windows (R above 2 leaves ranks idle) and of 4, from states the others made:
one divergent bit anywhere breaks the chain."""
from __future__ import annotations

from dataclasses import replace

import pytest

from training.config import Topology
from training.rundir import HASHLOG, read_jsonl
from training.train import TrainOptions, Trainer

pytestmark = pytest.mark.slow
STEPS = 80
MESHES = [Topology(r, 1) for r in range(1, 9)] + [Topology(3, 2), Topology(1, 3), Topology(2, 2)]
CUTS = (1, 2, 4)  # micro_batch


def _log(cfg, out, plan: list[tuple[Topology, int]]) -> list[dict]:
    opts = TrainOptions(STEPS, checkpoint_every=0, eval_every=0, progress=False)
    t = Trainer(cfg, out, opts)
    for step in range(STEPS):
        topology, micro_batch = plan[step % len(plan)]
        t.opts = replace(opts, topology=topology)
        t.ctx = replace(t.ctx, cfg=cfg.replace(**{"train.micro_batch": micro_batch}))
        t.one_step()
    t.log.close()
    return read_jsonl(out / HASHLOG)


def test_every_world_size_and_microbatch_cut_writes_the_one_process_log(tiny1, tmp_path, one_thread):
    cfg = tiny1.replace(**{"train.heldout_windows": 0})  # no held-out set: nothing here evaluates
    want = _log(cfg, tmp_path / "1x1", [(Topology(1, 1), 1)])
    plan = [(MESHES[s % len(MESHES)], CUTS[s % len(CUTS)]) for s in range(len(MESHES) * len(CUTS))]
    assert len(set(plan)) == len(MESHES) * len(CUTS)  # every pair
    got = _log(cfg, tmp_path / "cycled", plan)
    assert [r["accum"] for r in want[1:]] == [2] * 64 + [4] * (STEPS - 64)  # the ramp; a partial a window
    assert [r["topology"] for r in got[1:]] == [plan[s % len(plan)][0].label() for s in range(STEPS)]
    for a, b in zip(want, got):
        assert {k: v for k, v in a.items() if k != "topology"} == {k: v for k, v in b.items() if k != "topology"}, \
            f"step {a['step']} on {b.get('topology')} with micro_batch {plan[(a['step'] or 0) % len(plan)][1]} " \
            f"differs from 1x1 with micro_batch 1"
