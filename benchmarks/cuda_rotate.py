"""CUDA rotate-quantize kernels (benchmarks/cuda_rotate.cu) against the Triton kernel
(kernels/triton/rotated_mm.rotate_quantize) in one run: bits compared, then both timed against the floor. Two
of the int8 linear backward's passes over G [m tokens, n features]: its rows along n (dx's operand, `rows`)
and its columns along m (dw's, `cols`); and the other two, the columns of x_hat and w_hat, rebuilt from x and w
and their steps (`x_hat`, `w_hat`; the column kernel with its pre-scale).

    python3 benchmarks/cuda_rotate.py [--shapes 8192x5632 8192x2048 8192x11264] [--kinds rows cols]
                                      [--rebuilt 8192x2048x5632] [--out FILE]

Nothing in the step uses the CUDA kernel. It answers one question before anything is integrated: does a
kernel whose butterflies move between lanes by warp shuffles (Triton 3.6 has none) beat the Triton kernel's
float32 scratch row, and by how much? The rotate-quantize passes are ~80 ms of the 24-layer step, at 4-17x
their floor (docs/perf.md). The floor here is 4 bytes read and 1 written an element, at the 4.3 TB/s that
a device copy reaches on the H200. The CUDA source is compiled at run time by CuPy (NVRTC), or else by
torch.utils.cpp_extension (nvcc); the GPU machine has both.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels.ref import fixed, philox, rotated_mm as r_rot  # noqa: E402
from kernels.ref.hadamard import block_hadamard  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "benchmarks" / "cuda_rotate.cu"
COPY_BW = 4.3e12  # bytes/s, a device-to-device copy through PyTorch on the H200 (KINDS.md)
THREADS = 256
MAX_C = 8 * 8 * 256  # the row kernel holds a row of up to 16,384 elements in registers


def _cupy_launcher():
    import cupy as cp
    import numpy as np

    module = cp.RawModule(code=SOURCE.read_text(), options=("--fmad=false", "-std=c++17"))
    kernels = {kind: module.get_function(f"rotate_quantize_{kind}") for kind in ("rows", "cols")}

    def launcher(kind: str, g: torch.Tensor, q: torch.Tensor, step: torch.Tensor, bad: torch.Tensor,
                 pre: torch.Tensor | None = None):
        grid, args = _grid_and_args(kind, g, q)
        args = (*(cp.from_dlpack(t) for t in (g, q, step, bad)), np.int64(args[0]),
                *(np.int32(a) for a in args[1:]))
        if kind == "cols":  # the pre-scale: a null pointer, or the steps and their stride (0: one step)
            args += ((np.uint64(0), np.int64(0)) if pre is None else
                     (cp.from_dlpack(pre), np.int64(pre.stride(0) if pre.dim() else 0)))

        def launch():
            with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):  # torch's stream: ordered, timed
                kernels[kind]((grid,), (THREADS,), args)
        return launch
    return launcher


def _grid_and_args(kind: str, g: torch.Tensor, q: torch.Tensor) -> tuple[int, tuple[int, ...]]:
    """rows: g [rows, C] contiguous, (s_row, C, Kp); cols: g [C, rows] contiguous, its columns the operand's
    rows, (s_col, rows, C, Kp), 32 columns a CTA."""
    if kind == "rows":
        return g.shape[0], (g.stride(0), g.shape[1], q.shape[1])
    return -(-g.shape[1] // 32), (g.stride(0), g.shape[1], g.shape[0], q.shape[1])


def _torch_extension_launcher():
    from torch.utils.cpp_extension import load_inline

    wrapper = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
void launch_rows(torch::Tensor g, torch::Tensor q, torch::Tensor step, torch::Tensor bad) {
  rotate_quantize_rows<<<g.size(0), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      g.data_ptr<float>(), reinterpret_cast<signed char*>(q.data_ptr<int8_t>()), step.data_ptr<float>(),
      bad.data_ptr<int>(), g.stride(0), (int)g.size(1), (int)q.size(1));
}
void launch_cols(torch::Tensor g, torch::Tensor q, torch::Tensor step, torch::Tensor bad, torch::Tensor pre,
                 bool has_pre) {
  rotate_quantize_cols<<<(g.size(1) + 31) / 32, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      g.data_ptr<float>(), reinterpret_cast<signed char*>(q.data_ptr<int8_t>()), step.data_ptr<float>(),
      bad.data_ptr<int>(), g.stride(0), (int)g.size(1), (int)g.size(0), (int)q.size(1),
      has_pre ? pre.data_ptr<float>() : nullptr, has_pre && pre.dim() ? pre.stride(0) : 0);
}
"""
    decl = ("void launch_rows(torch::Tensor g, torch::Tensor q, torch::Tensor step, torch::Tensor bad);\n"
            "void launch_cols(torch::Tensor g, torch::Tensor q, torch::Tensor step, torch::Tensor bad, "
            "torch::Tensor pre, bool has_pre);")
    mod = load_inline("cuda_rotate", cpp_sources=decl,
                      cuda_sources=SOURCE.read_text() + wrapper, functions=["launch_rows", "launch_cols"],
                      extra_cuda_cflags=["--fmad=false", "-arch=sm_90"], verbose=False)

    def launcher(kind, g, q, step, bad, pre=None):
        if kind == "rows":
            return lambda: mod.launch_rows(g, q, step, bad)
        return lambda: mod.launch_cols(g, q, step, bad, pre if pre is not None else step, pre is not None)
    return launcher


