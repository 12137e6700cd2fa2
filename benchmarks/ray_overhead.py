"""What training through Ray Train costs: tokens/s of the one-process trainer against one Ray Train worker on the
same device, the same config and backend, side by side in one run: one-process, then `--rounds` times Ray and
one-process again, so that a drift of the machine shows as a spread between the one-process arms.

Each arm trains `--steps` steps from scratch with no checkpoints or evaluations in between; its tokens/s is the step's
tokens over the median of its per-step seconds (metrics.jsonl) after `--warmup` steps, and the cost of Ray is the
median of all Ray steps against the median of all one-process steps (pooled over the rounds). A small step on a GPU is
bound by the host's kernel launches, so the host's other load shows in it: both arms run with the same `--threads`,
and OpenMP's idle threads sleep (OMP_WAIT_POLICY=PASSIVE, as the Makefile sets it) instead of spinning against
Ray's processes. The Ray arm's driver makes
the run directory and the checkpoint of step 0 on its CPU, then one worker trains on the device (a whole GPU, NCCL
group of one): its steps are the one-process steps plus whatever Ray Train adds to each.

    python benchmarks/ray_overhead.py --config small-parity --device cuda --backend triton --steps 40 \\
        --out benchmarks/results/ray_overhead_h100.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from training.presets import run_config  # noqa: E402
from training.ray_auth import auth_mode, token_auth  # noqa: E402
from training.rundir import HASHLOG, METRICS, read_jsonl  # noqa: E402
from training.train import TrainOptions, train  # noqa: E402

auth_mode()  # before anything imports ray, which reads RAY_AUTH_MODE once, as it is imported


def _rate(run: Path, warmup: int, tokens_per_step: int) -> dict:
    steps = [r["seconds"] for r in read_jsonl(run / METRICS) if r.get("event") == "step" and r["step"] >= warmup]
    secs = statistics.median(steps)
    return {"steps_timed": len(steps), "median_step_s": secs, "tokens_per_s": tokens_per_step / secs,
            "step_seconds": steps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="small-parity")
    p.add_argument("--corpus", default=None, help="default: the config's")
    p.add_argument("--device", default="cuda")
    p.add_argument("--backend", default="triton")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1, help="(Ray, one-process) pairs after the first one-process arm")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads of both arms (default: the driver's; Ray's workers would otherwise get 1)")
    p.add_argument("--out", default="benchmarks/results/ray_overhead.json")
    a = p.parse_args(argv)

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP; Ray's workers inherit it
    import ray
    import torch

    from training.ray_train import train_ray

    cfg = run_config(a.config, corpus=a.corpus)
    threads = a.threads or torch.get_num_threads()
    opts = TrainOptions(a.steps, checkpoint_every=0, eval_every=0, device=a.device, backend=a.backend, progress=False,
                        threads=threads)
    tokens_per_step = None
    rows, logs = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        token_auth()
        ray.init(address="local", num_cpus=4, num_gpus=1 if a.device.startswith("cuda") else 0,
                 include_dashboard=False, log_to_driver=False)
        try:
            for i, arm in enumerate(["one-process"] + ["ray-train", "one-process"] * a.rounds):
                out = Path(tmp) / f"{i}-{arm}"
                t0 = time.perf_counter()
                if arm == "ray-train":
                    train_ray(cfg, out, opts, (1, 1), threads=threads, gpus_per_worker=1.0)
                else:
                    train(cfg, out, opts)
                log = read_jsonl(out / HASHLOG)
                tokens_per_step = tokens_per_step or log[1]["tokens"]
                logs.setdefault(arm, []).append([{k: v for k, v in r.items() if k != "topology"} for r in log])
                rows.append({"arm": arm, "wall_s": time.perf_counter() - t0, **_rate(out, a.warmup, tokens_per_step)})
        finally:
            ray.shutdown()
    pooled = {arm: statistics.median(s for r in rows if r["arm"] == arm for s in r["step_seconds"])
              for arm in ("one-process", "ray-train")}
    result = {"config": a.config, "device": a.device, "backend": a.backend, "steps": a.steps, "warmup": a.warmup,
              "threads": threads,
              "gpu": torch.cuda.get_device_name() if a.device.startswith("cuda") else None,
              "torch": torch.__version__, "tokens_per_step": tokens_per_step, "arms": rows,
              "pooled_median_step_s": pooled, "ray_cost": pooled["ray-train"] / pooled["one-process"] - 1.0,
              "same_log": all(x == logs["one-process"][0] for arm_logs in logs.values() for x in arm_logs)}
    print(f"{'arm':12} {'tokens/s':>10} {'median step s':>14} {'wall s':>8}")
    for r in rows:
        print(f"{r['arm']:12} {r['tokens_per_s']:10.0f} {r['median_step_s']:14.4f} {r['wall_s']:8.1f}")
    print(f"Ray Train costs {100 * result['ray_cost']:+.2f}% of the one-process tokens/s (pooled median step "
          f"{pooled['ray-train']:.4f} s vs {pooled['one-process']:.4f} s); every arm the same hash log but for the "
          f"topology: {result['same_log']}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
