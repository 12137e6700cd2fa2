"""Per-op time of the BR reference backend vs the stock PyTorch equivalent, side by side in one run.

    python benchmarks/ops.py [--device cpu|cuda] [--size small|large] [--out FILE]

Each row times forward + backward where the op is differentiable (median of repeats, after warm-up).
The ratio is ours / stock: what reproducibility costs today on the reference backend.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels.ref import (adamw, attention, contraction, elementary as E, embedding, int8_linear, loss,  # noqa: E402
                         philox, reduce, rmsnorm, rope, softmax, swiglu)

SIZES = {  # (tokens, hidden, ffn, heads, kv heads, head dim, seq, vocab)
    "small": dict(n=512, d=256, f=704, hq=4, hkv=1, hd=64, t=128, v=4096),
    "large": dict(n=4096, d=2048, f=5632, hq=16, hkv=4, hd=128, t=1024, v=32768),
}


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timeit(fn, dev, reps: int) -> float:
    """Median seconds of fn() over `reps` runs after two warm-ups."""
    for _ in range(2):
        fn()
    _sync(dev)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _x(shape, dev, seed=0, std=1.0, grad=True):
    t = philox.normal(seed, 0, shape, std=std).to(dev)
    return t.requires_grad_(grad)


def _fb(fn, *inputs):
    """Forward + backward with a ones upstream gradient."""
    def run():
        for t in inputs:
            t.grad = None
        y = fn()
        y = y[0] if isinstance(y, tuple) else y
        y.backward(torch.ones_like(y))
    return run


def cases(s, dev):
    n, d, f, hq, hkv, hd, t, v = (s[k] for k in ("n", "d", "f", "hq", "hkv", "hd", "t", "v"))
    x = _x((n, d), dev)
    g = _x((n, d), dev, 1)
    w = _x((d, d), dev, 2, 0.02)
    sx = torch.tensor(0.05, device=dev, requires_grad=True)
    gu = _x((n, 2 * f), dev, 3)
    b = n // t
    q, k, vv = _x((b, hq, t, hd), dev, 4), _x((b, hkv, t, hd), dev, 5), _x((b, hkv, t, hd), dev, 6)
    head = _x((v, d), dev, 7, 0.02)
    tgt = (philox.random_bits(8, 0, n) % v).to(dev)
    ids = (philox.random_bits(9, 0, n) % v).to(dev)
    emb = _x((v, d), dev, 10)
    cos, sin = rope.rope_tables(t, hd, device=dev)
    cos_t, sin_t = cos.clone(), sin.clone()
    p = _x((d, f), dev, 11, grad=False)
    gp = _x((d, f), dev, 12, grad=False)
    m1, v1 = torch.zeros_like(p), torch.zeros_like(p)
    p_stock = p.clone().requires_grad_()
    p_stock.grad = gp.clone()
    opt = torch.optim.AdamW([p_stock], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                            **({"fused": True} if dev.type == "cuda" else {"foreach": True}))

    def stock_rope(z):
        z1, z2 = z[..., : hd // 2], z[..., hd // 2:]
        return torch.cat([z1 * cos_t - z2 * sin_t, z2 * cos_t + z1 * sin_t], -1)

    def stock_ce():
        logits = x @ head.T
        lse = torch.logsumexp(logits, -1)
        return F.cross_entropy(logits, tgt) + 1e-4 * (lse * lse).mean()

    def rep_k(z):
        return z.repeat_interleave(hq // hkv, dim=1)

    return [
        ("exp", f"{n}x{d}", _fb(lambda: E.exp(x), x), _fb(lambda: torch.exp(x), x)),
        ("silu", f"{n}x{d}", _fb(lambda: E.silu(x), x), _fb(lambda: F.silu(x), x)),
        ("sum (exact)", f"{n}x{d}", _fb(lambda: reduce.sum(x, -1), x), _fb(lambda: x.sum(-1), x)),
        ("global_l2_norm", f"{d}x{f}", lambda: reduce.global_l2_norm([gp]),
         lambda: torch.linalg.vector_norm(gp)),
        ("hp_matmul (3 slices)", f"{n}x{d}x{d}", _fb(lambda: contraction.hp_matmul(x, w), x, w),
         _fb(lambda: x @ w, x, w)),
        ("int8_linear W8A8", f"{n}x{d}x{d}", _fb(lambda: int8_linear.int8_linear(x, w, sx), x, w, sx),
         _fb(lambda: F.linear(x, w), x, w)),
        ("rmsnorm", f"{n}x{d}", _fb(lambda: rmsnorm.rmsnorm(x), x), _fb(lambda: F.rms_norm(x, (d,)), x)),
        ("rope", f"{b}x{hq}x{t}x{hd}", _fb(lambda: rope.apply_rope(q, cos, sin), q), _fb(lambda: stock_rope(q), q)),
        ("swiglu", f"{n}x{2 * f}", _fb(lambda: swiglu.swiglu(gu), gu),
         _fb(lambda: F.silu(gu[:, :f]) * gu[:, f:], gu)),
        ("softmax", f"{n}x{d}", _fb(lambda: softmax.softmax(x, -1), x), _fb(lambda: torch.softmax(x, -1), x)),
        ("attention (causal, GQA)", f"{b}x{hq}/{hkv}x{t}x{hd}",
         _fb(lambda: attention.attention(q, k, vv), q, k, vv),
         _fb(lambda: F.scaled_dot_product_attention(q, rep_k(k), rep_k(vv), is_causal=True), q, k, vv)),
        ("cross_entropy + z-loss", f"{n}x{d}x{v}", _fb(lambda: loss.cross_entropy_zloss(x, head, tgt), x, head),
         _fb(stock_ce, x, head)),
        ("embedding", f"{n} of {v}x{d}", _fb(lambda: embedding.embedding(ids, emb), emb),
         _fb(lambda: F.embedding(ids, emb), emb)),
        ("adamw step", f"{d}x{f}", lambda: adamw.adamw_step(p, gp, m1, v1, step=3, lr=1e-3, weight_decay=0.1),
         opt.step),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--size", default="small", choices=sorted(SIZES))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/ops.json")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    rows = []
    table = Table(title=f"BR reference vs stock PyTorch, fwd+bwd, {args.device}, size {args.size}")
    for col in ("op", "shape", "ours ms", "stock ms", "ours/stock"):
        table.add_column(col, justify="right" if col != "op" else "left")
    for name, shape, ours, stock in cases(SIZES[args.size], dev):
        t_ours, t_stock = timeit(ours, dev, args.reps), timeit(stock, dev, args.reps)
        rows.append(dict(op=name, shape=shape, ours_ms=t_ours * 1e3, stock_ms=t_stock * 1e3,
                         ratio=t_ours / t_stock))
        table.add_row(name, shape, f"{t_ours * 1e3:.3f}", f"{t_stock * 1e3:.3f}", f"{t_ours / t_stock:.1f}x")
    Console().print(table)
    meta = dict(device=str(dev), size=args.size, torch=torch.__version__, machine=platform.machine(),
                processor=torch.cuda.get_device_name() if dev.type == "cuda" else platform.processor(),
                threads=torch.get_num_threads(), date=time.strftime("%Y-%m-%d"))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(dict(meta=meta, rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
