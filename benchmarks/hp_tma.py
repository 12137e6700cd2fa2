"""The head's hp contraction through TMA descriptors, with and without Triton's Hopper warp specialization,
against production's kernel: bits and time, each variant in a process of its own with a time limit.

"What 2x stock needs at this contract" (docs/perf.md) puts the rest of the gap in the 3-slice contractions,
whose Triton tile (three int32 accumulators) reaches 42-64% of the int8 peak, and names a warp-specialized
kernel as the way on. Triton 3.6 has a Hopper warp-specialization pass; it only takes loops whose loads are
TMA descriptor loads (benchmarks/hp_tma_kernel.py). A warp-specialized kernel whose barriers do not match
hangs rather than fails, so every (variant, shape) runs in a child process killed at --timeout and reported as
a timeout instead of stalling the run.

    python benchmarks/hp_tma.py [--variants tma tma-2stages tma-ws] [--shapes logits dh ragged]
                                [--timeout 60] [--out benchmarks/results/hp_tma.json]
    TRITON_INTERPRET=1 python benchmarks/hp_tma.py --smoke   # CPU: the TMA kernel's bits at tiny shapes
    python benchmarks/hp_tma.py --ptxas   # no GPU: each variant compiled for sm_90a, ptxas's report, and whether
                                          # the warp specialization took (setmaxnreg in the PTX, warps launched)

Shapes (batch x M x N x K): the loss's logits chunk (1024 tokens x vocab 128,256 x d 2048), its dh (1024 x
2048 x 128,256: K past one int32 accumulation), and a ragged batched product. Operands: seeded normals, rows
scaled by powers of two, with an inf, a NaN and zero rows planted. Times: median of triton.testing.do_bench;
ratio = production / variant (above 1: the variant is faster). Prints a table, writes JSON.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = {"tma": dict(ws=False, warps=8, stages=3), "tma-2stages": dict(ws=False, warps=8, stages=2),
            "tma-ws": dict(ws=True, warps=4, stages=2)}
SHAPES = {"logits": (1, 1024, 128256, 2048), "dh": (1, 1024, 2048, 128256), "ragged": (2, 1000, 3001, 2000)}
SMOKE_SHAPES = [(1, 100, 70, 48), (2, 64, 40, 160)]


def operands(batch: int, m: int, n: int, k: int, device):
    """Seeded 3-slice operands A (batch * m rows) and B^T (batch * n rows) over k, with non-finite entries and
    zero rows planted."""
    import torch

    from kernels.triton import contraction as hp

    g = torch.Generator().manual_seed(batch * 1_000_003 + m * 1009 + n * 31 + k)
    a = torch.randn(batch * m, k, generator=g) * torch.exp2(torch.randint(-8, 8, (batch * m, 1), generator=g).float())
    b = torch.randn(batch * n, k, generator=g) * 0.02
    a[3, 5], a[min(17, batch * m - 1), 1], b[min(11, batch * n - 1), 2] = float("inf"), 3e38, float("nan")
    a[7], b[min(13, batch * n - 1)] = 0.0, 0.0
    a, b = a.to(device), b.to(device)
    return (hp.split(a, batch * m, k, a.stride(0), a.stride(1), 3),
            hp.split(b, batch * n, k, b.stride(0), b.stride(1), 3))


def measure(variant: str, shape: tuple[int, int, int, int], timing: bool = True) -> dict:
    """Bits of the variant against production's hp_gemm on the same slices, and both times (CUDA)."""
    import torch
    import triton

    from benchmarks.hp_tma_kernel import hp_gemm_tma
    from kernels.triton import contraction as hp
    from kernels.triton.launch import INTERPRET

    batch, m, n, k = shape
    sa, sb = operands(batch, m, n, k, "cpu" if INTERPRET else "cuda")
    want = hp.hp_gemm(sa, sb, batch, m, n, use="head")
    cfg = VARIANTS[variant] if not INTERPRET else dict(VARIANTS[variant], ws=False)
    tiles = dict(bm=64, bn=32, bk=32) if INTERPRET else {}
    got = hp_gemm_tma(sa, sb, batch, m, n, **cfg, **tiles)
    row = {"variant": variant, "shape": list(shape),
           "same_bits": bool(torch.equal(got.view(torch.int32), want.view(torch.int32)))}
    if timing:
        row["production_ms"] = triton.testing.do_bench(lambda: hp.hp_gemm(sa, sb, batch, m, n, use="head"))
        row["variant_ms"] = triton.testing.do_bench(lambda: hp_gemm_tma(sa, sb, batch, m, n, **cfg))
        row["ratio"] = row["production_ms"] / row["variant_ms"]
    return row


