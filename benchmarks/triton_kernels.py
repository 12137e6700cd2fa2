"""The Triton twins of the step's hot ops (int8 GEMMs, Hadamard, int8_linear, hp_matmul, embedding, CE + z-loss,
attention) vs stock PyTorch vs the BR reference on CUDA, each against its floor: the larger of (bytes moved /
bandwidth) and (operations / the H200's nominal dense rate for the units it runs on).

    python benchmarks/triton_kernels.py [--tokens 8192] [--ops hadamard rotated] [--out benchmarks/results/triton_kernels.json]
    TRITON_INTERPRET=1 python benchmarks/triton_kernels.py --smoke   # CPU: every case once, tiny shapes, no timing

Shapes follow open-1b (hidden 2048, FFN 5632, vocab 32768). Times are medians of triton.testing.do_bench
(CUDA events, L2 flushed). int8 floors use int8 tensor-core ops (the hp contraction counts its 6 slice GEMMs);
stock GEMMs are bf16 (and torch._int_mm for the bare int8 GEMM, B column-major as cuBLAS wants it).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels.ref import attention as r_att, contraction as r_hp, embedding as r_emb, hadamard as r_had  # noqa: E402
from kernels.ref import int8_linear as r_lin, intmm as r_mm, loss as r_loss, philox, rotated_mm as r_rot  # noqa: E402

NOMINAL_BW = 4.8e12      # H200 HBM3e, bytes/s (datasheet)
NOMINAL_INT8 = 1979e12   # H200 SXM dense int8 tensor-core ops/s (datasheet)
NOMINAL_BF16 = 989e12    # dense bf16 FLOP/s
HP_GEMMS = 6             # slice products of a 3-slice hp contraction


def _x(shape, seed, dev, std=1.0, grad=True):
    return philox.normal(seed, 0, shape, std=std, device=dev).requires_grad_(grad)


def _int8(shape, seed, dev):
    n = 1
    for s in shape:
        n *= s
    return (philox.random_bits(seed, 0, n, device=dev) % 255 - 127).to(torch.int8).reshape(shape)


def _fb(fn, *inputs):
    """Forward + backward with a fixed upstream gradient (loss-like tuples: the first element)."""
    g = {}

    def run():
        for t in inputs:
            t.grad = None
        y = fn()
        y = y[0] if isinstance(y, tuple) else y
        if "g" not in g:
            g["g"] = torch.ones_like(y)
        y.backward(g["g"])
    return run


def cases(n: int, d: int, f: int, v: int, dev):
    """(op, shape, bytes, int8 ops, bf16 flops, triton fn, stock fn, ref fn)."""
    from kernels.triton import attention as t_att, contraction as t_hp, embedding as t_emb, hadamard as t_had
    from kernels.triton import int8_linear as t_lin, intmm as t_mm, loss as t_loss, rotated_mm as t_rot

    rows = []
    # bare int8 GEMM [n, d] x [d, f]
    a, b = _int8((n, d), 1, dev), _int8((d, f), 2, dev)
    b_cm = b.t().contiguous().t()  # column-major: cuBLAS's fast int8 layout, and our kernel's K-contiguous B
    rows.append(("int8_mm", f"{n}x{d}x{f}", n * d + d * f + 4 * n * f, 2 * n * d * f, 0,
                 lambda: t_mm.int8_mm(a, b_cm), lambda: torch._int_mm(a, b_cm), lambda: r_mm.int8_mm(a, b_cm)))
    # Hadamard rotation of [n, f] along f in blocks of 256 (stock: the same rotation as a bf16 GEMM per block)
    x = _x((n, f), 3, dev, grad=False)
    h256 = r_had.fwht(torch.eye(256, device=dev)).to(torch.bfloat16)
    xb = x.to(torch.bfloat16)
    rows.append(("block_hadamard (256)", f"{n}x{f}", 8 * n * f, 0, 0, lambda: t_had.block_hadamard(x, 1),
                 lambda: (xb.reshape(-1, 256) @ h256), lambda: r_had.block_hadamard(x, 1)))
    # the rotated int8 product of a backward GEMM: g [n, f] x w [f, d], contracting over f
    gr, wr = _x((n, f), 4, dev, grad=False), _x((f, d), 5, dev, std=0.02, grad=False)
    gb, wb = gr.to(torch.bfloat16), wr.to(torch.bfloat16)
    rows.append(("rotated_int8_mm", f"{n}x{f}x{d}", 2 * (4 * n * f + 4 * f * d) + n * f + f * d + 4 * n * d,
                 2 * n * f * d, 0, lambda: t_rot.rotated_int8_mm(gr, wr), lambda: gb @ wb,
                 lambda: r_rot.rotated_int8_mm(gr, wr)))
    # the W8A8 QAT linear, forward + backward: 3 int8 GEMMs (stock: bf16 F.linear, 3 bf16 GEMMs)
    xl, wl = _x((n, d), 6, dev), _x((f, d), 7, dev, std=0.02)
    sx = torch.tensor(0.03, device=dev, requires_grad=True)
    xlb, wlb = _x((n, d), 6, dev).to(torch.bfloat16).detach().requires_grad_(), \
        _x((f, d), 7, dev, std=0.02).to(torch.bfloat16).detach().requires_grad_()
    lin_bytes = 3 * (4 * n * d + 4 * f * d + 4 * n * f)  # each float operand read, each result written, per GEMM
    rows.append(("int8_linear fwd+bwd", f"{n}x{d}->{f}", lin_bytes, 3 * 2 * n * d * f, 0,
                 _fb(lambda: t_lin.int8_linear(xl, wl, sx), xl, wl, sx), _fb(lambda: F.linear(xlb, wlb), xlb, wlb),
                 _fb(lambda: r_lin.int8_linear(xl, wl, sx), xl, wl, sx)))
    # hp_matmul forward + backward (3 contractions of 6 slice GEMMs); stock: float32 matmul (TF32 off)
    hx, hw = _x((n, d), 8, dev), _x((d, d), 9, dev, std=0.02)
    rows.append(("hp_matmul fwd+bwd", f"{n}x{d}x{d}", 3 * 4 * (2 * n * d + d * d), 3 * HP_GEMMS * 2 * n * d * d, 0,
                 _fb(lambda: t_hp.hp_matmul(hx, hw), hx, hw), _fb(lambda: hx @ hw, hx, hw),
                 _fb(lambda: r_hp.hp_matmul(hx, hw), hx, hw)))
    # embedding forward + backward
    ids = (philox.random_bits(10, 0, n, device=dev) % v)
    emb = _x((v, d), 11, dev)
    rows.append(("embedding fwd+bwd", f"{n} of {v}x{d}", 4 * (2 * n * d + 2 * n * d + v * d) + 8 * 2 * v * d, 0, 0,
                 _fb(lambda: t_emb.embedding(ids, emb), emb), _fb(lambda: F.embedding(ids, emb), emb),
                 _fb(lambda: r_emb.embedding(ids, emb), emb)))
    # fused CE + z-loss, forward + backward (logits, dh, dW: 3 hp contractions); stock: bf16 logits + F.cross_entropy
    h, head = _x((n, d), 12, dev), _x((v, d), 13, dev, std=0.02)
    hb, headb = h.detach().to(torch.bfloat16).requires_grad_(), head.detach().to(torch.bfloat16).requires_grad_()
    tgt = philox.random_bits(14, 0, n, device=dev) % v

    def stock_ce():
        logits = (hb @ headb.T).float()
        lse = torch.logsumexp(logits, -1)
        return F.cross_entropy(logits, tgt) + 1e-4 * (lse * lse).mean()

    rows.append(("cross_entropy + z-loss fwd+bwd", f"{n}x{d}x{v}", 4 * (2 * n * d + 3 * v * d) + 3 * 4 * n * v,
                 3 * HP_GEMMS * 2 * n * d * v, 0,
                 _fb(lambda: t_loss.cross_entropy_zloss(h, head, tgt), h, head), _fb(stock_ce, hb, headb),
                 _fb(lambda: r_loss.cross_entropy_zloss(h, head, tgt), h, head)))
    # causal GQA attention, forward + backward: 16 query / 4 kv heads of 128, sequences of 1024 (stock: SDPA)
    t, hq, hkv, hd = (min(1024, n), 16, 4, 128) if d >= 1024 else (min(32, n), 2, 1, 16)  # the latter: --smoke
    bq = max(1, n // t)
    q, k, va = _x((bq, hq, t, hd), 15, dev), _x((bq, hkv, t, hd), 16, dev), _x((bq, hkv, t, hd), 17, dev)

    def rep(z):
        return z.repeat_interleave(hq // hkv, dim=1)

    # int8 ops: logits (6 slice GEMMs) + P.V (1) forward, dv, dp, dq, dk (4 x 6) backward; P [.., T, T] moved ~8x
    att_ops = (6 + 1 + 4 * 6) * 2 * bq * hq * t * t * hd
    rows.append(("attention (causal, GQA) fwd+bwd", f"{bq}x{hq}/{hkv}x{t}x{hd}", 8 * 4 * bq * hq * t * t, att_ops, 0,
                 _fb(lambda: t_att.attention(q, k, va), q, k, va),
                 _fb(lambda: F.scaled_dot_product_attention(q, rep(k), rep(va), is_causal=True), q, k, va),
                 _fb(lambda: r_att.attention(q, k, va), q, k, va)))
    return rows


def floor_ms(nbytes: int, int8_ops: int, bf16_flops: int, bw: float) -> float:
    return max(nbytes / bw, int8_ops / NOMINAL_INT8, bf16_flops / NOMINAL_BF16) * 1e3


def smoke() -> int:
    """Every case once at tiny shapes on this machine (TRITON_INTERPRET=1 on a CPU): the benchmark's logic only."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for name, shape, *_, t_fn, s_fn, r_fn in cases(64, 32, 48, 80, dev):
        t0 = time.perf_counter()
        for fn in (t_fn, s_fn, r_fn):
            fn()
        print(f"{name:32s} {shape:16s} ok ({time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--skip-ref", action="store_true", help="leave out the (slow) eager reference")
    ap.add_argument("--smoke", action="store_true", help="run each case once at tiny shapes, no timing")
    ap.add_argument("--ops", nargs="+", default=None, metavar="WORD",
                    help="only the rows whose op name contains one of these words (e.g. hadamard rotated)")
    ap.add_argument("--out", default="benchmarks/results/triton_kernels.json")
    args = ap.parse_args(argv)
    if args.smoke:
        return smoke()
    from rich.console import Console
    from rich.table import Table
    from triton.testing import do_bench

    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False  # stock float32 matmul stays float32
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    bw = 2 * src.numel() / (do_bench(lambda: dst.copy_(src), return_mode="median") * 1e-3)  # measured ceiling
    del src, dst
    table = Table(title=f"Triton twins vs stock vs reference, {torch.cuda.get_device_name()}")
    for col in ("op", "shape", "triton ms", "stock ms", "ref ms", "floor ms", "triton/stock", "ref/triton",
                "floor/triton"):
        table.add_column(col, justify="left" if col == "op" else "right")
    rows = []
    for name, shape, nbytes, ops8, flops16, t_fn, s_fn, r_fn in cases(args.tokens, 2048, 5632, args.vocab, dev):
        if args.ops and not any(w in name for w in args.ops):
            continue
        t_ms = do_bench(t_fn, return_mode="median")
        s_ms = do_bench(s_fn, return_mode="median")
        r_ms = None if args.skip_ref else do_bench(r_fn, warmup=1, rep=1, return_mode="median")
        fl = floor_ms(nbytes, ops8, flops16, NOMINAL_BW)
        rows.append(dict(op=name, shape=shape, bytes=nbytes, int8_ops=ops8, triton_ms=t_ms, stock_ms=s_ms,
                         ref_ms=r_ms, floor_ms=fl, floor_measured_bw_ms=floor_ms(nbytes, ops8, flops16, bw)))
        print(json.dumps(rows[-1]), flush=True)  # each row as it comes, in case a later one fails
        table.add_row(name, shape, f"{t_ms:.3f}", f"{s_ms:.3f}", "-" if r_ms is None else f"{r_ms:.3f}",
                      f"{fl:.3f}", f"{t_ms / s_ms:.2f}x", "-" if r_ms is None else f"{r_ms / t_ms:.1f}x",
                      f"{fl / t_ms:.0%}")
    Console().print(table)
    Console().print(f"measured D2D copy: {bw / 1e12:.2f} TB/s (read + write)")
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=__import__("triton").__version__, tokens=args.tokens, vocab=args.vocab,
                copy_bw_bytes_per_s=bw, nominal_bw_bytes_per_s=NOMINAL_BW, nominal_int8_ops_per_s=NOMINAL_INT8,
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(dict(meta=meta, rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
