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
    assert err < 0.303, err  # 0.3019; codebooks rounded to FP4 at every EM step stalled at 0.3046 here
    assert stats[0]["damp_attempts"] == 1


def test_codebook_em_trains_in_float_and_ends_on_the_fp4_grid():
    g = torch.Generator().manual_seed(5)
    v = torch.randn(3000, 8, generator=g) * 3.0
    c0, c1, history = codebook.fit_codebooks(v, None, kmeans_iters=3, iters=3, beam=4, seed=1)
    assert torch.equal(fp4_round(c0), c0) and torch.equal(fp4_round(c1), c1)
    # float centroids between EM steps: an FP4-projected k-means would leave every atom on the grid
    c = codebook.kmeans(v, None, 3, torch.Generator().manual_seed(1))
    assert not torch.equal(fp4_round(c), c) and len(history) == 3


def test_grid_distance_is_zero_on_the_grid_and_half_a_spacing_midway():
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    assert not bool(codebook.grid_distance(torch.cat([grid, -grid])).any())
    mid = torch.tensor([0.25, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, -4.9])
    want = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.45])
    assert torch.allclose(codebook.grid_distance(mid), want, rtol=0, atol=1e-6)


def test_freeze_nearest_adds_the_free_entries_nearest_the_grid():
    g = torch.Generator().manual_seed(8)
    books = torch.randn(2, ATOMS, 8, generator=g) * 2.0
    frozen = torch.rand(2, ATOMS, 8, generator=g) < 0.1
    grown = codebook.freeze_nearest(books, frozen, 0.5)
    assert int(grown.sum()) == round(0.5 * books.numel()) and bool(grown[frozen].all())
    dist = codebook.grid_distance(books)
    assert float(dist[grown & ~frozen].max()) <= float(dist[~grown].min())


def _float_books(v: torch.Tensor):
    gen = torch.Generator().manual_seed(1)
    c0 = codebook.kmeans(v, None, 4, gen)
    a = codebook.nearest(v, c0)
    c1 = codebook.kmeans(v - c0[a], None, 4, gen)
    return c0, c1, a, codebook.nearest(v - c0[a], c1)


def test_rounding_in_stages_loses_less_than_rounding_at_once():
    """In-sample error after the books go to FP4: 5.205 in stages, 5.248 for c0 rounded at once with c1
    refit twice and rounded (the previous fit), 5.607 for both rounded at once; 5.184 in float."""
    v = torch.randn(4096, 8, generator=torch.Generator().manual_seed(5)) * 3.0
    c0, c1, a, b = _float_books(v)

    def err(c0, c1):
        a, b = codebook.assign_pair(v, c0, c1, beam=4, rounds=0)
        return float(codebook.weighted_error(v, c0[a] + c1[b], None).mean())

    s0, s1 = codebook.round_in_stages(v, None, c0, c1, a, b, steps=2, beam=4, rounds=0)
    assert torch.equal(fp4_round(s0), s0) and torch.equal(fp4_round(s1), s1)
    r0, r1 = fp4_round(c0), c1
    for _ in range(2):
        a, b = codebook.assign_pair(v, r0, r1, None, 0, a, b, beam=4)
        r1 = codebook.m_step(v - r0[a], b, None, r1, codebook.weighted_error(v, r0[a] + r1[b], None), project=False)
    assert err(s0, s1) < 0.995 * err(r0, fp4_round(r1)) and err(s0, s1) < 1.01 * err(c0, c1)
    with pytest.raises(ValueError, match="last stage must be 1.0"):
        codebook.round_in_stages(v, None, c0, c1, a, b, steps=1, beam=4, rounds=0, stages=(0.5, 0.75))


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
