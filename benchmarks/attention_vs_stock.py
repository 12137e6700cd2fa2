"""One attention layer, forward + backward: ours (Triton, the reference's bits) vs the faster of stock PyTorch's two
in bf16, as the race's stock arms run them (SDPA: is_causal for a global layer, a boolean window mask for a local
one; compiled flex attention with the window's block mask, which skips the tiles outside it) vs the
floor of our own work: the largest part of the step's gap to stock ("Where the step's time goes", docs/perf.md).

    python benchmarks/attention_vs_stock.py [--batch 4] [--seq-len 2048] [--window 512] [--out FILE.json]

Shape: open-1b's layer (16 query / 4 kv heads of 128) at the race's 4 x 2,048 tokens. Ours takes float32 q, k, v
(the model's), stock bf16 ones. The floor counts our arithmetic over the (query, key) pairs a query sees: five
3-slice contractions (6 int8 products each) and P.V's one, at the int8 peak, or q, k, v, o and their
gradients read or written once at the measured copy bandwidth, whichever is longer: no [T, T] tensor in memory.
Times: median of triton.testing.do_bench (CUDA events).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels.ref import philox  # noqa: E402
from kernels.ref.attention import allowed_keys  # noqa: E402

INT8_PEAK = 1979e12  # dense int8 tensor-core ops/s, H100 and H200 SXM (datasheets)
HP_PRODUCTS, HP_CONTRACTIONS = 6, 5  # a 3-slice contraction's int8 products; logits, dv, dp, dq, dk


def pairs_seen(t: int, window: int | None) -> int:
    """(query, key) pairs of one causal sequence of t, each query seeing its last `window` keys (all if None)."""
    if window is None or window >= t:
        return t * (t + 1) // 2
    return window * (window + 1) // 2 + (t - window) * window


def floor_ms(b: int, hq: int, hkv: int, t: int, hd: int, window: int | None, bandwidth: float) -> float:
    """Our work at the units' peaks: contractions over the pairs seen vs q, k, v, o and gradients moved once."""
    pairs = b * hq * pairs_seen(t, window)
    ops = (HP_CONTRACTIONS * HP_PRODUCTS + 1) * 2 * pairs * hd
    nbytes = 4 * b * t * hd * (4 * hq + 4 * hkv)  # q, o, do, dq and k, v, dk, dv in float32
    return max(ops / INT8_PEAK, nbytes / bandwidth) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "attention_vs_stock.json"))
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table
    from triton.testing import do_bench

    from benchmarks.triton_kernels import _fb as fwd_bwd  # forward + backward with a fixed upstream gradient
    from benchmarks.triton_ops import copy_bandwidth
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from kernels.triton import attention as t_att

    dev = torch.device("cuda")
    b, t, hq, hkv, hd = args.batch, args.seq_len, 16, 4, 128
    bandwidth = copy_bandwidth()

    def inputs(dtype):
        q = philox.normal(1, 0, (b, hq, t, hd), device=dev).to(dtype).requires_grad_()
        k = philox.normal(2, 0, (b, hkv, t, hd), device=dev).to(dtype).requires_grad_()
        v = philox.normal(3, 0, (b, hkv, t, hd), device=dev).to(dtype).requires_grad_()
        return q, k, v

    q, k, v = inputs(torch.float32)
    qb, kb, vb = inputs(torch.bfloat16)
    table = Table(title=f"one attention layer fwd+bwd, {b} x {t} tokens, {hq}/{hkv} heads x {hd}, "
                        f"{torch.cuda.get_device_name()}")
    flex = torch.compile(flex_attention)
    for col in ("layer", "ours ms", "SDPA ms", "flex ms", "floor ms", "ours / best stock", "ours / floor"):
        table.add_column(col, justify="left" if col == "layer" else "right")
    rows = []
    for name, window in ((f"local (window {args.window})", args.window), ("global (causal)", None)):
        mask = None if window is None else allowed_keys(t, True, window, dev)  # the window, as the model's
        ours = fwd_bwd(lambda: t_att.attention(q, k, v, causal=True, window=window), q, k, v)
        sdpa = fwd_bwd(lambda: F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, is_causal=mask is None,
                                                               enable_gqa=True), qb, kb, vb)

        def visible(b_, h_, qi, ki, w=window):
            return (ki <= qi) if w is None else (ki <= qi) & (ki > qi - w)

        blocks = create_block_mask(visible, None, None, t, t, device=dev)
        flexed = fwd_bwd(lambda: flex(qb, kb, vb, block_mask=blocks, enable_gqa=True), qb, kb, vb)
        ours_ms = do_bench(ours, return_mode="median")
        sdpa_ms, flex_ms = do_bench(sdpa, return_mode="median"), do_bench(flexed, return_mode="median")
        stock_ms = min(sdpa_ms, flex_ms)
        fl = floor_ms(b, hq, hkv, t, hd, window, bandwidth)
        rows.append({"layer": name, "window": window, "ours_ms": ours_ms, "stock_sdpa_ms": sdpa_ms,
                     "stock_flex_ms": flex_ms, "stock_ms": stock_ms, "floor_ms": fl,
                     "ours_over_stock": ours_ms / stock_ms, "ours_over_floor": ours_ms / fl})
        table.add_row(name, f"{ours_ms:.3f}", f"{sdpa_ms:.3f}", f"{flex_ms:.3f}", f"{fl:.3f}",
                      f"{ours_ms / stock_ms:.2f}x", f"{ours_ms / fl:.1f}x")
    Console().print(table)
    out = {"device": torch.cuda.get_device_name(), "batch": b, "seq_len": t, "heads": [hq, hkv, hd],
           "copy_bandwidth": bandwidth, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
