"""Reductions, elementary functions, Philox and the contraction: accuracy vs float64 and invariances."""
from decimal import Decimal, localcontext

import numpy as np
import pytest
import torch

from kernels.digest import bits_equal
from kernels.ref import chunks, contraction, elementary as E, philox, reduce
from kernels.ref.checks import check_finite

N = 400_000


def ulp_error(y: torch.Tensor, ref: np.ndarray) -> float:
    """Max |y - ref| in float32 ulps of the reference (normal range only)."""
    r = ref.astype(np.float64)
    ok = np.isfinite(r) & (np.abs(r) >= np.finfo(np.float32).tiny) & (np.abs(r) < 3e38)
    spacing = np.spacing(np.abs(r[ok]).astype(np.float32)).astype(np.float64)
    return float(np.max(np.abs(y.double().numpy()[ok] - r[ok]) / spacing))


def draw(lo, hi, seed=0):
    u = philox.uniform(seed, 0, (N,)).double()
    return (lo + (hi - lo) * u).float()


# (op, input domain, float64 reference); bound: < 1 ulp everywhere, measured ~0.5 (correctly rounded
# except within ~1e-8 ulp of a tie)
UNARY = [
    ("exp", E.exp_, lambda: draw(-87, 88), np.exp),
    ("log", E.log_, lambda: E.exp_(draw(-87, 88)), np.log),
    ("sqrt", E.sqrt_, lambda: E.exp_(draw(-87, 88)), np.sqrt),
    ("rsqrt", E.rsqrt_, lambda: E.exp_(draw(-87, 88)), lambda x: 1 / np.sqrt(x)),
    ("reciprocal", E.reciprocal_, lambda: E.exp_(draw(-80, 80)), lambda x: 1 / x),
    ("sigmoid", E.sigmoid_, lambda: draw(-80, 30), lambda x: 1 / (1 + np.exp(-x))),
    ("silu", E.silu_, lambda: draw(-80, 80), lambda x: x / (1 + np.exp(-x))),
    ("sin", E.sin_, lambda: draw(-2.0**20, 2.0**20), np.sin),
    ("cos", E.cos_, lambda: draw(-2.0**20, 2.0**20), np.cos),
    ("sin-small", E.sin_, lambda: draw(-4, 4), np.sin),
]


@pytest.mark.parametrize("name,fn,domain,ref", UNARY, ids=[u[0] for u in UNARY])
def test_elementary_within_one_ulp(name, fn, domain, ref):
    x = domain()
    assert ulp_error(fn(x), ref(x.double().numpy())) < 1.0


def test_elementary_special_values():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([nan, inf, -inf, 0.0, -0.0, 1e-45, 89.0, -104.0])
    assert torch.equal(E.exp_(x)[1:], torch.tensor([inf, 0.0, 1.0, 1.0, 1.0, inf, 0.0]))
    assert torch.isnan(E.exp_(x)[0])
    lg = E.log_(torch.tensor([0.0, -1.0, inf, 1.0, 1e-45]))
    assert lg[0] == -inf and torch.isnan(lg[1]) and lg[2] == inf and lg[3] == 0
    assert abs(lg[4].item() - np.log(np.float32(1e-45).astype(np.float64))) < 1e-5   # subnormal input
    assert E.rsqrt_(torch.tensor([0.0, inf])).tolist() == [inf, 0.0]


def test_bias_correction_matches_exact_rational():
    for beta in (0.9, 0.95, 0.999):
        for t in (1, 2, 15, 667, 80957):
            with localcontext() as ctx:
                ctx.prec = 60                               # 60 digits: the reference's error is ~1e-55
                exact = 1 - Decimal(beta) ** t
                got = Decimal(E.bias_correction(beta, t))
                assert abs((got - exact) / exact) < Decimal("1e-13")   # float32 needs 6e-8


def test_bias_correction_rejects_bad_arguments():
    with pytest.raises(ValueError, match="bias_correction.*'t'"):
        E.bias_correction(0.9, 0)
    with pytest.raises(ValueError, match="bias_correction.*'beta'"):
        E.bias_correction(1.5, 3)


def test_elementary_rejects_wrong_dtype():
    with pytest.raises(ValueError, match="exp: argument 'x'.*float32"):
        E.exp(torch.ones(3, dtype=torch.float64))


def test_exact_sum_is_order_independent_and_accurate():
    x = philox.normal(1, 0, (16, 3001), std=1.0) * E.exp_(philox.normal(1, 1, (16, 3001), std=4.0))
    perm = torch.from_numpy(np.random.default_rng(0).permutation(3001))
    a, b = reduce.exact_sum(x, -1), reduce.exact_sum(x[:, perm], -1)
    assert bits_equal(a, b)
    ref = x.double().sum(-1)
    assert float(((a.double() - ref).abs() / ref.abs()).max()) < 1.2e-7   # one float32 rounding


def test_exact_sum_propagates_non_finite():
    x = torch.tensor([[1.0, float("inf"), 2.0], [1.0, float("inf"), float("-inf")], [float("nan"), 0.0, 1.0]])
    s = reduce.exact_sum(x)
    assert s[0] == float("inf") and torch.isnan(s[1]) and torch.isnan(s[2])


