"""benchmarks/attention_vs_stock.py's floor arithmetic (no GPU needed): the pairs it counts are the mask's."""
import pytest
import torch

from benchmarks.attention_vs_stock import floor_ms, pairs_seen
from kernels.ref.attention import allowed_keys


@pytest.mark.parametrize("t, window", [(1, 1), (7, 1), (7, 3), (64, 16), (65, 64), (64, 64), (33, 100)])
def test_pairs_seen_counts_the_window_mask(t, window):
    assert pairs_seen(t, window) == int(allowed_keys(t, True, window).sum())


def test_pairs_seen_without_a_window_is_the_causal_triangle():
    t = 37
    assert pairs_seen(t, None) == int(torch.ones(t, t, dtype=torch.bool).tril().sum())


def test_floor_is_the_longer_of_compute_and_memory():
    slow_memory = floor_ms(1, 16, 4, 2048, 128, None, bandwidth=1e9)
    fast_memory = floor_ms(1, 16, 4, 2048, 128, None, bandwidth=1e15)
    assert slow_memory == pytest.approx(4 * 2048 * 128 * (4 * 16 + 4 * 4) / 1e9 * 1e3)
    assert fast_memory == pytest.approx(31 * 2 * 16 * pairs_seen(2048, None) * 128 / 1979e12 * 1e3)
    assert floor_ms(1, 16, 4, 2048, 128, 512, bandwidth=1e15) < fast_memory
