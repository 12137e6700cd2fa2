"""Where one attention layer's time goes on the Triton backend: each step of kernels/triton/attention.py's
forward and backward timed alone, the hp contractions cut into their two operand splits and the GEMM.

    python benchmarks/attention_phases.py [--window 512] [--out benchmarks/results/attention_phases.json]

Shape: one open-1b proxy layer (4 sequences of 2,048 tokens, 16 query / 4 kv heads of 128), with a sliding
window (the model's local layers) and without (its global ones). Each phase runs on the outputs of the one
before it (the layer's own data), timed by the median of triton.testing.do_bench; the phases' sum is printed
beside the whole forward + backward so what the table leaves out (allocation, launches) shows.
Bits are not this benchmark's business: tests/gpu and benchmarks/ab_tiles.py compare them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels.ref import philox  # noqa: E402
from kernels.triton import attention as t_att, contraction as hp, softmax as t_soft  # noqa: E402
from benchmarks.phase_timing import time_phases  # noqa: E402


def _hp_parts(name: str, a: torch.Tensor, b: torch.Tensor, band: tuple | None = None, seen: tuple | None = None,
              **gemm) -> list[tuple[str, object]]:
    """hp_matmul_(a, b) as its three launches: split a's rows, split b's columns, the GEMM; with band =
    (kind, T, window, batch_bad), a's split and the GEMM over its band (kernels/triton/attention._product);
    with seen = (T, window), the GEMM of the tiles a window reaches (contraction.hp_window_matmul_, dP)."""
    lead = a.shape[:-2]
    batch = lead.numel()
    m, n = a.shape[-2], b.shape[-1]

    def split_a():
        return hp.band_split(a, *band) if band else hp.operand_rows(a, hp.DEFAULT_SLICES, transpose=False)
    sa = split_a()
    sb = hp.operand_rows(b, hp.DEFAULT_SLICES, transpose=True)
    if band:
        gemm["band"] = band[:3]
    parts = [(f"{name}: split of the left operand {tuple(a.shape)}{' (its band)' if band else ''}", split_a),
             (f"{name}: split of the right operand {tuple(b.shape)}",
              lambda: hp.operand_rows(b, hp.DEFAULT_SLICES, transpose=True))]
    if seen:
        def force():
            return hp._maybe_nonfinite_rows(sa, sb, batch, m, n, a.shape[-1])
        gemm.update(causal=seen, masked=False, store_unseen=False, force=force())
        parts.append((f"{name}: rows that may be non-finite (written whole)", force))
    kind = " (the tiles a window reaches)" if seen else ""
    return parts + [(f"{name}: GEMM [{batch} x {m} x {n}], K {a.shape[-1]}{kind}",
                     lambda: hp.hp_gemm(sa, sb, batch, m, n, **gemm))]


def phases(b: int, t: int, window: int | None, dev) -> tuple[list[tuple[str, object]], object]:
    """[(phase, fn)] in the layer's order, each fn a closure over the previous phases' outputs, and the whole
    forward + backward as one fn."""
    hq, hkv, d = 16, 4, 128
    q = philox.normal(4, 0, (b, hq, t, d), device=dev).requires_grad_(True)
    k = philox.normal(5, 0, (b, hkv, t, d), device=dev).requires_grad_(True)
    v = philox.normal(6, 0, (b, hkv, t, d), device=dev).requires_grad_(True)
    go = philox.normal(7, 0, (b, hq, t, d), device=dev)
    scale = t_att.default_scale(d, dev)
    allowed = t_att.allowed_keys(t, True, window, dev)
    qg, gog = q.detach().reshape(b, hkv, hq // hkv * t, d), go.reshape(b, hkv, hq // hkv * t, d)
    kd, vd = k.detach(), v.detach()
    band = window if t_soft.causal_band_fits(t, window) else None
    m = qg.shape[2]
    reach = min(window or t, t)  # the keys a row can see: its window, or up to its diagonal (attention.forward)
    split_band = hp.band_fits(t, m, reach)
    dpw = t_att.dp_window(t, band, split_band, reach)  # dP's tiles and dS's rows over the keys a row reaches
    logits = t_att._logits(qg, kd, allowed, scale, window, band is None)
    p = t_att._probabilities(logits.clone(), True, window)
    flags = torch.zeros(gog.shape[:-1].numel(), dtype=torch.int32, device=dev)
    dp = hp.hp_window_matmul_(gog, vd.transpose(-1, -2), t, dpw, flags) if dpw else \
        hp.hp_matmul_(gog, vd.transpose(-1, -2), row_flags=flags)
    ds = t_soft.softmax_causal_backward(p, dp, dpw, flags) if dpw else t_soft.softmax_backward(p, dp, -1)
    no_bad = torch.zeros(b * hkv, dtype=torch.int32, device=dev)  # finite inputs: no batch is bad
    keys = (hp.KEY_ROWS, t, reach, no_bad) if split_band else None
    queries = (hp.QUERY_ROWS, t, reach, None) if split_band else None
    steps = [("forward: logits (q and k split, causal GEMM)",
              lambda: t_att._logits(qg, kd, allowed, scale, window, band is None)),
             ("forward: softmax", lambda: t_att._probabilities(logits, True, window)),
             ("forward: P.V (V's codes, int8 blocks)",
              lambda: t_att.pv_int8(p.reshape(b * hkv, m, t), vd.reshape(b * hkv, t, d).contiguous(), 64, True,
                                    window))]
    steps += _hp_parts("backward dV = P^T dO", p.transpose(-1, -2), gog, keys)
    steps += _hp_parts("backward dP = dO V^T", gog, vd.transpose(-1, -2), seen=(t, dpw) if dpw else None,
                       row_flags=flags)
    steps.append(("backward: softmax backward (dS)",
                  (lambda: t_soft.softmax_causal_backward(p, dp, dpw, flags)) if dpw else
                  (lambda: t_soft.softmax_backward(p, dp, -1))))
    steps += _hp_parts("backward dQ = dS K", ds, kd, queries)
    steps += _hp_parts("backward dK = dS^T Q", ds.transpose(-1, -2), qg, keys)

    def whole():
        for x in (q, k, v):
            x.grad = None
        t_att.attention(q, k, v, window=window).backward(go)
    return steps, whole


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=int, default=512, help="the local layers' window (the global layer is timed too)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "attention_phases.json"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("attention_phases: needs a CUDA device (the Triton backend's kernels)")
    dev = torch.device("cuda")
    out = {"gpu": torch.cuda.get_device_name(), "layers": []}
    for window in (args.window, None):
        rows, total, summed = time_phases(*phases(4, 2048, window, dev), rep=100)
        label = f"window {window}" if window else "global causal"
        print(f"\n{label}: forward + backward {total:.2f} ms, phases summed {summed:.2f} ms")
        print(f"| phase | ms | share of the sum |\n| --- | --- | --- |")
        for r in rows:
            print(f"| {r['phase']} | {r['ms']:.3f} | {r['ms'] / summed:.1%} |")
        out["layers"].append(dict(layer=label, window=window, whole_ms=total, phases_ms=summed, rows=rows))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
