"""The initial fit: quality against the 2-bit bounds and baselines, damping, non-finite guards."""
import math

import pytest
import torch

from quant import baselines, codebook, ldlq, metrics
from quant.capture import LayerCapture
from quant.errors import FitError
from quant.fit import FitConfig, fit_projection
from quant.format import ATOMS, decode
from quant.fp_formats import fp4_round
from quant.hessian import damped_inverse_factor, expert_hessian
from quant.synthetic import SyntheticConfig, build_layer

SHANNON_2BIT = 0.25       # sqrt(2^-4): rate-distortion bound, Gaussian source, 2 bits/sample
LLOYD_MAX_2BIT = 0.3430   # sqrt(0.1175): optimal 4-level scalar quantizer of a Gaussian
FAST = FitConfig(sample_groups=4096, kmeans_iters=5, em_iters=4)


def test_gaussian_groups_beat_lloyd_max():
    """i.i.d. Gaussian weights, H = I (weight error): ARVQ below Lloyd-Max scalar, above Shannon."""
    g = torch.Generator().manual_seed(11)
    w = torch.randn(256, 512, generator=g)
    p, stats = fit_projection([w], [torch.eye(512)], [0], layer=0, projection="w13", cfg=FAST)
    err = metrics.weight_rel_error(w, decode(p, 0))
    rtn = metrics.weight_rel_error(w, baselines.rtn(w, baselines.global_for([w])))
    assert SHANNON_2BIT < err < LLOYD_MAX_2BIT and err < rtn, (err, rtn)
    assert err < 0.303, err  # 0.3015; codebooks rounded to FP4 at every EM step stalled at 0.3046 here
    assert stats[0]["damp_attempts"] == 1


def test_codebook_em_trains_in_float_and_ends_on_the_fp4_grid():
    g = torch.Generator().manual_seed(5)
    v = torch.randn(3000, 8, generator=g) * 3.0
    c0, c1, history = codebook.fit_codebooks(v, None, kmeans_iters=3, iters=3, beam=4, seed=1)
    assert torch.equal(fp4_round(c0), c0) and torch.equal(fp4_round(c1), c1)
    # float centroids between EM steps: an FP4-projected k-means would leave every atom on the grid
    c = codebook.kmeans(v, None, 3, torch.Generator().manual_seed(1))
    assert not torch.equal(fp4_round(c), c) and len(history) == 3


def test_m_step_reseeds_empty_atoms_at_the_worst_samples_in_order():
    g = torch.Generator().manual_seed(6)
    target, err = torch.randn(40, 8, generator=g), torch.rand(40, generator=g)
    assign = torch.randint(0, ATOMS - 3, (40,), generator=g)
    c = codebook.m_step(target, assign, None, torch.zeros(ATOMS, 8), err, project=False)
    empty = [k for k in range(ATOMS) if not bool((assign == k).any())]
    worst = torch.topk(err, len(err)).indices
    assert len(empty) > 40 and torch.equal(c[empty[:40]], target[worst])
    assert not bool(c[empty[40:]].any())  # more empty atoms than samples: the rest keep their old value
    k = int(assign[0])
    assert torch.allclose(c[k], target[assign == k].mean(0), rtol=1e-6, atol=1e-6)


def test_group_inverses_invert_every_diagonal_block():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(256, 64, generator=g)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(x.T @ x / 256)), upper=True)
    t = ldlq.group_inverses(u)
    for i in range(8):
        blk = u[8 * i:8 * i + 8, 8 * i:8 * i + 8]
        assert torch.allclose(blk @ t[i], torch.eye(8), atol=1e-4), i  # float32 8x8 triangular solve


@pytest.fixture(scope="module")
def moe():
    cap = build_layer(SyntheticConfig(hidden=256, ffn=128, experts=3, tokens=2048), layer=3)
    return cap.split(0.25)


