"""Triton twins vs stock PyTorch vs the BR reference backend on CUDA, forward + backward, with each op's
floor from the bytes it must move (each input read once, each output written once).

    python benchmarks/triton_ops.py [--tokens 8192] [--out benchmarks/results/triton_ops.json]

Shapes follow open-1b (hidden 2048, FFN 5632, head dim 128). Times are medians of
triton.testing.do_bench (CUDA events, L2 flushed between runs). Also: on-device BLAKE3 of a 1 GiB
state vs copying it to the host and hashing there with stock blake3.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels.ref import adamw as r_adamw, elementary as r_el, philox, reduce as r_reduce  # noqa: E402
from kernels.ref import rmsnorm as r_rms, rope as r_rope, softmax as r_soft, swiglu as r_swiglu  # noqa: E402

NOMINAL_BW = 4.8e12  # H200 HBM3e, bytes/s (datasheet)
DEV = torch.device("cuda")


def _x(shape, seed, std=1.0, grad=True):
    return philox.normal(seed, 0, shape, std=std, device=DEV).requires_grad_(grad)


def _fb(fn, *inputs):
    """Forward + backward with a fixed upstream gradient."""
    g = {}

    def run():
        for t in inputs:
            t.grad = None
        y = fn()
        if "g" not in g:
            g["g"] = torch.ones_like(y)
        y.backward(g["g"])
    return run


def cases(n: int, d: int, f: int, hd: int):
    """(op, shape, bytes moved fwd+bwd, triton fn, stock fn, ref fn)."""
    from kernels.triton import adamw as t_adamw, elementary as t_el, reduce as t_reduce
    from kernels.triton import rmsnorm as t_rms, rope as t_rope, softmax as t_soft, swiglu as t_swiglu

    el = n * d
    x = _x((n, d), 1)
    xp = (x.detach().abs() + 1e-3).requires_grad_()
    w = (1.0 + 0.1 * _x((d,), 2, grad=False)).requires_grad_()
    gu = _x((n, 2 * f), 3)
    heads = d // hd
    q = _x((n // 2048, heads, 2048, hd), 4)
    cos, sin = r_rope.rope_tables(2048, hd, device=DEV)
    sm = _x((n, 2048), 5, std=3.0)

    def stock_rope(z):
        z1, z2 = z[..., : hd // 2], z[..., hd // 2:]
        return torch.cat([z1 * cos - z2 * sin, z2 * cos + z1 * sin], -1)

    rows = []
    for name, t_fn, s_fn, r_fn, inp in (("exp", t_el.exp, torch.exp, r_el.exp, x),
                                        ("sigmoid", t_el.sigmoid, torch.sigmoid, r_el.sigmoid, x),
                                        ("silu", t_el.silu, F.silu, r_el.silu, x),
                                        ("sqrt", t_el.sqrt, torch.sqrt, r_el.sqrt, xp),
                                        ("rsqrt", t_el.rsqrt, torch.rsqrt, r_el.rsqrt, xp)):
        rows.append((name, f"{n}x{d}", 20 * el, _fb(lambda t=t_fn, i=inp: t(i), inp),
                     _fb(lambda s=s_fn, i=inp: s(i), inp), _fb(lambda r=r_fn, i=inp: r(i), inp)))
    rows += [
        ("sum (exact, last dim)", f"{n}x{d}", 8 * el, _fb(lambda: t_reduce.sum(x, -1), x),
         _fb(lambda: x.sum(-1), x), _fb(lambda: r_reduce.sum(x, -1), x)),
        ("rmsnorm (gain)", f"{n}x{d}", 20 * el, _fb(lambda: t_rms.rmsnorm(x, w), x, w),
         _fb(lambda: F.rms_norm(x, (d,), w, 1e-6), x, w), _fb(lambda: r_rms.rmsnorm(x, w), x, w)),
        ("swiglu", f"{n}x{2 * f}", 32 * n * f, _fb(lambda: t_swiglu.swiglu(gu), gu),
         _fb(lambda: F.silu(gu[:, :f]) * gu[:, f:], gu), _fb(lambda: r_swiglu.swiglu(gu), gu)),
        ("rope", "x".join(map(str, q.shape)), 16 * q.numel(), _fb(lambda: t_rope.apply_rope(q, cos, sin), q),
         _fb(lambda: stock_rope(q), q), _fb(lambda: r_rope.apply_rope(q, cos, sin), q)),
        ("softmax", f"{n}x2048", 20 * sm.numel(), _fb(lambda: t_soft.softmax(sm, -1), sm),
         _fb(lambda: torch.softmax(sm, -1), sm), _fb(lambda: r_soft.softmax(sm, -1), sm)),
    ]
    for dtype, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        count = 4 * n * d  # 2^26 parameters at the default shape
        p = _x((count,), 6, 0.02, grad=False).to(dtype)
        gp = _x((count,), 7, 0.01, grad=False).to(dtype)
        m1, v1 = torch.zeros(count, device=DEV), torch.zeros(count, device=DEV)
        ps = p.clone().requires_grad_()
        ps.grad = gp.clone()
        opt = torch.optim.AdamW([ps], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
        width = p.element_size()
        rows.append((f"adamw step ({label} params)", f"{count}", count * (3 * width + 16),
                     lambda p=p, gp=gp, m1=m1, v1=v1: t_adamw.adamw_step(p, gp, m1, v1, step=3, lr=1e-3,
                                                                          weight_decay=0.1),
                     opt.step,
                     lambda p=p, gp=gp, m1=m1, v1=v1: r_adamw.adamw_step(p, gp, m1, v1, step=3, lr=1e-3,
                                                                          weight_decay=0.1)))
    return rows


def copy_bandwidth() -> float:
    """Measured device-to-device copy rate, bytes read + written per second (the practical ceiling)."""
    from triton.testing import do_bench

    a = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), return_mode="median")
    return 2 * a.numel() / (ms * 1e-3)


def bench_hash(size: int) -> dict:
    """On-device BLAKE3 vs device->host copy + stock blake3 (one thread and all threads)."""
    import blake3
    from triton.testing import do_bench

    from kernels.triton import statehash

    data = torch.randint(0, 256, (size,), dtype=torch.uint8, device=DEV)
    gpu_ms = do_bench(lambda: statehash.blake3_digest(data), return_mode="median")
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)

    def wall(fn, reps=3):
        out = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            out.append(time.perf_counter() - t0)
        return statistics.median(out) * 1e3

    copy_ms = wall(lambda: host.copy_(data))
    pageable_ms = wall(lambda: data.cpu())
    buf = host.numpy()
    one_ms = wall(lambda: blake3.blake3(buf).digest())
    all_ms = wall(lambda: blake3.blake3(buf, max_threads=blake3.blake3.AUTO).digest())
    same = statehash.blake3_digest(data) == blake3.blake3(buf).digest()
    gb = size / 1e9
    return dict(bytes=size, same_digest=same, gpu_ms=gpu_ms, gpu_gbps=gb / (gpu_ms * 1e-3),
                d2h_pinned_ms=copy_ms, d2h_pageable_ms=pageable_ms, cpu_blake3_1thread_ms=one_ms,
                cpu_blake3_all_threads_ms=all_ms, cpu_threads=os.cpu_count(),
                host_path_pinned_all_threads_ms=copy_ms + all_ms,
                host_path_pageable_1thread_ms=pageable_ms + one_ms,
                floor_ms=size / NOMINAL_BW * 1e3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hash-bytes", type=int, default=1 << 30)
    ap.add_argument("--out", default="benchmarks/results/triton_ops.json")
    args = ap.parse_args(argv)
    from triton.testing import do_bench

    bw = copy_bandwidth()
    rows = []
    table = Table(title=f"Triton twins vs stock vs reference, fwd+bwd, {torch.cuda.get_device_name()}")
    for col in ("op", "shape", "triton ms", "stock ms", "ref ms", "floor ms", "triton/stock", "ref/triton",
                "floor/triton"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for name, shape, nbytes, t_fn, s_fn, r_fn in cases(args.tokens, 2048, 5632, 128):
        t_ms, s_ms, r_ms = (do_bench(fn, return_mode="median") for fn in (t_fn, s_fn, r_fn))
        floor = nbytes / NOMINAL_BW * 1e3
        rows.append(dict(op=name, shape=shape, bytes=nbytes, triton_ms=t_ms, stock_ms=s_ms, ref_ms=r_ms,
                         floor_ms=floor, floor_measured_bw_ms=nbytes / bw * 1e3))
        print(json.dumps(rows[-1]), flush=True)  # each row as it comes, in case a later one fails
        table.add_row(name, shape, f"{t_ms:.3f}", f"{s_ms:.3f}", f"{r_ms:.3f}", f"{floor:.3f}",
                      f"{t_ms / s_ms:.2f}x", f"{r_ms / t_ms:.1f}x", f"{floor / t_ms:.0%}")
    Console().print(table)
    h = bench_hash(args.hash_bytes)
    Console().print(f"state hash, {h['bytes'] / 2**30:.2f} GiB: on-device BLAKE3 {h['gpu_ms']:.2f} ms "
                    f"({h['gpu_gbps']:.0f} GB/s, same digest as CPU: {h['same_digest']}); host path: D2H pinned "
                    f"{h['d2h_pinned_ms']:.1f} ms (pageable {h['d2h_pageable_ms']:.1f}) + blake3 "
                    f"{h['cpu_blake3_1thread_ms']:.1f} ms (1 thread) / {h['cpu_blake3_all_threads_ms']:.1f} ms "
                    f"({h['cpu_threads']} threads); floor {h['floor_ms']:.2f} ms")
    Console().print(f"measured D2D copy: {bw / 1e12:.2f} TB/s (read + write)")
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=__import__("triton").__version__, tokens=args.tokens, copy_bw_bytes_per_s=bw,
                nominal_bw_bytes_per_s=NOMINAL_BW, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(dict(meta=meta, rows=rows, state_hash=h), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
