"""Seconds per PV update per expert (and per reassignment pass), ARVQ part 2, on CPU or CUDA.

    .venv/bin/python benchmarks/arvq_pv.py                       # CPU, a small layer
    python3 benchmarks/arvq_pv.py --device cuda --preset glm     # H200: GLM-5.3-sized projections

A synthetic layer (random codes, routing, targets: PV's cost does not depend on the values) of E cold
experts with w13 [2F, D] and w2 [D, F]; each update runs `microbatches` x `micro_rows` routed rows through
the BR forward/backward, the exact expert sum, the exact clip and BR Adam (quant/pv.py). Imports stay light
(torch, kernels, quant.pv/student/objective/expert_sum): no Ray, no blake3. Prints a table, writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

# the repo root first: benchmarks/collectives.py would otherwise shadow the collectives package
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels.ref.philox import normal, random_bits  # noqa: E402
from quant.expert_sum import Reducer  # noqa: E402
from quant.format import RVQProjection  # noqa: E402
from quant.objective import LayerProblem, Split  # noqa: E402
from quant.experts import ExpertState  # noqa: E402
from quant.pv import PVConfig, Tuner  # noqa: E402
from quant.reassign import reassign  # noqa: E402
from quant.student import Latent  # noqa: E402

PRESETS = {"small": dict(hidden=512, ffn=256, experts=4, rows=4096, micro_rows=1024),
           "tiny-moe": dict(hidden=128, ffn=128, experts=3, rows=16384, micro_rows=1024),
           "glm": dict(hidden=6144, ffn=2048, experts=8, rows=16384, micro_rows=4096)}


def _codes(seed: int, stream: int, shape, hi: int, device: str = "cpu") -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return (random_bits(seed, stream, n, device=device) % hi).reshape(shape)


def projection(e: int, n: int, k: int, seed: int, device: str) -> RVQProjection:
    """Random valid codes, drawn on the device (Philox on a host CPU is slow at GLM sizes)."""
    return RVQProjection(codebooks=_codes(seed, 1, (e, 2, 256, 8), 16, device).to(torch.uint8),
                         indices=_codes(seed, 2, (e, n, k // 8, 2), 256, device).to(torch.uint8),
                         scales=(_codes(seed, 3, (e, n, k // 128), 8, device) + 40).to(torch.uint8)
                         .view(torch.float8_e4m3fn),
                         global_scale=torch.tensor(1.0 / (6.0 * k ** 0.5), dtype=torch.float32, device=device),
                         experts=tuple(range(e)))


def problem(d: int, e: int, rows: int, device: str, seed: int = 0) -> LayerProblem:
    def split(r: int, s: int) -> Split:
        f = normal(seed, 10 + s, (r, d), device=device)
        first, other = _codes(seed, 20 + s, (r,), e, device), _codes(seed, 20 + s, (r,), e - 1, device)
        topk = torch.stack([first, (first + 1 + other) % e], 1)                  # two distinct experts
        gates = torch.full((r, 2), 0.5, device=device)
        frozen = normal(seed, 30 + s, (r, d), device=device)
        ref = frozen + normal(seed, 40 + s, (r, d), std=0.1, device=device)
        return Split(f, topk, gates, frozen, ref, torch.ones(r, device=device))
    sp = {"train": split(rows, 0), "val": split(1024, 1), "audit": split(1024, 2)}
    steps = {x: (torch.tensor(0.05, device=device), torch.tensor(0.02, device=device)) for x in range(e)}
    return LayerProblem(0, list(range(e)), sp, torch.tensor(0.01 * d, device=device), steps)


def _sync(device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter()


def run(preset: str, device: str, updates: int) -> dict:
    c = PRESETS[preset]
    d, f, e = c["hidden"], c["ffn"], c["experts"]
    p13, p2 = projection(e, 2 * f, d, 1, device), projection(e, d, f, 2, device)
    states = [ExpertState(x, {"w13": Latent.from_projection(p13, x).to(device),
                              "w2": Latent.from_projection(p2, x).to(device)}) for x in range(e)]
    prob = problem(d, e, c["rows"], device)
    cfg = replace(PVConfig(), updates=updates, micro_rows=c["micro_rows"], reassign_every=0, validate_every=10 ** 6,
                  adaptive=False, min_rows=0)
    tuner = Tuner(prob, states, Reducer(device=device), cfg)
    rows = torch.arange(c["micro_rows"])
    tuner._grads(rows)  # warm-up: first-call allocations and kernel compilation out of the timing
    t0 = _sync(device)
    tuner.run()
    t1 = _sync(device)
    reassign(tuner, rows, rows + c["micro_rows"])
    t2 = _sync(device)
    per_update = (t1 - t0) / updates
    return {"preset": preset, "device": device, "hidden": d, "ffn": f, "experts": e,
            "rows_per_update": cfg.microbatches * c["micro_rows"], "updates": updates,
            "s_per_update": per_update, "s_per_update_per_expert": per_update / e,
            "s_reassign_pass_per_expert": (t2 - t1) / e}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="ARVQ PV seconds per update per expert")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default=None, help=f"one of {sorted(PRESETS)} (default: small on CPU, glm on CUDA)")
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/arvq_pv_<device>.json)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    presets = [a.preset] if a.preset else (["small", "tiny-moe"] if a.device == "cpu" else ["tiny-moe", "glm"])
    rows = [run(p, a.device, a.updates) for p in presets]
    print(f"{'preset':>9} {'device':>6} {'D':>6} {'F':>6} {'E':>3} {'rows/upd':>9} {'s/update':>9} "
          f"{'s/upd/expert':>13} {'s/reassign/expert':>18}")
    for r in rows:
        print(f"{r['preset']:>9} {r['device']:>6} {r['hidden']:>6} {r['ffn']:>6} {r['experts']:>3} "
              f"{r['rows_per_update']:>9} {r['s_per_update']:>9.3f} {r['s_per_update_per_expert']:>13.3f} "
              f"{r['s_reassign_pass_per_expert']:>18.3f}")
    dev = a.device.split(":")[0]
    out = Path(a.out or f"benchmarks/results/arvq_pv_{dev}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "machine": platform.machine(), "threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name() if dev == "cuda" else None,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