def lane_schedule_fwht(blocks: torch.Tensor) -> torch.Tensor:
    """The CUDA kernel's butterflies in torch, for a CPU test against the reference: blocks [n, 256] float32 laid
    out as the kernel holds them ([n, 32 lanes, 8]), the in-lane stages, then each lane-exchange stage."""
    v = blocks.reshape(-1, 32, 8).clone()
    h = 1
    while h < 8:
        k = torch.arange(8)
        lower = k[(k & h) == 0]
        a, b = v[..., lower], v[..., lower + h]
        v[..., lower], v[..., lower + h] = a + b, a - b
        h *= 2
    lanes = torch.arange(32)
    for m in (1, 2, 4, 8, 16):
        other = v[:, lanes ^ m]  # __shfl_xor_sync(e[k], m)
        upper = ((lanes & m) != 0)[None, :, None]
        v = torch.where(upper, other - v, v + other)
    return v.reshape(blocks.shape)


def column_schedule_fwht(blocks: torch.Tensor) -> torch.Tensor:
    """The column kernel's butterflies in torch: element 32 k + l in register k of lane l ([n, 8, 32]); the lane
    exchanges (stages 1 .. 16), then the in-lane stages (32, 64, 128)."""
    v = blocks.reshape(-1, 8, 32).clone()
    lanes = torch.arange(32)
    for m in (1, 2, 4, 8, 16):
        other = v[:, :, lanes ^ m]
        upper = ((lanes & m) != 0)[None, None, :]
        v = torch.where(upper, other - v, v + other)
    h = 1
    while h < 8:
        k = torch.arange(8)
        lower = k[(k & h) == 0]
        a, b = v[:, lower], v[:, lower + h]
        v[:, lower], v[:, lower + h] = a + b, a - b
        h *= 2
    return v.reshape(blocks.shape)


def compile_launcher():
    """(how it was built, launcher(g, q, step, bad) -> launch())."""
    try:
        return "cupy (NVRTC)", _cupy_launcher()
    except Exception as e:  # no CuPy, or its NVRTC refused: the same source through nvcc
        print(f"cupy: {type(e).__name__}: {e}; building with torch.utils.cpp_extension", flush=True)
        return "torch.utils.cpp_extension (nvcc)", _torch_extension_launcher()


def operand(rows: int, c: int, seed: int) -> torch.Tensor:
    """Normals with the edges planted in the first rows: inf, NaN, a stage overflow (inf - inf), zeros, -0.0,
    one outlier, a row of ties for the rounding."""
    g = philox.normal(seed, 0, (rows, c), device="cuda")
    if rows >= 8:
        g[0, 5] = float("inf")
        g[1, c - 1] = float("nan")
        g[2, :256] = 3.0e38  # the butterflies overflow to inf, then take inf - inf
        g[3] = 0.0
        g[4] = -0.0
        g[5, 17] = 1.0e30
        g[6] = torch.arange(c, device="cuda", dtype=torch.float32) * 0.5  # many exact halves after the step
    return g


def reference(g: torch.Tensor):
    """kernels/ref: the codes, step and flag of each row (rotated_mm.rotated_int8_mm's operand a)."""
    bad = (~torch.isfinite(g)).any(dim=1).to(torch.int32)
    q, step = r_rot.quantize_symmetric(block_hadamard(fixed.finite_or_zero(g), dim=1), dim=1)
    return q, step.view(-1), bad


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    ints = {1: torch.int8, 4: torch.int32}
    return a.shape == b.shape and torch.equal(a.contiguous().view(ints[a.element_size()]),
                                              b.contiguous().view(ints[b.element_size()]))


