"""kernels/cuda/nvrtc.py and rotate.py's build, on a machine without CUDA: an NVRTC stand-in records what it is
asked and answers as the C API does. What the real NVRTC makes of the source: tests/gpu/test_cuda_rotate.py."""
from __future__ import annotations

import contextlib
import ctypes
import warnings

import pytest
import torch

from kernels.cuda import nvrtc, rotate


class FakeNVRTC:
    """The calls compile_source makes, with ctypes arguments as the C API gets them."""

    def __init__(self, rc: int = 0, log: bytes = b"", output: bytes = b"\x7fELF\x00\x01cubin"):
        self.rc, self.log, self.output = rc, log, output
        self.options: list[bytes] = []
        self.destroyed = False
        self.nvrtcGetErrorString = lambda rc: b"NVRTC_ERROR_STAND_IN"

    def nvrtcCreateProgram(self, prog, source, name, n, headers, names):
        prog._obj.value = 1
        self.name = name
        return 0

    def nvrtcCompileProgram(self, prog, n, options):
        self.options = [options[i] for i in range(n)]
        return self.rc

    def _size(self, data):
        def get_size(prog, size):
            size._obj.value = len(data)
            return 0
        return get_size

    def _copy(self, data):
        def get(prog, buf):
            ctypes.memmove(buf, data, len(data))
            return 0
        return get

    def __getattr__(self, name):
        data = {"Log": self.log + b"\0", "CUBIN": self.output, "PTX": self.output + b"\0"}
        for kind, payload in data.items():
            if name == f"nvrtcGet{'Program' if kind == 'Log' else ''}{kind}Size":
                return self._size(payload)
            if name == f"nvrtcGet{'Program' if kind == 'Log' else ''}{kind}":
                return self._copy(payload)
        raise AttributeError(name)

    def nvrtcDestroyProgram(self, prog):
        self.destroyed = True
        return 0


def test_a_cubin_comes_back_whole_and_the_program_is_freed():
    lib = FakeNVRTC()
    out = nvrtc.compile_source(lib, "src", "k.cu", ["--gpu-architecture=sm_90", *nvrtc.BR_OPTIONS], cubin=True)
    assert out == lib.output  # zero bytes included
    assert lib.options == [b"--gpu-architecture=sm_90", *(o.encode() for o in nvrtc.BR_OPTIONS)]
    assert lib.name == b"k.cu" and lib.destroyed


def test_ptx_is_a_c_string():
    lib = FakeNVRTC(output=b".version 8.0")
    assert nvrtc.compile_source(lib, "src", "k.cu", ["--gpu-architecture=compute_90"], cubin=False) == b".version 8.0"


def test_a_refused_source_names_the_file_the_options_and_the_log():
    lib = FakeNVRTC(rc=6, log=b"k.cu(3): error: expected an expression")
    with pytest.raises(nvrtc.NVRTCError, match=r"k\.cu: NVRTC error 6 .*--fmad=false(.|\n)*expected an expression"):
        nvrtc.compile_source(lib, "src", "k.cu", ["--gpu-architecture=sm_90", *nvrtc.BR_OPTIONS], cubin=True)
    assert lib.destroyed


def test_the_br_options_forbid_contraction_and_flushing():
    assert {"--fmad=false", "--prec-div=true", "--ftz=false"} <= set(nvrtc.BR_OPTIONS)


@pytest.fixture
def fake_device(monkeypatch):
    """rotate._kernels on a pretend sm_90 device: what it compiles and loads, without CUDA."""
    import torch.cuda._utils as cu

    calls = {}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(nvrtc, "library", lambda major: calls.update(major=major) or calls.setdefault("lib", FakeNVRTC()))
    monkeypatch.setattr(cu, "_cuda_load_module", lambda binary, names: calls.update(loaded=(binary, names)) or
                        calls.setdefault("order", []).append("load") or
                        {n: cu._CudaKernel(ctypes.c_void_p(i + 1), None) for i, n in enumerate(names)}, raising=False)
    monkeypatch.setattr(rotate, "_ensure_context", lambda device: calls.setdefault("order", []).append(("context", device)))
    monkeypatch.setattr(rotate, "self_check", lambda launch_variant, device: calls.get("self_check"))
    rotate._kernels.cache_clear()
    yield calls
    rotate._kernels.cache_clear()
    rotate._failures.clear()


