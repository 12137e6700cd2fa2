"""int8 W8A8 QAT linear: quantization bits vs a float64 reference, forward/backward error bounds vs float64,
the LSQ step gradient, argument errors, determinism and thread-count independence."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kernels.digest import bits_equal
from kernels.ref import philox
from kernels.ref.int8_linear import (int8_linear, int8_linear_backward, int8_linear_backward_windows, lsq_grad_scale,
                                     lsq_step_factor, quantize_activation, quantize_weight, repin_constant,
                                     weight_step)
from kernels.ref.rotated_mm import rotated_int8_mm

Q = 127
U32 = 2.0 ** -24
M, K, N = 96, 160, 200   # no powers of two: the block rotation pads both contraction dims


def inputs(seed: int, m: int = M, k: int = K, n: int = N, wdtype=torch.float32):
    x = philox.normal(seed, 0, (m, k))
    w = philox.normal(seed, 1, (n, k), std=0.02).to(wdtype)
    g = philox.normal(seed, 2, (m, n))
    s_x = torch.tensor(0.03)   # |x / s_x| reaches ~140: some activations clip
    return x, w, s_x, g


def run(x, w, s_x, g, **kw):
    """(y, dx, dw, ds) through autograd."""
    x, w, s_x = (t.clone().requires_grad_() for t in (x, w, s_x))
    y = int8_linear(x, w, s_x, **kw)
    y.backward(g)
    return y.detach(), x.grad, w.grad, s_x.grad


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).norm() / ref.norm()).item()


# --- float64 references, written independently of the library ---

def ref_weight_step(w: torch.Tensor) -> np.ndarray:
    """float32 s_w from math.fsum (correctly rounded mean |w|) and float32(2/sqrt(127)) in float32."""
    c = np.float32(2.0 / math.sqrt(Q))
    rows = w.double().abs().tolist()
    mean = np.array([math.fsum(r) * (1.0 / len(r)) for r in rows]).astype(np.float32)
    s = mean * c
    return np.where(s > 0, s, np.float32(1.0))


def ref_codes(v64: np.ndarray) -> np.ndarray:
    """float32 quotient (double rounding via float64 is harmless for /), round half to even, clamp."""
    return np.clip(np.round(v64.astype(np.float32)), -Q, Q).astype(np.int8)


def lsq_float64(x, w, s_x, s_w, g):
    """Fake-quant LSQ in float64 with torch autograd: round by STE, clamp, gradient-scaled step; s_w fixed."""
    x64, w64, s64 = (t.double().detach().requires_grad_() for t in (x, w, s_x))
    gs = 1.0 / math.sqrt(x.numel() * Q)
    s = (s64 - s64 * gs).detach() + s64 * gs

    def ste(v):
        return v + (torch.round(v) - v).detach()

    x_hat = s * torch.clamp(ste(x64 / s), -Q, Q)
    sw = s_w.double()[:, None]
    w_hat = sw * torch.clamp(ste(w64 / sw), -Q, Q)
    y = x_hat @ w_hat.t()
    y.backward(g.double())
    return y.detach(), x64.grad, w64.grad, s64.grad, w_hat.detach()


# --- forward ---

def test_repin_constant_is_correctly_rounded():
    assert repin_constant().item() == float(np.float32(2.0 / math.sqrt(Q)))


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_quantization_bits_match_float64_reference(wdtype):
    x, w, s_x, _ = inputs(1, wdtype=wdtype)
    x[0, 0] = 10.0  # |x / s_x| = 333: the clamp is exercised
    s_w = weight_step(w)
    assert np.array_equal(s_w.numpy().view(np.int32), ref_weight_step(w).view(np.int32))
    q_w, _ = quantize_weight(w, s_w)
    q_x, _ = quantize_activation(x, s_x)
    assert np.array_equal(q_w.numpy(), ref_codes(w.double().numpy() / s_w.double().numpy()[:, None]))
    assert np.array_equal(q_x.numpy(), ref_codes(x.double().numpy() / float(s_x)))


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_forward_within_three_roundings_of_float64(wdtype):
    x, w, s_x, _ = inputs(2, wdtype=wdtype)
    y = int8_linear(x, w, s_x)
    s_w = weight_step(w)
    q_w, _ = quantize_weight(w, s_w)
    q_x, _ = quantize_activation(x, s_x)
    acc = q_x.to(torch.int64) @ q_w.to(torch.int64).t()                 # exact
    ref = acc.double() * float(s_x) * s_w.double()[None, :]
    # float32(acc), float32(s_x * s_w), their product: three roundings of at most u each
    assert torch.all((y.double() - ref).abs() <= 3.0001 * U32 * ref.abs())
    # the float64 LSQ fake-quant forward divides in float64, so it decides a rare near-tie differently
    y64 = lsq_float64(x, w, s_x, s_w, torch.zeros(M, N))[0]
    assert rel(y, y64) < 1e-6


def test_leading_dims_are_flattened_tokens():
    x, w, s_x, g = inputs(3)
    y2, dx2, dw2, ds2 = run(x, w, s_x, g)
    y3, dx3, dw3, ds3 = run(x.reshape(4, 24, K), w, s_x, g.reshape(4, 24, N))
    assert bits_equal(y3.reshape(M, N), y2) and bits_equal(dx3.reshape(M, K), dx2)
    assert bits_equal(dw3, dw2) and bits_equal(ds3, ds2)


# --- backward ---

@pytest.mark.parametrize("rotate", [True, False])
def test_backward_vs_float64_lsq_gradient(rotate):
    x, w, s_x, g = inputs(4)
    _, dx, dw, ds = run(x, w, s_x, g, rotate=rotate)
    _, dx64, dw64, ds64, w_hat = lsq_float64(x, w, s_x, weight_step(w), g)
    # int8 per-row / per-column quantization of both GEMM operands: measured ~0.9% (Gaussian data)
    assert rel(dx, dx64) < 0.02
    assert rel(dw, dw64) < 0.02
    # ds = gs * sum_i f_i dx_hat_i: by Cauchy-Schwarz its error is at most gs * |f| * |dx_hat - dx_hat64|
    v = x / s_x
    f = lsq_step_factor(v, torch.clamp(torch.round(v), -Q, Q)).double()
    dx_hat64 = g.double() @ w_hat
    bound = lsq_grad_scale(x.numel()).item() * f.norm().item() * 0.02 * dx_hat64.norm().item()
    assert abs(ds.item() - ds64.item()) <= bound


def test_step_gradient_is_the_exact_sum():
    x, w, s_x, g = inputs(5)
    _, _, ds = int8_linear_backward(g, x, w, s_x, needs=(False, False, True))
    s_w = weight_step(w)
    q_w, _ = quantize_weight(w, s_w)
    dx_hat = rotated_int8_mm(g, q_w.float() * s_w[:, None])
    q_x, v = quantize_activation(x, s_x)
    total = math.fsum((dx_hat.double() * lsq_step_factor(v, q_x).double()).reshape(-1).tolist())
    ref = float(np.float32(total)) * lsq_grad_scale(x.numel()).item()
    assert abs(ds.item() - ref) <= 2 * U32 * abs(ref)
    assert lsq_grad_scale(x.numel()).item() == pytest.approx(1.0 / math.sqrt(x.numel() * Q), rel=1e-7)


def test_ste_masks_clipped_elements():
    x, w, s_x, g = inputs(6)
    x[0, :4] = torch.tensor([5.0, -5.0, 3.81, -3.81])   # |x / 0.03| = 167, 167, 127, 127
    w[1, 2] = 1.0                                         # ~60 mean|w|: beyond 127 steps
    _, dx, dw, _ = run(x, w, s_x, g)
    assert torch.equal(dx[0, :2], torch.zeros(2)) and bool((dx[0, 2:4] != 0).all())
    assert dw[1, 2].item() == 0.0 and bool((dw[1, :2] != 0).all())


def test_rotation_flattens_gradient_outliers():
    m, k, n = 512, 128, 384
    x = philox.normal(7, 0, (m, k))
    w = philox.normal(7, 1, (n, k), std=0.02)
    g = philox.normal(7, 2, (m, n))
    # heavy tails as real gradients have: ~1% of the columns and rows x100
    col = torch.where(philox.uniform(7, 3, (n,)) < 0.01, 100.0, 1.0)
    row = torch.where(philox.uniform(7, 4, (m,)) < 0.01, 100.0, 1.0)
    g = g * col[None, :] * row[:, None]
    s_x = torch.tensor(0.03)
    _, dx64, dw64, _, _ = lsq_float64(x, w, s_x, weight_step(w), g)
    err = {r: run(x, w, s_x, g, rotate=r) for r in (True, False)}
    e_rot = (rel(err[True][1], dx64), rel(err[True][2], dw64))
    e_raw = (rel(err[False][1], dx64), rel(err[False][2], dw64))
    assert max(e_rot) < 0.015 and min(e_raw) > 0.02          # measured ~0.9% vs ~3-5%


# --- special values, errors, determinism ---

def test_zero_row_and_bfloat16_weight():
    x, w, s_x, g = inputs(8, wdtype=torch.bfloat16)
    w[3] = 0
    y, dx, dw, ds = run(x, w, s_x, g)
    assert weight_step(w)[3].item() == 1.0
    assert torch.equal(y[:, 3], torch.zeros(M)) and dw.dtype == torch.bfloat16
    assert all(bool(torch.isfinite(t).all()) for t in (y, dx, dw.float(), ds))


def test_nonfinite_input_poisons_its_row_and_column():
    x, w, s_x, _ = inputs(9)
    x[5, 7] = float("nan")
    w[11, 0] = float("inf")
    y = int8_linear(x, w, s_x)
    assert bool(torch.isnan(y[5]).all()) and bool(torch.isnan(y[:, 11]).all())
    assert int(torch.isnan(y).sum()) == N + M - 1


@pytest.mark.parametrize("args,arg", [
    ((torch.zeros(4, 8, dtype=torch.float64), torch.zeros(3, 8), torch.tensor(1.0)), "'x'"),
    ((torch.zeros(4, 8), torch.zeros(3, 7), torch.tensor(1.0)), "'w'"),
    ((torch.zeros(4, 8), torch.zeros(3, 8, dtype=torch.float16), torch.tensor(1.0)), "'w'"),
    ((torch.zeros(4, 8), torch.zeros(8), torch.tensor(1.0)), "'w'"),
    ((torch.zeros(4, 8), torch.zeros(3, 8), torch.tensor([1.0])), "'s_x'"),
    ((torch.zeros(4, 8), torch.zeros(3, 8), torch.tensor(1.0, dtype=torch.float64)), "'s_x'"),
    ((torch.zeros(4, 8), torch.zeros(3, 8, device="meta"), torch.tensor(1.0)), "'w'"),
    ((torch.zeros(0, 8), torch.zeros(3, 8), torch.tensor(1.0)), "'x'"),
    (([[1.0]], torch.zeros(3, 8), torch.tensor(1.0)), "'x'"),
])
def test_bad_arguments_name_op_and_argument(args, arg):
    with pytest.raises(ValueError, match=rf"int8_linear.*{arg}"):
        int8_linear(*args)


def test_bad_block_is_named():
    x, w, s_x, _ = inputs(10, 8, 16, 8)
    with pytest.raises(ValueError, match=r"int8_linear.*'block'"):
        int8_linear(x, w, s_x, block=100)


def _all_bits(seed: int):
    x, w, s_x, g = inputs(seed)
    return run(x, w, s_x, g)


def test_two_calls_give_identical_bits():
    a, b = _all_bits(11), _all_bits(11)
    assert all(bits_equal(p, q) for p, q in zip(a, b))


def test_thread_count_does_not_change_bits():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _all_bits(12)
        torch.set_num_threads(2)
        two = _all_bits(12)
    finally:
        torch.set_num_threads(before)
    assert all(bits_equal(p, q) for p, q in zip(one, two))


@pytest.mark.parametrize("needs", [(True, True, True), (True, False, False), (False, True, True)])
def test_windows_backward_is_each_windows_own(needs):
    """The batched backward of 3 windows gives, for each window, the bits of the backward of that window alone:
    dx from one GEMM over the batch (with a NaN row and clipped activations), dw and ds_x from its rows only."""
    x, w, s_x, g = inputs(7, m=3 * 40)
    x, g = x.reshape(3, 40, K), g.reshape(3, 40, N)
    x[1, 5, 3] = float("nan")
    dx, dws, dss = int8_linear_backward_windows(g, x, w, s_x, needs=needs)
    alone = [int8_linear_backward(g[i], x[i], w, s_x, needs=needs) for i in range(3)]
    assert (dx is None) == (not needs[0]) and (dws[0] is None) == (not needs[1]) and (dss[0] is None) == (not needs[2])
    if needs[0]:
        assert bits_equal(dx, torch.stack([a[0] for a in alone]))
    for i in range(3):
        for got, want in ((dws[i], alone[i][1]), (dss[i], alone[i][2])):
            assert (got is None and want is None) or bits_equal(got, want)
    if needs[1]:  # the check can fail: the batch's dw (steps over all 120 tokens) is not a window's
        whole = int8_linear_backward(g.reshape(120, N), x.reshape(120, K), w, s_x, needs=(False, True, False))[1]
        assert not bits_equal(whole, sum(dws[1:], dws[0]))
