"""Softmax, int8-P.V attention and fused cross-entropy + z-loss: accuracy vs float64, masks, GQA,
chunk independence, argument errors and bitwise determinism across thread counts.

Stated bounds (measured values in the comments; inputs N(0,1)-ish, logits up to ~20):
- softmax: every element within 4 float32 ulps of float64 (measured <= 2.3); dx_i within
  8 ulp * y_i * (|g_i| + <|g|, y>) (the float32 y's rounding moves <g, y>).
- attention forward: dominated by the int8 P.V; per block |P^ - P| <= pm/254 and |V^ - V| <= amax/254
  give |O - O64| <= amax_col(V) * (1 + sum_b n_b pm_b) / 254 (asserted; measured <= 0.38 of it) and
  max|O - O64| <= 2% of max|V| (measured <= 0.8% here, 0.94% at 16/4 heads, T=512, D=128).
- attention backward (straight-through, unquantized): within 1e-4 of max|grad| of float64 autograd of
  unquantized attention (measured <= 1.1e-5 here, 3.5e-5 at 16/4 heads, T=512, D=128); it is set by the
  3-slice logits (~1e-6 of sum|q||k|), not by the backward's own contractions.
- loss, ce, z: relative 1e-6 (measured <= 2.9e-7); dh, dW: within 1e-4 of max|grad| (measured <= 2.0e-5).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kernels.cases import registry, run_case, seed_of
from kernels.digest import bits_equal
from kernels.ref import philox
from kernels.ref.attention import attention, default_scale, pv_int8, quantize_int8
from kernels.ref.loss import TOKEN_BLOCK, cross_entropy_zloss
from kernels.ref.softmax import logsumexp, softmax

ULP = 2.0 ** -24


def _randn(name: str, shape, std: float = 1.0) -> torch.Tensor:
    return philox.normal(seed_of(name), 0, shape, std=std)


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


def _rel_to_max(a: torch.Tensor, ref: torch.Tensor) -> float:
    """max |a - ref| / max |ref| (0 when both are all zero, e.g. dq with a window of 1)."""
    return float((a.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


# --- softmax ---

@pytest.mark.parametrize("shape,dim", [((7, 33), -1), ((3, 130, 5), 1), ((4, 1000), -1), ((2, 1), 0)])
def test_softmax_matches_float64(shape, dim):
    x = _leaf(_randn(f"sm{shape}", shape, 4.0))
    g = _randn(f"sm{shape}g", shape)
    y = softmax(x, dim)
    y.backward(g)
    x64 = _leaf(x.detach().double())
    ref = torch.softmax(x64, dim)
    ref.backward(g.double())
    assert float(((y.detach().double() - ref.detach()).abs() / ref.detach()).max()) <= 4 * ULP
    # y's own rounding (<= 4 ulp) moves <g, y>; the float64 backward adds ~1 ulp of its own
    r = ref.detach()
    gy = (g.double().abs() * r).sum(dim, keepdim=True)
    assert bool(((x.grad.double() - x64.grad).abs() <= 8 * ULP * r * (g.double().abs() + gy)).all())
    lse = logsumexp(x.detach(), dim)
    lref = torch.logsumexp(x64.detach(), dim)
    assert float(((lse.double() - lref).abs() / lref.abs().clamp_min(1.0)).max()) <= 4 * ULP


def test_softmax_of_minus_inf_is_exactly_zero():
    x = _randn("sminf", (5, 17), 3.0)
    x[:, ::3] = -math.inf
    x = _leaf(x)
    y = softmax(x)
    y.backward(_randn("sminfg", (5, 17)))
    assert bool((y[:, ::3] == 0).all()) and bool(torch.isfinite(y).all())
    assert bool((x.grad[:, ::3] == 0).all())
    assert float((y.detach().double().sum(-1) - 1).abs().max()) <= 20 * ULP


# --- attention helpers ---

def _mask_loops(t: int, causal: bool, window) -> torch.Tensor:
    """The mask written out element by element, independent of the op's vectorized one."""
    m = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        for j in range(t):
            m[i, j] = (not causal) or (j <= i and (window is None or i - j < window))
    return m


def _attention64(q, k, v, causal=True, window=None):
    """Unquantized float64 attention with an explicit mask and explicit GQA head expansion."""
    b, hq, t, d = q.shape
    grp = hq // k.shape[1]
    k = k.repeat_interleave(grp, 1)
    v = v.repeat_interleave(grp, 1)
    s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
    s = s.masked_fill(~_mask_loops(t, causal, window), -math.inf)
    p = torch.softmax(s, -1)
    return torch.matmul(p, v), p


def _qkv(name, b, hq, hkv, t, d):
    return (_leaf(_randn(f"{name}q", (b, hq, t, d), 2.0)), _leaf(_randn(f"{name}k", (b, hkv, t, d))),
            _leaf(_randn(f"{name}v", (b, hkv, t, d))))


