"""Where the state hash's time goes after a step: host planning, BLAKE3 kernels, the digests' transfer.

    python3 benchmarks/state_hash_cost.py [--layers 24] [--seq-len 2048] [--batch 4] [--reps 6] [--clocks]

The rounds of benchmarks/train_throughput.py (`triton-paired`, `triton-pipelined`) say what the state hash adds
to a step. This splits it into its parts on the trainer's real state (Triton backend, one step run so
that params, m, v and the clipped gradients hold a step's values), each timed with the GPU idle before:

- `host: buffers`: `statehash._words` over every tensor (the no-copy fast path, or a padded copy);
- `host: plan`: `statehash._plan`, the launch tables;
- `digests, events, planned anew` / `plan kept`: CUDA events around `statehash.queue_digests`: its host
  work, which the idle GPU waits for, then every chunk and tree launch; with its launch tables planned anew,
  or kept from the call before (statehash._launch_tables);
- `digests, wall`: `queue_digests` and the digests' transfer to the host, wall clock (plan kept);
- `state hash, wall`: `training.state_hash.state_hash(state_entries(...))`, what the trainer calls after its step.

Reps alternate the chunk kernel's loads (LOADS: statehash.VECTOR_LOADS and PREFETCH), one after the other on
the same state, and check their digests equal. `--clocks`: nvidia-smi's SM clock and power over each state
hash (benchmarks/gpu_clocks.py), to set beside the paired rounds' (train_throughput.py --clocks). Prints a table of medians, writes JSON
(benchmarks/results/state_hash_cost.json).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from training.config import Topology  # noqa: E402
from benchmarks.gpu_clocks import ClockLog, no_spans  # noqa: E402
from benchmarks.train_throughput import proxy, setup_ours, token_batches  # noqa: E402


def _wall(fn) -> tuple[float, object]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def _gpu(fn) -> float:
    """Seconds between CUDA events around fn's launches, the GPU idle before."""
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e-3


LOADS = {"tile loads": (False, False), "16-byte loads": (True, False), "16-byte loads a block ahead": (True, True)}


def measure(tensors, entries_fn, loads: str, span=no_spans) -> tuple[dict, bytes]:
    from training.state_hash import state_hash
    from kernels.triton import statehash

    statehash.VECTOR_LOADS, statehash.PREFETCH = LOADS[loads]
    host0 = time.perf_counter()
    buffers = [statehash._words(t) for t in tensors]
    host1 = time.perf_counter()
    statehash._plan(buffers)
    host2 = time.perf_counter()
    statehash._plans.clear()
    anew = _gpu(lambda: statehash.queue_digests(tensors))
    kept = _gpu(lambda: statehash.queue_digests(tensors))
    wall, rows = _wall(lambda: statehash.queue_digests(tensors).cpu())
    with span(f"{loads}: the state hash"):
        full, digest = _wall(lambda: state_hash(entries_fn()))
    return {"host: buffers": host1 - host0, "host: plan": host2 - host1, "digests, events, planned anew": anew,
            "digests, events, plan kept": kept, "digests, wall": wall,
            "state hash, wall": full}, bytes(rows.numpy().tobytes()) + digest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=6, help="reps of each load path (after one untimed each)")
    ap.add_argument("--clocks", action="store_true", help="nvidia-smi's SM clock and power over each state hash")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "state_hash_cost.json"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("state_hash_cost: needs a CUDA GPU", file=sys.stderr)
        return 2
    from training.state_hash import state_entries
    from training.step import run_step

    c = proxy(args.layers, args.seq_len)
    ctx, st, code, cj = setup_ours(c, args.batch, 1, "triton", stage=False)
    run_step(st, token_batches(c, args.batch, 1)[0], Topology(), ctx)
    entries_fn = lambda: state_entries(st, cj, code, {"window": st.step})  # noqa: E731
    tensors = [v for _, v in sorted(entries_fn().items(), key=lambda kv: kv[0].encode())
               if isinstance(v, torch.Tensor)]
    gib = sum(t.numel() * t.element_size() for t in tensors) / 2**30
    samples: dict[str, list[dict]] = {name: [] for name in LOADS}
    first = None
    log = ClockLog() if args.clocks else None
    for rep in range(args.reps + 1):
        for name in LOADS:
            row, bits = measure(tensors, entries_fn, name, log.span if log else no_spans)
            first = first or bits
            if bits != first:
                print(f"state_hash_cost: digests differ ({name}, rep {rep})", file=sys.stderr)
                return 1
            if rep:
                samples[name].append(row)
    parts = list(samples["tile loads"][0])
    med = {name: {p: statistics.median(r[p] for r in rows) for p in parts} for name, rows in samples.items()}
    print(f"\nopen-1b proxy, {args.layers} layers: {len(tensors)} tensors, {gib:.2f} GiB hashed; digests equal "
          f"with every load\n")
    print("| part | " + " | ".join(f"{name} ms" for name in LOADS) + " |")
    print("| --- |" + " --- |" * len(LOADS))
    for p in parts:
        print(f"| {p} | " + " | ".join(f"{1e3 * med[name][p]:.2f}" for name in LOADS) + " |")
    out = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "layers": args.layers,
           "tensors": len(tensors), "gib": gib, "device": torch.cuda.get_device_name(),
           "median_s": med, "samples_s": samples}
    if log:
        out["clocks"] = log.stop()  # the untimed first rep's spans included
        for name, s in out["clocks"].items():
            print(f"clocks, {name}: {s}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