def run_rebuilt(launcher, which: str, m: int, k: int, n: int) -> dict:
    """The rebuilt operands' columns: x_hat [m, k] (one step s_x) along m, or w_hat [n, k] (s_w per row) along n."""
    import triton

    from kernels.triton import int8_linear as t_lin, rotated_mm as t_rot

    x = philox.normal(11, 0, (m, k), device="cuda")
    w = philox.normal(12, 0, (n, k), std=0.02, device="cuda")
    s_x = torch.tensor(0.05, device="cuda")
    src, pre = (x, s_x) if which == "x_hat" else (w, t_lin._weight(w, s_x, quant=False)[0])
    c, rows = src.shape
    if c % 256:
        raise ValueError(f"{which}: C {c} is not a multiple of 256")
    q = torch.empty((rows, c), dtype=torch.int8, device="cuda")
    step = torch.empty(rows, dtype=torch.float32, device="cuda")
    bad = torch.empty(rows, dtype=torch.int32, device="cuda")
    launch = launcher("cols", src, q, step, bad, pre)

    def triton_pass():
        return t_rot.rotate_quantize(src, rows, c, 1, rows, block=256, pre=pre)
    launch()
    tq, ts, tb = triton_pass()
    torch.cuda.synchronize()
    return {"kind": which, "m": c, "n": rows, "rows": rows, "c": c,
            "bits_vs_triton": {"codes": same(q, tq), "step": same(step, ts), "bad": same(bad, tb)},
            "cuda_ms": triton.testing.do_bench(launch), "triton_ms": triton.testing.do_bench(triton_pass),
            "floor_ms": rows * c * 5 / COPY_BW * 1e3}


def run_case(launcher, kind: str, m: int, n: int, check_reference: bool) -> dict:
    """G [m tokens, n features]: `rows` rotates G's rows along n (dx's operand), `cols` its columns along m (dw's)."""
    import triton

    from kernels.triton import rotated_mm as t_rot

    rows, c = (m, n) if kind == "rows" else (n, m)
    if c % 256 or (kind == "rows" and c > MAX_C):
        raise ValueError(f"--shapes {m}x{n}: the CUDA kernels take C a multiple of 256 (rows: up to {MAX_C})")
    o = operand(rows, c, seed=rows * 100003 + c)  # the operand's rows, edges planted in the first ones
    g = o if kind == "rows" else o.t().contiguous()  # as the linear's backward holds G
    q = torch.empty((rows, c), dtype=torch.int8, device="cuda")
    step = torch.empty(rows, dtype=torch.float32, device="cuda")
    bad = torch.empty(rows, dtype=torch.int32, device="cuda")
    launch = launcher(kind, g, q, step, bad)
    strides = (c, 1) if kind == "rows" else (1, rows)

    def triton_pass():
        return t_rot.rotate_quantize(g, rows, c, *strides, block=256)
    launch()
    tq, ts, tb = triton_pass()
    torch.cuda.synchronize()
    out = {"kind": kind, "m": m, "n": n, "rows": rows, "c": c,
           "bits_vs_triton": {"codes": same(q, tq), "step": same(step, ts), "bad": same(bad, tb)}}
    if check_reference:
        rq, rs, rb = reference(o)
        out["bits_vs_reference"] = {"codes": same(q, rq), "step": same(step, rs), "bad": same(bad, rb)}
    out["cuda_ms"] = triton.testing.do_bench(launch)
    out["triton_ms"] = triton.testing.do_bench(triton_pass)
    out["floor_ms"] = rows * c * 5 / COPY_BW * 1e3
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["8192x5632", "8192x2048", "8192x11264"],
                    help="G's m x n (tokens x features); each is run as rows and as columns")
    ap.add_argument("--kinds", nargs="+", default=["rows", "cols"], choices=("rows", "cols"))
    ap.add_argument("--rebuilt", default="8192x2048x5632", help="m x k x n of x_hat's and w_hat's column passes "
                    "(x [m, k], w [n, k]); 'none' to skip")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cuda_rotate.json"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: benchmarks/cuda_rotate.py needs a CUDA device", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    built, launcher = compile_launcher()
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
    print("\n| G (m x n) | pass | bits: CUDA = Triton (codes, step, bad) | CUDA ms | Triton ms | Triton / CUDA | "
          "floor ms | CUDA / floor |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        bits = "yes" if all(r["bits_vs_triton"].values()) else f"NO {r['bits_vs_triton']}"
        print(f"| {r['m']}x{r['n']} | {r['kind']} | {bits} | {r['cuda_ms']:.3f} | {r['triton_ms']:.3f} | "
              f"{r['triton_ms'] / r['cuda_ms']:.2f}x | {r['floor_ms']:.3f} | {r['cuda_ms'] / r['floor_ms']:.1f}x |")
    for r in results:
        if "bits_vs_reference" in r:
            print(f"CUDA = reference ({r['m']}x{r['n']}, {r['kind']}): {r['bits_vs_reference']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "built": built,
                                          "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                          "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                          "rows": results}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