def test_the_build_targets_the_devices_arch_with_the_br_options(fake_device):
    fns = rotate._kernels(0)
    assert set(fns) == set(rotate.KERNELS)
    lib = fake_device["lib"]
    assert lib.options[0] == b"--gpu-architecture=sm_90"
    assert lib.options[1:] == [o.encode() for o in nvrtc.BR_OPTIONS]
    assert lib.name == rotate.SOURCE.name.encode()
    assert fake_device["loaded"] == (lib.output, list(rotate.KERNELS))
    assert fake_device["major"] == 13  # torch's CUDA major: the libnvrtc its wheels ship
    # the module loads into the thread's current context: made current first (autograd's thread may have none)
    assert fake_device["order"] == [("context", 0), "load"]
    assert rotate.status(0) == "built"


def test_a_failed_build_warns_once_and_leaves_the_triton_kernel(fake_device, monkeypatch):
    fake_device["lib"] = FakeNVRTC(rc=6, log=b"unsupported gpu architecture")
    with pytest.warns(RuntimeWarning, match="(?s)rotate_quantize.cu: not built for cuda:0 .*unsupported gpu architecture"):
        assert rotate._kernels(0) is None
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert rotate._kernels(0) is None  # cached: no second build, no second warning
    assert again == []
    assert rotate.status(0).startswith("not built: NVRTCError")


def test_a_missing_library_names_what_was_tried(monkeypatch):
    def absent(name):
        raise OSError(name)
    monkeypatch.setattr(ctypes, "CDLL", absent)
    with pytest.raises(nvrtc.NVRTCError, match=r"no NVRTC library for CUDA 13 \(tried libnvrtc\.so\.13, libnvrtc\.so"):
        nvrtc.library(13)


def test_a_failed_self_check_leaves_the_triton_kernel(fake_device):
    fake_device["self_check"] = "cols (40 x 512, pre-scale None): codes differ from kernels/ref"
    with pytest.warns(RuntimeWarning, match=r"self-check: cols \(40 x 512, pre-scale None\): codes differ"):
        assert rotate._kernels(0) is None


def _emulated(mutate=None):
    """launch_variant through the kernels' torch stand-in (kernels/cuda/emulate.emulated_launcher); `mutate`
    spoils its output, as a broken argument passing or build would."""
    from kernels.cuda.emulate import emulated_launcher

    def launch_variant(variant, src, rows, c, s_row, s_col, pre, q, step, bad):
        emulated_launcher("rows" if variant == "rows" else "cols", src, q, step, bad, pre)()
        if mutate:
            mutate(variant, pre, q, step, bad)
    return launch_variant


def test_the_self_check_passes_the_kernels_arithmetic():
    assert rotate.self_check(_emulated(), "cpu") is None


@pytest.mark.parametrize("case,what", [
    (lambda variant, pre, q, step, bad: q.view(-1)[100].add_(1) if variant == "cols-split" else None,
     "cols-split (40 x 512, pre-scale None): codes"),
    (lambda variant, pre, q, step, bad: step.__setitem__(1, 2.0) if variant == "rows" else None,
     "rows (8 x 512, pre-scale None): steps"),  # the NaN row's step (1) replaced
    (lambda variant, pre, q, step, bad: bad.zero_() if variant == "rows" else None, "rows (8 x 512, pre-scale None): flags"),
    (lambda variant, pre, q, step, bad: q.neg_() if pre is not None and pre.dim() else None,
     "cols (40 x 512, pre-scale per C): codes"),
])
def test_the_self_check_names_what_differs(case, what):
    assert rotate.self_check(_emulated(case), "cpu").startswith(what)


