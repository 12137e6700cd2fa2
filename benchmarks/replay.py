"""Replay cost on one device: a step of a W-rank virtual mesh replayed sequentially vs W x one rank's step.

    .venv/bin/python benchmarks/replay.py [--config tiny] [--windows 8] [--worlds 1 2 4 8] [--modes exact ordered]
                                          [--reps 3] [--threads 1] [--device cpu]

Per (reduction mode, W): `replay` is training.step.run_step of step 0 on the virtual mesh Wx1 (every rank's
microbatches in mesh order, replicas folded by TreeFold in ordered mode) with `--windows` windows of one
window per microbatch; `rank` is one rank's share of that step run as its own step (windows/W windows, same
microbatch size: its forward/backward, local accumulation, clip, AdamW, stage digests); `1x1` is the whole
batch on one rank. Target: replay <= 1.2 x (W x rank). Peak memory: the step's additional peak RSS
(ru_maxrss after minus RSS before), each (mode, W) in a fresh subprocess. Prints a table, writes
benchmarks/results/replay.json and docs/results/replay-<device>.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _step_seconds(cfg, topo: str, windows: int, device: str, reps: int) -> float:
    import torch

    from training.config import Topology
    from training.init import init_params
    from training.step import StepContext, TrainState, run_step

    cfg = cfg.replace(**{"train.batch_phases": ((1 << 50, windows),)})
    ctx = StepContext.build(cfg, device)
    params = init_params(cfg.model, cfg.train.seed, ctx.device)
    # synthetic tokens (timing only; bits are not compared here): a fixed integer pattern, no RNG
    n = windows * (cfg.model.seq_len + 1)
    tokens = ((torch.arange(n, dtype=torch.int64) * 7919) % cfg.model.vocab_size).reshape(windows, -1).to(ctx.device)
    best = float("inf")
    for _ in range(reps):
        state = TrainState.fresh({k: v.clone() for k, v in params.items()})
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        run_step(state, tokens, Topology.parse(topo), ctx)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(config: str, mode: str, world: int, windows: int, device: str, reps: int, threads: int) -> dict:
    """One (mode, W) row, in this process (run it in a fresh one for the memory figure)."""
    import torch

    from training.presets import preset

    torch.set_num_threads(threads)
    cfg = preset(config).replace(**{"train.micro_batch": 1, "train.reduction": mode, "train.heldout_windows": 0})
    base = _rss_mb()
    replay = _step_seconds(cfg, f"{world}x1", windows, device, reps)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    rank = _step_seconds(cfg, "1x1", windows // world, device, reps)
    whole = _step_seconds(cfg, "1x1", windows, device, reps)
    return {"mode": mode, "world": world, "windows": windows, "replay_s": replay, "rank_s": rank,
            "world_x_rank_s": world * rank, "ratio": replay / (world * rank), "one_rank_whole_batch_s": whole,
            "replay_peak_extra_mb": peak}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="tiny")
    p.add_argument("--windows", type=int, default=8, help="windows per step (divisible by every world size)")
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--modes", nargs="+", default=["exact", "ordered"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: "mode,world" in a subprocess
    a = p.parse_args()
    if a.one:
        mode, world = a.one.split(",")
        print(json.dumps(measure(a.config, mode, int(world), a.windows, a.device, a.reps, a.threads)))
        return 0
    from rich.console import Console
    from rich.table import Table

    import torch

    rows = []
    t = Table(title=f"replay of one step, {a.config}, {a.windows} windows, 1 window per microbatch, {a.device}, "
                    f"{a.threads} thread(s)")
    for c in ("mode", "W", "replay s", "rank s", "W x rank s", "replay / (W x rank)", "1x1 whole batch s",
              "replay peak +MB"):
        t.add_column(c, justify="right")
    con = Console()
    for mode in a.modes:
        for w in a.worlds:
            out = subprocess.run([sys.executable, __file__, "--one", f"{mode},{w}", "--config", a.config, "--windows",
                                  str(a.windows), "--reps", str(a.reps), "--threads", str(a.threads), "--device",
                                  a.device], check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            rows.append(r)
            con.print(f"{mode} W={w}: replay {r['replay_s']:.3f} s, ratio {r['ratio']:.2f}")
            t.add_row(mode, str(w), f"{r['replay_s']:.3f}", f"{r['rank_s']:.3f}", f"{r['world_x_rank_s']:.3f}",
                      f"{r['ratio']:.2f}", f"{r['one_rank_whole_batch_s']:.3f}", f"{r['replay_peak_extra_mb']:.1f}")
    con.print(t)
    doc = {"benchmark": "replay", "time": datetime.now(timezone.utc).isoformat(), "machine": platform.processor()
           or platform.machine(), "torch": torch.__version__, "command": " ".join([Path(sys.executable).name] + sys.argv),
           "config": a.config, "device": a.device, "threads": a.threads, "rows": rows}
    for path in (ROOT / "benchmarks/results/replay.json", ROOT / f"docs/results/replay-{a.device}.json"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
