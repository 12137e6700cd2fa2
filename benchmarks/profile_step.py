"""Where a training step's GPU time goes: `training.step.run_step` (+ the state hash) under torch.profiler.

    python3 benchmarks/profile_step.py [--backend triton] [--layers 4] [--seq-len 2048] [--batch 4] [--steps 1]

The same open-1b proxy as benchmarks/train_throughput.py. Every op the forward calls through the backend
namespace, every autograd backward node and the step's phases (reduction, clip, AdamW, stage digests, state
hash) become profiler ranges; the table lists each range's GPU kernel time (summed over calls) and share of
the step, then the heaviest kernels, and the heaviest (kernel, launch grid) pairs from the trace. GPU busy
time against the wall clock says how much is launch overhead; the idle table says which range the host was
in when the GPU waited for its next kernel (with --steps > 1, across the steps' boundaries as well).
Writes JSON (benchmarks/results/profile_step.json) and a Chrome trace next to it.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time
import types
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.train_throughput import proxy, token_batches  # noqa: E402


def _ranged(fn, name: str):
    @functools.wraps(fn)
    def inner(*a, **k):
        with record_function(name):
            return fn(*a, **k)
    return inner


class _Module:
    """A backend module whose callables run inside a profiler range named `op:<module>.<name>`."""

    def __init__(self, mod, name: str):
        self._mod, self._name = mod, name

    def __getattr__(self, attr: str):
        v = getattr(self._mod, attr)
        return _ranged(v, f"op:{self._name}.{attr}") if callable(v) and not isinstance(v, type) else v


class Traced:
    """An op namespace (kernels.backend) seen through profiler ranges."""

    def __init__(self, ns):
        self._ns = ns

    def __getattr__(self, module: str):
        v = getattr(self._ns, module)
        return _Module(v, module) if isinstance(v, types.ModuleType) else v  # e.g. the backend's `name`


def _phases() -> None:
    """Profiler ranges around run_step's phases (names looked up in training.step at call time)."""
    import training.step as s
    for name in ("reduce_gradients", "clip", "adamw_update", "named_digest", "tensor_digest"):
        setattr(s, name, _ranged(getattr(s, name), f"phase:{name}"))
    from kernels.digest import DigestMemo  # the state hash's two halves: queueing its digests, and reading them
    for name in ("queue", "digests"):
        setattr(DigestMemo, name, _ranged(getattr(DigestMemo, name), f"phase:DigestMemo.{name}"))


@functools.cache
def _events(trace: Path) -> list[dict]:
    """The Chrome trace's events, read once for the tables that each look at them."""
    return json.loads(trace.read_text()).get("traceEvents", [])


def kernels_by_grid(trace: Path) -> list[dict]:
    """GPU time per (kernel, launch grid) from the Chrome trace, heaviest first: which calls of a kernel that
    runs at several shapes (a split, the hp GEMM) carry its time."""
    groups: dict[tuple[str, str], list[float]] = {}
    for e in _events(trace):
        if e.get("cat") == "kernel" and "dur" in e:
            key = (e.get("name", "?"), "x".join(str(g) for g in e.get("args", {}).get("grid", [])))
            groups.setdefault(key, []).append(e["dur"])
    rows = [{"kernel": k[:120], "grid": g, "calls": len(d), "gpu_ms": sum(d) / 1e3} for (k, g), d in groups.items()]
    return sorted(rows, key=lambda r: r["gpu_ms"], reverse=True)


_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def _range_name(e: dict) -> str | None:
    name = e.get("name", "")
    if e.get("cat") in ("user_annotation", "cpu_op") and name.startswith(("op:", "phase:", "autograd::engine")):
        return name.replace("autograd::engine::evaluate_function: ", "bwd:")
    return None


def _ranges_by_thread(events: list[dict]) -> dict:
    """thread id -> [(start, end, range name)]: the ranges (_range_name) each host thread ran."""
    out: dict = {}
    for e in events:
        if "dur" in e and (n := _range_name(e)):
            out.setdefault(e.get("tid"), []).append((e["ts"], e["ts"] + e["dur"], n))
    return out


def _launches(events: list[dict]) -> dict:
    """correlation id -> the host call that launched it: the runtime's (torch) or the driver's (Triton's
    launcher calls cuLaunchKernel directly)."""
    return {e["args"]["correlation"]: e for e in events
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}


def _innermost(ranges: dict, e: dict, ops_first: bool) -> str:
    """The innermost range (latest start) around host event `e` on its own thread; with `ops_first`, an `op:`
    or `bwd:` range before any `phase:`."""
    inside = [r for r in ranges.get(e.get("tid"), []) if r[0] <= e["ts"] <= r[1]]
    ops = [r for r in inside if not r[2].startswith("phase:")] if ops_first else []
    pick = ops or inside
    return max(pick, key=lambda r: r[0])[2] if pick else "(outside any range)"


