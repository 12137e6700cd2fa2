"""Rotate-quantize's CUDA kernels (rotate_quantize.cu): built once a process with NVRTC, launched on torch's stream.

kernels/triton/rotated_mm.rotate_quantize calls `launch` first; it returns False for a case these kernels do not
cover (or when they are off or could not be built), and the Triton kernel runs. Both give the reference's bits,
so which one ran never shows in a digest; it shows in the step time (docs/perf.md, "rotate-quantize in CUDA").

Two layouts of an operand's rows along C, with Hadamard blocks of 256 and C a multiple of 256:
- `rows`: C contiguous (G's rows for dx). One CTA a row, the row held in registers; C up to 16,384.
- `cols`: the operand's rows adjacent in memory, C strided (G's columns for dw; x_hat's and w_hat's columns,
  rebuilt from x or w and their steps). 32 columns a CTA, C split over CTAs when the column groups are fewer
  than ~4 an SM, the split's amax and flags combined by atomics (max and or: exact in any order).

The build calls NVRTC (kernels/cuda/nvrtc.py) through the libnvrtc that torch's CUDA wheels ship; the CUBIN is
loaded by torch's private helper (torch.cuda._utils._cuda_load_module, present in torch 2.11 and 2.13) and each
kernel launched through the driver's cuLaunchKernel by `Kernel`: no CUDA toolkit, no CuPy, no nvcc. The launcher
passes Python ints as C ints, which is why the kernels take int strides and `launch` checks that they fit. Each
build is checked against kernels/ref before first use (self_check), through the same launcher, so a change in
the helper or in the argument passing cannot give silently wrong bits.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import threading
import warnings
from pathlib import Path

import torch

from kernels.cuda import nvrtc

SOURCE = Path(__file__).with_name("rotate_quantize.cu")
KERNELS = ("rotate_quantize_rows", "rotate_quantize_cols", "rotate_cols_amax", "rotate_cols_codes")
COLUMN_KERNELS = KERNELS[1:]  # their tiles are dynamic shared memory where a source says so (tiles_bytes)
BLOCK = 256  # the Hadamard block the kernels rotate
THREADS = 256
MAX_ROW_C = 8 * 8 * BLOCK  # the row kernel holds up to 8 blocks a warp, 8 warps, in registers
COLS = 32  # operand rows (source columns) a column CTA takes
CTAS_PER_SM = 4
INT_MAX = 2**31 - 1
MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

_enabled = os.environ.get("BR_CUDA_KERNELS", "1") != "0"
_failures: dict[int, str] = {}


@contextlib.contextmanager
def triton_only():
    """Within: rotate_quantize takes the Triton kernel everywhere (benchmarks' A/B, the tests' comparisons)."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


def layout(src: torch.Tensor, rows: int, c: int, s_row: int, s_col: int, block: int | None,
           pre: torch.Tensor | None) -> str | None:
    """"rows", "cols", or None (the Triton kernel) for an operand of `rows` rows along C, as rotate_quantize
    describes it: element (r, i) at src + r s_row + i s_col."""
    if block != BLOCK or c < BLOCK or c % BLOCK or rows < 1 or src.dtype != torch.float32:
        return None
    if max(rows, c, s_row, s_col) > INT_MAX or (pre is not None and not _pre_ok(pre, src, c)):
        return None
    if s_col == 1 and pre is None and c <= MAX_ROW_C and s_row % 4 == 0 and src.data_ptr() % 16 == 0:
        return "rows"  # float4 loads: every row 16-byte aligned
    if s_row == 1 and s_col > 0:
        return "cols"
    return None


def _pre_ok(pre: torch.Tensor, src: torch.Tensor, c: int) -> bool:
    """A step for the rebuilt operand: one (0-dim) or one per C index, float32, beside src."""
    shaped = pre.dim() == 0 or (pre.dim() == 1 and pre.shape[0] >= c and pre.stride(0) <= INT_MAX)
    return shaped and pre.dtype == torch.float32 and pre.device == src.device


