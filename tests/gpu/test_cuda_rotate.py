"""rotate_quantize's CUDA kernels (kernels/cuda/rotate.py) on the GPU: built, taken where the dispatch says, and
bit for bit the Triton kernel's codes, steps and flags and the reference's, for both layouts, every column variant,
and the rebuilt operands (x_hat with one step, w_hat with a step per C index); edges planted (inf, NaN, a stage
overflow, zeros, -0.0, an outlier, ties)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

from kernels.cuda import rotate  # noqa: E402
from kernels.cuda.rotate import probe as operand, reference  # noqa: E402
from kernels.digest import bits_equal as same  # noqa: E402
from kernels.ref import philox, rotated_mm as r_rot  # noqa: E402
from kernels.triton import rotated_mm as t_rot  # noqa: E402


@pytest.fixture
def variants_run(monkeypatch):
    """The variants rotate_quantize launched, in order (the build and its self-check done first, unrecorded)."""
    rotate._kernels(torch.cuda.current_device())
    seen = []
    launch_variant = rotate._launch_variant

    def spy(fns, variant, *args):
        seen.append(variant)
        return launch_variant(fns, variant, *args)
    monkeypatch.setattr(rotate, "_launch_variant", spy)
    return seen


def both(src, rows, c, s_row, s_col, pre=None):
    """(CUDA's, Triton's) codes, step and flags of the same rotate_quantize call."""
    got = t_rot.rotate_quantize(src, rows, c, s_row, s_col, block=256, pre=pre)
    with rotate.triton_only():
        want = t_rot.rotate_quantize(src, rows, c, s_row, s_col, block=256, pre=pre)
    torch.cuda.synchronize()
    return got, want


def test_the_kernels_are_built():
    assert rotate.status(torch.cuda.current_device()) == "built"


@pytest.mark.parametrize("rows,c", [(8, 256), (33, 2048), (300, 5632), (9, 16384)], ids=str)
def test_rows(rows, c, variants_run):
    o = operand(rows, c, seed=rows * 31 + c, device="cuda")
    got, want = both(o, rows, c, c, 1)
    assert variants_run == ["rows"]
    assert all(same(a, b) for a, b in zip(got, want))
    assert all(same(a, b) for a, b in zip(got, reference(o)))


@pytest.mark.parametrize("rows,c,variant", [(8, 256, "cols"), (31, 512, "cols-split"),
                                            (100, 2048, "cols-split"), (2048, 8192, "cols-split"),
                                            (17000, 256, "cols")], ids=str)
def test_columns(rows, c, variant, variants_run):
    """G [C, rows] as the backward holds it for dw; one split where C is one block or the column groups fill the SMs."""
    o = operand(rows, c, seed=rows * 37 + c, device="cuda")  # the operand's rows (edges planted in the first)
    g = o.t().contiguous()
    got, want = both(g, rows, c, 1, rows)
    assert variants_run == [variant]
    assert all(same(a, b) for a, b in zip(got, want))
    assert all(same(a, b) for a, b in zip(got, reference(o)))


@pytest.mark.parametrize("variant", ["cols", "cols-split"])
def test_each_column_variant_alone(variant):
    """Both column variants, whichever the dispatch would pick, against the reference."""
    rows, c = 70, 1024
    o = operand(rows, c, seed=5, device="cuda")
    g = o.t().contiguous()
    q = torch.empty((rows, c), dtype=torch.int8, device="cuda")
    step, bad = torch.empty(rows, device="cuda"), torch.empty(rows, dtype=torch.int32, device="cuda")
    rotate.run(variant, g, rows, c, 1, rows, None, q, step, bad)
    assert all(same(a, b) for a, b in zip((q, step, bad), reference(o)))


@pytest.mark.parametrize("which", ["x_hat", "w_hat"])
def test_rebuilt_operands(which, variants_run):
    """x_hat's columns from x [m, k] and one step; w_hat's from w [n, k] and a step per row of w (its C index)."""
    c, rows = 2048, 96
    src = philox.normal(21, 0, (c, rows), std=1.0 if which == "x_hat" else 0.02, device="cuda")
    src[3, 4], src[10, 50] = float("inf"), float("nan")
    src[20:24, 7] = 3.0e38
    pre = (torch.tensor(0.03, device="cuda") if which == "x_hat"
           else philox.normal(22, 0, (c,), device="cuda").abs() * 0.001 + 1e-4)
    got, want = both(src, rows, c, 1, rows, pre=pre)
    assert variants_run == ["cols-split"]
    assert all(same(a, b) for a, b in zip(got, want))
    scale = pre if pre.dim() == 0 else pre[:, None]
    rebuilt = r_rot.to_int8(src / scale).to(torch.float32) * scale
    assert all(same(a, b) for a, b in zip(got, reference(rebuilt.t().contiguous())))


def test_padding_and_strided_views(variants_run):
    """A view whose rows are longer than C (s_row > c): the codes past C stay as the Triton kernel writes them."""
    base = operand(40, 2560, seed=9, device="cuda")
    view = base[:, :2048]
    got, want = both(view, 40, 2048, 2560, 1)
    assert variants_run == ["rows"]
    assert all(same(a, b) for a, b in zip(got, want))


def test_off_means_the_triton_kernel(variants_run):
    o = operand(16, 512, seed=3, device="cuda")
    with rotate.triton_only():
        t_rot.rotate_quantize(o, 16, 512, 512, 1, block=256)
    assert variants_run == []


def test_a_thread_that_has_run_no_cuda_work():
    """Autograd runs a backward on its own thread; when rotate_quantize is that thread's first CUDA work, the
    driver has no current context there until the launcher makes one current."""
    import threading

    o = operand(16, 512, seed=4, device="cuda")
    out = {}

    def work():
        try:
            out["got"] = t_rot.rotate_quantize(o, 16, 512, 512, 1, block=256)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            out["error"] = e
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert "error" not in out, out.get("error")
    assert all(same(a, b) for a, b in zip(out["got"], reference(o)))


# A fresh process whose first rotate-quantize, and so the kernels' build, runs on a thread other than the one
# that made the CUDA tensors: autograd's backward thread, or a plain Python thread.
_FIRST_ON_ANOTHER_THREAD = """
import sys, threading
import torch
from kernels.cuda import rotate
from kernels.ref import philox
from kernels.triton import int8_linear as t_lin, rotated_mm as t_rot

