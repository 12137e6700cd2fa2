"""A stand-in for replay.core.replay_segment, used by test_batch.py's Ray workers ONLY while replay/core.py
does not exist yet (to be deleted when it lands). It replays with the trainer itself: the checkpoint at or
before the segment copied into a scratch run directory, then `Trainer.one_step` per step, each step's state
and chain hash compared with the original log. No tests here."""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Mismatch:
    step: int
    stage: str
    detail: str


@dataclass
class ReplayResult:
    run_hash: str
    first_step: int
    end_step: int
    verdict: str
    mismatch: Mismatch | None
    expected_chain: str
    computed_chain: str
    steps_replayed: int
    device: str
    backend: str
    seconds: float


def replay_segment(run, first_step: int, end_step: int, device: str = "cpu", progress: bool = False) -> ReplayResult:
    from app import checkpoint as ckpt
    from app.config import from_dict
    from app.hashlog import read_jsonl
    from app.train import TrainOptions, Trainer

    t0, run = time.perf_counter(), Path(run)
    logged = {r["step"]: r for r in read_jsonl(run / "hashlog.jsonl")}
    cfg = from_dict(json.loads((run / "config.json").read_text()))
    start = max([c for c in ckpt.list_checkpoints(run) if c <= first_step], default=0)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "run"
        opts = TrainOptions(steps=end_step, checkpoint_every=0, eval_every=0, device=device, progress=False)
        if start:
            scratch.mkdir()
            shutil.copy(run / "config.json", scratch / "config.json")
            shutil.copytree(ckpt.ckpt_dir(run, start), ckpt.ckpt_dir(scratch, start))
            (scratch / "hashlog.jsonl").write_bytes(b"".join(
                (json.dumps(logged[s], sort_keys=True, separators=(",", ":")) + "\n").encode()
                for s in range(-1, start)))
            tr = Trainer(cfg, scratch, opts, resume=True)
        else:
            tr = Trainer(cfg, scratch, opts)
        tr.expected = {}
        mismatch, rec, n = None, None, 0
        while tr.state.step < end_step:
            rec, _, _ = tr.one_step()
            n += 1
            want = logged[rec["step"]]
            if (rec["state_hash"], rec["chain_hash"]) != (want["state_hash"], want["chain_hash"]):
                mismatch = Mismatch(rec["step"], "state", f"state hash {rec['state_hash']} vs logged "
                                                          f"{want['state_hash']}")
                break
        tr.log.close()
        tr.metrics.close()
    step = rec["step"]
    return ReplayResult(logged[max(logged)]["chain_hash"], first_step, end_step,
                        "MISMATCH" if mismatch else "MATCH", mismatch, logged[step]["chain_hash"],
                        rec["chain_hash"], n, device, "reference", time.perf_counter() - t0)


def install() -> None:
    """Ray worker setup hook: provide replay.core if the real one is not importable yet."""
    try:
        import replay.core  # noqa: F401
    except ImportError:
        m = types.ModuleType("replay.core")
        m.Mismatch, m.ReplayResult, m.replay_segment = Mismatch, ReplayResult, replay_segment
        sys.modules["replay.core"] = m
