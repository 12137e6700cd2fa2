"""Relative error of int8_linear's backward GEMMs (dX and dW) vs float64, with and without the Walsh-Hadamard
rotation along the contraction dim, for Gaussian and heavy-tailed upstream gradients (paper section 3.2
claims ~5% without, ~1% with, for the weight gradient).

    .venv/bin/python benchmarks/hadamard_error.py [--m 4096 --k 2048 --n 5632] [--out PATH]

The float64 reference is the same STE gradient with exact GEMMs: dX = (G w_hat) masked, dW = (G^T x_hat)
masked, w_hat / x_hat the forward's dequantized operands. Errors are ||got - ref||_F / ||ref||_F;
the LSQ step gradient ds_x, a sum that cancels, is measured against the sum of its terms' magnitudes.
Inputs come from a seeded torch.Generator (measurement only; the op itself uses no RNG).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

import torch

from kernels.ref.int8_linear import (QMAX, int8_linear_backward, lsq_grad_scale, lsq_step_factor,
                                     quantize_activation, quantize_weight, weight_step)

CASES = {  # name -> (outlier rows, outlier columns) of G
    "gaussian": (False, False),
    "outlier columns": (False, True),
    "outlier rows": (True, False),
    "outlier rows+columns": (True, True),
}


def make_inputs(m: int, k: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen)
    w = torch.randn(n, k, generator=gen) * 0.02
    g = torch.randn(m, n, generator=gen)
    # LSQ's initial activation step 2 mean|x| / sqrt(127) (host float64 is fine here: it only picks an input)
    s_x = torch.tensor(2.0 * x.double().abs().mean().item() / QMAX ** 0.5, dtype=torch.float32)  # br-ok: benchmark input
    return x, w, s_x, g


def heavy_tailed(g: torch.Tensor, rows: bool, cols: bool, frac: float, scale: float, seed: int) -> torch.Tensor:
    """G with round(frac * count) whole rows (tokens) and/or columns (output channels) multiplied by `scale`."""
    gen = torch.Generator().manual_seed(seed + 1)
    out = g.clone()
    if rows:
        out[torch.randperm(g.shape[0], generator=gen)[: max(1, round(frac * g.shape[0]))]] *= scale
    if cols:
        out[:, torch.randperm(g.shape[1], generator=gen)[: max(1, round(frac * g.shape[1]))]] *= scale
    return out


def reference(g, x, w, s_x) -> dict[str, torch.Tensor]:
    """float64 STE gradients with exact GEMMs, from the op's own quantized operands."""
    s_w = weight_step(w)
    q_w, v_w = quantize_weight(w, s_w)
    q_x, v_x = quantize_activation(x, s_x)
    g64 = g.double()
    w_hat = q_w.double() * s_w.double()[:, None]
    x_hat = q_x.double() * float(s_x)
    dx_hat = g64 @ w_hat  # br-ok: float64 reference, measurement only
    dw_hat = g64.t() @ x_hat  # br-ok: float64 reference, measurement only
    f = lsq_step_factor(v_x, q_x).double()
    gs = lsq_grad_scale(x.numel()).double()
    ds = (dx_hat * f).sum() * gs  # br-ok: float64 reference, measurement only
    # ds is a cancelling sum: its error is measured against the sum of the magnitudes of its terms
    ds_scale = (dx_hat * f).abs().sum() * gs  # br-ok: float64 reference, measurement only
    return {"dx": torch.where(v_x.abs() <= QMAX, dx_hat, 0.0), "dw": torch.where(v_w.abs() <= QMAX, dw_hat, 0.0),
            "ds": ds, "ds_scale": ds_scale}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform's guess."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref).norm() / ref.norm()).item()  # br-ok: float64 error metric, measurement only


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, default=4096, help="tokens (contraction dim of dW)")
    ap.add_argument("--k", type=int, default=2048, help="input features")
    ap.add_argument("--n", type=int, default=5632, help="output features (contraction dim of dX)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--outlier-frac", type=float, default=0.01, help="fraction of G's rows / columns scaled")
    ap.add_argument("--outlier-scale", type=float, default=100.0)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--out", default="benchmarks/results/hadamard_error.json")
    args = ap.parse_args()

    x, w, s_x, g0 = make_inputs(args.m, args.k, args.n, args.seed)
    rows = []
    print(f"int8_linear backward vs float64, M={args.m} K={args.k} N={args.n}, outliers: "
          f"{args.outlier_frac:.0%} of rows/columns x{args.outlier_scale:g}, block {args.block}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'G':<22}{'rotate':>8}{'dX err':>10}{'dW err':>10}{'ds_x err*':>11}")
    for name, (r, c) in CASES.items():
        g = heavy_tailed(g0, r, c, args.outlier_frac, args.outlier_scale, args.seed)
        ref = reference(g, x, w, s_x)
        for rotate in (False, True):
            t0 = time.perf_counter()
            dx, dw, ds = int8_linear_backward(g, x, w, s_x, rotate=rotate, block=args.block)
            secs = time.perf_counter() - t0
            row = {"case": name, "rotate": rotate, "dx_rel_err": rel_err(dx, ref["dx"]),
                   "dw_rel_err": rel_err(dw, ref["dw"]),
                   "ds_err_vs_abs_terms": abs(ds.item() - ref["ds"].item()) / ref["ds_scale"].item(),
                   "ds_rel_err": abs(ds.item() - ref["ds"].item()) / abs(ref["ds"].item()),
                   "seconds_cpu_eager": secs}
            rows.append(row)
            print(f"{name:<22}{str(rotate):>8}{row['dx_rel_err']:>10.4f}{row['dw_rel_err']:>10.4f}"
                  f"{row['ds_err_vs_abs_terms']:>11.2e}")
    print("errors: ||got - ref||_F / ||ref||_F vs float64; *ds_x: |got - ref| / sum_i |term_i| (a cancelling sum)")
    result = {
        "benchmark": "hadamard_error", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpu": cpu_model(),
                    "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__},
        "shape": {"M": args.m, "K": args.k, "N": args.n}, "seed": args.seed, "block": args.block,
        "outlier_frac": args.outlier_frac, "outlier_scale": args.outlier_scale, "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out} ({result['date']}, {result['machine']['cpu']}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
