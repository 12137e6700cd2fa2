"""The LM head's slice count: error vs float64 and time, against stock's bf16 head, in one run.

    python3 benchmarks/head_slices.py [--tokens 8192] [--slices 2 3 4] [--out benchmarks/results/head_slices.json]

The head's three contractions (logits, dh, dW) are hp products (kernels/ref/contraction): `s` int8 slices
per operand keep 7 s - 1 bits below each row's largest |element| and cost s (s + 1) / 2 int8 products each.
At 3 slices (the default, `model.head_slices`) the head is ~half of the Triton step's GEMM time on the
open-1b proxy (docs/perf.md), so the slice count is the largest lever on the step that the contract leaves
open: ARCHITECTURE.md lets a run choose it and asks for its error. This benchmark gives both:

- error of loss, dh and dW vs float64 (same inputs rounded as the arm sees them: h float32, W bf16-valued, as
  the bf16 masters are), as max |err| / max |ref| and as the relative Frobenius norm, for each slice count
  and for stock's head (F.linear under bf16 autocast, the loss in float32: benchmarks/stock_model.py);
- the fused loss's forward + backward time through the Triton backend per slice count, and stock's eager bf16
  head + loss beside them (one run; ratios).

Two input cases at the proxy's head shape (d 2048, vocab 128,256): `init` (W ~ N(0, 0.02): the run's start,
a near-uniform softmax, so g's entries are ~1/V beside the target's -1) and `peaked` (W ~ N(0, 0.1): logits
of std ~4.5, sharper distributions). The g rows are where few slices lose most: a row's slices are fixed-point
at its largest |g| (~1 at the target), so 2 slices (13 bits) drop probabilities below ~1e-4 that bf16 keeps.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels.ref import philox  # noqa: E402

Z_WEIGHT = 1e-4
CASES = {"init": 0.02, "peaked": 0.1}


def inputs(n: int, d: int, v: int, w_std: float, dev):
    h = philox.normal(1, 0, (n, d), device=dev)
    w = philox.normal(2, 0, (v, d), std=w_std, device=dev).bfloat16().float()  # bf16 masters' values
    tg = philox.random_bits(3, 0, n, device=dev) % v
    return h, w, tg


def float64_reference(h, w, tg) -> dict:
    """loss, dh, dW of the fused loss in float64 (closed form: g = softmax (1 + 2 zw lse) - onehot, / n)."""
    h64, w64 = h.double(), w.double()
    logits = h64 @ w64.t()
    lse = torch.logsumexp(logits, -1)
    n = h.shape[0]
    loss = (lse - logits.gather(1, tg[:, None])[:, 0]).mean() + Z_WEIGHT * (lse * lse).mean()
    g = torch.softmax(logits, -1).mul_((1 + 2 * Z_WEIGHT * lse)[:, None])
    g[torch.arange(n, device=h.device), tg] -= 1
    g /= n
    del logits
    return {"loss": loss, "dh": g @ w64, "dw": g.t() @ h64}


def ours(h, w, tg, slices: int):
    from kernels.triton import loss as t_loss
    hh, ww = h.clone().requires_grad_(True), w.clone().requires_grad_(True)

    def run():
        hh.grad = ww.grad = None
        loss = t_loss.cross_entropy_zloss(hh, ww, tg, z_weight=Z_WEIGHT, slices=slices)[0]
        loss.backward()
        return loss.detach(), hh.grad, ww.grad
    return run


def stock(h, w, tg):
    """Stock's head: float32 leaves, F.linear under bf16 autocast, logsumexp and cross-entropy in float32."""
    hh, ww = h.clone().requires_grad_(True), w.clone().requires_grad_(True)

    def run():
        hh.grad = ww.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = F.linear(hh, ww).float()
            lse = torch.logsumexp(logits, -1)
            loss = F.cross_entropy(logits, tg) + Z_WEIGHT * (lse * lse).mean()
        loss.backward()
        return loss.detach(), hh.grad, ww.grad
    return run


def errors(loss, dh, dw, ref) -> dict:
    out = {"loss_rel": abs(float(loss) - float(ref["loss"])) / abs(float(ref["loss"]))}
    for name, got in (("dh", dh), ("dw", dw)):
        diff = got.double() - ref[name]
        out[f"{name}_max"] = float(diff.abs().max() / ref[name].abs().max())
        out[f"{name}_fro"] = float(diff.norm() / ref[name].norm())
    return out


def measure(n, d, v, w_std, slices_list, dev) -> list[dict]:
    import triton.testing

    h, w, tg = inputs(n, d, v, w_std, dev)
    ref = float64_reference(h, w, tg)
    rows = []
    for label, run in [(f"{s} slices", ours(h, w, tg, s)) for s in slices_list] + [("stock bf16", stock(h, w, tg))]:
        row = {"arm": label, **errors(*run(), ref),
               "ms": triton.testing.do_bench(run, warmup=3, rep=20, return_mode="median")}
        rows.append(row)
        print(row, flush=True)
    del ref
    torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--slices", nargs="+", type=int, default=[2, 3, 4])
    ap.add_argument("--cases", nargs="+", choices=tuple(CASES), default=list(CASES))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "head_slices.json"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("head_slices: needs a CUDA GPU", file=sys.stderr)
        return 2
    n, d, v = args.tokens, 2048, 128_256
    result = {"command": "benchmarks/head_slices.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "shape": {"tokens": n, "d": d, "vocab": v}, "cases": {}}
    for case in args.cases:
        result["cases"][case] = measure(n, d, v, CASES[case], args.slices, "cuda")
    print(f"\nLM head, {n:,} tokens x d {d} x vocab {v:,}: loss forward + backward; errors vs float64 "
          "(max: max|err| / max|ref|; fro: relative Frobenius)\n")
    print("| case | arm | ms | 3-slice ms / arm ms | loss rel | dh max | dh fro | dW max | dW fro |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for case, rows in result["cases"].items():
        base = next((r["ms"] for r in rows if r["arm"] == "3 slices"), None)
        for r in rows:
            ratio = f"{base / r['ms']:.2f}x" if base else "-"
            print(f"| {case} | {r['arm']} | {r['ms']:.1f} | {ratio} | {r['loss_rel']:.1e} | {r['dh_max']:.1e} | "
                  f"{r['dh_fro']:.1e} | {r['dw_max']:.1e} | {r['dw_fro']:.1e} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
