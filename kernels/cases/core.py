"""Cases for reductions, elementary functions, Philox and the higher-precision contraction."""
from __future__ import annotations

import torch

from kernels.cases import Case, leaf, seed_of
from kernels.ref import contraction, elementary as E, philox, reduce

SHAPES = [(1, 1), (7, 33), (64, 1000), (3, 4097)]


def _normal(name, shape, scale=1.0):
    return philox.normal(seed_of(name), 0, shape, std=scale)


def _unary(op_name, fn, domain):
    def make(shape):
        label = "x".join(map(str, shape))

        def run(dev):
            x = leaf(domain(_normal(f"{op_name}{label}", shape, 4.0)), dev)
            y = fn(x)
            g = _normal(f"{op_name}{label}/g", shape).to(dev)
            out = {"y": y}
            if y.requires_grad:
                y.backward(g)
            if x.grad is not None:
                out["dx"] = x.grad
            return out
        return Case(op_name, label, run)
    return [make(s) for s in SHAPES]


def _positive(x):
    return x.abs() + 1e-3


def _reduce_case(op_name, fn, shape):
    label = "x".join(map(str, shape))

    def run(dev):
        x = leaf(_normal(f"{op_name}{label}", shape, 3.0), dev)
        y = fn(x)
        y.backward(_normal(f"{op_name}{label}/g", tuple(y.shape)).to(dev))
        return {"y": y, "dx": x.grad}
    return Case(op_name, label, run)


def _dot_case(shape):
    label = "x".join(map(str, shape))

    def run(dev):
        a = _normal(f"dot{label}a", shape).to(dev)
        b = _normal(f"dot{label}b", shape).to(dev)
        return {"y": reduce.dot(a, b)}
    return Case("dot", label, run)


def _norm_case(sizes):
    label = "+".join(map(str, sizes))

    def run(dev):
        ts = [_normal(f"l2{label}{i}", (n,), 0.1).to(dev) for i, n in enumerate(sizes)]
        return {"norm": reduce.global_l2_norm(ts)}
    return Case("global_l2_norm", label, run)


def _matmul_case(m, k, n, batch=()):
    label = "x".join(map(str, (*batch, m, k, n)))

    def run(dev):
        a = leaf(_normal(f"mm{label}a", (*batch, m, k)), dev)
        b = leaf(_normal(f"mm{label}b", (*batch, k, n)), dev)
        y = contraction.hp_matmul(a, b)
        y.backward(_normal(f"mm{label}g", (*batch, m, n)).to(dev))
        return {"y": y, "da": a.grad, "db": b.grad}
    return Case("hp_matmul", label, run)


def _philox_case(shape):
    label = "x".join(map(str, shape))

    def run(dev):
        s = seed_of(label)
        return {"uniform": philox.uniform(s, 1, shape, device=dev),
                "normal": philox.normal(s, 2, shape, device=dev),
                "trunc_normal": philox.trunc_normal(s, 3, shape, device=dev),
                "bits": philox.random_bits(s, 4, shape[0] * shape[1], offset=5, device=dev)}
    return Case("philox", label, run)


CASES: list[Case] = [
    *_unary("exp", E.exp, lambda x: x),
    *_unary("log", E.log, _positive),
    *_unary("sqrt", E.sqrt, _positive),
    *_unary("rsqrt", E.rsqrt, _positive),
    *_unary("reciprocal", E.reciprocal, _positive),
    *_unary("sigmoid", E.sigmoid, lambda x: x),
    *_unary("silu", E.silu, lambda x: x),
    *_unary("sin", E.sin, lambda x: x * 1000.0),
    *_unary("cos", E.cos, lambda x: x * 1000.0),
    *[_reduce_case("sum", lambda x: reduce.sum(x, -1), s) for s in SHAPES],
    *[_reduce_case("mean", lambda x: reduce.mean(x, 0), s) for s in SHAPES],
    *[_reduce_case("max", lambda x: reduce.max(x, -1), s) for s in SHAPES],
    *[_dot_case(s) for s in SHAPES],
    *[_norm_case(s) for s in [(1,), (5, 1000), (4097, 3, 77)]],
    _matmul_case(1, 1, 1), _matmul_case(7, 33, 5), _matmul_case(100, 257, 130),
    _matmul_case(17, 9, 11, batch=(2, 3)),
    *[_philox_case(s) for s in [(1, 1), (7, 33), (64, 1000)]],
]
