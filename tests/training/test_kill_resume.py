"""A trainer killed with SIGKILL at any moment resumes to the hash log of an uninterrupted run.

`python -m app train` runs as a subprocess and is killed: once its init record is logged (before its first
checkpoint), while a checkpoint is being written (its temporary directory exists), and at random moments after
a step was logged (seeded); after each kill `--resume` (or, where the kill came before the run directory existed,
the same command) carries on. The finished log is byte-identical to an uninterrupted run's, and every checkpoint
left in the run directory is whole (a half-written one is a temporary directory nothing loads)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training.checkpoint import load_checkpoint
from training.params import spec_map
from training.rundir import CHECKPOINTS, CONFIG, HASHLOG, list_checkpoints, read_jsonl
from training.state_hash import code_version
from training.train import TrainOptions, train

ROOT = Path(__file__).resolve().parents[2]
STEPS, EVERY = 12, 4
pytestmark = pytest.mark.slow


def _start(corpus: Path, out: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "app", "train", "--config", "tiny", "--corpus", str(corpus), "--steps", str(STEPS),
            "--checkpoint-every", str(EVERY), "--eval-every", "0", "--threads", "1", "--no-progress", "--out", str(out)]
    if (out / CONFIG).is_file():
        argv.append("--resume")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _logged(out: Path) -> int:
    """Records in the hash log (0 while it does not exist)."""
    try:
        return len((out / HASHLOG).read_bytes().splitlines())
    except FileNotFoundError:
        return 0


def _kill_when(p: subprocess.Popen, ready, delay: float, timeout: float = 120.0) -> bool:
    """SIGKILL `p` `delay` seconds after `ready()` holds; False if it finished (or the wait ran out) first."""
    deadline = time.time() + timeout
    while p.poll() is None and time.time() < deadline:
        if ready():
            time.sleep(delay)
            if p.poll() is not None:
                return False
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            return True
        time.sleep(0.002)
    return False


def test_sigkill_at_any_moment_then_resume_gives_the_uninterrupted_log(tiny, demo_corpus, one_thread, tmp_path):
    ref = tmp_path / "ref"
    train(tiny, ref, TrainOptions(STEPS, checkpoint_every=EVERY, eval_every=0, progress=False))
    out, rng = tmp_path / "killed", random.Random(7)
    moments = [(lambda: _logged(out) >= 1, 0.0),  # the init record is logged: before the first checkpoint
               (lambda: any((out / CHECKPOINTS).glob(".tmp-*")), 0.0),  # a checkpoint is being written
               # a random while after a record: inside a step, its hashing or its logging
               *[(lambda n=n: _logged(out) >= n, rng.uniform(0.0, 0.4)) for n in sorted(rng.sample(range(3, STEPS), 3))]]
    kills = 0
    for ready, delay in moments:
        p = _start(demo_corpus, out)
        if _kill_when(p, ready, delay):
            kills += 1
        else:
            assert p.returncode == 0, p.stdout.read().decode()[-2000:]
    p = _start(demo_corpus, out)
    assert p.wait(timeout=300) == 0, p.stdout.read().decode()[-2000:]
    assert kills >= 3
    assert (out / HASHLOG).read_bytes() == (ref / HASHLOG).read_bytes()
    specs = spec_map(tiny.model)
    for step in list_checkpoints(out):  # every checkpoint the kills left behind loads, digests and state hash checked
        load_checkpoint(out / CHECKPOINTS / f"step-{step:012d}", specs, code_version())
    resumes = [e for e in read_jsonl(out / "metrics.jsonl") if e.get("event") == "resume"]
    assert len(resumes) >= kills - 1 and all(e["from_step"] % EVERY == 0 for e in resumes)


def test_a_start_refused_at_its_first_step_leaves_no_run_directory(tiny, one_thread, tmp_path):
    from training.config import Topology
    from training.errors import ConfigError

    out = tmp_path / "run"
    ordered = tiny.replace(**{"train.reduction": "ordered", "train.micro_batch": 1})
    with pytest.raises(ConfigError, match="same number on every rank"):  # 2 windows on 3 ranks: 1, 1 and 0
        train(ordered, out, TrainOptions(2, checkpoint_every=0, eval_every=0, progress=False, topology=Topology(3, 1)))
    assert not out.exists()
    train(tiny, out, TrainOptions(1, checkpoint_every=0, eval_every=0, progress=False))  # the same --out, at once
    assert _logged(out) == 2