def _pv_bound(p64: torch.Tensor, v: torch.Tensor, block: int, grp: int) -> torch.Tensor:
    """amax_col(V) * (1 + sum_b n_b * pm_b) / 254 per output element (see the module docstring)."""
    t = v.shape[-2]
    vmax = v.abs().amax(-2, keepdim=True).repeat_interleave(grp, 1).double()
    mass = torch.ones_like(p64[..., :1])
    for b0 in range(0, t, block):
        pb = p64[..., b0:b0 + block]
        mass = mass + pb.shape[-1] * pb.amax(-1, keepdim=True)
    return vmax * mass / 254.0 + 1e-5 * vmax


ATTN_SHAPES = [  # b, hq, hkv, t, d, causal, window, pv_block
    (1, 2, 1, 7, 8, True, None, 4),
    (2, 4, 2, 37, 16, True, 5, 16),
    (1, 4, 2, 37, 128, True, 16, 64),
    (1, 4, 1, 130, 16, True, None, 64),
    (1, 2, 2, 33, 8, False, None, 8),
    (1, 2, 1, 20, 8, True, 1, 3),
]


@pytest.mark.parametrize("b,hq,hkv,t,d,causal,window,block", ATTN_SHAPES)
def test_attention_matches_float64_reference(b, hq, hkv, t, d, causal, window, block):
    name = f"attn{b}{hq}{hkv}{t}{d}{causal}{window}"
    q, k, v = _qkv(name, b, hq, hkv, t, d)
    o = attention(q, k, v, causal=causal, window=window, pv_block=block)
    go = _randn(name + "g", tuple(o.shape))
    o.backward(go)
    q64, k64, v64 = (_leaf(x.detach().double()) for x in (q, k, v))
    o64, p64 = _attention64(q64, k64, v64, causal, window)
    o64.backward(go.double())
    err = (o.detach().double() - o64.detach()).abs()
    assert bool((err <= _pv_bound(p64.detach(), v.detach(), block, hq // hkv)).all())
    assert float(err.max() / v.detach().abs().max()) <= 0.02
    for got, ref in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert _rel_to_max(got, ref) <= 1e-4


def test_default_scale_is_correctly_rounded():
    for d in (8, 16, 64, 128, 96):
        assert float(default_scale(d)) == float(torch.tensor(1.0 / math.sqrt(d), dtype=torch.float32))


def test_quantize_int8_round_trip():
    x = _randn("quant", (9, 40), 3.0)
    amax = x.abs().amax(-1, keepdim=True)
    q, s = quantize_int8(x, amax)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    assert bool(((q.float() * s - x).abs() <= s * (0.5 + 1e-6)).all())
    zq, zs = quantize_int8(torch.zeros(3, 4), torch.zeros(3, 1))
    assert bool((zq == 0).all()) and bool((zs == 0).all())


def test_pv_int8_equals_float64_sum_of_its_int8_blocks():
    p = torch.softmax(_randn("pvp", (2, 11, 45), 3.0).double(), -1).float()
    v = _randn("pvv", (2, 45, 8))
    got = pv_int8(p, v, 16)
    emu = torch.zeros(2, 11, 8, dtype=torch.float64)
    mag = torch.zeros_like(emu)
    for b0 in range(0, 45, 16):
        pb, vb = p[..., b0:b0 + 16], v[..., b0:b0 + 16, :]
        qp, sp = quantize_int8(pb, pb.amax(-1, keepdim=True))
        qv, sv = quantize_int8(vb, vb.abs().amax(-2, keepdim=True))
        term = torch.matmul(qp.double(), qv.double()) * sp.double() * sv.double()
        emu, mag = emu + term, mag + term.abs()
    # three float32 roundings per block term, one at the end
    assert bool(((got.double() - emu).abs() <= 3 * ULP * mag + ULP * emu.abs()).all())


def test_pv_int8_block_sum_is_exact_whatever_the_order():
    p = torch.softmax(_randn("pvo", (3, 50), 2.0).double(), -1).float()
    v = _randn("pvov", (50, 4))
    whole = pv_int8(p, v, 10)
    rev = pv_int8(torch.flip(p, [-1]), torch.flip(v, [-2]), 10)
    assert bits_equal(whole, rev)


def test_gqa_equals_explicit_head_expansion():
    q, k, v = _qkv("gqa", 2, 4, 2, 37, 16)
    o = attention(q, k, v, window=5, pv_block=16)
    go = _randn("gqag", tuple(o.shape))
    o.backward(go)
    ke, ve = _leaf(k.detach().repeat_interleave(2, 1)), _leaf(v.detach().repeat_interleave(2, 1))
    qe = _leaf(q.detach())
    oe = attention(qe, ke, ve, window=5, pv_block=16)
    oe.backward(go)
    # per-(row, column) contractions and per-kv-head quantizers: grouping changes no bit
    assert bits_equal(o, oe) and bits_equal(q.grad, qe.grad)
    dk_sum = ke.grad.view(2, 2, 2, 37, 16).double().sum(2)
    dv_sum = ve.grad.view(2, 2, 2, 37, 16).double().sum(2)
    assert _rel_to_max(k.grad, dk_sum) <= 1e-5 and _rel_to_max(v.grad, dv_sum) <= 1e-5


@pytest.mark.parametrize("window", [None, 5])
def test_keys_outside_the_mask_change_no_bit(window):
    q, k, v = _qkv(f"mask{window}", 1, 2, 1, 37, 8)
    j0 = 10
    o = attention(q.detach(), k.detach(), v.detach(), window=window, pv_block=8)
    k2 = k.detach().clone()
    k2[..., j0, :] += 1.0
    o2 = attention(q.detach(), k2, v.detach(), window=window, pv_block=8)
    sees = torch.tensor([j0 <= i and (window is None or i - j0 < window) for i in range(37)])
    assert bits_equal(o[..., ~sees, :], o2[..., ~sees, :])
    assert not bool((o[..., sees, :] == o2[..., sees, :]).all())


def test_attention_gradients_for_a_subset_of_inputs():
    q, k, v = _qkv("subset", 1, 2, 1, 9, 8)
    attention(q.detach(), k.detach(), v, pv_block=4).backward(torch.ones(1, 2, 9, 8))
    assert v.grad is not None and q.grad is None and k.grad is None


def test_non_finite_inputs_give_nan_not_garbage():
    q, k, v = (x.detach() for x in _qkv("nan", 1, 2, 1, 9, 8))
    v = v.clone()
    v[0, 0, 4, 3] = math.inf
    o = attention(q, k, v, pv_block=4)
    assert bool(torch.isnan(o[..., 3]).all())
    assert bool(torch.isfinite(o[..., [0, 1, 2, 4, 5, 6, 7]]).all())


# --- loss ---

def _loss64(h, w, t, zw, ignore=-100):
    logits = torch.matmul(h, w.t())
    lse = torch.logsumexp(logits, -1)
    valid = t != ignore
    ce = F.cross_entropy(logits, t, ignore_index=ignore)
    z = lse[valid].square().mean()
    return ce + zw * z, ce, z


def _loss_inputs(name, n, v, d, every=5):
    h = _leaf(_randn(f"{name}h", (n, d)))
    w = _leaf(_randn(f"{name}w", (v, d), 0.5))
    bits = philox.random_bits(seed_of(f"{name}t"), 0, n)
    t = torch.where(bits % every == 1, torch.full_like(bits, -100), bits % v)
    return h, w, t


@pytest.mark.parametrize("n,v,d,zw", [(7, 11, 8, 1e-4), (33, 257, 16, 1e-4), (130, 1000, 32, 1e-4),
                                      (40, 50, 8, 0.5)])
def test_loss_matches_float64(n, v, d, zw):
    h, w, t = _loss_inputs(f"ce{n}{v}", n, v, d)
    loss, ce, z = cross_entropy_zloss(h, w, t, z_weight=zw, chunk=TOKEN_BLOCK)
    loss.backward()
    h64, w64 = _leaf(h.detach().double()), _leaf(w.detach().double())
    l64, ce64, z64 = _loss64(h64, w64, t, zw)
    l64.backward()
    for got, ref in ((loss, l64), (ce, ce64), (z, z64)):
        assert abs(float(got.detach()) - float(ref.detach())) <= 1e-6 * abs(float(ref.detach()))
    assert _rel_to_max(h.grad, h64.grad) <= 1e-4
    assert _rel_to_max(w.grad, w64.grad) <= 1e-4
    assert bool((h.grad[t == -100] == 0).all())


def test_loss_error_falls_with_each_slice():
    """The head's slice count trades error for int8 products (1, 3, 6, 10): each slice more cuts the error of
    the loss, dh and dW vs float64 by well over 4x (measured 12-100x at this shape)."""
    h, w, t = _loss_inputs("cesl", 130, 1000, 32)
    h64, w64 = _leaf(h.detach().double()), _leaf(w.detach().double())
    l64 = _loss64(h64, w64, t, 1e-4)[0]
    l64.backward()
    errors = []
    for slices in (1, 2, 3, 4):
        hh, ww = _leaf(h), _leaf(w)
        loss = cross_entropy_zloss(hh, ww, t, slices=slices)[0]
        loss.backward()
        errors.append((abs(float(loss.detach()) - float(l64.detach())) / abs(float(l64.detach())),
                       _rel_to_max(hh.grad, h64.grad), _rel_to_max(ww.grad, w64.grad)))
    for fewer, more in zip(errors, errors[1:]):
        assert all(m * 4 < f for f, m in zip(fewer, more)), errors


def test_loss_bits_do_not_depend_on_chunk():
    h, w, t = _loss_inputs("cechunk", 2 * TOKEN_BLOCK + 300, 97, 16)  # 3, 2 and 1 chunks, the last partial
    outs = []
    for chunk in (TOKEN_BLOCK, 2 * TOKEN_BLOCK, 3 * TOKEN_BLOCK):
        hh, ww = _leaf(h), _leaf(w)
        loss, ce, z = cross_entropy_zloss(hh, ww, t, chunk=chunk)
        loss.backward(torch.tensor(0.37))
        outs.append((loss, ce, z, hh.grad, ww.grad))
    for other in outs[1:]:
        assert all(bits_equal(a, b) for a, b in zip(outs[0], other))


def test_loss_components_carry_no_gradient_and_all_ignored_is_zero():
    h, w, _ = _loss_inputs("ceig", 9, 13, 8)
    t = torch.full((9,), -100, dtype=torch.int64)
    loss, ce, z = cross_entropy_zloss(h, w, t)
    assert not ce.requires_grad and not z.requires_grad
    loss.backward()
    assert float(loss.detach()) == 0.0 and bool((h.grad == 0).all()) and bool((w.grad == 0).all())


def test_loss_without_grad_needs_no_backward_state():
    h, w, t = _loss_inputs("cenog", 9, 13, 8)
    with torch.no_grad():
        loss, _, _ = cross_entropy_zloss(h, w, t)
    ref = cross_entropy_zloss(h.detach(), w.detach(), t)[0]
    assert bits_equal(loss, ref)


# --- argument errors ---

def _raises(fn, *words):
    with pytest.raises(ValueError) as e:
        fn()
    for word in words:
        assert word in str(e.value), str(e.value)


def test_bad_arguments_name_op_and_argument():
    q, k, v = (x.detach() for x in _qkv("bad", 1, 4, 2, 5, 8))
    _raises(lambda: attention(q.double(), k, v), "attention", "'q'")
    _raises(lambda: attention(q, k[:, :, :4], v), "attention", "'k'")
    _raises(lambda: attention(q, k, v[..., :4]), "attention", "'v'")
    _raises(lambda: attention(q, torch.zeros(1, 3, 5, 8), torch.zeros(1, 3, 5, 8)), "attention", "'k'")
    _raises(lambda: attention(q, k, v, window=0), "attention", "'window'")
    _raises(lambda: attention(q, k, v, causal=False, window=3), "attention", "'window'")
    _raises(lambda: attention(q, k, v, pv_block=0), "attention", "'pv_block'")
    _raises(lambda: attention(q, k, v, scale=-1.0), "attention", "'scale'")
    h, w, t = _loss_inputs("badce", 6, 7, 4)
    _raises(lambda: cross_entropy_zloss(h.double(), w, t), "cross_entropy_zloss", "'h'")
    _raises(lambda: cross_entropy_zloss(h, w[:, :3], t), "cross_entropy_zloss", "'w_head'")
    _raises(lambda: cross_entropy_zloss(h, w, t.int()), "cross_entropy_zloss", "'targets'")
    _raises(lambda: cross_entropy_zloss(h, w, t[:5]), "cross_entropy_zloss", "'targets'")
    _raises(lambda: cross_entropy_zloss(h, w, torch.full((6,), 7)), "cross_entropy_zloss", "'targets'")
    _raises(lambda: cross_entropy_zloss(h, w, t, chunk=100), "cross_entropy_zloss", "'chunk'")
    _raises(lambda: cross_entropy_zloss(h, w, t, z_weight=-1.0), "cross_entropy_zloss", "'z_weight'")
    _raises(lambda: cross_entropy_zloss(h, w, t, slices=5), "cross_entropy_zloss", "'slices'")
    _raises(lambda: softmax(h.double()), "softmax", "'x'")
    _raises(lambda: softmax(h, 2), "softmax", "'dim'")
    _raises(lambda: logsumexp(h, -3), "logsumexp", "'dim'")


# --- bits ---

def test_cases_are_registered_with_unique_names():
    names = [c.name for c in registry(("attention",))]
    assert len(names) == len(set(names))
    for op in ("softmax", "logsumexp", "attention", "cross_entropy_zloss"):
        assert sum(c.op == op for c in registry(("attention",))) >= 2


def test_bits_do_not_depend_on_thread_count():
    before = torch.get_num_threads()
    try:
        runs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            runs.append([run_case(c, "cpu") for c in registry(("attention",))])
    finally:
        torch.set_num_threads(before)
    for c, a, b in zip(registry(("attention",)), *runs):
        for key in a:
            assert torch.equal(a[key].view(torch.int32), b[key].view(torch.int32)), f"{c.name}:{key}"
