"""The `small-parity` run (small's shape, 2 windows of 64 tokens a step) on CUDA and on this machine's CPU,
both with the reference backend: the hash logs must be identical, line for line, for PARITY_STEPS steps.

    PARITY_STEPS=100 python3 -m pytest tests/gpu/test_train_parity.py -s
    (PARITY_CORPUS: corpus directory, default data/demo, built if missing; PARITY_OUT: keep the two run
    directories there instead of in pytest's tmp_path)

Both runs are subprocesses (`python -m app train`), started together: the CPU one uses the host's cores
while the GPU one runs. On a difference the message names the first step and the first stage digest
(forward, backward, reduced, clipped, optimizer) that differs.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
ROOT = Path(__file__).resolve().parents[2]
STEPS = int(os.environ.get("PARITY_STEPS", "100"))
STAGES = ("forward", "backward", "reduced", "clipped", "optimizer")


def _first_difference(cpu: list[dict], gpu: list[dict]) -> str:
    for a, b in zip(cpu, gpu):
        if a != b:
            stage = next((s for s in STAGES if a.get("digests", {}).get(s) != b.get("digests", {}).get(s)), "state")
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            return f"step {a['step']}: first differing stage {stage!r}; fields {keys}"
    return f"logs differ in length: cpu {len(cpu)}, cuda {len(gpu)}"


def test_small_parity_hash_log_cuda_equals_cpu(tmp_path):
    corpus = os.environ.get("PARITY_CORPUS", str(ROOT / "data" / "demo"))
    if not (Path(corpus) / "manifest.json").is_file():
        from stream import build_demo
        build_demo(corpus, progress=False)
    base = Path(os.environ.get("PARITY_OUT") or tmp_path)
    procs = {}
    for dev in ("cpu", "cuda"):
        cmd = [sys.executable, "-m", "app", "train", "--config", "small-parity", "--corpus", corpus,
               "--steps", str(STEPS), "--out", str(base / dev), "--device", dev, "--no-progress",
               "--checkpoint-every", "0", "--eval-every", "0"]
        procs[dev] = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = {dev: p.communicate() for dev, p in procs.items()}
    for dev, p in procs.items():
        assert p.returncode == 0, f"{dev} run failed:\n{out[dev][1][-4000:]}"
    logs = {dev: [json.loads(x) for x in (base / dev / "hashlog.jsonl").read_text().splitlines()]
            for dev in procs}
    assert len(logs["cpu"]) == STEPS + 1
    assert logs["cpu"] == logs["cuda"], _first_difference(logs["cpu"], logs["cuda"])
    print(f"{STEPS} steps: identical hash logs; run hash {logs['cpu'][-1]['chain_hash']}")