def run_isolated(variant: str, shape: str, timeout: float, command: list[str] | None = None) -> dict:
    """measure() in a child process (the last line it prints is its JSON row); a hang past `timeout` seconds or
    a crash comes back as a row saying so."""
    cmd = command or [sys.executable, str(Path(__file__).resolve()), "--one", variant, shape]
    row = {"variant": variant, "shape_name": shape}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**row, "status": f"timeout after {timeout:g} s (a hang, or a compile slower than that)"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {**row, "status": f"error (exit {done.returncode}): {' / '.join(tail)}"}
    return {**row, **json.loads(lines[-1]), "status": "ok"}


def ptxas(long_k: bool) -> list[dict]:
    """Each variant compiled for sm_90a at its tiles (kernels/triton/offline.py): registers, spills, shared
    memory, the warps it launches with and whether the PTX sets per-partition register counts (setmaxnreg: the
    warp specialization took)."""
    import triton
    from triton.compiler import ASTSource

    from benchmarks.hp_tma_kernel import _hp_tma_kernel
    from kernels.triton.launch import BR_OPTIONS
    from kernels.triton.offline import TARGET, ptxas_usage

    sig = {"a_desc": "tensordesc<i8[128, 128]>", "b_desc": "tensordesc<i8[64, 128]>", "ea_ptr": "*i64",
           "eb_ptr": "*i64", "bada_ptr": "*i32", "badb_ptr": "*i32", "out_ptr": "*fp32", "M": "i32", "N": "i32",
           "Kp": "i32", "RA": "i32", "RB": "i32"}
    names = _hp_tma_kernel.arg_names
    rows = []
    for name, cfg in VARIANTS.items():
        ce = dict(LONG_K=long_k, WS=cfg["ws"], BM=128, BN=64, BK=128, GROUP_M=8, STAGES=cfg["stages"])
        full = {**sig, **{k: "constexpr" for k in ce}}
        attrs = {(names.index(k),): [["tt.divisibility", 16]] for k, v in full.items()
                 if v.startswith("*") or k in ("Kp", "RA", "RB")}
        k = triton.compile(ASTSource(fn=_hp_tma_kernel, signature=full, constexprs=ce, attrs=attrs), target=TARGET,
                           options={**BR_OPTIONS, "num_warps": cfg["warps"]})
        rows.append({"variant": name, "long_k": long_k, **ptxas_usage(k), "warps": k.metadata.num_warps,
                     "warp_specialized": "setmaxnreg" in k.asm["ptx"]})
    return rows


def table(rows: list[dict]) -> str:
    out = ["| variant | shape | status | same bits | production ms | variant ms | production / variant |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ok = r["status"] == "ok"
        bits = r["same_bits"] if ok else "-"
        times = f"{r['production_ms']:.3f} | {r['variant_ms']:.3f} | {r['ratio']:.2f}x |" if ok else "- | - | - |"
        out.append(f"| {r['variant']} | {r['shape_name']} | {r['status']} | {bits} | {times}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=sorted(VARIANTS))
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a (variant, shape) may take")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "hp_tma.json"))
    p.add_argument("--smoke", action="store_true", help="bits only, tiny shapes, in this process")
    p.add_argument("--ptxas", action="store_true", help="compile for sm_90a here and print ptxas's report")
    p.add_argument("--one", nargs=2, metavar=("VARIANT", "SHAPE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one[0], SHAPES[args.one[1]])))
        return 0
    if args.ptxas:
        for r in ptxas(False) + ptxas(True):
            print(r)
        return 0
    if args.smoke:
        rows = [measure(v, s, timing=False) for v in args.variants for s in SMOKE_SHAPES]
        for r in rows:
            print(r)
        return 0 if all(r["same_bits"] for r in rows) else 1
    rows = [run_isolated(v, s, args.timeout) for s in args.shapes for v in args.variants]
    print(table(rows))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0 if all(r["status"] != "ok" or r["same_bits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
