"""The trainer end to end on the tiny preset: loss falls, resume continues the chain bit-exactly, and the
same run resumed under AVX2 or another thread count writes the same hash log."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from training.errors import DivergenceError
from training.rundir import read_jsonl
from training.report import report
from training.train import TrainOptions, train

ROOT = Path(__file__).resolve().parents[2]
VARIANT_STEPS = 66  # through the batch ramp (step 64: 2 -> 4 windows, one microbatch -> two)
STEPS, EVERY = 80, 40  # checkpoints at 40 and 80: a resume from 40 crosses the ramp

pytestmark = pytest.mark.slow


def _lines(run: Path) -> list[str]:
    return (run / "hashlog.jsonl").read_text().splitlines()


@pytest.fixture(scope="module")
def run(tiny, one_thread, tmp_path_factory) -> tuple[Path, dict]:
    """tiny, STEPS in one go, checkpoints every EVERY, held-out CE every EVERY / 2."""
    out = tmp_path_factory.mktemp("runs") / "a"
    return out, train(tiny, out, TrainOptions(steps=STEPS, checkpoint_every=EVERY, eval_every=EVERY // 2,
                                              progress=False))


def test_held_out_loss_falls(run):
    out, summary = run
    evals = [r for r in read_jsonl(out / "metrics.jsonl") if r.get("event") == "eval"]
    assert [e["step"] for e in evals] == list(range(0, STEPS + 1, EVERY // 2))
    first, last = evals[0]["heldout_ce"], evals[-1]["heldout_ce"]
    print(f"held-out CE {first:.4f} -> {last:.4f}; training loss {summary['first_loss']:.4f} -> "
          f"{summary['last_loss']:.4f}; hashing {100 * summary['hash_share']:.2f}% of step time")
    assert first > 8.0 and last < first - 1.0
    assert (out / "loss.png").stat().st_size > 0
    rep = report(out)
    assert rep["grad_norm"]["full"]["steps"] == STEPS and len(rep["files"]) == 4  # loss, grads, weights, step time


def test_step_seconds_are_each_steps_own(run):
    """A step's seconds cover its own run and hashing, not a neighbour's: none is a tiny fraction of the typical
    step (what timing the interval between two records gave after a checkpoint), and together they fit in the
    run's wall time."""
    out, _ = run
    events = read_jsonl(out / "metrics.jsonl")
    secs = [e["seconds"] for e in events if e["event"] == "step"]
    wall = next(e["time"] for e in events if e["event"] == "end") - events[0]["time"]
    assert len(secs) == STEPS and min(secs) > sorted(secs)[STEPS // 2] / 20 and sum(secs) <= wall


def _stopped_at_checkpoint(a: Path, dst: Path) -> Path:
    """Run `a` as it stood when it had done EVERY steps: that checkpoint, the log through the step before it, no
    later files."""
    shutil.copytree(a, dst, ignore=shutil.ignore_patterns(f"step-{STEPS:012d}", "*.png", "report.json"))
    (dst / "hashlog.jsonl").write_text("\n".join(_lines(a)[:EVERY + 1]) + "\n")
    metrics = (dst / "metrics.jsonl").read_text().splitlines()
    def before(m: dict) -> bool:  # "step" events count from 0; eval/checkpoint events record steps done
        return m["event"] != "end" and m.get("step", 0) < (EVERY if m["event"] == "step" else EVERY + 1)

    keep = [m for m in metrics if before(json.loads(m))]
    (dst / "metrics.jsonl").write_text("\n".join(keep) + "\n")
    return dst


def test_resume_from_a_checkpoint_continues_the_chain_bit_exactly(tiny, run, tmp_path):
    a, _ = run
    b = _stopped_at_checkpoint(a, tmp_path / "b")
    train(tiny, b, TrainOptions(steps=STEPS, checkpoint_every=EVERY, eval_every=EVERY // 2, progress=False),
          resume=True)
    assert _lines(b) == _lines(a)
    assert json.loads(_lines(b)[-1])["chain_hash"] == json.loads(_lines(a)[-1])["chain_hash"]
    assert not list(b.glob("hashlog.before-resume-*"))  # nothing was logged past the checkpoint


def test_resume_recomputes_logged_steps_and_detects_a_fork(tiny, run, tmp_path):
    a, _ = run
    c = tmp_path / "c"
    shutil.copytree(a, c, ignore=shutil.ignore_patterns(f"step-{STEPS:012d}"))
    lines = _lines(c)
    forked = EVERY + 4  # past the checkpoint the resume starts from
    rec = json.loads(lines[forked + 1])
    rec["chain_hash"] = "0" * 64  # pretend the original run had computed something else at that step
    lines[forked + 1] = json.dumps(rec, sort_keys=True, separators=(",", ":"))
    (c / "hashlog.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DivergenceError, match=f"step {forked}"):
        train(tiny, c, TrainOptions(steps=forked + 6, checkpoint_every=EVERY, eval_every=0, progress=False),
              resume=True)
    assert (c / "hashlog.before-resume-1.jsonl").is_file()


def _variant(tiny, out: Path, threads: str, **env) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "app", "train", "--config", "tiny", "--corpus", tiny.train.corpus, "--steps",
           str(VARIANT_STEPS), "--out", str(out), "--resume", "--no-progress", "--checkpoint-every", "0",
           "--eval-every", "0", "--threads", threads]
    return subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=900)


# against the in-process run (this machine's default instruction set and thread count): AVX2 on 1 thread, and the
# default instruction set on 2 threads, each resuming the run from its checkpoint at EVERY and going through the
# ramp (the init's draws under AVX2 and any thread count: tests/kernels/test_golden.py)
@pytest.mark.parametrize("threads,env", [("1", {"ATEN_CPU_CAPABILITY": "avx2"}), ("2", {})], ids=["avx2-1thread",
                                                                                             "2threads"])
def test_same_hash_log_under_avx2_and_any_thread_count(tiny, run, tmp_path, threads, env):
    a, _ = run
    v = _stopped_at_checkpoint(a, tmp_path / "v")
    res = _variant(tiny, v, threads, **env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "run hash" in res.stdout
    assert _lines(v) == _lines(a)[:VARIANT_STEPS + 1]