def kernels_by_op(trace: Path, top: int = 4) -> list[dict]:
    """GPU time per op, from the Chrome trace: each kernel (or copy, or fill) is charged to the innermost `op:`
    range or autograd node (`bwd:`) around the host call that launched it, on the launching thread (a backward
    runs on autograd's own), else to the innermost `phase:` there, else to "(outside any range)". Each row
    names its `top` heaviest kernels: which part of the step a kernel serves, where kernels_by_grid cannot say."""
    events = _events(trace)
    launches, ranges = _launches(events), _ranges_by_thread(events)
    groups: dict[str, dict[str, list[float]]] = {}
    for e in events:
        launch = launches.get(e.get("args", {}).get("correlation"))
        if e.get("cat") in _GPU_CATS and "dur" in e and launch is not None:
            owner = _innermost(ranges, launch, ops_first=True)
            groups.setdefault(owner, {}).setdefault(e.get("name", "?")[:120], []).append(e["dur"])
    rows = []
    for op, kernels in groups.items():
        heavy = sorted(kernels.items(), key=lambda kv: sum(kv[1]), reverse=True)[:top]
        rows.append({"op": op, "gpu_ms": sum(map(sum, kernels.values())) / 1e3,
                     "launches": sum(map(len, kernels.values())),
                     "kernels": [{"kernel": k, "calls": len(d), "gpu_ms": sum(d) / 1e3} for k, d in heavy]})
    return sorted(rows, key=lambda r: r["gpu_ms"], reverse=True)