class FakeDriver:
    """cuLaunchKernel as the driver gets it: reads each parameter back through the array of addresses."""

    def __init__(self, kinds: list[str]):
        self.kinds, self.launches, self.attributes = kinds, [], []

    def cuFuncSetAttribute(self, func, attribute, value):
        self.attributes.append((func.value, attribute, value.value, len(self.launches)))
        return 0

    def cuLaunchKernel(self, func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        read = {"ptr": lambda a: ctypes.c_void_p.from_address(a).value, "int": lambda a: ctypes.c_int.from_address(a).value}
        self.launches.append({"func": func.value, "grid": (gx, gy, gz), "block": (bx, by, bz), "shared": shared,
                              "stream": stream.value, "args": [read[k](params[i]) for i, k in enumerate(self.kinds)],
                              "extra": extra})
        return 0


def test_a_launch_passes_each_argument_as_its_parameter_kind(monkeypatch):
    """rotate.Kernel, the launcher the build wraps each kernel in: tensors as addresses, ints as C ints (negative
    ones too), on the given stream, THREADS a block; each thread its own values; a wrong count refused."""
    import threading

    kinds = rotate.signatures()["rotate_cols_amax"]
    driver = FakeDriver(kinds)
    monkeypatch.setattr(rotate, "_driver", lambda: driver)
    kernel = rotate.Kernel(ctypes.c_void_p(77), kinds)
    t = [torch.zeros(4) for _ in range(kinds.count("ptr"))]

    def args(base):
        it = iter(t)
        return [next(it) if k == "ptr" else base - i for i, k in enumerate(kinds)]
    kernel((3, 2), args(1000), 0xABC)
    worker = threading.Thread(target=kernel, args=((5,), args(-7), 0))
    worker.start()
    worker.join()
    kernel((1,), args(2**31 - 1), 5)
    want = [[x.data_ptr() if k == "ptr" else x for k, x in zip(kinds, args(b))] for b in (1000, -7, 2**31 - 1)]
    assert [la["args"] for la in driver.launches] == want
    assert [(la["grid"], la["stream"]) for la in driver.launches] == [((3, 2, 1), 0xABC), ((5, 1, 1), None),
                                                                        ((1, 1, 1), 5)]
    assert {(la["func"], la["block"], la["shared"], la["extra"]) for la in driver.launches} == {
        (77, (rotate.THREADS, 1, 1), 0, None)}
    with pytest.raises(ValueError, match="9 arguments for a kernel of 10 parameters"):
        kernel((1,), args(0)[:-1], 0)
    with pytest.raises(ValueError, match="other than a pointer or an int"):
        rotate.Kernel(ctypes.c_void_p(1), ["ptr", "float"])


def test_the_column_kernels_launch_with_their_two_tiles_of_shared_memory(monkeypatch):
    """rotate_quantize.cu's column kernels take two tiles of dynamic shared memory (past 48 KiB: the next block's
    copies in flight while this one is rotated) and say how many bytes in `#define TILES_BYTES`: the function is
    allowed them (the driver's opt-in attribute) before its first launch, and each launch asks for them. A source
    without the line (a revision from before, a benchmark's baseline) gets none."""
    text = rotate.SOURCE.read_text()
    assert rotate.tiles_bytes(text) == 2 * rotate.BLOCK * (rotate.COLS + 1) * 4 > 48 * 1024
    assert rotate.tiles_bytes(text.replace("#define TILES_BYTES", "#define OTHER_BYTES")) == 0
    kinds = rotate.signatures()["rotate_cols_codes"]
    driver = FakeDriver(kinds)
    monkeypatch.setattr(rotate, "_driver", lambda: driver)
    kernel = rotate.Kernel(ctypes.c_void_p(9), kinds, rotate.tiles_bytes(text))
    t = torch.zeros(4)
    for _ in range(2):
        kernel((2, 3), [t if k == "ptr" else 1 for k in kinds], 0)
    assert driver.attributes == [(9, rotate.MAX_DYNAMIC_SHARED, rotate.tiles_bytes(text), 0)]  # once, first
    assert [la["shared"] for la in driver.launches] == [rotate.tiles_bytes(text)] * 2
    rotate.Kernel(ctypes.c_void_p(10), kinds, 1024)((1,), [t if k == "ptr" else 1 for k in kinds], 0)
    assert len(driver.attributes) == 1 and driver.launches[-1]["shared"] == 1024  # no opt-in under 48 KiB


def test_a_kernel_without_kinds_takes_them_from_its_first_arguments(monkeypatch):
    """The kernels of another revision of the source (a benchmark's) have no signature here."""
    driver = FakeDriver(["ptr", "int", "ptr"])
    monkeypatch.setattr(rotate, "_driver", lambda: driver)
    a, b = torch.zeros(2), torch.zeros(3)
    rotate.Kernel(ctypes.c_void_p(1), None)((1,), [a, -5, b], 0)
    assert driver.launches[0]["args"] == [a.data_ptr(), -5, b.data_ptr()]
