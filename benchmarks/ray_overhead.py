"""What training through Ray Train costs: tokens/s of the one-process trainer against one Ray Train worker on the
same device, the same config and backend, side by side in one run (one-process, Ray, one-process again, so that a
drift of the machine shows as a spread between the two one-process arms).

Each arm trains `--steps` steps from scratch with no checkpoints or evaluations in between; its tokens/s is the step's
tokens over the median of its per-step seconds (metrics.jsonl) after `--warmup` steps. The Ray arm's driver makes
the run directory and the checkpoint of step 0 on its CPU, then one worker trains on the device (a whole GPU, NCCL
group of one): its steps are the one-process steps plus whatever Ray Train adds to each.

    python benchmarks/ray_overhead.py --config small-parity --device cuda --backend triton --steps 40 \\
        --out benchmarks/results/ray_overhead_h100.json
"""
from __future__ import annotations

import argparse
import json
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
    steps = [r for r in read_jsonl(run / METRICS) if r.get("event") == "step" and r["step"] >= warmup]
    secs = statistics.median(r["seconds"] for r in steps)
    return {"steps_timed": len(steps), "median_step_s": secs, "tokens_per_s": tokens_per_step / secs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="small-parity")
    p.add_argument("--corpus", default=None, help="default: the config's")
    p.add_argument("--device", default="cuda")
    p.add_argument("--backend", default="triton")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", default="benchmarks/results/ray_overhead.json")
    a = p.parse_args(argv)

    import ray
    import torch

    from training.ray_train import train_ray

    cfg = run_config(a.config, corpus=a.corpus)
    opts = TrainOptions(a.steps, checkpoint_every=0, eval_every=0, device=a.device, backend=a.backend, progress=False)
    tokens_per_step = None
    rows, logs = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        token_auth()
        ray.init(address="local", num_cpus=4, num_gpus=1 if a.device.startswith("cuda") else 0,
                 include_dashboard=False, log_to_driver=False)
        try:
            for i, arm in enumerate(("one-process", "ray-train", "one-process")):
                out = Path(tmp) / f"{i}-{arm}"
                t0 = time.perf_counter()
                if arm == "ray-train":
                    train_ray(cfg, out, opts, (1, 1), gpus_per_worker=1.0)
                else:
                    train(cfg, out, opts)
                log = read_jsonl(out / HASHLOG)
                tokens_per_step = tokens_per_step or log[1]["tokens"]
                logs[arm] = [{k: v for k, v in r.items() if k != "topology"} for r in log]
                rows.append({"arm": arm, "wall_s": time.perf_counter() - t0, **_rate(out, a.warmup, tokens_per_step)})
        finally:
            ray.shutdown()
    base = statistics.mean(r["tokens_per_s"] for r in rows if r["arm"] == "one-process")
    ray_row = next(r for r in rows if r["arm"] == "ray-train")
    result = {"config": a.config, "device": a.device, "backend": a.backend, "steps": a.steps, "warmup": a.warmup,
              "gpu": torch.cuda.get_device_name() if a.device.startswith("cuda") else None,
              "torch": torch.__version__, "tokens_per_step": tokens_per_step, "arms": rows,
              "ray_cost": base / ray_row["tokens_per_s"] - 1.0,
              "same_log": logs["ray-train"] == logs["one-process"]}
    print(f"{'arm':12} {'tokens/s':>10} {'median step s':>14} {'wall s':>8}")
    for r in rows:
        print(f"{r['arm']:12} {r['tokens_per_s']:10.0f} {r['median_step_s']:14.4f} {r['wall_s']:8.1f}")
    print(f"Ray Train costs {100 * result['ray_cost']:+.2f}% of the one-process tokens/s; the same hash log but for "
          f"the topology: {result['same_log']}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
