"""The `small-parity` run (small's shape) on CUDA with the reference backend and with the Triton backend: the
hash logs must be identical, line for line, for BACKEND_STEPS steps (default 100).

    BACKEND_STEPS=100 python3 -m pytest tests/gpu/test_train_backend.py -s
    (BACKEND_CORPUS: corpus directory, default data/demo, built if missing; BACKEND_OUT: keep the two run
    directories there; each run's metrics.jsonl has its step and hashing seconds)

Both runs are subprocesses (`python -m app train --device cuda --backend ...`) started together on the one GPU.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
ROOT = Path(__file__).resolve().parents[2]
STEPS = int(os.environ.get("BACKEND_STEPS", "100"))
STAGES = ("forward", "backward", "reduced", "clipped", "optimizer")


def _first_difference(a_log: list[dict], b_log: list[dict]) -> str:
    for a, b in zip(a_log, b_log):
        if a != b:
            stage = next((s for s in STAGES if a.get("digests", {}).get(s) != b.get("digests", {}).get(s)), "state")
            return f"step {a['step']}: first differing stage {stage!r}"
    return f"logs differ in length: {len(a_log)} vs {len(b_log)}"


def _step_seconds(run: Path) -> float:
    ev = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    secs = sorted(e["seconds"] for e in ev if e.get("event") == "step")
    return secs[len(secs) // 2]


def test_triton_backend_hash_log_equals_reference(tmp_path):
    corpus = os.environ.get("BACKEND_CORPUS", str(ROOT / "data" / "demo"))
    if not (Path(corpus) / "manifest.json").is_file():
        from stream import build_demo
        build_demo(corpus, progress=False)
    base = Path(os.environ.get("BACKEND_OUT") or tmp_path)
    procs = {}
    for backend in ("ref", "triton"):
        cmd = [sys.executable, "-m", "app", "train", "--config", "small-parity", "--corpus", corpus,
               "--steps", str(STEPS), "--out", str(base / backend), "--device", "cuda", "--backend", backend,
               "--no-progress", "--checkpoint-every", "0", "--eval-every", "0"]
        procs[backend] = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = {k: p.communicate() for k, p in procs.items()}
    for k, p in procs.items():
        assert p.returncode == 0, f"{k} run failed:\n{out[k][1][-4000:]}"
    logs = {k: [json.loads(x) for x in (base / k / "hashlog.jsonl").read_text().splitlines()] for k in procs}
    assert len(logs["ref"]) == STEPS + 1
    assert logs["ref"] == logs["triton"], _first_difference(logs["ref"], logs["triton"])
    print(f"{STEPS} steps: identical hash logs; run hash {logs['ref'][-1]['chain_hash']}; median step "
          f"ref {_step_seconds(base / 'ref'):.3f} s, triton {_step_seconds(base / 'triton'):.3f} s (both on one GPU)")