@pytest.mark.parametrize("projection", ["w13", "w2"])
def test_synthetic_moe_arvq_beats_rtn_and_gptq(moe, projection):
    """Held-out output error ||(W - Wq) X|| / ||W X||, pooled over two experts."""
    cal, held = moe
    experts = [0, 1]
    ws = [cal.weight(projection, e) for e in experts]
    hs = [expert_hessian(cal, projection, e).h for e in experts]
    xs = [held.inputs(projection, e, held.routed(e)[0]) for e in experts]
    p, _ = fit_projection(ws, hs, experts, layer=3, projection=projection, cfg=FAST)
    glob = baselines.global_for(ws)
    err = {
        "arvq": metrics.pooled([metrics.output_sq(w, decode(p, i), x) for i, (w, x) in enumerate(zip(ws, xs))]),
        "rtn": metrics.pooled([metrics.output_sq(w, baselines.rtn(w, glob), x) for w, x in zip(ws, xs)]),
        "gptq": metrics.pooled([metrics.output_sq(w, baselines.gptq(w, h, glob, "t"), x)
                                for w, h, x in zip(ws, hs, xs)]),
    }
    assert err["arvq"] < err["gptq"] and err["arvq"] < err["rtn"], err
    assert all(math.isfinite(v) and v > 0 for v in err.values())


def test_fit_is_deterministic(moe):
    cal, _ = moe
    w, h = cal.weight("w2", 0), expert_hessian(cal, "w2", 0).h
    cfg = FitConfig(sample_groups=512, kmeans_iters=2, em_iters=1, passes=1)
    a, _ = fit_projection([w], [h], [0], layer=3, projection="w2", cfg=cfg)
    b, _ = fit_projection([w], [h], [0], layer=3, projection="w2", cfg=cfg)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.codebooks, b.codebooks)
    assert torch.equal(a.scales.view(torch.uint8), b.scales.view(torch.uint8))


def _indefinite(lam: float, k: int = 16) -> torch.Tensor:
    """Unit diagonal, 2x2 blocks [[1, c], [c, 1]]: eigenvalues 1 +- c, so the smallest is -lam."""
    h = torch.eye(k)
    for i in range(0, k, 2):
        h[i, i + 1] = h[i + 1, i] = 1.0 + lam
    return h


def test_damping_escalates_by_four():
    # mean diag 1: damp 1e-3 * 4^(t-1) first exceeds 2 at t = 7
    f = damped_inverse_factor(_indefinite(2.0), "layer 3 expert 5 projection w2")
    assert f.attempts == 7 and f.damp == pytest.approx(1e-3 * 4 ** 6)
    hinv = torch.linalg.inv(_indefinite(2.0) + f.damp * torch.eye(16))
    assert torch.allclose(f.u.T @ f.u, hinv, rtol=1e-4, atol=1e-5)


def test_damping_gives_up_after_12_naming_the_place():
    with pytest.raises(FitError, match=r"layer 3 expert 5 projection w2: Cholesky .* failed 12 times"):
        damped_inverse_factor(_indefinite(1e7), "layer 3 expert 5 projection w2")


def test_nan_activation_names_layer_expert_projection(moe):
    cal, _ = moe
    tok = cal.routed(1)[0][0]
    x = cal.x.clone()
    x[tok, 7] = float("nan")
    bad = LayerCapture(cal.layer, x, cal.topk, cal.gates, cal.w13, cal.w2, cal.domain)
    with pytest.raises(FitError, match="layer 3 expert 1 projection w13: captured activations"):
        expert_hessian(bad, "w13", 1)
    with pytest.raises(FitError, match="layer 3 expert 1 projection w2: SwiGLU intermediate"):
        expert_hessian(bad, "w2", 1)


def test_nan_weight_names_layer_expert_projection(moe):
    cal, _ = moe
    w = cal.weight("w2", 2).clone()
    w[3, 4] = float("inf")
    h = expert_hessian(cal, "w2", 2).h
    with pytest.raises(FitError, match="layer 3 expert 2 projection w2: weight has 1 non-finite"):
        fit_projection([cal.weight("w2", 0), w], [h, h], [0, 2], layer=3, projection="w2", cfg=FAST)


def test_rare_expert_falls_back_to_all_tokens():
    cap = build_layer(SyntheticConfig(hidden=128, ffn=128, experts=4, tokens=1024), layer=0)
    rare = cap.n_experts - 1
    assert len(cap.routed(rare)[0]) < 32
    h = expert_hessian(cap, "w13", rare)
    assert h.fallback and h.tokens == 1024
    assert not expert_hessian(cap, "w13", 0).fallback
