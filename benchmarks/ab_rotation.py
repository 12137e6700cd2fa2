"""A/B of the Hadamard kernels: this tree's `rotate_quantize` and `block_hadamard` against an older revision's,
in one run on one GPU, bits compared (codes, steps, flags, rotated values) and times as ratios.

    mkdir -p ab_old && for f in hadamard rotated_mm; do git show REV:kernels/triton/$f.py > ab_old/$f.py; done
    python benchmarks/ab_rotation.py --old ab_old [--out benchmarks/results/ab_rotation.json]

Cases are the three operand layouts of int8_linear's rotated backward at the open-1b proxy's FFN shape
(8,192 tokens x 5,632): G's rows for dX (C contiguous), G's columns for dW (rows contiguous), and W's columns
rebuilt from their codes (the PRE path); plus the standalone block_hadamard of G. Times: median of
triton.testing.do_bench (CUDA events, L2 flushed). Tiles: the new kernels' rows per program, swept.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _load_old(folder: Path):
    """The older revision's hadamard and rotated_mm as modules of their own (rotated_mm's import redirected)."""
    mods = {}
    for name in ("hadamard", "rotated_mm"):
        src = (folder / f"{name}.py").read_text()
        src = src.replace("from kernels.triton.hadamard import", "from ab_old_hadamard import")
        path = folder / f"ab_old_{name}.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(f"ab_old_{name}", path)
        mods[name] = importlib.util.module_from_spec(spec)
        sys.modules[f"ab_old_{name}"] = mods[name]
        spec.loader.exec_module(mods[name])
    return mods["hadamard"], mods["rotated_mm"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, type=Path, help="folder with the older hadamard.py and rotated_mm.py")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ab_rotation.json"))
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table
    from triton.testing import do_bench

    from kernels.cuda import rotate as cuda_rotate
    from kernels.digest import bits_equal
    from kernels.ref import philox
    from kernels.triton import hadamard as new_had, rotated_mm as new_rot

    old_had, old_rot = _load_old(args.old)
    g = philox.normal(1, 0, (8192, 5632), device="cuda")
    g[:, ::7] *= 100.0  # outlier columns
    w = philox.normal(2, 0, (5632, 2048), std=0.02, device="cuda")
    s_w = (w.abs().amax(1) / 127).contiguous()
    cases = {"dX operand: G rows (C contiguous)": (g, 8192, 5632, 5632, 1, None),
             "dW operand: G columns (rows contiguous)": (g, 5632, 8192, 1, 5632, None),
             "dX operand: W columns from codes (PRE)": (w, 2048, 5632, 1, 2048, s_w)}
    table = Table(title=f"Hadamard kernels, {args.old} vs this tree, {torch.cuda.get_device_name()}")
    for col in ("case", "old ms", "new ms (tile)", "old / new", "bits"):
        table.add_column(col, justify="left" if col == "case" else "right")
    rows = []

    def timed(fn):
        return do_bench(fn, return_mode="median")

    for name, (src, r, c, s_row, s_col, pre) in cases.items():
        def run(m):  # the Triton kernel of both trees (this tree's would take its CUDA kernels for these shapes)
            with cuda_rotate.triton_only():
                return m.rotate_quantize(src, r, c, s_row, s_col, block=256, pre=pre)
        want, t_old = run(old_rot), timed(lambda: run(old_rot))
        default = new_rot.TILE
        for tile in (2048, 4096, 8192):
            new_rot.TILE = tile
            same = all(bits_equal(a, b) for a, b in zip(run(new_rot), want))
            rows.append(dict(case=name, tile=tile, old_ms=t_old, new_ms=timed(lambda: run(new_rot)), same_bits=same))
        new_rot.TILE = default
    want, t_old = old_had.block_hadamard(g, 1), timed(lambda: old_had.block_hadamard(g, 1))
    default = new_had.PASS_TILE
    for tile in (1024, 2048, 4096):
        new_had.PASS_TILE = tile
        same = bits_equal(new_had.block_hadamard(g, 1), want)
        rows.append(dict(case="block_hadamard(G, 256)", tile=tile, old_ms=t_old,
                         new_ms=timed(lambda: new_had.block_hadamard(g, 1)), same_bits=same))
    new_had.PASS_TILE = default
    for row in rows:
        table.add_row(row["case"], f"{row['old_ms']:.3f}", f"{row['new_ms']:.3f} ({row['tile']})",
                      f"{row['old_ms'] / row['new_ms']:.2f}x", "same" if row["same_bits"] else "DIFFER")
    Console().print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"old": str(args.old), "gpu": torch.cuda.get_device_name(), "rows": rows},
                                         indent=1))
    return 0 if all(r["same_bits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
