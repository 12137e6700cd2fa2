"""Deterministic all-reduce vs torch.distributed.all_reduce on the same buffers, side by side in one run.

    python3 benchmarks/collectives.py                                  # gloo, CPU, 2 and 4 processes, 16-256 MB
    python3 benchmarks/collectives.py --backend nccl --procs 2         # NCCL, one GPU per process, 16 MB-1 GB
    options: --sizes-mb 16,64,256  --reps N  --warmup N  --chunks 1,8  --no-exact  --out FILE

Variants per buffer: det (recursive-doubling, TreeFold's bits; CollectiveGroup.all_reduce_, which reuses
its receive buffers), det/cK (the same, pipelined in K chunks: same bits), native
(torch.distributed.all_reduce SUM: order unspecified), exact (fixed-point int64 sum on the native
all-reduce, collectives/exact.py). Time = median over reps of the slowest rank's time. The premium is
det / native. Bits: every rank's det result is compared with TreeFold of all ranks' partials (rank 0
rebuilds them from their seeds by integer hashing and folds them one at a time), and so is native's
(reported, not required); exact is checked for identical bits on every rank.
Processes: torch.multiprocessing spawn, one per rank (NCCL: one GPU each, init with device_id).
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
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from collectives import CollectiveGroup, TreeFold, free_port  # noqa: E402
from collectives.exact import exact_all_reduce_  # noqa: E402

MB = 1 << 20


def _partial(rank: int, n: int, seed: int, dev: torch.device) -> torch.Tensor:
    """Rank `rank`'s buffer: a 2^20-element block hashed from (seed, rank, index) into floats with exact
    integer ops, tiled to n. Any device rebuilds every rank's partial bit for bit (torch's RNG would tie
    the values to the device model)."""
    m = min(n, 1 << 20)
    h = torch.arange(m, dtype=torch.int64, device=dev)
    h = (h * 0x9E3779B1 + (seed * 1000 + rank + 1) * 0x85EBCA77) & 0xFFFFFFFF
    for mul, shift in ((0x2C1B3C6D, 15), (0x297A2D39, 12), (0x7FEB352D, 15)):
        h = ((h ^ (h >> shift)) * mul) & 0xFFFFFFFF
    mant = ((h >> 8) - (1 << 23)).to(torch.float32)  # |mant| < 2^23: exact
    exp = (h & 15).to(torch.int32) + (127 - 31)  # 2^-31 .. 2^-16: values ~2^-8 .. 2^7
    block = mant * (exp << 23).view(torch.float32)
    out = torch.empty(n, dtype=torch.float32, device=dev)
    for a in range(0, n, m):
        out[a:a + m] = block[: min(m, n - a)]
    return out


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _all(flag: bool, dev: torch.device) -> bool:
    """True iff `flag` holds on every rank (MIN is exact in any order)."""
    t = torch.tensor([int(flag)], dtype=torch.int32, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def _time(fn, x: torch.Tensor, buf: torch.Tensor, g: CollectiveGroup, warmup: int, reps: int) -> float:
    """Median over reps of the slowest rank's seconds for fn(buf), buf refilled from x before each rep."""
    times = []
    for i in range(warmup + reps):
        buf.copy_(x)
        _sync(g.device)
        g.barrier()
        t0 = time.perf_counter()
        fn(buf)
        _sync(g.device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    t = torch.tensor(times, dtype=torch.float64, device=g.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a collective finishes when its slowest rank does
    return statistics.median(t.tolist())


def _worker(rank: int, world: int, port: int, cfg: dict, out_dir: str) -> None:
    backend = cfg["backend"]
    if backend == "gloo":
        torch.set_num_threads(1)
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    g = CollectiveGroup.init(rank, world, master_addr="127.0.0.1", master_port=port, backend=backend,
                             device=dev, timeout_s=1800)
    chunked = {k: CollectiveGroup(None, chunks=k, device=dev) for k in cfg["chunks"] if k > 1}
    rows = []
    try:
        for size_mb in cfg["sizes_mb"]:
            n = size_mb * MB // 4
            x = _partial(rank, n, cfg["seed"], dev)
            ref = torch.empty_like(x)
            if rank == 0:
                tf = TreeFold()
                for r in range(world):  # one partial at a time: O(log R) resident
                    tf.push(_partial(r, n, cfg["seed"], dev))
                ref = tf.result()
            g.broadcast(ref, src=0)
            buf = torch.empty_like(x)
            row = {"procs": world, "size_mb": size_mb, "ms": {}, "bits_equal_treefold": {}, "ranks_agree": {}}
            variants = [("det", g.all_reduce_)]
            variants += [(f"det/c{k}", chunked[k].all_reduce_) for k in cfg["chunks"] if k > 1]
            variants.append(("native", lambda b: dist.all_reduce(b, op=dist.ReduceOp.SUM)))
            if cfg["exact"]:
                variants.append(("exact", lambda b: exact_all_reduce_(b)))
            for name, fn in variants:
                row["ms"][name] = 1e3 * _time(fn, x, buf, g, cfg["warmup"], cfg["reps"])
                zero = buf.clone()
                g.broadcast(zero, src=0)
                row["ranks_agree"][name] = _all(_same(buf, zero), dev)
                row["bits_equal_treefold"][name] = _all(_same(buf, ref), dev)
                del zero
            rows.append(row)
            del x, ref, buf
            if rank == 0:
                print(json.dumps(row), flush=True)
    finally:
        g.destroy()
    if rank == 0:
        Path(out_dir, "rows.json").write_text(json.dumps(rows))


def machine(backend: str) -> dict:
    cpu = platform.processor()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {"cpu": cpu, "cores_visible": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__}
    if backend == "nccl":
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        v = torch.cuda.nccl.version()
        info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return info


def table(rows: list[dict]) -> list[str]:
    names = list(rows[0]["ms"])
    head = ["procs", "MB"] + [f"{n} ms" for n in names] + ["premium det/native"]
    head += [f"{n}/native" for n in names if n not in ("det", "native")]
    head += ["det = TreeFold", "native = TreeFold", "exact: ranks agree" if "exact" in names else ""]
    out = ["| " + " | ".join(h for h in head if h) + " |", "|" + " --- |" * len([h for h in head if h])]
    for r in rows:
        ms = r["ms"]
        cells = [str(r["procs"]), str(r["size_mb"])] + [f"{ms[n]:.1f}" for n in names]
        cells.append(f"{ms['det'] / ms['native']:.2f}x")
        cells += [f"{ms[n] / ms['native']:.2f}x" for n in names if n not in ("det", "native")]
        bt = r["bits_equal_treefold"]
        cells += ["yes" if all(bt[n] for n in names if n.startswith("det")) else "**no**",
                  "yes" if bt["native"] else "no"]
        if "exact" in names:
            cells.append("yes" if r["ranks_agree"]["exact"] else "**no**")
        out.append("| " + " | ".join(cells) + " |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    ap.add_argument("--procs", default=None, help="comma list of process counts (gloo: 2,4; nccl: all GPUs)")
    ap.add_argument("--sizes-mb", default=None, help="buffer sizes in MB (gloo: 16,64,256; nccl: 16,64,256,1024)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions (gloo 5, nccl 20)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--chunks", default="1", help="also time the pipelined det all-reduce with these chunk counts")
    ap.add_argument("--no-exact", action="store_true", help="skip the fixed-point all-reduce")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/collectives.json")
    a = ap.parse_args()
    nccl = a.backend == "nccl"
    if nccl and not torch.cuda.is_available():
        raise SystemExit("--backend nccl needs CUDA GPUs")
    procs = [int(p) for p in (a.procs or (str(torch.cuda.device_count()) if nccl else "2,4")).split(",")]
    if nccl and max(procs) > torch.cuda.device_count():
        raise SystemExit(f"--procs {max(procs)} needs as many GPUs, found {torch.cuda.device_count()}")
    cfg = {"backend": a.backend, "seed": a.seed, "warmup": a.warmup, "exact": not a.no_exact,
           "reps": a.reps or (20 if nccl else 5), "chunks": [int(c) for c in a.chunks.split(",")],
           "sizes_mb": [int(s) for s in (a.sizes_mb or ("16,64,256,1024" if nccl else "16,64,256")).split(",")]}
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # single host: rendezvous over loopback
    rows = []
    for world in procs:
        with tempfile.TemporaryDirectory(prefix="bench-collectives-") as tmp:
            mp.start_processes(_worker, args=(world, free_port(), cfg, tmp), nprocs=world, join=True,
                               start_method="spawn")
            rows += json.loads(Path(tmp, "rows.json").read_text())
    lines = table(rows)
    t = Table(title=f"all-reduce, {a.backend}: det vs torch native (ms, median of {cfg['reps']})")
    for h in lines[0].strip("| ").split(" | "):
        t.add_column(h)
    for ln in lines[2:]:
        t.add_row(*ln.strip("| ").split(" | "))
    Console(width=200).print(t)
    doc = {"command": "python3 " + " ".join(sys.argv), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="minutes"), "machine": machine(a.backend), "config": cfg, "results": rows, "table": lines}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
