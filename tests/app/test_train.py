"""The trainer end to end on the tiny preset (one window per microbatch, the `run200` fixture): loss falls,
resume re-checks logged steps and detects a fork, and the same run under AVX2 or another thread count writes
the same hash log. 200 steps in one go vs 100 + resume from the step-100 checkpoint + 100: the elastic story
(test_demo_story.py) resumes at step 100 on a resized worker group and compares its chain with run200's."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.errors import DivergenceError
from app.hashlog import read_jsonl
from app.report import report
from app.train import TrainOptions, train

ROOT = Path(__file__).resolve().parents[2]
VARIANT_STEPS = 70  # through the batch ramp (step 64: 2 -> 4 windows, accumulation 2 -> 4)

pytestmark = pytest.mark.slow


def _lines(run: Path) -> list[str]:
    return (run / "hashlog.jsonl").read_text().splitlines()


def test_held_out_loss_falls(run200):
    out, summary = run200
    evals = [r for r in read_jsonl(out / "metrics.jsonl") if r.get("event") == "eval"]
    assert [e["step"] for e in evals] == [0, 50, 100, 150, 200]
    first, last = evals[0]["heldout_ce"], evals[-1]["heldout_ce"]
    print(f"held-out CE {first:.4f} -> {last:.4f}; training loss {summary['first_loss']:.4f} -> "
          f"{summary['last_loss']:.4f}; hashing {100 * summary['hash_share']:.2f}% of step time")
    assert first > 8.0 and last < first - 1.0
    assert (out / "loss.png").stat().st_size > 0
    rep = report(out)
    assert rep["grad_norm"]["full"]["steps"] == 200 and len(rep["files"]) == 3


def test_resume_recomputes_logged_steps_and_detects_a_fork(tiny1, run200, tmp_path):
    a, _ = run200
    c = tmp_path / "c"
    shutil.copytree(a, c, ignore=shutil.ignore_patterns("step-000000000200"))
    lines = _lines(c)
    rec = json.loads(lines[105])
    rec["chain_hash"] = "0" * 64  # pretend the original run had computed something else at step 104
    lines[105] = json.dumps(rec, sort_keys=True, separators=(",", ":"))
    (c / "hashlog.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DivergenceError, match="step 104"):
        train(tiny1, c, TrainOptions(steps=110, checkpoint_every=100, eval_every=0, progress=False), resume=True)
    assert (c / "hashlog.before-resume-1.jsonl").is_file()


def _variant(tiny1, out: Path, threads: str, **env) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "app", "train", "--config", "tiny", "--micro-batch", "1", "--corpus",
           tiny1.train.corpus, "--steps",
           str(VARIANT_STEPS), "--out", str(out), "--no-progress", "--checkpoint-every", "0", "--eval-every", "0",
           "--threads", threads]
    return subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=900)


# against the in-process run (this machine's default instruction set and thread count): AVX2 on 1 thread,
# and the default instruction set on 2 threads
@pytest.mark.parametrize("threads,env", [("1", {"ATEN_CPU_CAPABILITY": "avx2"}), ("2", {})], ids=["avx2-1thread",
                                                                                             "2threads"])
def test_same_hash_log_under_avx2_and_any_thread_count(tiny1, run200, tmp_path, threads, env):
    a, _ = run200
    res = _variant(tiny1, tmp_path / "v", threads, **env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "run hash" in res.stdout
    assert _lines(tmp_path / "v") == _lines(a)[:VARIANT_STEPS + 1]
