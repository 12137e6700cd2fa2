"""Compile kernels/cuda/rotate_quantize.cu for sm_90 on a machine with no GPU and no nvcc: NVRTC to PTX, then ptxas's
register, spill and shared-memory report per kernel, and the SASS's instruction counts that matter here.

    python3 -m pip download --no-deps -d /tmp/cuda-wheels nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12
    python3 benchmarks/cuda_offline.py --wheels /tmp/cuda-wheels [--source kernels/cuda/rotate_quantize.cu]

The wheels are unpacked under the --wheels folder; cuobjdump is Triton's (pip install triton), when present.
Only for looking at the code: the GPU machine builds its own (kernels/cuda/rotate.py).
"""
from __future__ import annotations

import argparse
import ctypes
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernels.cuda import nvrtc  # noqa: E402  (no torch: this runs on any Python)


def unpack(wheels: Path) -> tuple[Path, Path]:
    """(libnvrtc.so, ptxas) from the two wheels in `wheels`, unpacked beside them."""
    out = wheels / "unpacked"
    for whl in sorted(wheels.glob("nvidia_cuda_*.whl")):
        with zipfile.ZipFile(whl) as z:
            z.extractall(out)
    lib = next(out.glob("nvidia/cuda_nvrtc/lib/libnvrtc.so.*"), None)
    ptxas = out / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"
    if lib is None or not ptxas.is_file():
        raise SystemExit(f"--wheels {wheels}: no nvidia-cuda-nvrtc / nvidia-cuda-nvcc wheel there (see the module doc)")
    ptxas.chmod(0o755)
    return lib, ptxas


def nvrtc_ptx(lib: Path, source: Path) -> bytes:
    """PTX for compute_90 of `source`, with the backend's options (nvrtc.BR_OPTIONS)."""
    try:
        return nvrtc.compile_source(ctypes.CDLL(str(lib)), source.read_text(), source.name,
                                    ["--gpu-architecture=compute_90", *nvrtc.BR_OPTIONS], cubin=False)
    except nvrtc.NVRTCError as e:
        raise SystemExit(str(e)) from None


def sass_counts(cubin: Path) -> dict[str, dict[str, int]] | None:
    """Per kernel: shuffles, global loads and stores, shared-memory accesses, local (spill) accesses."""
    try:
        import triton
    except ImportError:
        return None
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    text = subprocess.run([str(tool), "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    out: dict[str, dict[str, int]] = {}
    for name, body in re.findall(r"Function : (\w+)(.*?)(?=Function : |\Z)", text, flags=re.S):
        out[name] = {k: len(re.findall(p, body)) for k, p in
                     (("SHFL", r"\bSHFL\."), ("LDG", r"\bLDG\."), ("STG", r"\bSTG\."), ("LDS", r"\bLDS\b"),
                      ("STS", r"\bSTS\b"), ("LDL/STL", r"\b(?:LDL|STL)\b"), ("BAR", r"\bBAR\."))}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheels", required=True, type=Path, help="folder with the nvrtc and nvcc wheels")
    ap.add_argument("--source", type=Path, default=ROOT / "kernels" / "cuda" / "rotate_quantize.cu")
    args = ap.parse_args()
    lib, ptxas = unpack(args.wheels)
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        ptx.write_bytes(nvrtc_ptx(lib, args.source))
        report = subprocess.run([str(ptxas), "-arch=sm_90", "-v", str(ptx), "-o", str(cubin)], check=True,
                                capture_output=True, text=True).stderr
        print(report.strip())
        counts = sass_counts(cubin)
    if counts:
        print(f"\n| kernel | {' | '.join(next(iter(counts.values())))} |\n|---" + "|---" * len(next(iter(counts.values()))) + "|")
        for name, c in counts.items():
            print(f"| {name} | {' | '.join(str(v) for v in c.values())} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
