"""Cases for the Walsh-Hadamard transform and the int8 W8A8 QAT linear (forward and all three gradients)."""
from __future__ import annotations

import torch

from kernels.cases import Case, leaf, seed_of
from kernels.ref import hadamard, int8_linear, philox


def _normal(name, shape, std=1.0):
    return philox.normal(seed_of(name), 0, shape, std=std)


def _hadamard_case(shape, block):
    label = "x".join(map(str, shape)) + f"/b{block}"

    def run(dev):
        x = _normal(f"had{label}", shape).to(dev)
        out = {"block": hadamard.block_hadamard(x, -1, block)}
        if hadamard.is_pow2(shape[-1]):
            out["fwht"] = hadamard.fwht(x, -1)
        return out
    return Case("hadamard", label, run)


def _linear_case(m, k, n, wdtype=torch.float32, rotate=True):
    label = f"{m}x{k}x{n}" + ("/bf16" if wdtype == torch.bfloat16 else "") + ("" if rotate else "/norot")

    def run(dev):
        x = leaf(_normal(f"lin{label}x", (m, k)), dev)
        w = leaf(_normal(f"lin{label}w", (n, k), 0.02).to(wdtype), dev)
        s_x = leaf(torch.tensor(0.03), dev)
        y = int8_linear.int8_linear(x, w, s_x, rotate=rotate)
        g = _normal(f"lin{label}g", (m, n)).to(dev)
        g[:, :2] *= 100.0                       # outlier gradient columns: what the rotation is for
        y.backward(g)
        return {"y": y, "dx": x.grad, "dw": w.grad, "ds_x": s_x.grad}
    return Case("int8_linear", label, run)


CASES: list[Case] = [
    _hadamard_case((1, 1), 256), _hadamard_case((3, 64), 256), _hadamard_case((5, 300), 128),
    _hadamard_case((2, 777), 256),
    _linear_case(1, 8, 8), _linear_case(7, 33, 5), _linear_case(130, 96, 200),
    _linear_case(64, 257, 100, torch.bfloat16), _linear_case(33, 64, 48, rotate=False),
]
