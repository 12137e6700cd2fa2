"""int8_linear and the Hadamard butterflies on CUDA vs this machine's CPU: 0 mismatching bits
(forward, dx, dw, ds_x; rotated and unrotated backward; float32 and bf16 weights)."""
import pytest
import torch

from kernels.ref import philox
from kernels.ref.hadamard import block_hadamard, fwht
from kernels.ref.int8_linear import int8_linear

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def mismatches(a: torch.Tensor, b: torch.Tensor) -> int:
    """Count of elements whose raw bits differ (no blake3 needed on the GPU machine)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    ia, ib = (t.detach().cpu().contiguous().view(INTS[t.element_size()]) for t in (a, b))
    return int((ia != ib).sum())  # br-ok: integer count in a test


def run(dev, x, w, s_x, g, rotate):
    x, w, s_x = (t.to(dev).clone().requires_grad_() for t in (x, w, s_x))
    y = int8_linear(x, w, s_x, rotate=rotate)
    y.backward(g.to(dev))
    return {"y": y, "dx": x.grad, "dw": w.grad, "ds": s_x.grad}


@pytest.mark.parametrize("m,k,n,wdtype", [(96, 160, 200, torch.float32), (1, 8, 16, torch.float32),
                                          (300, 256, 704, torch.bfloat16), (1024, 512, 1408, torch.float32)])
@pytest.mark.parametrize("rotate", [True, False])
def test_int8_linear_cuda_matches_cpu(m, k, n, wdtype, rotate):
    seed = m * 100003 + n
    x = philox.normal(seed, 0, (m, k))
    w = philox.normal(seed, 1, (n, k), std=0.02).to(wdtype)
    g = philox.normal(seed, 2, (m, n))
    g[:, :: max(1, n // 7)] *= 100.0   # heavy-tailed columns, as real gradients have
    s_x = torch.tensor(0.03)
    cpu, gpu = run("cpu", x, w, s_x, g, rotate), run("cuda", x, w, s_x, g, rotate)
    bad = {k_: mismatches(cpu[k_], gpu[k_]) for k_ in cpu}
    assert all(v == 0 for v in bad.values()), bad


def test_hadamard_cuda_matches_cpu():
    x = philox.normal(5, 0, (33, 1000))
    for f in (lambda t: fwht(t[:, :512]), lambda t: block_hadamard(t, dim=1), lambda t: block_hadamard(t, dim=0)):
        assert mismatches(f(x), f(x.cuda())) == 0
