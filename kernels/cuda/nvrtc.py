"""One CUDA source to PTX or CUBIN through NVRTC's C API (ctypes): the backend's build and the offline report's.

Written here rather than taken from torch.cuda._utils._nvrtc_compile, which adds the CUDA toolkit's include
path and so fails (OSError, CUDA_HOME) on a machine with torch's CUDA wheels but no toolkit. These kernels
include nothing, and the libnvrtc that torch's wheels ship is all they need.
"""
from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence
from pathlib import Path

# bit-relevant, for every kernel here: no multiply-add contraction, IEEE division, subnormals kept (the reference's
# arithmetic; Triton's launches carry the same through kernels/triton/launch.BR_OPTIONS)
BR_OPTIONS = ("--fmad=false", "--prec-div=true", "--ftz=false", "-std=c++17")


class NVRTCError(RuntimeError):
    """NVRTC refused the source: the message names it and carries NVRTC's log."""


def library(cuda_major: int) -> ctypes.CDLL:
    """libnvrtc for CUDA `cuda_major`: the one torch's CUDA wheels loaded (found by its soname, as torch finds it),
    else one in an installed `nvidia` wheel's lib folder."""
    names = ([f"nvrtc64_{cuda_major}0_0.dll"] if sys.platform == "win32" else
             [f"libnvrtc.so.{cuda_major}", "libnvrtc.so"])
    try:
        import nvidia  # the CUDA wheels' namespace package: nvidia/cuda_nvrtc/lib, nvidia/cu13/lib, ...
        names += [str(f) for d in nvidia.__path__ for f in sorted(Path(d).glob(f"*/lib/{names[0]}*"))]
    except ImportError:
        pass
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise NVRTCError(f"no NVRTC library for CUDA {cuda_major} (tried {', '.join(names)})")


def compile_source(lib: ctypes.CDLL, source: str, filename: str, options: Sequence[str], *,
                   cubin: bool) -> bytes:
    """The source's PTX (cubin=False, for a virtual `compute_XX`) or CUBIN (for a real `sm_XX`), as bytes.
    `options` include the architecture (--gpu-architecture=...)."""
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), filename.encode(), 0, None, None),
           filename, "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in options]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        if rc:
            raise NVRTCError(f"{filename}: NVRTC error {rc} with options {list(options)}:\n{_log(lib, prog)}")
        size = ctypes.c_size_t()
        get_size, get = ((lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN) if cubin else
                         (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX))
        _check(lib, get_size(prog, ctypes.byref(size)), filename, "the output's size")
        out = ctypes.create_string_buffer(size.value)
        _check(lib, get(prog, out), filename, "the output")
        return out.raw if cubin else out.value  # a CUBIN holds zero bytes; PTX is a C string
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _log(lib: ctypes.CDLL, prog: ctypes.c_void_p) -> str:
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    return log.value.decode(errors="replace")


def _check(lib: ctypes.CDLL, rc: int, filename: str, what: str) -> None:
    if rc:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise NVRTCError(f"{filename}: NVRTC error {rc} ({lib.nvrtcGetErrorString(rc).decode()}) at {what}")