def col_splits(rows: int, c: int, sms: int) -> int:
    """Splits of C over CTAs for the column kernels: ~4 CTAs an SM, at most one Hadamard block each."""
    groups = -(-rows // COLS)
    return max(1, min(c // BLOCK, -(-CTAS_PER_SM * sms // groups)))


def launch(src: torch.Tensor, rows: int, c: int, s_row: int, s_col: int, block: int | None,
           pre: torch.Tensor | None, q: torch.Tensor, step: torch.Tensor, bad: torch.Tensor) -> bool:
    """Write rotate_quantize's codes q [rows, kp], step [rows] and flags bad [rows] with a CUDA kernel: True, or
    False (nothing written) when this case is the Triton kernel's."""
    if not (_enabled and src.is_cuda):
        return False
    kind = layout(src, rows, c, s_row, s_col, block, pre)
    if kind is None:
        return False
    device = _index(src)
    fns = _kernels(device)
    if fns is None:
        return False
    if kind == "cols" and col_splits(rows, c, _sm_count(device)) > 1:
        kind = "cols-split"  # faster at every measured shape with more than one split (docs/perf.md)
    _launch_variant(fns, kind, src, rows, c, s_row, s_col, pre, q, step, bad)
    return True


def run(variant: str, src: torch.Tensor, rows: int, c: int, s_row: int, s_col: int, pre: torch.Tensor | None,
        q: torch.Tensor, step: torch.Tensor, bad: torch.Tensor) -> None:
    """One variant's launches ("rows", "cols" or "cols-split") for a case `layout` accepted; the kernels must be
    built. benchmarks/cuda_rotate.py times each variant through here."""
    _launch_variant(_kernels(_index(src)), variant, src, rows, c, s_row, s_col, pre, q, step, bad)


def _launch_variant(fns: dict, variant: str, src: torch.Tensor, rows: int, c: int, s_row: int, s_col: int,
                    pre: torch.Tensor | None, q: torch.Tensor, step: torch.Tensor, bad: torch.Tensor) -> None:
    device, kp = _index(src), q.shape[1]
    with _on(device):
        _ensure_context(device)
        stream = torch.cuda.current_stream(device).cuda_stream
        if variant == "rows":
            fns["rotate_quantize_rows"]((rows,), rows_args(src, q, step, bad, s_row, c, kp), stream)
            return
        splits = col_splits(rows, c, _sm_count(device)) if variant == "cols-split" else 1
        grid = (-(-rows // COLS), splits)
        if variant == "cols":
            fns["rotate_quantize_cols"](grid, cols_args(src, q, step, bad, s_col, rows, c, kp, pre), stream)
            return
        words = torch.zeros((3, rows), dtype=torch.int32, device=src.device)  # amax bits, NaN, flag
        amax_args, codes_args = split_args(src, q, step, bad, s_col, rows, c, kp, pre, words)
        fns["rotate_cols_amax"](grid, amax_args, stream)
        fns["rotate_cols_codes"](grid, codes_args, stream)


# The build's self-check: (variant, operand rows, C, pre-scale) on planted operands, against kernels/ref
SELF_CHECK = (("rows", 8, 512, None), ("cols", 40, 512, None), ("cols-split", 40, 512, None),
              ("cols-split", 40, 512, "one"), ("cols", 40, 512, "per C"))


def probe(rows: int, c: int, seed: int, device) -> torch.Tensor:
    """Normals with the edges planted in the first rows: inf, NaN, a stage overflow (inf - inf), zeros, -0.0,
    one outlier, a row of ties for the rounding."""
    from kernels.ref import philox

    g = philox.normal(seed, 0, (rows, c), device=device)
    if rows >= 8:
        g[0, 5] = float("inf")
        g[1, c - 1] = float("nan")
        g[2, :256] = 3.0e38  # the butterflies overflow to inf, then take inf - inf
        g[3] = 0.0
        g[4] = -0.0
        g[5, 17] = 1.0e30
        g[6] = torch.arange(c, device=device, dtype=torch.float32) * 0.5  # many exact halves after the step
    return g


def reference(o: torch.Tensor, pre: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kernels/ref's codes, step and flag of each row of the operand o [rows, C], rebuilt first as
    to_int8(o / pre) * pre when a pre-scale (one, or one per C index) is given."""
    from kernels.ref import fixed, rotated_mm as r_rot
    from kernels.ref.hadamard import block_hadamard

    if pre is not None:
        o = r_rot.to_int8(o / pre).to(torch.float32) * pre
    bad = (~torch.isfinite(o)).any(dim=1).to(torch.int32)
    q, step = r_rot.quantize_symmetric(block_hadamard(fixed.finite_or_zero(o), dim=1), dim=1)
    return q, step.view(-1), bad


def self_check(launch_variant, device) -> str | None:
    """None when every variant, through `launch_variant(variant, src, rows, c, s_row, s_col, pre, q, step, bad)`,
    gives the reference's codes, steps and flags on planted operands; else which one did not. Run once a build,
    before any use: the launch goes through private torch helpers whose argument passing could change."""
    from kernels.digest import bits_equal

    for i, (variant, rows, c, pre_kind) in enumerate(SELF_CHECK):
        o = probe(rows, c, seed=1000 + i, device=device)
        pre = {None: None, "one": torch.tensor(0.03, device=device),
               "per C": torch.rand(c, generator=torch.Generator().manual_seed(i)).to(device) * 0.05 + 1e-3}[pre_kind]
        src, s_row, s_col = (o, c, 1) if variant == "rows" else (o.t().contiguous(), 1, rows)
        got = (torch.empty((rows, c), dtype=torch.int8, device=device),
               torch.empty(rows, dtype=torch.float32, device=device), torch.empty(rows, dtype=torch.int32, device=device))
        launch_variant(variant, src, rows, c, s_row, s_col, pre, *got)
        want = reference(o, pre)
        wrong = [name for name, a, b in zip(("codes", "steps", "flags"), got, want) if not bits_equal(a, b)]
        if wrong:
            return f"{variant} ({rows} x {c}, pre-scale {pre_kind}): {', '.join(wrong)} differ from kernels/ref"
    return None


def _index(t: torch.Tensor) -> int:
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def _pre_args(pre: torch.Tensor | None, stand_in: torch.Tensor) -> list:
    """(has_pre, pre, pre_stride): the launcher takes no null pointer, so an absent pre passes a stand-in."""
    if pre is None:
        return [0, stand_in, 0]
    return [1, pre, pre.stride(0) if pre.dim() else 0]


def rows_args(src, q, step, bad, s_row: int, c: int, kp: int) -> list:
    return [src, q, step, bad, s_row, c, kp]


def cols_args(src, q, step, bad, s_col: int, rows: int, c: int, kp: int, pre) -> list:
    return [src, q, step, bad, s_col, rows, c, kp, *_pre_args(pre, step)]


def split_args(src, q, step, bad, s_col: int, rows: int, c: int, kp: int, pre, words) -> tuple[list, list]:
    """The split column kernels' arguments: the amax pass's, then the codes pass's."""
    pre_args = _pre_args(pre, step)
    amax = [src, s_col, rows, c, *pre_args, words[0], words[1], words[2]]
    codes = [src, q, s_col, rows, c, kp, *pre_args, words[0], words[1], words[2], step, bad]
    return amax, codes


def signatures() -> dict[str, list[str]]:
    """Each kernel's parameter kinds in the source: "ptr" or the C type (checked against the argument lists)."""
    text = SOURCE.read_text()
    out = {}
    for name in KERNELS:
        params = re.search(rf"\b{name}\(([^)]*)\)", text).group(1)
        out[name] = ["ptr" if "*" in p else p.split()[0] for p in (x.strip() for x in params.split(","))]
    return out


def tiles_bytes(text: str) -> int:
    """The column kernels' dynamic shared memory, from the source's `#define TILES_BYTES` (0 in a revision of the
    source from before the kernels took their tiles so: a benchmark's baseline)."""
    m = re.search(r"^#define TILES_BYTES (\d+)\b", text, re.M)
    return int(m.group(1)) if m else 0


def build(device: int, source: str | None = None) -> dict:
    """The kernels of `source` (rotate_quantize.cu's text by default) compiled for `device`, loaded, and checked
    against the reference (self_check); raises when NVRTC is missing or refuses, or the check fails. A
    benchmark may build an older revision's source beside the current one."""
    from torch.cuda._utils import _cuda_load_module

    major, minor = torch.cuda.get_device_capability(device)
    lib = nvrtc.library(int(torch.version.cuda.split(".")[0]))
    text = SOURCE.read_text() if source is None else source
    cubin = nvrtc.compile_source(lib, text, SOURCE.name,
                                 [f"--gpu-architecture=sm_{major}{minor}", *nvrtc.BR_OPTIONS], cubin=True)
    with torch.cuda.device(device):
        _ensure_context(device)  # the module loads into the thread's current context: autograd's may have none
        kinds = signatures() if source is None else {name: None for name in KERNELS}
        shared = tiles_bytes(text)
        fns = {name: Kernel(k.func, kinds[name], shared if name in COLUMN_KERNELS else 0)
               for name, k in _cuda_load_module(cubin, list(KERNELS)).items()}
        problem = self_check(functools.partial(_launch_variant, fns), torch.device("cuda", device))
    if problem:
        raise RuntimeError(f"self-check: {problem}")
    return fns


@functools.cache
def _kernels(device: int) -> dict | None:
    """The four kernels built for `device` (build), or None (and a warning, once) when they could not be."""
    try:
        return build(device)
    except Exception as e:  # no libnvrtc, an older torch, a refused build: the Triton kernel gives the same bits
        _failures[device] = f"{type(e).__name__}: {e}"
        warnings.warn(f"{SOURCE.name}: not built for cuda:{device} ({_failures[device]}); "
                      "rotate_quantize runs its Triton kernel", RuntimeWarning, stacklevel=3)
        return None


def status(device: int = 0) -> str:
    """"built", "off", or why the kernels could not be built (benchmarks print it beside their figures)."""
    if not _enabled:
        return "off"
    if not torch.cuda.is_available():
        return "not built: no CUDA device"
    return "built" if _kernels(device) is not None else f"not built: {_failures.get(device, '?')}"


@functools.cache
def _sm_count(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _on(device: int):
    """The kernels' module belongs to its device's context: switch only when another device is current."""
    return contextlib.nullcontext() if device == torch.cuda.current_device() else torch.cuda.device(device)


@functools.cache
def _driver() -> ctypes.CDLL:
    """libcuda, the driver API the launches go through."""
    from torch.cuda._utils import _get_gpu_runtime_library

    return _get_gpu_runtime_library()


def _ensure_context(device: int) -> None:
    """Make the device's primary context current on this thread, as Triton's launcher does: the module's load
    and the launches go through the driver API, and a thread that has run no CUDA work yet (autograd's backward
    thread, at its first op) has no current context there ("invalid device context")."""
    from torch.cuda._utils import _check_cuda

    lib = _driver()
    ctx = ctypes.c_void_p()
    _check_cuda(lib.cuCtxGetCurrent(ctypes.byref(ctx)))
    if ctx.value:
        return
    dev = ctypes.c_int()
    _check_cuda(lib.cuDeviceGet(ctypes.byref(dev), device))
    _check_cuda(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    _check_cuda(lib.cuCtxSetCurrent(ctx))


class Kernel:
    """One loaded kernel, launched through the driver's cuLaunchKernel on torch's current stream.

    torch's own launcher (torch.cuda._utils._CudaKernel) makes and casts a ctypes value for every argument on
    every call; these kernels take 7-14 arguments and the int8 linear's backward launches them ~450 times a step,
    a backward that was host-bound on a slow host (docs/perf.md). So each thread makes one C value a parameter
    and the array of their addresses once, and a launch sets the values: Python ints as C ints (the kernels take
    int strides; `launch` checks they fit), tensors as their addresses. `kinds` ("ptr" or "int" per parameter,
    from the source: signatures) fixes the values' types; None takes them from the first call's arguments (a
    benchmark's other revision of the source). `shared`: bytes of dynamic shared memory a launch gets; past 48 KiB
    the function must be allowed them first (the driver's opt-in attribute)."""

    def __init__(self, func: ctypes.c_void_p, kinds: list[str] | None, shared: int = 0):
        if kinds is not None and set(kinds) - {"ptr", "int"}:
            raise ValueError(f"{SOURCE.name}: a kernel parameter of a kind other than a pointer or an int: {kinds}")
        self.func, self.kinds, self.shared = func, kinds, shared
        self._local = threading.local()
        self._allowed = shared <= 48 * 1024

    def _allow_shared(self) -> None:
        """The driver's opt-in for dynamic shared memory past 48 KiB, once, at the first launch (the build's
        fakes in tests/kernels have no driver; setting it twice from two threads is harmless)."""
        from torch.cuda._utils import _check_cuda

        _check_cuda(_driver().cuFuncSetAttribute(self.func, MAX_DYNAMIC_SHARED, ctypes.c_int(self.shared)))
        self._allowed = True

    def _values(self, args: list) -> tuple[list, ctypes.Array]:
        """This thread's C values and the array of their addresses (made on its first launch)."""
        made = getattr(self._local, "made", None)
        if made is None:
            kinds = self.kinds or ["ptr" if isinstance(a, torch.Tensor) else "int" for a in args]
            values = [ctypes.c_void_p() if k == "ptr" else ctypes.c_int() for k in kinds]
            made = self._local.made = (values, (ctypes.c_void_p * len(values))(*map(ctypes.addressof, values)))
        return made

    def __call__(self, grid: tuple[int, ...], args: list, stream: int) -> None:
        values, array = self._values(args)
        if len(args) != len(values):
            raise ValueError(f"{SOURCE.name}: {len(args)} arguments for a kernel of {len(values)} parameters")
        for v, a in zip(values, args):
            v.value = a.data_ptr() if isinstance(a, torch.Tensor) else a
        if not self._allowed:
            self._allow_shared()
        gx, gy, gz = (*grid, *(1,) * (3 - len(grid)))
        rc = _driver().cuLaunchKernel(self.func, gx, gy, gz, THREADS, 1, 1, self.shared, ctypes.c_void_p(stream), array,
                                      None)
        if rc:  # the error's name and text, as torch's launcher raises them (imported only then: a hot path)
            from torch.cuda._utils import _check_cuda

            _check_cuda(rc)
