"""Accuracy of each op vs float64, with the bound the tests hold it to (shown by `make demo`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from kernels.ref import (adamw, contraction, elementary as E, embedding, int8_linear, loss, philox, reduce,
                         rmsnorm, rope, softmax, swiglu)
from kernels.ref.attention import attention


@dataclass(frozen=True)
class Probe:
    op: str
    metric: str
    measure: Callable[[], float]
    bound: float


def _ulp(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Max error in float32 ulps of the float64 reference."""
    r = ref.double()
    ok = torch.isfinite(r) & (r.abs() >= torch.finfo(torch.float32).tiny) & (r.abs() < 3e38)
    r32 = r[ok].float()
    spacing = (torch.nextafter(r32.abs(), torch.tensor(float("inf"))) - r32.abs()).double()
    return float(((y.double()[ok] - r[ok]).abs() / spacing).max())


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error vs the float64 reference."""
    r = ref.double()
    return float((y.double() - r).norm() / r.norm())


def _u(lo: float, hi: float, n: int = 200_000, seed: int = 11) -> torch.Tensor:
    return (lo + (hi - lo) * philox.uniform(seed, 0, (n,)).double()).float()


def _unary(op, fn, ref, lo, hi, positive_exp=False):
    def measure():
        x = _u(lo, hi)
        if positive_exp:
            x = E.exp_(x)
        return _ulp(fn(x), ref(x.double()))
    return Probe(op, "max ulp", measure, 1.0)


def _matmul(slices, bound):
    def measure():
        a, b = philox.normal(1, 0, (64, 1024)), philox.normal(1, 1, (1024, 96))
        return _rel(contraction.hp_matmul_(a, b, slices), a.double() @ b.double())
    return Probe("hp_matmul", f"rel err, {slices} slices", measure, bound)


def _sum():
    x = philox.normal(2, 0, (64, 4096))
    return _rel(reduce.exact_sum(x, -1), x.double().sum(-1))


def _norm():
    ts = [philox.normal(3, i, (1000 * (i + 1),)) for i in range(4)]
    ref = torch.sqrt(sum(t.double().square().sum() for t in ts))
    return _rel(reduce.global_l2_norm(ts), ref)


def _n(shape, stream=0, std=1.0, seed=21):
    return philox.normal(seed, stream, shape, std=std)


def _int8_dw():
    x, w, g = _n((512, 256), 0), _n((384, 256), 1, 0.02), _n((512, 384), 2)
    g[:5] *= 100.0                                   # outlier tokens: the rotation's reason to exist
    s_x = torch.tensor(0.03)
    _, dw, _ = int8_linear.int8_linear_backward(g, x, w, s_x)
    xh = (int8_linear.quantize_activation(x, s_x)[0].double() * 0.03)
    return _rel(dw, g.double().T @ xh)


def _rmsnorm():
    x, w = _n((64, 384), 3), _n((384,), 4)
    ref = x.double() * torch.rsqrt(x.double().square().mean(-1, keepdim=True) + 1e-6) * w.double()
    return _rel(rmsnorm.rmsnorm(x, w), ref)


def _rope():
    cos, sin = rope.rope_tables(4096, 128)
    inv = 5e5 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    ang = torch.arange(4096, dtype=torch.float64)[:, None] * inv[None]
    return max(_ulp(cos, torch.cos(ang)), _ulp(sin, torch.sin(ang)))


def _swiglu():
    x = _n((64, 2 * 300), 5)
    g, u = x.double()[:, :300], x.double()[:, 300:]
    return _rel(swiglu.swiglu(x), g * torch.sigmoid(g) * u)


def _softmax():
    x = _n((64, 1000), 6, 3.0)
    return _ulp(softmax.softmax(x, -1), torch.softmax(x.double(), -1))


def _attention():
    q, k, v = _n((1, 4, 130, 64), 7), _n((1, 2, 130, 64), 8), _n((1, 2, 130, 64), 9)
    kk, vv = (t.double().repeat_interleave(2, 1) for t in (k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), kk, vv, is_causal=True)
    return _rel(attention(q, k, v), ref)


def _loss():
    h, w = _n((256, 64), 10), _n((1000, 64), 11, 0.1)
    t = philox.random_bits(12, 0, 256) % 1000
    logits = h.double() @ w.double().T
    lse = torch.logsumexp(logits, -1)
    ref = torch.nn.functional.cross_entropy(logits, t) + 1e-4 * (lse * lse).mean()
    return _rel(loss.cross_entropy_zloss(h, w, t)[0], ref)


def _embedding():
    ids = philox.random_bits(13, 0, 4096) % 50
    g = _n((4096, 64), 14)
    ref = torch.zeros(50, 64, dtype=torch.float64).index_add_(0, ids, g.double())
    return _rel(embedding.embedding_grad(ids, g, 50), ref)


def _adamw():
    p, g = _n((256, 300), 15), _n((256, 300), 16, 0.01)
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    p64 = p.double().clone().requires_grad_()
    opt = torch.optim.AdamW([p64], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for step in (1, 2, 3):
        adamw.adamw_step(p, g, m, v, step=step, lr=1e-3, weight_decay=0.1)
        p64.grad = g.double()
        opt.step()
    return _rel(p, p64.detach())


PROBES: list[Probe] = [
    _unary("exp", E.exp_, torch.exp, -87, 88),
    _unary("log", E.log_, torch.log, -87, 88, positive_exp=True),
    _unary("sqrt", E.sqrt_, torch.sqrt, -87, 88, positive_exp=True),
    _unary("rsqrt", E.rsqrt_, torch.rsqrt, -87, 88, positive_exp=True),
    _unary("sigmoid", E.sigmoid_, torch.sigmoid, -80, 30),
    _unary("silu", E.silu_, lambda x: x * torch.sigmoid(x), -80, 80),
    _unary("sin", E.sin_, torch.sin, -1e5, 1e5),
    _unary("cos", E.cos_, torch.cos, -1e5, 1e5),
    Probe("sum", "rel err", _sum, 1.2e-7),
    Probe("global_l2_norm", "rel err", _norm, 1.2e-7),
    _matmul(2, 1e-2), _matmul(3, 1e-4), _matmul(4, 1e-6),
    Probe("int8_linear", "dW rel err (rotated int8, outlier tokens)", _int8_dw, 0.02),
    Probe("rmsnorm", "rel err", _rmsnorm, 1e-6),
    Probe("rope", "table max ulp", _rope, 1.0),
    Probe("swiglu", "rel err", _swiglu, 1e-6),
    Probe("softmax", "max ulp", _softmax, 4.0),
    Probe("attention", "rel err (int8 P.V)", _attention, 0.02),
    Probe("cross_entropy_zloss", "rel err", _loss, 1e-6),
    Probe("embedding", "dW rel err", _embedding, 1e-6),
    Probe("adamw", "rel err after 3 steps", _adamw, 1e-6),
]

