"""The compact wire's passes on a CPU as one C++ loop each (wire_cpu.cpp), built here at run time with g++.

The eager torch passes of collectives/exact_wire.py make many full-size int64 temporaries; these read each input
once, OpenMP over blocks, and give the same bits (tests/collectives/test_wire_fused.py). The build is a plain
shared library loaded with ctypes: no Python or torch headers, so it takes about a second and needs only a C++
compiler (CXX, else g++). It is cached by the hash of the source, flags and compiler under
$XDG_CACHE_HOME/auditable-training (else ~/.cache/..., else the temporary directory), written atomically. Where
it cannot be built, `library()` warns once and the wire runs its eager passes (the same bits).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("wire_cpu.cpp")
# bit-relevant: no contraction of * and + into FMAs and no fast-math (each float64 op rounds as the eager one)
FLAGS = ("-O3", "-std=c++17", "-fopenmp", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math")
_failure: list[str] = []

P, I64, F64, I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_int
SIGNATURES = {"wire_scan": (P, P, P, P, I64, I64, P, P, I32),
              "wire_encode": (P, P, P, P, I64, I64, I32, P, I32),
              "wire_decode": (P, P, I64, I64, I32, F64, P, P, P, I32),
              "wire_late": (P, P, I64, I64, I32, F64, P, I64, P),
              "wire_narrow": (P, I64, I32, P, I32),
              "wire_widen_add": (P, I64, I32, P, I32, I32)}
WIDTHS = (5, 6, 7)  # the packed wire's widths built here (collectives/allreduce.py)


def _cache_dir() -> Path:
    """$XDG_CACHE_HOME/auditable-training (else ~/.cache/...), or the temporary directory's where that is not
    writable."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    out = Path(base) / "auditable-training"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError:
        out = Path(tempfile.gettempdir()) / "auditable-training"
        out.mkdir(parents=True, exist_ok=True)
    return out


def build(compiler: str | None = None) -> Path:
    """The shared library of wire_cpu.cpp, compiled once per source, flags and compiler version (cached)."""
    cxx = compiler or os.environ.get("CXX") or "g++"
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    text = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([text, " ".join(FLAGS).encode(), version.encode()])).hexdigest()[:16]
    out = _cache_dir() / f"wire_cpu-{key}.so"
    if out.exists():
        return out
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run([cxx, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{SOURCE.name}: {cxx} failed ({done.returncode}):\n{done.stderr[-2000:]}")
        os.replace(tmp, out)  # atomic: another process building the same key writes the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library, or None (and a warning, once) where it could not be built."""
    try:
        lib = ctypes.CDLL(str(build()))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
        _failure.append(f"{type(e).__name__}: {e}")
        warnings.warn(f"{SOURCE.name}: not built ({_failure[0]}); the compact wire runs its eager passes",
                      RuntimeWarning, stacklevel=2)
        return None
    for name, args in SIGNATURES.items():
        getattr(lib, name).argtypes = args
    lib.wire_late.restype = I64
    return lib


def status() -> str:
    """"built", or why not (benchmarks and tests name it)."""
    return "built" if library() is not None else f"not built: {_failure[0] if _failure else '?'}"


def takes(*tensors: torch.Tensor | None) -> bool:
    """True where these passes can run: the library is built and every tensor is on the CPU, each row contiguous."""
    present = [t for t in tensors if t is not None]
    return (all(t.device.type == "cpu" and t.stride(-1) == 1 for t in present)
            and library() is not None)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def scan(limbs: torch.Tensor, bad: torch.Tensor | None, block: int, top: torch.Tensor, flag: torch.Tensor) -> None:
    """Phase 1 on one part: normalize limbs (3, n) in place; per block E into top and the bad flag into flag
    (int32, contiguous)."""
    n = limbs.shape[1]
    library().wire_scan(*(_ptr(limbs[i]) for i in range(3)), _ptr(bad), n, block, _ptr(top), _ptr(flag),
                        torch.get_num_threads())


def encode(limbs: torch.Tensor, s: torch.Tensor, k: int, block: int, words: torch.Tensor) -> None:
    """Phase 2's words of one part (normalized limbs (3, n), s per block int64 contiguous) into words (n,)."""
    library().wire_encode(*(_ptr(limbs[i]) for i in range(3)), _ptr(s), limbs.shape[1], block, k, _ptr(words),
                          torch.get_num_threads())


def decode(s: torch.Tensor, k: int, words: torch.Tensor, scale: float, out: torch.Tensor,
           block: int) -> tuple[torch.Tensor, int]:
    """out = the result at lo of one part's summed words; (its elements that need phase 3, how many had F > 0)."""
    n, lib = words.numel(), library()
    counts = torch.empty((2, s.numel()), dtype=torch.int32)
    lib.wire_decode(_ptr(words), _ptr(s), n, block, k, scale, _ptr(out), _ptr(counts[0]), _ptr(counts[1]),
                    torch.get_num_threads())
    blocks = counts[1].nonzero().squeeze(1)
    idx = torch.empty(int(counts[1].sum()), dtype=torch.int64)
    if idx.numel():
        lib.wire_late(_ptr(words), _ptr(s), n, block, k, scale, _ptr(blocks), blocks.numel(), _ptr(idx))
    return idx, int(counts[0].sum())


def narrow(values: torch.Tensor, width: int, out: torch.Tensor) -> None:
    """out (n, width) uint8 = the low `width` bytes of each int64 of values (n,), contiguous (allreduce.narrow)."""
    library().wire_narrow(_ptr(values), values.numel(), width, _ptr(out), torch.get_num_threads())


def widen_add(packed: torch.Tensor, acc: torch.Tensor, assign: bool) -> None:
    """acc (n,) int64 = (0 if assign else acc) + the sign-extended values of packed (n, width) uint8 (allreduce.widen)."""
    library().wire_widen_add(_ptr(packed), acc.numel(), packed.shape[1], _ptr(acc), int(assign),
                             torch.get_num_threads())

