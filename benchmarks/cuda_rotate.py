"""rotate_quantize's CUDA kernels (kernels/cuda/rotate_quantize.cu) against its Triton kernel
(kernels/triton/rotated_mm.rotate_quantize) in one run: bits compared, then both timed against the floor. Two
of the int8 linear backward's passes over G [m tokens, n features]: its rows along n (dx's operand, `rows`)
and its columns along m (dw's, `cols`); and the other two, the columns of x_hat and w_hat, rebuilt from x and w
and their steps (`x_hat`, `w_hat`; the column kernels with their pre-scale).

    python3 benchmarks/cuda_rotate.py [--shapes 8192x5632 8192x2048 8192x11264] [--kinds rows cols]
                                      [--rebuilt 8192x2048x5632] [--baseline REV] [--out FILE]
    TRITON_INTERPRET=1 python3 benchmarks/cuda_rotate.py --smoke   # CPU: the kernels' torch stand-in, small shapes

Each CUDA variant is timed (rows; cols in one launch; cols-split, C over CTAs in two launches), whichever the
backend would pick: rotate_quantize takes rows for C-contiguous operands, and cols-split for strided ones
whenever it has more than one split. The floor is 4 bytes read and 1 written an element, at the 4.3 TB/s that a
device copy reaches on the H200. The kernels are built as the backend builds them (kernels/cuda/nvrtc.py).
--baseline REV builds rotate_quantize.cu as at git revision REV (or the source file REV, where the tree has no
history) beside them and times its variants too ("cols-split@REV"), so a kernel change is measured against its
predecessor in one run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels.cuda import rotate as cuda_rotate  # noqa: E402
from kernels.cuda.emulate import emulated_launcher  # noqa: E402
from kernels.ref import philox  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COPY_BW = 4.3e12  # bytes/s, a device-to-device copy through PyTorch on the H200
MAX_C = cuda_rotate.MAX_ROW_C  # the row kernel holds a row of up to 16,384 elements in registers
DEVICE = "cuda"  # "cpu" under --smoke
TAGS = [""]  # variant suffixes timed: "" (the working tree's kernels), and "@REV" with --baseline REV


def operand_view(variant: str, g: torch.Tensor) -> tuple[int, int, int, int]:
    """(rows, c, s_row, s_col) of the operand a variant reads from g: its rows, or its columns."""
    if variant.startswith("rows"):
        return g.shape[0], g.shape[1], g.stride(0), 1
    return g.shape[1], g.shape[0], 1, g.stride(0)


def cuda_launcher(variant: str, g: torch.Tensor, q: torch.Tensor, step: torch.Tensor, bad: torch.Tensor,
                  pre: torch.Tensor | None = None):
    """launch() of one variant of kernels/cuda/rotate.py on G as the backward holds it: rows of g ("rows"), or
    the columns of g [C, rows] ("cols", "cols-split")."""
    rows, c, s_row, s_col = operand_view(variant, g)
    assert cuda_rotate.layout(g, rows, c, s_row, s_col, 256, pre) == variant.split("-")[0], variant
    return lambda: cuda_rotate.run(variant, g, rows, c, s_row, s_col, pre, q, step, bad)


def col_splits(rows: int, c: int) -> int:
    sms = torch.cuda.get_device_properties().multi_processor_count if DEVICE == "cuda" else 132  # --smoke: an H200
    return cuda_rotate.col_splits(rows, c, sms)


def compile_launcher():
    """(how it was built, launcher(variant, g, q, step, bad, pre) -> launch())."""
    state = cuda_rotate.status(torch.cuda.current_device())
    if state != "built":
        raise SystemExit(f"kernels/cuda/rotate_quantize.cu: {state}")
    return "NVRTC (kernels/cuda/nvrtc.py, as the backend)", cuda_launcher


def baseline_source(rev: str) -> tuple[str, str]:
    """(tag, text): rotate_quantize.cu as at git revision `rev`, or in the file `rev` (for a machine without
    the repository's history; tagged with the file's stem)."""
    if Path(rev).is_file():
        return Path(rev).stem, Path(rev).read_text()
    shown = subprocess.run(["git", "show", f"{rev}:kernels/cuda/rotate_quantize.cu"], cwd=ROOT,
                           capture_output=True, text=True)
    if shown.returncode != 0:
        raise SystemExit(f"--baseline {rev}: neither a file nor a git revision with kernels/cuda/rotate_quantize.cu "
                         f"({shown.stderr.strip()})")
    return rev, shown.stdout


def baseline_launcher(text: str, launcher):
    """`launcher` that also runs variants named "<variant>@<tag>": the kernels of the CUDA source `text`, built
    and self-checked as the backend builds its own, for a same-run A/B."""
    fns = cuda_rotate.build(torch.cuda.current_device(), text)

    def launch_either(variant: str, g, q, step, bad, pre=None):
        if "@" not in variant:
            return launcher(variant, g, q, step, bad, pre)
        base = variant.split("@")[0]
        return lambda: cuda_rotate._launch_variant(fns, base, g, *operand_view(base, g), pre, q, step, bad)
    return launch_either


def operand(rows: int, c: int, seed: int, device: str | None = None) -> torch.Tensor:
    """kernels/cuda/rotate.probe: normals with inf, NaN, a stage overflow, zeros, -0.0, an outlier and ties planted."""
    return cuda_rotate.probe(rows, c, seed, device or DEVICE)


reference = cuda_rotate.reference  # kernels/ref's codes, step and flag of each operand row


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    ints = {1: torch.int8, 4: torch.int32}
    return a.shape == b.shape and torch.equal(a.contiguous().view(ints[a.element_size()]),
                                              b.contiguous().view(ints[b.element_size()]))


def bench(fn) -> float:
    """ms: do_bench's median on the GPU; under --smoke one call's wall time (not a measurement)."""
    if DEVICE == "cpu":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton

    return triton.testing.do_bench(fn)


def measure(launcher, variants: list[str], g: torch.Tensor, rows: int, c: int, pre, triton_pass, ref=None) -> dict:
    """Each CUDA variant's codes, step and flags against the Triton pass's (and `ref`'s) bits, then all timed."""
    out = {}
    tq, ts, tb = triton_pass()
    for variant in variants:
        q = torch.empty((rows, c), dtype=torch.int8, device=DEVICE)
        step = torch.empty(rows, dtype=torch.float32, device=DEVICE)
        bad = torch.empty(rows, dtype=torch.int32, device=DEVICE)
        launch = launcher(variant, g, q, step, bad, pre)
        launch()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        r = {"bits_vs_triton": {"codes": same(q, tq), "step": same(step, ts), "bad": same(bad, tb)}}
        if ref is not None:
            rq, rs, rb = ref
            r["bits_vs_reference"] = {"codes": same(q, rq), "step": same(step, rs), "bad": same(bad, rb)}
        r["ms"] = bench(launch)
        if variant.startswith("cols-split"):
            r["splits"] = col_splits(rows, c)
        out[variant] = r
    return {"cuda": out, "triton_ms": bench(triton_pass), "floor_ms": rows * c * 5 / COPY_BW * 1e3}


def run_rebuilt(launcher, which: str, m: int, k: int, n: int) -> dict:
    """The rebuilt operands' columns: x_hat [m, k] (one step s_x) along m, or w_hat [n, k] (s_w per row) along n."""
    from kernels.triton import int8_linear as t_lin, rotated_mm as t_rot

    x = philox.normal(11, 0, (m, k), device=DEVICE)
    w = philox.normal(12, 0, (n, k), std=0.02, device=DEVICE)
    s_x = torch.tensor(0.05, device=DEVICE)
    src, pre = (x, s_x) if which == "x_hat" else (w, t_lin._weight(w, s_x, quant=False)[0])
    c, rows = src.shape
    if c % 256:
        raise ValueError(f"{which}: C {c} is not a multiple of 256")

    def triton_pass():
        with cuda_rotate.triton_only():
            return t_rot.rotate_quantize(src, rows, c, 1, rows, block=256, pre=pre)
    return {"kind": which, "m": c, "n": rows, "rows": rows, "c": c,
            **measure(launcher, [v + tag for v in ("cols", "cols-split") for tag in TAGS], src, rows, c, pre,
                     triton_pass)}


def run_case(launcher, kind: str, m: int, n: int, check_reference: bool) -> dict:
    """G [m tokens, n features]: `rows` rotates G's rows along n (dx's operand), `cols` its columns along m (dw's)."""
    from kernels.triton import rotated_mm as t_rot

    rows, c = (m, n) if kind == "rows" else (n, m)
    if c % 256 or (kind == "rows" and c > MAX_C):
        raise ValueError(f"--shapes {m}x{n}: the CUDA kernels take C a multiple of 256 (rows: up to {MAX_C})")
    o = operand(rows, c, seed=rows * 100003 + c)  # the operand's rows, edges planted in the first ones
    g = o if kind == "rows" else o.t().contiguous()  # as the linear's backward holds G
    strides = (c, 1) if kind == "rows" else (1, rows)

    def triton_pass():
        with cuda_rotate.triton_only():
            return t_rot.rotate_quantize(g, rows, c, *strides, block=256)
    variants = [v + tag for v in (["rows"] if kind == "rows" else ["cols", "cols-split"]) for tag in TAGS]
    return {"kind": kind, "m": m, "n": n, "rows": rows, "c": c,
            **measure(launcher, variants, g, rows, c, None, triton_pass, reference(o) if check_reference else None)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["8192x5632", "8192x2048", "8192x11264"],
                    help="G's m x n (tokens x features); each is run as rows and as columns")
    ap.add_argument("--kinds", nargs="+", default=["rows", "cols"], choices=("rows", "cols"))
    ap.add_argument("--rebuilt", default="8192x2048x5632", help="m x k x n of x_hat's and w_hat's column passes "
                    "(x [m, k], w [n, k]); 'none' to skip")
    ap.add_argument("--baseline", metavar="REV", help="also time rotate_quantize.cu as at git revision REV, or "
                    "the CUDA source file REV (variants named <variant>@REV, or @<file stem>), in the same run")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cuda_rotate.json"))
    ap.add_argument("--smoke", action="store_true", help="CPU, with TRITON_INTERPRET=1: the kernels' torch stand-in "
                    "against the Triton kernel at small shapes (default --shapes 512x512, --rebuilt 512x64x256)")
    args = ap.parse_args()
    global DEVICE
    t0 = time.perf_counter()
    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("error: --smoke runs the Triton kernel on the CPU: set TRITON_INTERPRET=1", file=sys.stderr)
            return 2
        DEVICE = "cpu"
        if args.shapes == ap.get_default("shapes"):
            args.shapes = ["512x512"]
        if args.rebuilt == ap.get_default("rebuilt"):
            args.rebuilt = "512x64x256"
        built, launcher = "torch stand-in (--smoke)", emulated_launcher
    elif not torch.cuda.is_available():
        print("error: benchmarks/cuda_rotate.py needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    else:
        built, launcher = compile_launcher()
        if args.baseline:
            tag, text = baseline_source(args.baseline)
            launcher = baseline_launcher(text, launcher)
            TAGS.append(f"@{tag}")
    print(f"compiled with {built} in {time.perf_counter() - t0:.1f} s", flush=True)
    results = []
    for i, shape in enumerate(args.shapes):
        m, n = (int(v) for v in shape.split("x"))
        for kind in args.kinds:
            results.append(run_case(launcher, kind, m, n, check_reference=i == 0))
            print(results[-1], flush=True)
    if args.rebuilt != "none":
        m, k, n = (int(v) for v in args.rebuilt.split("x"))
        for which in ("x_hat", "w_hat"):
            results.append(run_rebuilt(launcher, which, m, k, n))
            print(results[-1], flush=True)
    print("\n| operand (C x rows) | pass | CUDA variant | bits = Triton (codes, step, bad) | CUDA ms | Triton ms | "
          "Triton / CUDA | floor ms | CUDA / floor |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        for variant, v in r["cuda"].items():
            bits = "yes" if all(v["bits_vs_triton"].values()) else f"NO {v['bits_vs_triton']}"
            name = variant + (f" ({v['splits']} splits)" if "splits" in v else "")
            print(f"| {r['c']}x{r['rows']} | {r['kind']} | {name} | {bits} | {v['ms']:.3f} | {r['triton_ms']:.3f} | "
                  f"{r['triton_ms'] / v['ms']:.2f}x | {r['floor_ms']:.3f} | {v['ms'] / r['floor_ms']:.1f}x |")
            if "bits_vs_reference" in v:
                print(f"|  |  | = the reference: {v['bits_vs_reference']} |  |  |  |  |  |  |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "built": built,
                                          "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                          "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
                                          "torch": torch.__version__,
                                          "rows": results}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
