"""REAP saliency, domain mixing and the hot/cold split."""
import pytest
import torch

from quant.errors import ConfigError
from quant.saliency import mixed_scores, reap_scores, select_hot
from quant.synthetic import SyntheticConfig, build_layer


@pytest.fixture(scope="module")
def cap():
    return build_layer(SyntheticConfig(hidden=128, ffn=128, experts=4, tokens=512), layer=1)


def test_reap_is_gate_times_output_norm_over_routed_tokens(cap):
    s = reap_scores(cap)
    e = 2
    want = []
    for t in range(cap.x.shape[0]):
        for slot in range(cap.topk.shape[1]):
            if int(cap.topk[t, slot]) == e:
                y = cap.intermediate(e, cap.x[t:t + 1]) @ cap.w2[e].T
                want.append(float(cap.gates[t, slot]) * float(y.double().norm()))
    assert float(s[e]) == pytest.approx(sum(want) / len(want), rel=1e-5)
    assert (s >= 0).all() and s.dtype == torch.float64


def test_mixed_weighting(cap):
    text, other = reap_scores(cap, 0), reap_scores(cap, 1)
    m = mixed_scores(cap, 0.75)
    assert torch.allclose(m, 0.75 * text / text.sum() + 0.25 * other / other.sum())
    assert torch.allclose(mixed_scores(cap, 1.0), text / text.sum())
    with pytest.raises(ConfigError, match="text_weight"):
        mixed_scores(cap, 1.5)


def test_select_hot_by_count_share_and_scope():
    scores = {3: torch.tensor([0.1, 0.9, 0.3, 0.3]), 4: torch.tensor([0.5, 0.05, 0.8, 0.2])}
    assert select_hot(scores, count=3) == {3: [1], 4: [0, 2]}
    assert select_hot(scores, share=0.25) == {3: [1], 4: [2]}          # ceil(0.25 * 8) = 2
    assert select_hot(scores, count=1, scope="layer") == {3: [1], 4: [2]}
    assert select_hot(scores, count=2, scope="layer") == {3: [1, 2], 4: [0, 2]}  # tie 0.3/0.3: lower id
    assert select_hot(scores, count=0) == {3: [], 4: []}
    with pytest.raises(ConfigError, match="exactly one"):
        select_hot(scores, count=1, share=0.5)
