"""Cases for softmax, log-sum-exp, int8-P.V attention and the fused cross-entropy + z-loss."""
from __future__ import annotations

import torch

from kernels.cases import Case, leaf, seed_of
from kernels.ref import philox
from kernels.ref.attention import attention
from kernels.ref.loss import cross_entropy_zloss
from kernels.ref.softmax import logsumexp, softmax


def _normal(name, shape, scale=1.0):
    return philox.normal(seed_of(name), 0, shape, std=scale)


def _label(shape) -> str:
    return "x".join(map(str, shape))


def _softmax_case(op_name, fn, shape, dim):
    label = f"{_label(shape)},d{dim}"

    def run(dev):
        x = leaf(_normal(f"{op_name}{label}", shape, 4.0), dev)
        y = fn(x, dim)
        y.backward(_normal(f"{op_name}{label}/g", tuple(y.shape)).to(dev))
        return {"y": y, "dx": x.grad}
    return Case(op_name, label, run)


def _attention_case(b, hq, hkv, t, d, *, causal=True, window=None, pv_block=64):
    label = f"{b}x{hq}/{hkv}x{t}x{d}" + ("" if causal else ",full") + (f",w{window}" if window else "") \
        + f",b{pv_block}"

    def run(dev):
        q = leaf(_normal(f"attn{label}q", (b, hq, t, d), 2.0), dev)
        k = leaf(_normal(f"attn{label}k", (b, hkv, t, d)), dev)
        v = leaf(_normal(f"attn{label}v", (b, hkv, t, d)), dev)
        o = attention(q, k, v, causal=causal, window=window, pv_block=pv_block)
        o.backward(_normal(f"attn{label}g", (b, hq, t, d)).to(dev))
        return {"o": o, "dq": q.grad, "dk": k.grad, "dv": v.grad}
    return Case("attention", label, run)


def _loss_case(n, v, d, *, z_weight=1e-4, chunk=1024):
    label = f"{n}x{v}x{d}" + (f",z{z_weight:g}" if z_weight != 1e-4 else "") + (f",c{chunk}" if chunk != 1024 else "")

    def run(dev):
        h = leaf(_normal(f"ce{label}h", (n, d)), dev)
        w = leaf(_normal(f"ce{label}w", (v, d), 0.5), dev)
        bits = philox.random_bits(seed_of(f"ce{label}t"), 0, n)
        t = torch.where(bits % 7 == 3, torch.full_like(bits, -100), bits % v).to(dev)
        loss, ce, z = cross_entropy_zloss(h, w, t, z_weight=z_weight, chunk=chunk)
        loss.backward(_normal(f"ce{label}g", ()).to(dev))
        return {"loss": loss, "ce": ce, "z": z, "dh": h.grad, "dw": w.grad}
    return Case("cross_entropy_zloss", label, run)


CASES: list[Case] = [
    _softmax_case("softmax", softmax, (1, 1), -1),
    _softmax_case("softmax", softmax, (7, 33), -1),
    _softmax_case("softmax", softmax, (3, 130, 5), 1),
    _softmax_case("softmax", softmax, (16, 1000), -1),
    _softmax_case("logsumexp", logsumexp, (7, 33), -1),
    _softmax_case("logsumexp", logsumexp, (3, 130, 5), 1),
    _attention_case(1, 2, 1, 7, 8, pv_block=4),
    _attention_case(2, 4, 2, 37, 16, window=5, pv_block=16),
    _attention_case(1, 4, 2, 37, 128, window=16, pv_block=16),
    _attention_case(1, 4, 1, 130, 16),
    _attention_case(1, 2, 2, 33, 8, causal=False, pv_block=8),
    _loss_case(7, 11, 8),
    _loss_case(33, 257, 16, z_weight=1e-2),
    _loss_case(130, 1000, 32),
    _loss_case(1100, 300, 16, chunk=1024 * 2),
]
