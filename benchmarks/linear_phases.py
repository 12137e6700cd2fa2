"""Where the int8 QAT linears' time goes on the Triton backend: each launch of kernels/triton/int8_linear.py's
forward and backward timed alone, for the four linears of an open-1b layer, beside a floor for each.

    python benchmarks/linear_phases.py [--tokens 8192] [--out benchmarks/results/linear_phases.json]

Shapes: open-1b's (d 2048, 16/4 heads of 128, FFN 5632): wqkv 2048 -> 3072, wo 2048 -> 2048, w_gate_up
2048 -> 11264 (gate and up fused), w_down 5632 -> 2048, at the proxy's 8,192 tokens a step. Each phase runs
on the linear's own data (random, seeded: the times do not depend on the values), by the median of
triton.testing.do_bench; the phases' sum is printed beside the whole forward + backward (int8_linear, then
backward), so what the table leaves out (allocation, launches) shows. Floor: the larger of the phase's bytes
at 4.3 TB/s (the H200's measured copy rate) and its int8 operations at 1,979 TOPS (dense peak).
Bits are not this benchmark's business: tests/gpu compares them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels.ref import hadamard as ref_had, philox  # noqa: E402
from kernels.ref.hadamard import DEFAULT_BLOCK  # noqa: E402
from kernels.triton import int8_linear as t_lin  # noqa: E402
from kernels.triton.intmm import gemm  # noqa: E402
from kernels.triton.rotated_mm import rotate_quantize  # noqa: E402
from benchmarks.phase_timing import time_phases  # noqa: E402

HBM = 4.3e12    # bytes/s
INT8 = 1979e12  # ops/s
LINEARS = {"wqkv": (2048, 3072), "wo": (2048, 2048), "w_gate_up": (2048, 11264), "w_down": (5632, 2048)}


def _floor_ms(nbytes: float, ops: float = 0.0) -> float:
    return 1e3 * max(nbytes / HBM, ops / INT8)


def phases(m: int, k: int, n: int, dev) -> tuple[list[tuple[str, object, float]], object]:
    """[(phase, fn, floor ms)] of one linear x [m, k] -> [m, n], in the order the forward and backward run
    them, and the whole forward + backward as one fn."""
    x = philox.normal(11, 0, (m, k), device=dev)
    w = (philox.normal(12, 0, (n, k), device=dev) * 0.02).requires_grad_(True)
    s_x = torch.tensor(0.05, device=dev, requires_grad=True)
    g = philox.normal(13, 0, (m, n), device=dev)
    xg = x.clone().requires_grad_(True)
    hb = ref_had.block_size(n, DEFAULT_BLOCK)  # dx contracts over N, dw over M: their Hadamard blocks
    hm = ref_had.block_size(m, DEFAULT_BLOCK)
    wd = w.detach()
    s_w, cs, bad_w, q_w = t_lin._weight(wd, s_x.detach(), quant=True)
    q_x, bad_x = t_lin._activation(x, s_x.detach())
    dx_hat = t_lin.rotated_product(g, (n, 1), wd, (1, k), m, k, n, rotate=True, block=DEFAULT_BLOCK, b_pre=s_w)
    qa, sa, ba = rotate_quantize(g, m, n, n, 1, block=hb)
    qb, sb, bb = rotate_quantize(wd, k, n, 1, k, block=hb, pre=s_w)
    qc, sc, bc = rotate_quantize(g, n, m, 1, n, block=hm)
    qd, sd, bd = rotate_quantize(x, k, m, 1, k, block=hm, pre=s_x.detach())
    f32, i8 = 4, 1
    mk, nk, mn = m * k, n * k, m * n
    steps = [
        ("forward: weight step and codes", lambda: t_lin._weight(wd, s_x.detach(), quant=True),
         _floor_ms(2 * nk * f32 + nk * i8)),
        ("forward: activation codes", lambda: t_lin._activation(x, s_x.detach()), _floor_ms(mk * f32 + mk * i8)),
        ("forward: int8 GEMM + dequantize", lambda: gemm(q_x, q_w, out_dtype=torch.float32, col_scale=cs,
                                                          bad_rows=bad_x, bad_cols=bad_w),
         _floor_ms(mk * i8 + nk * i8 + mn * f32, 2 * m * n * k)),
        ("backward: weight step", lambda: t_lin._weight(wd, s_x.detach(), quant=False), _floor_ms(2 * nk * f32)),
        ("backward dx: rotate-quantize G's rows (over N)", lambda: rotate_quantize(g, m, n, n, 1, block=hb),
         _floor_ms(mn * f32 + mn * i8)),
        ("backward dx: rotate-quantize W's columns (over N, from s_w)",
         lambda: rotate_quantize(wd, k, n, 1, k, block=hb, pre=s_w), _floor_ms(nk * f32 + nk * i8)),
        ("backward dx: int8 GEMM", lambda: gemm(qa, qb, out_dtype=torch.float32, row_scale=sa, col_scale=sb,
                                                 inv=1.0 / hb, bad_rows=ba, bad_cols=bb),
         _floor_ms(mn * i8 + nk * i8 + mk * f32, 2 * m * n * k)),
        ("backward: dx's gate and the LSQ step gradient", lambda: t_lin._lsq(dx_hat, x, s_x.detach(), True, True),
         _floor_ms(3 * mk * f32)),
        ("backward dw: rotate-quantize G's columns (over M)", lambda: rotate_quantize(g, n, m, 1, n, block=hm),
         _floor_ms(mn * f32 + mn * i8)),
        ("backward dw: rotate-quantize x's columns (over M, from s_x)",
         lambda: rotate_quantize(x, k, m, 1, k, block=hm, pre=s_x.detach()), _floor_ms(mk * f32 + mk * i8)),
        ("backward dw: int8 GEMM + straight-through gate", lambda: gemm(qc, qd, out_dtype=torch.float32,
                                                                        row_scale=sc, col_scale=sd, inv=1.0 / hm,
                                                                        bad_rows=bc, bad_cols=bd, mask_src=wd,
                                                                        mask_scale=s_w),
         _floor_ms(mn * i8 + mk * i8 + 2 * nk * f32, 2 * m * n * k)),
    ]

    def whole():
        for t in (xg, w, s_x):
            t.grad = None
        t_lin.int8_linear(xg, w, s_x).backward(g)
    return steps, whole


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192, help="tokens a step (rows of x)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "linear_phases.json"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("linear_phases: needs a CUDA device (the Triton backend's kernels)")
    dev = torch.device("cuda")
    out = {"gpu": torch.cuda.get_device_name(), "tokens": args.tokens, "linears": []}
    for name, (k, n) in LINEARS.items():
        steps, whole = phases(args.tokens, k, n, dev)
        rows, total, summed = time_phases(steps, whole, rep=50)
        for r, (_, _, floor) in zip(rows, steps):
            r["floor_ms"] = floor
        print(f"\n{name} ({args.tokens} x {k} -> {n}): forward + backward {total:.3f} ms, phases summed "
              f"{summed:.3f} ms, floors summed {sum(r['floor_ms'] for r in rows):.3f} ms")
        print("| phase | ms | floor ms | ms / floor |\n| --- | --- | --- | --- |")
        for r in rows:
            print(f"| {r['phase']} | {r['ms']:.3f} | {r['floor_ms']:.3f} | {r['ms'] / r['floor_ms']:.1f}x |")
        out["linears"].append(dict(linear=name, k=k, n=n, whole_ms=total, phases_ms=summed, rows=rows))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
