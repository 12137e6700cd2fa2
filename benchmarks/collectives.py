"""All-reduce methods side by side on the same buffers: deterministic, torch native, and the exact gradient sums.

    python3 benchmarks/collectives.py                                  # gloo, CPU, 2 and 4 processes, 4M-64M elements
    python3 benchmarks/collectives.py --backend nccl --procs 2         # NCCL, one GPU per process, 4M-256M elements
    python3 benchmarks/collectives.py --procs 2,4,7,8 --sizes-m 16,64 \
        --methods native,native-bf16,exact-limbs,exact-compact,exact-compact-native --reps 3 --warmup 1   # exact, gloo
    options: --sizes-m 4,16,64 (or --sizes-mb: MB of float32)  --methods LIST  --reps N  --warmup N  --chunks 1,8
             --out FILE

Methods (M = 2^20 elements; each rank's buffer is a float32 partial hashed from (seed, rank, index)):
  det            CollectiveGroup.all_reduce_ (recursive doubling, TreeFold's bits; det/cK: in K chunks, same bits)
  native         torch.distributed.all_reduce SUM on float32 (order unspecified)
  native-bf16    the same on the bfloat16 rounding of the partial
  exact          collectives/exact.py (per-block int64 fixed point)
  exact-limbs    the exact gradient sum's limb wire: each rank's ExactSum limbs (3 x int64) and non-finite
                 stand-ins (float64) all-reduced, then ExactSum.result(1/R) (by pieces of 2^16 elements on a
                 CPU, which stay in cache: the same bits)
  exact-compact  the same sum on collectives/exact_wire.py (ExactSum's bits, ~7 bytes an element), its integer
                 all-reduces on CollectiveGroup's recursive-doubling schedule
  exact-compact-native  the same with torch.distributed.all_reduce doing the wire's integer sums and maxima
  exact-compact-eager   exact-compact with the wire's eager torch passes (fused=False; the fused passes'
                 reference) instead of its fused ones (collectives/wire_cpu.py, wire_triton.py)
Time: median over reps of the slowest rank's seconds for the method, from the rank's buffer (or accumulator)
to the summed float32 (refills between reps are not timed; the compact wire leaves its limbs the same integers
and needs none). wire_bytes_per_element: the bytes handed to torch.distributed.all_reduce or to the group's
all_reduce_sum_ / all_reduce_max_ (the exact wires' integers, on the recursive-doubling schedule) during the timed
calls (every phase counted), per rep and element; det moves its data point to point (not counted). Checks: det's
bits against TreeFold of all ranks' partials (rank 0 rebuilds them), exact-compact's against exact-limbs', and
that every rank holds the same bits. A method whose estimated memory for all ranks exceeds 85% of the memory
available is skipped and says so.
Processes: torch.multiprocessing spawn, one per rank (NCCL: one GPU each, init with device_id).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import resource
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
from collectives import wire_cpu  # noqa: E402
from collectives.exact_wire import compact_exact_sum  # noqa: E402
from training.reduction import ExactSum  # noqa: E402

M = 1 << 20
TILE = 1 << 20  # the hashed block every partial tiles
FILL = 1 << 20  # elements per ExactSum when filling limbs (untimed; bounds the temporaries)
PIECE = 1 << 16  # elements per ExactSum.result of summed limbs: in cache, as the compact wire's passes on a CPU
METHODS = ("det", "native", "native-bf16", "exact", "exact-limbs", "exact-compact", "exact-compact-native",
           "exact-compact-eager")
# bytes per element a rank holds at once while a method runs (its buffers and the others' of its phase), for the
# memory guard; PROCESS: a rank's own (torch, gloo, the interpreter, the fill's temporaries)
FOOTPRINT = {"det": 24, "native": 16, "native-bf16": 16, "exact": 28, "exact-limbs": 36, "exact-compact": 36,
             "exact-compact-native": 36, "exact-compact-eager": 36}
PROCESS = 800 << 20
SENT = {"bytes": 0, "on": False}


def _partial(rank: int, n: int, seed: int, dev: torch.device) -> torch.Tensor:
    """Rank `rank`'s buffer: a 2^20-element block hashed from (seed, rank, index) into floats with exact
    integer ops, tiled to n. Any device rebuilds every rank's partial bit for bit (torch's RNG would tie
    the values to the device model)."""
    m = min(n, TILE)
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


def _counting_all_reduce():
    """torch.distributed.all_reduce that adds its tensor's bytes to SENT while SENT["on"] (every module calls it
    through the torch.distributed namespace, so patching it there counts them all)."""
    plain = dist.all_reduce

    def all_reduce(tensor, *args, **kw):
        if SENT["on"]:
            SENT["bytes"] += tensor.numel() * tensor.element_size()
        return plain(tensor, *args, **kw)

    return all_reduce


def _counting_group_reduce(plain):
    """A CollectiveGroup all-reduce method (the compact wire's SUM and MAX, on the recursive-doubling schedule) that
    adds its tensor's bytes to SENT while SENT["on"], as torch.distributed.all_reduce's are: `width` bytes an
    element where the call packs its int64 values to that width."""

    def reduce_(self, tensor, *args, **kw):
        if SENT["on"] and not self.native:  # native mode calls torch.distributed.all_reduce: counted there
            width = kw.get("width", args[0] if args else None)
            SENT["bytes"] += tensor.numel() * (width or tensor.element_size())
        return plain(self, tensor, *args, **kw)

    return reduce_


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _all(flag: bool, dev: torch.device) -> bool:
    """True iff `flag` holds on every rank (MIN is exact in any order)."""
    t = torch.tensor([int(flag)], dtype=torch.int32, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    bits = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.view(bits), b.view(bits))


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()


def _agree(t: torch.Tensor, g: CollectiveGroup) -> bool:
    """Every rank holds rank 0's bits of t."""
    zero = t.clone()
    g.broadcast(zero, src=0)
    return _all(_same(t, zero), g.device)


def _time(fn, refill, g: CollectiveGroup, warmup: int, reps: int) -> tuple[float, float]:
    """(median over reps of the slowest rank's seconds for fn(), bytes all-reduced per rep); refill() before each."""
    times, sent = [], 0
    for i in range(warmup + reps):
        refill()
        _sync(g.device)
        g.barrier()
        SENT.update(bytes=0, on=True)
        t0 = time.perf_counter()
        fn()
        _sync(g.device)
        dt = time.perf_counter() - t0
        SENT["on"] = False
        if i >= warmup:
            times.append(dt)
            sent += SENT["bytes"]
    t = torch.tensor(times, dtype=torch.float64, device=g.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a collective finishes when its slowest rank does
    return statistics.median(t.tolist()), sent / reps


def _fill(limbs: torch.Tensor, bad: torch.Tensor | None, rank: int, seed: int) -> None:
    """This rank's ExactSum of its partial, written into limbs (3, n) and bad (as `shared` gives them), by pieces."""
    n = limbs.shape[1]
    tile = _partial(rank, min(n, TILE), seed, limbs.device)
    for a in range(0, n, FILL):
        b = min(n, a + FILL)
        acc = ExactSum((b - a,), limbs.device)
        acc.add(tile.repeat(-(-(b - a) // tile.numel()))[: b - a])
        mine, stand_in = acc.shared()
        limbs[:, a:b] = mine
        if bad is not None:
            bad[a:b] = stand_in


def _limb_result(limbs: torch.Tensor, bad: torch.Tensor, scale: float, out: torch.Tensor) -> None:
    """ExactSum.result of summed limbs, by pieces (elementwise: the same bits as one call)."""
    piece = PIECE if out.device.type == "cpu" else FILL
    for a in range(0, out.numel(), piece):
        b = min(out.numel(), a + piece)
        out[a:b] = ExactSum.of_shared(limbs[:, a:b], bad[a:b]).result(scale)


def _float_methods(g, cfg, n, x, ref, row, chunked) -> None:
    """det, det/cK, native, native-bf16, exact on the float32 partial x."""
    buf = torch.empty_like(x)
    xb = x.to(torch.bfloat16) if "native-bf16" in cfg["methods"] else None
    bufb = torch.empty_like(xb) if xb is not None else None
    runs = []
    if "det" in cfg["methods"]:
        runs += [("det", g.all_reduce_, x, buf)]
        runs += [(f"det/c{k}", chunked[k].all_reduce_, x, buf) for k in cfg["chunks"] if k > 1]
    if "native" in cfg["methods"]:
        runs.append(("native", lambda b: dist.all_reduce(b, op=dist.ReduceOp.SUM), x, buf))
    if xb is not None:
        runs.append(("native-bf16", lambda b: dist.all_reduce(b, op=dist.ReduceOp.SUM), xb, bufb))
    if "exact" in cfg["methods"]:
        runs.append(("exact", exact_all_reduce_, x, buf))
    for name, fn, src, dst in runs:
        ms, sent = _time(lambda: fn(dst), lambda: dst.copy_(src), g, cfg["warmup"], cfg["reps"])
        row["ms"][name], row["wire_bytes_per_element"][name] = 1e3 * ms, sent / n
        checks = {"ranks agree": _agree(dst, g)}
        if name.startswith("det"):
            checks["= TreeFold"] = _all(_same(dst, ref), g.device)
        row["checks"][name] = checks


def _exact_methods(g, cfg, n, rank, world, row) -> None:
    """exact-limbs and exact-compact from this rank's ExactSum of its partial; the compact bits against the limbs'."""
    dev, seed, scale = g.device, cfg["seed"], 1.0 / world
    limbs = torch.empty((3, n), dtype=torch.int64, device=dev)
    want = None  # the limb wire's result digest
    if "exact-limbs" in cfg["methods"]:
        bad = torch.empty(n, dtype=torch.float64, device=dev)
        want = torch.empty(n, dtype=torch.float32, device=dev)

        def limb_wire() -> None:
            g.all_reduce_sum_(limbs)
            g.all_reduce_sum_(bad)
            _limb_result(limbs, bad, scale, want)

        ms, sent = _time(limb_wire, lambda: _fill(limbs, bad, rank, seed), g, cfg["warmup"], cfg["reps"])
        row["ms"]["exact-limbs"], row["wire_bytes_per_element"]["exact-limbs"] = 1e3 * ms, sent / n
        row["checks"]["exact-limbs"] = {"ranks agree": _agree(want, g)}
        want = _digest(want)
        del bad
    native = CollectiveGroup(None, native=True, device=dev)
    for name, group, fused in (("exact-compact", g, True), ("exact-compact-native", native, True),
                               ("exact-compact-eager", g, False)):
        if name not in cfg["methods"]:
            continue
        _fill(limbs, None, rank, seed)
        got, stats = [], {}

        def compact() -> None:
            out, st = compact_exact_sum([(limbs, None)], group, scale, fused=fused)
            got[:] = out
            stats.update(vars(st))

        ms, sent = _time(compact, lambda: None, g, cfg["warmup"], cfg["reps"])
        row["ms"][name], row["wire_bytes_per_element"][name] = 1e3 * ms, sent / n
        checks = {"ranks agree": _agree(got[0], g)}
        if want is not None:
            checks["= exact-limbs"] = _all(_digest(got[0]) == want, dev)
        row["checks"][name] = checks
        row[{"exact-compact": "compact", "exact-compact-native": "compact_native"}.get(name, "compact_eager")] = stats


def _worker(rank: int, world: int, port: int, cfg: dict, out_dir: str) -> None:
    backend = cfg["backend"]
    if backend == "gloo":
        torch.set_num_threads(1)
    dist.all_reduce = _counting_all_reduce()
    CollectiveGroup.all_reduce_sum_ = _counting_group_reduce(CollectiveGroup.all_reduce_sum_)
    CollectiveGroup.all_reduce_max_ = _counting_group_reduce(CollectiveGroup.all_reduce_max_)
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    g = CollectiveGroup.init(rank, world, master_addr="127.0.0.1", master_port=port, backend=backend,
                             device=dev, timeout_s=3600)
    chunked = {k: CollectiveGroup(None, chunks=k, device=dev) for k in cfg["chunks"] if k > 1}
    rows = []
    try:
        for n in cfg["sizes"]:
            skipped = cfg["skip"].get(f"{world}/{n}", {})
            row = {"procs": world, "elements": n, "size_mb": n * 4 / M, "ms": {}, "wire_bytes_per_element": {},
                   "checks": {}, "skipped": skipped}
            cfg_n = {**cfg, "methods": [m for m in cfg["methods"] if m not in skipped]}
            x = _partial(rank, n, cfg["seed"], dev)
            ref = None
            if "det" in cfg_n["methods"]:
                ref = torch.empty_like(x)
                if rank == 0:
                    tf = TreeFold()
                    for r in range(world):  # one partial at a time: O(log R) resident
                        tf.push(_partial(r, n, cfg["seed"], dev))
                    ref = tf.result()
                g.broadcast(ref, src=0)
            _float_methods(g, cfg_n, n, x, ref, row, chunked)
            del x, ref
            _exact_methods(g, cfg_n, n, rank, world, row)
            peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss], dtype=torch.float64)
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
            row["peak_rss_mib_any_rank"] = float(peak) / 1024  # so far in this process (Linux: KiB)
            rows.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
    finally:
        g.destroy()
    if rank == 0:
        Path(out_dir, "rows.json").write_text(json.dumps(rows))


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo (Linux), else a large number."""
    try:
        return next(int(ln.split()[1]) * 1024 for ln in open("/proc/meminfo") if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return 1 << 60


def skips(world: int, sizes: list[int], methods: list[str], backend: str) -> dict:
    """{"R/n": {method: reason}} for methods whose host memory over every rank would not fit now."""
    if backend != "gloo":
        return {}
    avail, out = available_bytes(), {}
    for n in sizes:
        for m in methods:
            need = world * (FOOTPRINT[m] * n + PROCESS)
            if need > 0.85 * avail:
                out.setdefault(f"{world}/{n}", {})[m] = (f"memory: ~{need / 2 ** 30:.1f} GiB for {world} ranks, "
                                                         f"{avail / 2 ** 30:.1f} GiB available")
    return out


def machine(backend: str) -> dict:
    cpu = platform.processor()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {"cpu": cpu, "cores_visible": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__}
    if backend == "gloo":
        info["compact_wire_cpu_passes"] = wire_cpu.status()  # "built": exact-compact runs the fused passes
    if backend == "nccl":
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        v = torch.cuda.nccl.version()
        info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return info


def _check_text(checks: dict) -> str:
    return ", ".join(f"{k}: {'yes' if v else '**no**'}" for k, v in checks.items())


def table(rows: list[dict]) -> list[str]:
    """One line per (procs, elements, method): wire bytes an element, median ms, against native fp32, checks."""
    head = ["procs", "elements", "method", "wire B/elem", "median ms", "/ native fp32", "checks"]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        base = r["ms"].get("native")
        for name, ms in r["ms"].items():
            b = r["wire_bytes_per_element"].get(name)
            cells = [str(r["procs"]), f"{r['elements'] // M}M", name, "-" if not b else f"{b:.3f}", f"{ms:.1f}",
                     f"{ms / base:.2f}x" if base else "-", _check_text(r["checks"].get(name, {}))]
            out.append("| " + " | ".join(cells) + " |")
        for name, why in r["skipped"].items():
            out.append("| " + " | ".join([str(r["procs"]), f"{r['elements'] // M}M", name, "-", "-", "-",
                                          f"skipped ({why})"]) + " |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    ap.add_argument("--procs", default=None, help="comma list of process counts (gloo: 2,4; nccl: all GPUs)")
    ap.add_argument("--sizes-m", default=None, help="buffer sizes in M = 2^20 elements (gloo: 4,16,64; nccl: 4,16,"
                                                   "64,256)")
    ap.add_argument("--sizes-mb", default=None, help="buffer sizes in MB of float32 (instead of --sizes-m)")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {', '.join(METHODS)}")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions (gloo 5, nccl 20)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--chunks", default="1", help="also time the pipelined det all-reduce with these chunk counts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/collectives.json")
    a = ap.parse_args()
    nccl = a.backend == "nccl"
    if nccl and not torch.cuda.is_available():
        raise SystemExit("--backend nccl needs CUDA GPUs")
    procs = [int(p) for p in (a.procs or (str(torch.cuda.device_count()) if nccl else "2,4")).split(",")]
    if nccl and max(procs) > torch.cuda.device_count():
        raise SystemExit(f"--procs {max(procs)} needs as many GPUs, found {torch.cuda.device_count()}")
    methods = a.methods.split(",")
    if not set(methods) <= set(METHODS):
        raise SystemExit(f"--methods: expected some of {', '.join(METHODS)}, got {a.methods}")
    if a.sizes_mb:
        sizes = [int(s) * M // 4 for s in a.sizes_mb.split(",")]
    else:
        sizes = [int(s) * M for s in (a.sizes_m or ("4,16,64,256" if nccl else "4,16,64")).split(",")]
    cfg = {"backend": a.backend, "seed": a.seed, "warmup": a.warmup, "methods": methods, "sizes": sizes,
           "reps": a.reps or (20 if nccl else 5), "chunks": [int(c) for c in a.chunks.split(",")]}
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # single host: rendezvous over loopback
    load = {"start": os.getloadavg()}  # other work on the machine shows in the times
    rows = []
    for world in procs:
        cfg["skip"] = skips(world, sizes, methods, a.backend)
        with tempfile.TemporaryDirectory(prefix="bench-collectives-") as tmp:
            mp.start_processes(_worker, args=(world, free_port(), cfg, tmp), nprocs=world, join=True,
                               start_method="spawn")
            rows += json.loads(Path(tmp, "rows.json").read_text())
    load["end"] = os.getloadavg()
    lines = table(rows)
    t = Table(title=f"all-reduce, {a.backend}: median of {cfg['reps']} (ms), wire bytes an element")
    for h in lines[0].strip("| ").split(" | "):
        t.add_column(h)
    for ln in lines[2:]:
        t.add_row(*ln.strip("| ").split(" | "))
    Console(width=200).print(t)
    doc = {"command": "python3 " + " ".join(sys.argv), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="minutes"), "machine": machine(a.backend), "load_average": load, "config": cfg, "results": rows,
        "table": lines}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
