"""Compiling the Triton twins for the H200 (sm_90) on a machine without a GPU, and reading ptxas's report.

triton.compile runs its whole pipeline for an explicit target, ptxas included (Triton ships it): what the PTX
holds (tests/kernels/test_triton_ptx.py) and what a kernel costs in registers, spills and shared memory
(ptxas_usage; the GEMM tiles' figures: `git show 0106f46:docs/perf.md`) are known before any GPU time is spent.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.triton.launch import BR_OPTIONS

TARGET = GPUTarget("cuda", 90, 32)


def compile_sm90(fn, sig: dict, options: dict | None = None, **constexprs):
    """A jit function compiled for sm_90 with the launch options every twin uses.

    Pointers and the integer arguments named in options["aligned"] are marked divisible by 16, as a launch
    with 16-aligned tensors and sizes specializes them (what lets a GEMM's loads become async copies).
    """
    options = dict(options or {})
    aligned = options.pop("aligned", ())
    sig = {**sig, **{k: "constexpr" for k in constexprs}}
    names = fn.arg_names
    attrs = {(names.index(k),): [["tt.divisibility", 16]] for k, v in sig.items() if v.startswith("*") or k in aligned}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=TARGET, options={**BR_OPTIONS, **options})


def ptxas_usage(kernel) -> dict[str, int]:
    """Registers per thread and spill bytes (stores, loads) that ptxas reports for a compiled kernel's PTX, and
    its shared memory. Spills in a GEMM's K loop are local-memory traffic on every iteration."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as fh:
            fh.write(kernel.asm["ptx"])
        out = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", path, "-o", os.devnull], capture_output=True,
                             text=True, check=True).stderr

    def number(pattern: str) -> int:
        m = re.search(pattern, out)
        if m is None:
            raise RuntimeError(f"ptxas_usage: no {pattern!r} in ptxas's report:\n{out}")
        return int(m.group(1))
    return {"registers": number(r"Used (\d+) registers"), "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads"), "shared": int(kernel.metadata.shared)}