x = philox.normal(41, 0, (512, 256), device="cuda").requires_grad_(True)
w = philox.normal(42, 0, (512, 256), std=0.02, device="cuda").requires_grad_(True)
g = philox.normal(43, 0, (512, 512), device="cuda")
if sys.argv[1] == "backward":
    t_lin.int8_linear(x, w, torch.tensor(0.03, device="cuda")).backward(g)
else:
    t = threading.Thread(target=lambda: t_rot.rotate_quantize(g, 512, 512, 512, 1, block=256))
    t.start()
    t.join()
torch.cuda.synchronize()
print(rotate.status(0))
"""


@pytest.mark.parametrize("where", ["backward", "thread"])
def test_the_build_on_a_thread_with_no_cuda_work_yet(where):
    """The build loads its module through the driver API: on a thread with no current context (autograd's, at
    its first op) that failed with "invalid device context" until the build made the device's context current,
    and the process ran the Triton kernel from then on (same bits, slower)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _FIRST_ON_ANOTHER_THREAD, where],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "built", done.stdout + done.stderr[-3000:]


def test_int8_linear_backward_through_autograd():
    """The benchmark's case that found the missing context: a backward whose first kernel is a CUDA rotation."""
    from kernels.ref import int8_linear as r_lin
    from kernels.triton import int8_linear as t_lin

    x = philox.normal(31, 0, (512, 256), device="cuda")
    w = philox.normal(32, 0, (512, 256), std=0.02, device="cuda")
    g = philox.normal(33, 0, (512, 512), device="cuda")
    grads = []
    for lin in (t_lin, r_lin):
        xx, ww = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        lin.int8_linear(xx, ww, torch.tensor(0.03, device="cuda")).backward(g)
        grads.append((xx.grad, ww.grad))
    assert all(same(a, b) for a, b in zip(*grads))
