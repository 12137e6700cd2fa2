"""Registers, spills and shared memory of the Triton GEMM twins at their production tiles and at alternatives,
from Triton's own ptxas for sm_90: no GPU needed (kernels/triton/offline.py).

    python benchmarks/ptxas_report.py [--out benchmarks/results/ptxas_report.json]

A spill in a GEMM's K loop is local-memory traffic on every step; an alternative tile that fits its registers
is a candidate for the next H200 timing run (tiles are free choices for the bits: integer sums are exact).
Signatures are the PTX test's (tests/kernels/test_triton_ptx.py), so the two cannot drift apart.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# label -> (PTX-table entry, [(BM or R, BN or BK, warps, stages)]); each kernel's first tile is production's
TILES = {
    "hp (head logits, dh)": ("hp_gemm", [(128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 8, 3), (64, 64, 4, 3)]),
    # one K-step (attention's dP and logits, K = 128): no stages to pipeline; 64 x 64 at 4 warps fits two blocks
    # an SM (contraction.PRODUCTION_TILES)
    "hp, K <= 128 (dP)": ("hp_gemm", [(64, 64, 4, 1), (128, 64, 8, 3), (128, 64, 8, 1), (64, 32, 4, 1)]),
    "hp causal (attention)": ("hp_gemm_causal", [(64, 64, 4, 1), (128, 64, 8, 3), (128, 32, 8, 3), (64, 32, 4, 1)]),
    "head dW": ("loss_dw", [(128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 8, 3), (64, 32, 4, 3)]),
    "hp split (R x BK, warps)": ("hp_split", [(32, 64, 8, 1), (32, 128, 8, 1), (16, 64, 8, 1), (32, 64, 4, 1),
                                              (64, 64, 8, 1), (32, 32, 8, 1)]),
    "loss row (BLOCK, warps, -)": ("loss_row", [(2048, 0, 8, 1), (4096, 0, 8, 1), (4096, 0, 16, 1)]),
    "int8 GEMM + epilogue": ("int8_gemm_epilogue", [(128, 128, 8, 4), (128, 256, 8, 3), (64, 128, 4, 4)]),
}


def _ptx_table():
    spec = importlib.util.spec_from_file_location("ptx_table", ROOT / "tests" / "kernels" / "test_triton_ptx.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.KERNELS7


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ptxas_report.json"))
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    from kernels.triton.offline import compile_sm90, ptxas_usage

    table7 = _ptx_table()
    table = Table(title="Triton GEMM twins on sm_90: ptxas's report (first row of each kernel: production tile)")
    for col in ("kernel", "BM x BN, warps, stages", "registers", "spill stores B", "spill loads B", "smem KiB"):
        table.add_column(col, justify="left" if col == "kernel" else "right")
    rows = []
    for label, (entry, tiles) in TILES.items():
        fn, sig, opts, ce = table7[entry]
        for bm, bn, warps, stages in tiles:
            # the split's rows x elements, the loss row's elements per step, a GEMM's tile
            tile = {"R": bm, "BK": bn} if "R" in ce else {"BLOCK": bm} if "BLOCK" in ce else {"BM": bm, "BN": bn}
            use = ptxas_usage(compile_sm90(fn, sig, {**opts, "num_warps": warps, "num_stages": stages},
                                           **{**ce, **tile}))
            rows.append(dict(kernel=label, BM=bm, BN=bn, num_warps=warps, num_stages=stages, **use))
            shape = f"{bm}, {warps}, {stages}" if "BLOCK" in ce else f"{bm} x {bn}, {warps}, {stages}"
            table.add_row(label, shape, str(use["registers"]), str(use["spill_stores"]),
                          str(use["spill_loads"]), f"{use['shared'] / 1024:.0f}")
    Console(width=120).print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"target": "sm_90a", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
