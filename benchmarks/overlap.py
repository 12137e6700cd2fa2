"""When the cross-rank gradient reduction runs: bucket by bucket inside the last local backward, or after it.

    python3 benchmarks/overlap.py --out docs/results/overlap.json       # gloo: meshes 2x1, 4x1, 2x2; 6 steps, 1 warm-up
    python3 benchmarks/overlap.py --backend nccl --meshes 2x1 --out overlap_nccl.json   # one GPU a rank, Triton ops

R x S gloo ranks on this CPU (torch.multiprocessing spawn, one torch thread each) train the `--config` model
(default tiny; the demo corpus is built in a temporary directory unless --corpus) from scratch with two windows a
rank a step (micro_batch 1: two microbatches, the reduction overlaps the second one's backward), once per arm:
  bucketed   buckets of --bucket-elements (training/overlap.py), each reduced as soon as the backward has produced it
  one        a single bucket of every tensor: the reduction starts only when the backward has produced the last
             gradient (what the step did before buckets)
Each rank records the reduction's timeline (StepContext.observer: each gradient added, each bucket ready, started
and done on the communication thread, each microbatch's torch.autograd.grad returned), in seconds from the step's
start. The table: per mesh and arm, medians over rank 0's steps after --warmup of the step's seconds, the last
backward (its first gradient to autograd.grad's return), how long before that return bucket 0's reduction started,
and how long the reduction went on after it (it waits for the slowest rank's gradients too). Check: both arms end
with the state hash of the one-process run on the same virtual topology, on every rank of every mesh (rank 0 of an
HSDP mesh).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from collectives import free_port  # noqa: E402
from training.config import Topology  # noqa: E402

ARMS = ("bucketed", "one")


def _rank(rank: int, topo: Topology, port: int, cfg, arms: dict[str, int], steps: int, backend: str, ops: str,
          out: str) -> None:
    import torch.distributed as dist

    import stream
    from training.init import init_params
    from training.ray_train import TorchGroup
    from training.state_hash import state_entries, state_hash
    from training.step import StepContext, TrainState, run_step

    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    kw = {"device_id": dev} if backend == "nccl" else {}  # NCCL point to point wants an eager init (measured facts)
    if backend == "nccl":
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=topo.world, **kw)
    try:
        group = TorchGroup()
        base = StepContext.build(cfg, dev, ops)
        s = stream.open_stream(cfg.train.corpus, seq_len=cfg.model.seq_len, seed=cfg.train.seed)
        tokens = [torch.from_numpy(s.windows(*base.batch.window_range(i))).to(torch.int64).to(dev)
                  for i in range(steps)]

        def fresh() -> TrainState:
            return TrainState.fresh(init_params(cfg.model, cfg.train.seed, dev))

        result = {}
        if rank == 0:  # the one-process run on the virtual topology: what every arm must reproduce
            st = fresh()
            for i in range(steps):
                run_step(st, tokens[i], topo, base)
            result["virtual"] = {"state_hash": state_hash(state_entries(st, "{}", "c", {})).hex()}
        for arm, bucket in arms.items():
            events: list = []
            ctx = replace(base, bucket_elements=bucket,
                          observer=lambda e, b: events.append((e, b, time.perf_counter())))
            st = fresh()
            rows = []
            for i in range(steps):
                group.collectives.barrier()
                events.clear()
                t0 = time.perf_counter()
                run_step(st, tokens[i], topo, ctx, group)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                rows.append({"seconds": time.perf_counter() - t0,
                             "events": [(e, b, round(t - t0, 6)) for e, b, t in events]})
            digest = state_hash(state_entries(st, "{}", "c", {})).hex() if st.shard is None else None
            result[arm] = {"steps": rows, "state_hash": digest}
        Path(out, f"{rank}.json").write_text(json.dumps(result))
        group.collectives.barrier()
    finally:
        dist.destroy_process_group()


def _timeline(ev: list) -> dict:
    """One step's timeline in a few numbers (seconds from the step's start)."""
    end = max(t for e, b, t in ev if e == "backward_end")  # the last microbatch's autograd.grad returned
    first = min(t for e, b, t in ev if e == "gradient")
    start0 = min(t for e, b, t in ev if e == "start")
    done = max(t for e, b, t in ev if e == "done")
    return {"last_backward_s": end - first, "bucket0_lead_s": end - start0, "after_backward_s": done - end}


def _summary(rows: list, warmup: int) -> dict:
    """Medians over the timed steps: the step's seconds and its timeline's numbers."""
    timed = rows[warmup:]
    lines = [_timeline(r["events"]) for r in timed]
    return {"median_step_s": statistics.median(r["seconds"] for r in timed),
            "buckets": sum(e == "start" for e, _, _ in timed[-1]["events"]),
            **{k: statistics.median(x[k] for x in lines) for k in lines[0]}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--meshes", default="2x1,4x1,2x2", help="R x S topologies")
    p.add_argument("--config", default="tiny")
    p.add_argument("--corpus", default=None)
    p.add_argument("--bucket-elements", type=int, default=1 << 16)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"), help="nccl: one GPU a rank")
    p.add_argument("--ops", default=None, help="the op backend (default: ref on gloo, triton on nccl)")
    p.add_argument("--out", default="benchmarks/results/overlap.json")
    a = p.parse_args(argv)

    import stream
    from training.presets import run_config

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    rows, details = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = a.corpus
        base = run_config(a.config, corpus=corpus or tmp)
        if corpus is None:
            stream.build_demo(tmp, vocab_size=base.model.vocab_size, progress=False)
        arms = {"bucketed": a.bucket_elements, "one": 1 << 62}
        for mesh in a.meshes.split(","):
            topo = Topology.parse(mesh)
            cfg = base.replace(**{"train.micro_batch": 1, "train.batch_phases": ((1 << 50, 2 * topo.world),)})
            with tempfile.TemporaryDirectory() as out:
                ops = a.ops or ("triton" if a.backend == "nccl" else "ref")
                mp.start_processes(_rank, args=(topo, free_port(), cfg, arms, a.steps, a.backend, ops, out),
                                   nprocs=topo.world, join=True, start_method="spawn")
                ranks = [json.loads(Path(out, f"{r}.json").read_text()) for r in range(topo.world)]
            hashes = {r[arm]["state_hash"] for r in ranks for arm in ARMS} - {None}
            if hashes != {ranks[0]["virtual"]["state_hash"]}:
                raise SystemExit(f"{mesh}: an arm or rank ends in a state other than the one-process run's on {mesh}: "
                                 f"{sorted(hashes)}")
            for arm in ARMS:
                rows.append({"mesh": topo.label(), "arm": arm, **_summary(ranks[0][arm]["steps"], a.warmup)})
            details[topo.label()] = {arm: ranks[0][arm]["steps"][-1]["events"] for arm in ARMS}

    t = Table(title=f"gradient reduction against the last backward, {a.config}, rank 0, medians over timed steps")
    for c in ("mesh", "arm", "buckets", "median step s", "last backward s", "bucket 0 starts, s before its end",
              "reduction after its end s"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["mesh"], r["arm"], str(r["buckets"]), f"{r['median_step_s']:.3f}",
                  f"{r['last_backward_s']:.3f}", f"{r['bucket0_lead_s']:.3f}",
                  f"{r['after_backward_s']:.3f}")
    Console().print(t)
    doc = {"benchmark": "overlap", "date": datetime.date.today().isoformat(), "machine": platform.machine(),
           "backend": a.backend, "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
           "cpus": os.cpu_count(), "load_avg": os.getloadavg(), "torch": torch.__version__, "config": a.config,
           "bucket_elements": a.bucket_elements, "steps": a.steps, "warmup": a.warmup,
           "state_hash_of_the_one_process_run": True, "rows": rows, "last_step_events_rank0": details}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    tmp_out = Path(a.out).with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(doc, indent=1))
    os.replace(tmp_out, a.out)  # atomic
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