def test_mean_and_dot_and_norm_vs_float64():
    x = philox.normal(2, 0, (33, 1000))
    y = philox.normal(2, 1, (33, 1000))
    assert float((reduce.exact_mean(x, -1).double() - x.double().mean(-1)).abs().max()) < 1e-8
    d = reduce.dot(x, y)
    assert float(((d.double() - (x.double() * y.double()).sum(-1)).abs()).max()) < 1e-5
    ts = [x, y[:5], philox.normal(2, 2, (7,))]
    ref = np.sqrt(sum(float(t.double().square().sum()) for t in ts))
    assert abs(reduce.global_l2_norm(ts).item() - ref) / ref < 1.2e-7


def test_global_norm_is_independent_of_tensor_order_and_split():
    x = philox.normal(3, 0, (1000,))
    whole = reduce.global_l2_norm([x])
    parts = reduce.global_l2_norm([x[600:], x[:250], x[250:600]])
    assert bits_equal(whole, parts)


def test_reduction_gradients():
    x = philox.normal(4, 0, (5, 7)).requires_grad_()
    g = philox.normal(4, 1, (5,))
    reduce.mean(x, -1).backward(g)
    assert torch.allclose(x.grad.double(), (g.double() / 7)[:, None].expand(5, 7), rtol=1e-7, atol=0)
    x.grad = None
    xm = torch.tensor([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]], requires_grad=True)
    reduce.max(xm, -1).backward(torch.ones(2))
    assert xm.grad.tolist() == [[0, 1, 0], [1, 0, 0]]          # ties: first position


def test_philox_known_answers():
    # Random123 kat_vectors for philox4x32-10
    kat = [([0, 0, 0, 0], (0, 0), [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
           ([0xFFFFFFFF] * 4, (0xFFFFFFFF, 0xFFFFFFFF), [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
           ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], (0xA4093822, 0x299F31D0),
            [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1])]
    for ctr, key, want in kat:
        assert philox.philox4x32(torch.tensor([ctr]), key)[0].tolist() == want


def test_philox_draws_depend_only_on_index():
    full = philox.trunc_normal(42, 7, (3000,))
    part = philox.trunc_normal(42, 7, (500,), offset=1201)
    assert bits_equal(full[1201:1701], part)
    # a CPU draw is taken a chunk at a time: across a chunk's edge it equals a draw that holds the edge inside
    c = chunks.CPU_CHUNK
    big = philox.trunc_normal(42, 7, (c + 3000,))
    assert bits_equal(big[c - 1000: c + 1000], philox.trunc_normal(42, 7, (2000,), offset=c - 1000))
    assert bits_equal(philox.uniform(1, 2, (10, 10)).reshape(-1)[37:50], philox.uniform(1, 2, (13,), offset=37))
    assert not bits_equal(philox.normal(1, 2, (100,)), philox.normal(1, 3, (100,)))


def test_philox_distributions():
    z = philox.normal(5, 0, (N,)).double()
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    t = philox.trunc_normal(5, 1, (N,), std=0.02).double()
    assert t.abs().max() <= 0.04
    assert abs(t.std() - 0.02 * 0.8796) < 3e-4                 # std of N(0,1) truncated at +-2 is 0.8796
    u = philox.uniform(5, 2, (N,)).double()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.005


@pytest.mark.parametrize("slices,bound", [(2, 1e-2), (3, 1e-4), (4, 1e-6)])
def test_contraction_accuracy_vs_float64(slices, bound):
    a = philox.normal(6, 0, (64, 1000))
    b = philox.normal(6, 1, (1000, 130))
    a[:, :3] *= 50                                             # outlier columns, as activations have
    y = contraction.hp_matmul(a, b, slices).double()
    ref = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()
    assert float(((y - ref).abs() / scale).max()) < bound


def test_contraction_gradients_vs_float64():
    a = philox.normal(7, 0, (9, 13)).requires_grad_()
    b = philox.normal(7, 1, (13, 6)).requires_grad_()
    g = philox.normal(7, 2, (9, 6))
    contraction.hp_matmul(a, b).backward(g)
    ga, gb = g.double() @ b.detach().double().T, a.detach().double().T @ g.double()
    assert float((a.grad.double() - ga).abs().max() / ga.abs().max()) < 1e-5
    assert float((b.grad.double() - gb).abs().max() / gb.abs().max()) < 1e-5


def test_contraction_rejects_bad_shapes():
    with pytest.raises(ValueError, match="hp_matmul.*do not contract"):
        contraction.hp_matmul(torch.ones(3, 4), torch.ones(5, 2))
    with pytest.raises(ValueError, match="hp_matmul: argument 'b'.*float32"):
        contraction.hp_matmul(torch.ones(3, 4), torch.ones(4, 2, dtype=torch.float64))


def test_check_finite_names_the_tensor():
    check_finite("ok", torch.ones(3))
    with pytest.raises(ValueError, match=r"tensor 'layers.3.w' has 1 non-finite.*\(1, 2\)"):
        check_finite("layers.3.w", torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, float("nan")]]))
