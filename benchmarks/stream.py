"""Throughput of the canonical stream from the tokenized cache on one core, and the time to position it.

    python benchmarks/stream.py [--corpus DIR] [--seq-len 4096] [--seconds 3] [--out benchmarks/results/stream.json]

Without --corpus the embedded demo corpus is built into a temporary directory first (not timed).
Throughput: sequential `windows(m, m + 64)` calls (64 windows of seq_len + 1 tokens each), after the
shard caches are loaded; both gather paths (one slice per document, vectorized per token) are timed.
Positioning: a stream of seq_len 512, 4 windows per step is run to step 10**6 saving a state every
100 steps (states to a directory, not fsynced), then fresh streams are positioned at several steps
from that directory; the worst case is 99 steps past a saved state.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import stream  # noqa: E402
import stream.windows as W  # noqa: E402
from stream.schedule import BatchPhase, BatchSchedule  # noqa: E402


def machine() -> dict:
    cpu = platform.processor()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores_visible": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__}


def throughput(corpus: Path, seq_len: int, seconds: float, loop_min: int | None) -> dict:
    """Tokens per second of sequential window reads (warm cache)."""
    if loop_min is not None:
        W._LOOP_MIN_TOKENS = loop_min
    try:
        s = stream.open_stream(corpus, seq_len, 42)
        s.windows(0, 256)  # load every shard cache the first windows touch
        per_call, m, n, t0 = 64, 256, 0, time.perf_counter()
        while (dt := time.perf_counter() - t0) < seconds:
            x = s.windows(m, m + per_call)
            m += per_call
            n += x.size
        return {"seq_len": seq_len, "windows": m - 256, "tokens": n, "seconds": dt, "tokens_per_s": n / dt}
    finally:
        W._LOOP_MIN_TOKENS = 64


def positioning(corpus: Path, workdir: Path, last_step: int, every: int) -> dict:
    """Run to `last_step` saving states every `every` steps, then position fresh streams from them."""
    sched = BatchSchedule(512, (BatchPhase(1 << 62, 4),))
    store = stream.StateStore(workdir / "states", durable=False)
    s = stream.open_stream(corpus, sched.seq_len, 42)
    t0 = time.perf_counter()
    for step in range(0, last_step + 1, every):
        s.seek_step(step, sched)
        store.save(step, s.state())
    chain_s = time.perf_counter() - t0
    rows = []
    targets = [1_099, 10_099, 100_099, last_step - 1, last_step]
    for step in targets:
        fresh = stream.open_stream(corpus, sched.seq_len, 42)
        t0 = time.perf_counter()
        fresh.seek_step(step, sched, store)
        dt = time.perf_counter() - t0
        rows.append({"step": step, "from_state": store.nearest(step)[0], "seconds": dt})
        if step == last_step - 1:
            # correctness: read the step, and the state after it must be the saved state of the next step
            a, b = sched.window_range(step)
            fresh.windows(a, b)
            if fresh.state() != store.load(last_step):
                raise SystemExit("positioning check failed: state after step differs from the saved one")
    return {"seq_len": sched.seq_len, "windows_per_step": 4, "last_step": last_step, "every": every,
            "states": len(store.steps()), "chain_seconds": chain_s, "targets": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default=None, help="a prepared corpus (default: build the demo in a temp dir)")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--last-step", type=int, default=1_000_000)
    p.add_argument("--every", type=int, default=100)
    p.add_argument("--out", default="benchmarks/results/stream.json")
    args = p.parse_args(argv)
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = Path(args.corpus) if args.corpus else tmp / "demo"
        if not args.corpus:
            console.print("building the demo corpus (not timed) ...")
            stream.build_demo(corpus, progress=False)
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core from here on
        m = stream.load_manifest(corpus)
        res = {"command": " ".join(["python benchmarks/stream.py"] + (argv if argv is not None else sys.argv[1:])),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "machine": machine(), "one_core": hasattr(os, "sched_setaffinity"),
               "corpus": {"digest": m.digest, "tokens": sum(s.tokens for s in m.sources),
                          "documents": sum(s.documents for s in m.sources)}}
        res["throughput"] = {"auto": throughput(corpus, args.seq_len, args.seconds, None),
                             "slice per document": throughput(corpus, args.seq_len, args.seconds, 1),
                             "vectorized per token": throughput(corpus, args.seq_len, args.seconds, 10 ** 12)}
        res["positioning"] = positioning(corpus, tmp, args.last_step, args.every)
    t = Table(title="stream benchmark (one core)")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_column("target", justify="right")
    for k, v in res["throughput"].items():
        t.add_row(f"tokens/s, seq_len {v['seq_len']}, gather: {k}", f"{v['tokens_per_s'] / 1e6:.1f} M", ">= 20 M" if k == "auto" else "")
    pos = res["positioning"]
    t.add_row(f"run to step {pos['last_step']:,} saving {pos['states']:,} states", f"{pos['chain_seconds']:.1f} s", "")
    for r in pos["targets"]:
        t.add_row(f"position at step {r['step']:,} (state of step {r['from_state']:,})", f"{r['seconds'] * 1e3:.1f} ms", "< 1 s")
    console.print(t)
    console.print(f"corpus {res['corpus']['tokens']:,} tokens, {res['corpus']['documents']:,} documents; "
                  f"{res['machine']['cpu']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
