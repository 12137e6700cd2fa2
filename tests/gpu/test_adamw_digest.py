"""AdamW with the state hash's chunk pass fused (kernels/triton/adamw_digest.py): the reference's AdamW bits, and
each digest stock BLAKE3 of the bytes the tensor holds afterwards."""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
blake3 = pytest.importorskip("blake3")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRET), reason="needs CUDA")]

from app.digests import le_array  # noqa: E402
from kernels.ref import adamw as ref, philox  # noqa: E402
from kernels.triton import adamw_digest  # noqa: E402

SEED = int.from_bytes(os.urandom(4), "little")
DEV = torch.device("cpu" if INTERPRET else "cuda")
# the interpreter rounds float32 -> bfloat16 by truncation: bf16 AdamW bits are GPU evidence only
bf16_bits_on_gpu = not INTERPRET


def _raw(t: torch.Tensor) -> bytes:
    return blake3.blake3(le_array(t).tobytes()).digest()


def _group(n: int, dtype: torch.dtype, k: int, step: int):
    """(param, grad, m, v) of n elements: moments as after step - 1 updates, some zero gradients."""
    p = philox.normal(SEED, 4 * k, (n,), std=0.02).to(dtype)
    g = philox.normal(SEED, 4 * k + 1, (n,), std=0.01)
    g[::7] = 0
    m = philox.normal(SEED, 4 * k + 2, (n,), std=0.001) if step > 1 else torch.zeros(n)
    v = philox.normal(SEED, 4 * k + 3, (n,), std=0.001).square() if step > 1 else torch.zeros(n)
    return p, g, m, v


# element counts around the spans (512), chunks (256 float32, 512 bf16) and a program's 65,536 elements
SIZES = [1, 5, 255, 256, 257, 511, 512, 513, 1000, 4099, 65_536, 65_537 + 1024]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("step", [1, 7])
def test_fused_step_is_adamw_and_its_digests_are_blake3(dtype, step):
    sizes = SIZES if not INTERPRET else SIZES[:-2] + [65_537]
    decays = [0.1 if i % 2 else 0.0 for i in range(len(sizes))]
    host = [_group(n, dtype, k, step) for k, n in enumerate(sizes)]
    groups = [tuple(t.to(DEV).clone() for t in g) + (wd,) for g, wd in zip(host, decays)]
    rows = adamw_digest.adamw_digests(groups, step=step, lr=4.5e-4)
    assert rows is not None and rows.shape == (4 * len(sizes), 8)
    got = rows.cpu().numpy().astype("<i4")
    for i, (p, g, m, v, wd) in enumerate(groups):
        for j, (name, t) in enumerate((("param", p), ("grad", g), ("m", m), ("v", v))):
            assert got[4 * i + j].tobytes() == _raw(t), f"{name} of {sizes[i]} elements"
        if dtype == torch.float32 or bf16_bits_on_gpu:
            want = [x.clone() for x in host[i]]
            ref.adamw_step(*want, step=step, lr=4.5e-4, weight_decay=wd)
            for name, a, b in (("param", p, want[0]), ("m", m, want[2]), ("v", v, want[3])):
                ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
                assert torch.equal(a.cpu().view(ints), b.view(ints)), f"{name} of {sizes[i]} elements"
        assert torch.equal(g.cpu().view(torch.int32), host[i][1].view(torch.int32)), "the gradient is read only"


def test_mixed_parameter_dtypes_in_one_call():
    """bf16 masters and float32 activation steps go in one call (one launch each): rows keep the groups' order."""
    host = [_group(300, torch.bfloat16, 0, 2), _group(3, torch.float32, 1, 2), _group(700, torch.bfloat16, 2, 2)]
    groups = [tuple(t.to(DEV).clone() for t in g) + (0.1,) for g in host]
    got = adamw_digest.adamw_digests(groups, step=2, lr=1e-3).cpu().numpy().astype("<i4")
    for i, g in enumerate(groups):
        for j in range(4):
            assert got[4 * i + j].tobytes() == _raw(g[j]), (i, j)


def test_declines_what_it_cannot_take():
    """None, nothing written: the caller runs AdamW and hashes as before."""
    p, g, m, v = (t.to(DEV) for t in _group(100, torch.float32, 0, 1))
    before = p.clone()
    assert adamw_digest.adamw_digests([(p, g[:50], m, v, 0.0)], step=1, lr=1e-3) is None  # shapes differ
    assert adamw_digest.adamw_digests([(p, g.double(), m, v, 0.0)], step=1, lr=1e-3) is None  # float64 grad
    assert adamw_digest.adamw_digests([(p, g, m, v, 0.0)], step=0, lr=1e-3) is None  # Adam counts from 1
    assert adamw_digest.adamw_digests([(p[:0], g[:0], m[:0], v[:0], 0.0)], step=1, lr=1e-3) is None  # empty
    assert torch.equal(p, before)
    with pytest.raises(ValueError, match="beta1"):
        adamw_digest.adamw_digests([(p, g, m, v, 0.0)], step=1, lr=1e-3, beta1=1.0)
