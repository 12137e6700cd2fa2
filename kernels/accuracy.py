"""Accuracy of each op vs float64, with the bound the tests hold it to (shown by `make demo`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from kernels.ref import contraction, elementary as E, philox, reduce


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
]