def idle_by_range(trace: Path) -> list[dict]:
    """Idle GPU time and host synchronizations per range, from the Chrome trace. A gap between two GPU
    events is charged to the innermost range (latest start) around the host call that launched the second,
    on the launching thread: the host was still getting there. Syncs are the host calls that wait for the GPU
    (a pageable copy, a scalar read), counted by the range that made them, on their thread."""
    events = _events(trace)
    launches, ranges = _launches(events), _ranges_by_thread(events)
    rows: dict[str, dict] = {}

    def row(name: str) -> dict:
        return rows.setdefault(name, {"range": name, "idle_ms": 0.0, "gaps": 0, "syncs": 0, "sync_ms": 0.0})
    gpu = sorted((e for e in events if e.get("cat") in _GPU_CATS and "dur" in e), key=lambda e: e["ts"])
    busy_until = gpu[0]["ts"] + gpu[0]["dur"] if gpu else 0.0
    for nxt in gpu[1:]:
        gap = nxt["ts"] - busy_until  # from the end of all earlier work (a side stream's included)
        busy_until = max(busy_until, nxt["ts"] + nxt["dur"])
        launch = launches.get(nxt.get("args", {}).get("correlation"))
        if gap > 0 and launch is not None:
            r = row(_innermost(ranges, launch, ops_first=False))
            r["idle_ms"] += gap / 1e3
            r["gaps"] += 1
    for e in events:
        name = e.get("name", "")
        if e.get("cat") == "cuda_runtime" and name.startswith(_SYNCS) and not name.startswith("cudaMemcpyAsync"):
            r = row(_innermost(ranges, e, ops_first=False))
            r["syncs"] += 1
            r["sync_ms"] += e.get("dur", 0) / 1e3
    return sorted(rows.values(), key=lambda r: r["idle_ms"], reverse=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="triton", choices=("ref", "triton"))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1,
                    help="steps profiled one after another, unsynchronized as the trainer runs them (tables: sums)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--no-hash", action="store_true", help="stage digests off and no state hash (the nohash arm)")
    ap.add_argument("--state-only", action="store_true",
                    help="stage digests off, the state hash on (the paired arm's `statehash` mode)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "profile_step.json"))
    args = ap.parse_args(argv)
    from dataclasses import replace

    from training.config import Topology
    from training.init import init_params
    from training.presets import OPEN_1B
    from training.state_hash import canonical_json, code_version, state_entries, state_hash
    from training.step import StepContext, TrainState, run_step

    c = proxy(args.layers, args.seq_len)
    cfg = OPEN_1B.replace(**{"model": c, "train.micro_batch": args.batch, "train.batch_phases": ((1 << 50, args.batch),),
                             "train.heldout_windows": 0, "train.stage_digests": not (args.no_hash or args.state_only)})
    ctx = StepContext.build(cfg, "cuda", backend=args.backend)
    ctx = replace(ctx, ops=Traced(ctx.ops))
    _phases()
    st = TrainState.fresh(init_params(c, cfg.train.seed, ctx.device))
    code, cj = code_version(), canonical_json(cfg.to_dict()).decode()
    batches = token_batches(c, args.batch, args.warmup + args.steps)

    def step(ids):
        r = run_step(st, ids, Topology(), ctx)
        if not args.no_hash:
            with record_function("phase:state_hash"):
                state_hash(state_entries(st, cj, code, {"window": st.step}), r.memo)

    for b in batches[:args.warmup]:
        step(b)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for b in batches[args.warmup:]:
            step(b)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    trace = out.with_suffix(".trace.json")
    prof.export_chrome_trace(str(trace))
    events = prof.key_averages()
    dev_us = lambda e: getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)  # noqa: E731
    self_us = lambda e: getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)  # noqa: E731
    # device-side events only, less our ranges' GPU annotations (op:, phase:): a host op (an autograd
    # Function's forward, say) also carries the device time of the kernels it launched, counted twice otherwise
    kernels = [e for e in events if self_us(e) > 0 and e.device_type == DeviceType.CUDA
               and e.key.split(":")[0] not in ("op", "phase")]
    busy = sum(self_us(e) for e in kernels) / 1e6
    ranges = sorted((e for e in events if e.key.startswith(("op:", "phase:", "autograd::engine::evaluate_function"))),
                    key=dev_us, reverse=True)
    arm = args.backend + (" (no hashing)" if args.no_hash else " (state hash only)" if args.state_only else "")
    steps = f"{args.steps} steps (sums)" if args.steps > 1 else "step"
    print(f"\n{arm} {steps}, {c.n_layers} layers, T {c.seq_len}, {args.batch} windows: wall {wall:.3f} s, "
          f"GPU kernels {busy:.3f} s ({100 * busy / wall:.0f}% busy)\n")
    print("| range | calls | GPU ms | share of wall | CPU ms |\n| --- | --- | --- | --- | --- |")
    rows = []
    for e in ranges:
        name = e.key.replace("autograd::engine::evaluate_function: ", "bwd:")
        rows.append({"range": name, "calls": e.count, "gpu_ms": dev_us(e) / 1e3, "cpu_ms": e.cpu_time_total / 1e3})
        print(f"| {name} | {e.count} | {dev_us(e) / 1e3:.2f} | {100 * dev_us(e) / 1e6 / wall:.1f}% | "
              f"{e.cpu_time_total / 1e3:.1f} |")
    print("\n| kernel | calls | GPU ms | share of wall |\n| --- | --- | --- | --- |")
    top = []
    for e in sorted(kernels, key=self_us, reverse=True)[:args.top]:
        top.append({"kernel": e.key[:120], "calls": e.count, "gpu_ms": self_us(e) / 1e3})
        print(f"| {e.key[:90]} | {e.count} | {self_us(e) / 1e3:.2f} | {100 * self_us(e) / 1e6 / wall:.1f}% |")
    by_grid = kernels_by_grid(trace)[:args.top]
    print("\n| kernel | grid | calls | GPU ms |\n| --- | --- | --- | --- |")
    for r in by_grid:
        print(f"| {r['kernel'][:60]} | {r['grid']} | {r['calls']} | {r['gpu_ms']:.2f} |")
    by_op = kernels_by_op(trace)
    print("\n| op (launching the kernels) | GPU ms | launches | heaviest kernels (ms) |\n| --- | --- | --- | --- |")
    for r in by_op[:args.top]:
        heavy = ", ".join(f"{k['kernel'][:40]} {k['gpu_ms']:.2f}" for k in r["kernels"])
        print(f"| {r['op'][:60]} | {r['gpu_ms']:.2f} | {r['launches']} | {heavy} |")
    idle = idle_by_range(trace)
    print("\n| range (launching after a GPU gap) | idle GPU ms | gaps | host syncs | sync ms |\n"
          "| --- | --- | --- | --- | --- |")
    for r in idle[:args.top]:
        print(f"| {r['range'][:60]} | {r['idle_ms']:.2f} | {r['gaps']} | {r['syncs']} | {r['sync_ms']:.2f} |")
    idle_ms = sum(r["idle_ms"] for r in idle)
    print(f"\nGPU idle between its first and last event: {idle_ms:.2f} ms ({idle_ms / args.steps:.2f} ms a step)")
    out.write_text(json.dumps({"backend": args.backend, "hashing": not args.no_hash,
                               "stage_digests": not (args.no_hash or args.state_only), "layers": c.n_layers,
                               "seq_len": c.seq_len, "batch": args.batch, "steps": args.steps, "wall_s": wall,
                               "gpu_busy_s": busy, "gpu_idle_ms": idle_ms,
                               "ranges": rows, "kernels": top, "kernels_by_grid": by_grid, "kernels_by_op": by_op,
                               "idle_by_range": idle,
                               "gpu": torch.cuda.get_device_name()}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
