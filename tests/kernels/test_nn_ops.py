"""Layer ops (rmsnorm, rope, swiglu, embedding, adamw): accuracy vs float64, gradients, bits, validation.

Error measures: `rel` is the max elementwise |ours - ref| / |ref|; `nrm` is max |ours - ref| / max |ref|
(used where a result is a difference of terms and elementwise relative error is meaningless);
`ulps` is |ours - ref| in units of the float32 spacing at ref.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.cases import nn as nn_cases
from kernels.cases import run_case
from kernels.digest import bits_equal
from kernels.ref import philox
from kernels.ref.adamw import adamw_step, clip_coefficient
from kernels.ref.embedding import embedding
from kernels.ref.rmsnorm import rmsnorm
from kernels.ref.rope import apply_rope, rope_tables
from kernels.ref.swiglu import swiglu

F32, F64 = torch.float32, torch.float64
META = torch.device("meta")


def _normal(seed: int, shape, std: float = 1.0) -> torch.Tensor:
    return philox.normal(seed, 0, shape, std=std)


def rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.double() - ref).abs() / ref.abs()).max().item()


def nrm(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.double() - ref).abs().max() / ref.abs().max()).item()


def ulps(ours: torch.Tensor, ref: torch.Tensor) -> float:
    r = ref.to(F32).abs()
    spacing = (torch.nextafter(r, torch.tensor(float("inf"))) - r).double()
    return ((ours.double() - ref).abs() / spacing).max().item()


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


# --- rmsnorm ---

def _rmsnorm64(x, w, eps=1e-6):
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


@pytest.mark.parametrize("shape", [(7, 33), (5, 100), (2, 3, 384)])
@pytest.mark.parametrize("gain", [True, False])
def test_rmsnorm_accuracy_and_grads(shape, gain):
    # measured: y rel <= 1.6e-7, dx nrm <= 1.4e-7, dweight nrm <= 7.7e-8 (up to 64x1000)
    x = _normal(1, shape, 3.0).requires_grad_()
    w = (1.0 + _normal(2, shape[-1:], 0.1)).requires_grad_() if gain else None
    g = _normal(3, shape)
    y = rmsnorm(x, w)
    y.backward(g)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_() if gain else None
    y64 = _rmsnorm64(x64, w64)
    y64.backward(g.double())
    assert rel(y, y64) < 1e-6
    assert nrm(x.grad, x64.grad) < 1e-6
    if gain:
        assert nrm(w.grad, w64.grad) < 1e-6


def test_rmsnorm_dweight_independent_of_batch_layout():
    x = _normal(4, (6, 5, 100), 3.0)
    w = 1.0 + _normal(5, (100,), 0.1)
    g = _normal(6, (6, 5, 100))
    grads = []
    for shape in [(6, 5, 100), (30, 100), (2, 15, 100)]:
        wl = w.clone().requires_grad_()
        rmsnorm(x.reshape(shape), wl).backward(g.reshape(shape))
        grads.append(wl.grad)
    assert all(torch.equal(bits(grads[0]), bits(d)) for d in grads[1:])


# --- rope ---

def _tables64(t, d, theta=5e5):
    inv = theta ** (-(torch.arange(0, d, 2, dtype=F64) / d))
    ang = torch.arange(t, dtype=F64)[:, None] * inv[None, :]
    return torch.cos(ang), torch.sin(ang)


@pytest.mark.parametrize("t,d", [(7, 8), (130, 128), (4096, 128), (4096, 8)])
def test_rope_tables_within_one_ulp(t, d):
    # measured max 0.50001 ulp vs float64 libm (essentially correctly rounded)
    cos, sin = rope_tables(t, d)
    cr, sr = _tables64(t, d)
    assert cos.dtype == F32 and cos.shape == (t, d // 2)
    assert ulps(cos, cr) < 1.0 and ulps(sin, sr) < 1.0


@pytest.mark.parametrize("shape", [(1, 2, 7, 8), (2, 3, 33, 64), (1, 2, 130, 128)])
def test_apply_rope_accuracy_and_grad(shape):
    # measured: y nrm <= 8.3e-8, dx nrm <= 8.7e-8
    t, d = shape[-2:]
    h = d // 2
    cos, sin = rope_tables(t, d)
    x = _normal(7, shape).requires_grad_()
    g = _normal(8, shape)
    y = apply_rope(x, cos, sin)
    y.backward(g)
    x64 = x.detach().double().requires_grad_()
    c, s = cos.double(), sin.double()
    y64 = torch.cat([x64[..., :h] * c - x64[..., h:] * s, x64[..., h:] * c + x64[..., :h] * s], dim=-1)
    y64.backward(g.double())
    assert nrm(y, y64) < 1e-6
    assert nrm(x.grad, x64.grad) < 1e-6


def test_rope_position_zero_is_identity():
    cos, sin = rope_tables(3, 16)
    assert torch.equal(cos[0], torch.ones(8)) and torch.equal(sin[0], torch.zeros(8))


# --- swiglu ---

@pytest.mark.parametrize("shape", [(7, 66), (5, 200), (3, 2, 768)])
def test_swiglu_accuracy_and_grad(shape):
    # measured: y rel <= 1.1e-7, dx nrm <= 2.1e-7 (up to 1000x100)
    x = _normal(9, shape, 3.0).requires_grad_()
    f = shape[-1] // 2
    y = swiglu(x)
    g = _normal(10, tuple(y.shape))
    y.backward(g)
    x64 = x.detach().double().requires_grad_()
    y64 = F.silu(x64[..., :f]) * x64[..., f:]
    y64.backward(g.double())
    assert y.shape == (*shape[:-1], f)
    assert rel(y, y64) < 1e-6
    assert nrm(x.grad, x64.grad) < 1e-6


# --- embedding ---

def _ids(seed, shape, used):
    n = 1
    for s in shape:
        n *= s
    return (philox.random_bits(seed, 0, n) % used).reshape(shape)


@pytest.mark.parametrize("vocab,dim,ids_shape,used", [(11, 8, (7,), 3), (100, 33, (4, 130), 10),
                                                      (1000, 64, (8, 512), 700)])
def test_embedding_forward_and_grad(vocab, dim, ids_shape, used):
    # measured: dweight within 0.5 ulp of the float64 index_add (so correctly rounded here)
    ids = _ids(11, ids_shape, used)
    w = _normal(12, (vocab, dim), 0.02).requires_grad_()
    g = _normal(13, (*ids_shape, dim))
    y = embedding(ids, w)
    assert torch.equal(y, w.detach()[ids])
    y.backward(g)
    ref = torch.zeros(vocab, dim, dtype=F64).index_add_(0, ids.reshape(-1), g.reshape(-1, dim).double())
    hit = ref != 0
    assert ulps(w.grad[hit], ref[hit]) <= 1.0
    assert torch.equal(bits(w.grad[used:]), torch.zeros(vocab - used, dim, dtype=torch.int32))  # exactly +0


def test_embedding_grad_independent_of_token_order():
    ids = _ids(14, (4, 300), 17)
    g = _normal(15, (4, 300, 24))
    perm = philox.random_bits(16, 0, 1200).argsort()  # a fixed permutation of the tokens
    out = []
    for i, gg in [(ids.reshape(-1), g.reshape(-1, 24)), (ids.reshape(-1)[perm], g.reshape(-1, 24)[perm])]:
        w = torch.zeros(40, 24).requires_grad_()
        embedding(i, w).backward(gg)
        out.append(w.grad)
    assert torch.equal(bits(out[0]), bits(out[1]))


def test_embedding_bf16_and_nonfinite():
    ids = torch.tensor([0, 2, 2, 1, 2])
    w = torch.zeros(4, 3, dtype=torch.bfloat16).requires_grad_()
    g = torch.tensor([[1.0, 2.0, 3.0], [float("inf"), 1.0, 1.0], [1.0, float("-inf"), 1.0],
                      [float("nan"), 0.5, 0.25], [1.0, 1.0, 1.0]])
    embedding(ids, w).backward(g.to(torch.bfloat16))
    ref = torch.zeros(4, 3, dtype=F64).index_add_(0, ids, g.double())
    assert w.grad.dtype == torch.bfloat16
    torch.testing.assert_close(w.grad.double(), ref, rtol=0, atol=0, equal_nan=True)
    assert torch.isnan(w.grad[1, 0]) and w.grad[2, 0] == float("inf") and w.grad[2, 1] == float("-inf")


# --- adamw ---

def _adamw64_step(p, g, m, v, t, lr, wd):
    """One float64 AdamW step from the same inputs, plus the magnitudes of the terms behind p and m.

    Errors are measured relative to the terms (|b1 m| + |(1 - b1) g|, ...), not to the result, because
    m and p can cancel to ~0 and an elementwise relative error would then measure the cancellation.
    """
    p, g, m, v = p.double(), g.double(), m.double(), v.double()
    bc1, bc2 = 1 - 0.9 ** t, 1 - 0.95 ** t
    m_terms = 0.9 * m.abs() + 0.1 * g.abs()
    m = 0.9 * m + 0.1 * g
    v = 0.95 * v + 0.05 * g * g
    denom = (v / bc2).sqrt() + 1e-8
    p_terms = p.abs() * (1 + lr * wd) + lr * (m_terms / bc1) / denom
    p = p - lr * wd * p - lr * (m / bc1) / denom
    return p, m, v, p_terms, m_terms


@pytest.mark.parametrize("dtype", [F32, torch.bfloat16])
@pytest.mark.parametrize("shape,first_step,wd,zero_init", [((100,), 1, 0.0, False), ((7, 33), 1, 0.1, False),
                                                           ((13, 384), 1, 0.1, True), ((50,), 998, 0.1, False)])
def test_adamw_step_vs_float64(dtype, shape, first_step, wd, zero_init):
    # measured over 3 consecutive steps (up to 1000x100): float32 p err <= 2.3e-7 of its terms, m <= 1.3e-7,
    # v rel <= 1.5e-7; bf16 p equals float64 rounded to bf16 but for 3e-5 of elements (1 ulp, near ties)
    lr = 4.5e-4
    p = (torch.zeros(shape) if zero_init else _normal(17, shape, 0.02)).to(dtype)
    m, v = torch.zeros(shape), torch.zeros(shape)
    if first_step > 1:  # a late step starts from non-zero moments
        m, v = _normal(20, shape, 0.01), _normal(21, shape, 1e-4).abs()
    for k in range(3):
        g = _normal(18 + k, shape, 0.01).to(dtype)
        p_ref, m_ref, v_ref, p_terms, m_terms = _adamw64_step(p, g, m, v, first_step + k, lr, wd)
        adamw_step(p, g, m, v, step=first_step + k, lr=lr, weight_decay=wd)
        assert ((m.double() - m_ref).abs() / m_terms).max().item() < 1e-6
        assert rel(v, v_ref) < 1e-6
        if dtype == F32:
            assert ((p.double() - p_ref).abs() / p_terms).max().item() < 1e-6
        else:
            r = p_ref.to(dtype)
            spacing = (torch.nextafter(r.abs(), torch.tensor(float("inf"), dtype=dtype)) - r.abs()).double()
            assert ((p.double() - p_ref).abs() <= spacing).all()


def test_adamw_trajectory_vs_torch_adamw_float64():
    # the same semantics as stock AdamW (run in float64 here); measured nrm <= 8.2e-8 after 3 steps
    shape, lr, wd = (7, 33), 4.5e-4, 0.1
    p = _normal(22, shape, 0.02)
    m, v = torch.zeros(shape), torch.zeros(shape)
    ref = torch.nn.Parameter(p.double())
    opt = torch.optim.AdamW([ref], lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd, foreach=False)
    for k in range(3):
        g = _normal(23 + k, shape, 0.01)
        adamw_step(p, g, m, v, step=k + 1, lr=lr, weight_decay=wd)
        ref.grad = g.double()
        opt.step()
    st = opt.state[ref]
    assert nrm(p, ref.detach()) < 1e-6 and nrm(m, st["exp_avg"]) < 1e-6 and nrm(v, st["exp_avg_sq"]) < 1e-6


def test_clip_coefficient():
    def c(n):
        return clip_coefficient(torch.tensor(n, dtype=F32), 1.0)
    assert c(0.0).item() == 1.0 and c(0.5).item() == 1.0 and c(1.0).dtype == F32
    assert c(4.0).item() == (torch.tensor(1.0) / torch.tensor(4.0 + 1e-6, dtype=F32)).item()
    assert c(float("inf")).item() == 0.0 and torch.isnan(c(float("nan")))


# --- validation ---

@pytest.mark.parametrize("call,match", [
    (lambda: rmsnorm(torch.zeros(3, 4, dtype=F64)), r"rmsnorm: argument 'x'"),
    (lambda: rmsnorm(torch.zeros(3, 4), torch.ones(5)), r"rmsnorm: argument 'weight'"),
    (lambda: rmsnorm(torch.zeros(3, 4), torch.ones(4, device=META)), r"rmsnorm: argument 'weight'"),
    (lambda: rmsnorm(torch.zeros(3, 4), eps=-1.0), r"rmsnorm: argument 'eps'"),
    (lambda: rope_tables(8, 7), r"rope_tables: argument 'head_dim'"),
    (lambda: rope_tables(-1, 8), r"rope_tables: argument 'seq_len'"),
    (lambda: apply_rope(torch.zeros(2, 5, 8), torch.zeros(4, 4), torch.zeros(5, 4)), r"apply_rope: argument 'cos'"),
    (lambda: apply_rope(torch.zeros(2, 5, 8), torch.zeros(5, 4), torch.zeros(5, 4, dtype=F64)),
     r"apply_rope: argument 'sin'"),
    (lambda: apply_rope(torch.zeros(2, 5, 7), torch.zeros(5, 3), torch.zeros(5, 3)), r"apply_rope: argument 'x'"),
    (lambda: apply_rope(torch.zeros(5, 8), torch.zeros(5, 4, device=META), torch.zeros(5, 4)),
     r"apply_rope: argument 'cos'"),
    (lambda: swiglu(torch.zeros(3, 5)), r"swiglu: argument 'gate_up'"),
    (lambda: swiglu(torch.zeros(3, 4, dtype=torch.bfloat16)), r"swiglu: argument 'gate_up'"),
    (lambda: embedding(torch.zeros(3), torch.zeros(4, 2)), r"embedding: argument 'ids'"),
    (lambda: embedding(torch.tensor([0, 4]), torch.zeros(4, 2)), r"embedding: argument 'ids'"),
    (lambda: embedding(torch.tensor([0]), torch.zeros(4)), r"embedding: argument 'weight'"),
    (lambda: embedding(torch.tensor([0]), torch.zeros(4, 2, device=META)), r"embedding: argument 'weight'"),
    (lambda: adamw_step(torch.zeros(3), torch.zeros(4), torch.zeros(3), torch.zeros(3), step=1, lr=1e-3),
     r"adamw_step: argument 'grad'"),
    (lambda: adamw_step(torch.zeros(3), torch.zeros(3), torch.zeros(3, dtype=torch.bfloat16), torch.zeros(3),
                        step=1, lr=1e-3), r"adamw_step: argument 'm'"),
    (lambda: adamw_step(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(3, device=META),
                        step=1, lr=1e-3), r"adamw_step: argument 'v'"),
    (lambda: adamw_step(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(3), step=0, lr=1e-3),
     r"adamw_step: argument 'step'"),
    (lambda: adamw_step(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(3), step=1, lr=1e-3,
                        beta2=1.0), r"adamw_step: argument 'beta2'"),
    (lambda: clip_coefficient(torch.zeros(2), 1.0), r"clip_coefficient: argument 'total_norm'"),
    (lambda: clip_coefficient(torch.tensor(1.0), 0.0), r"clip_coefficient: argument 'max_norm'"),
])
def test_bad_inputs_raise_naming_op_and_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- determinism ---

def test_cases_bitwise_same_with_one_and_two_threads():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [run_case(c, "cpu") for c in nn_cases.CASES]
        torch.set_num_threads(2)
        two = [run_case(c, "cpu") for c in nn_cases.CASES]
    finally:
        torch.set_num_threads(before)
    for case, a, b in zip(nn_cases.CASES, one, two):
        assert a.keys() == b.keys()
        for k in a:
            assert bits_equal(a[k], b[k]), f"{case.name}: {k} differs between 1 and 2 threads"
