import hashlib
from fractions import Fraction

import numpy as np
import pytest

from stream.errors import ConfigError
from stream.mix import (MixGenerator, doc_key, mix_key, mix_probabilities, mix_thresholds, permutation,
                        pick_sources, shard_key, source_hash)


def test_keys_follow_the_documented_encoding():
    seed = (42).to_bytes(8, "big")
    h = hashlib.sha256(b"web").digest()
    assert source_hash("web") == h
    for key, payload in [(mix_key(42), b"stream/mix\0" + seed),
                         (shard_key(42, "web", 3), b"stream/shards\0" + seed + h + (3).to_bytes(8, "big")),
                         (doc_key(42, "web", 3, 5), b"stream/docs\0" + seed + h + (3).to_bytes(8, "big") + (5).to_bytes(8, "big"))]:
        d = hashlib.sha256(payload).digest()
        assert key.tolist() == [int.from_bytes(d[:8], "little"), int.from_bytes(d[8:16], "little")]


def test_golden_values_pin_the_generators():
    # numpy guarantees Philox's raw stream across versions; these values must never change
    assert mix_key(42).tolist() == [13947889668749337830, 13008220338008899013]
    assert MixGenerator(42).draw(3).tolist() == [16312795249289919942, 7918561115722153355, 757166685761122315]
    assert permutation(shard_key(42, "web", 0), 10).tolist() == [0, 8, 2, 9, 6, 4, 1, 3, 7, 5]
    assert permutation(doc_key(42, "web", 3, 1), 10).tolist() == [9, 2, 1, 4, 8, 6, 3, 7, 0, 5]


def test_keys_separate_seed_source_epoch_and_shard():
    keys = {tuple(k.tolist()) for k in [shard_key(1, "a", 0), shard_key(2, "a", 0), shard_key(1, "b", 0),
                                         shard_key(1, "a", 1), doc_key(1, "a", 0, 0), doc_key(1, "a", 0, 1), mix_key(1)]}
    assert len(keys) == 7
    with pytest.raises(ConfigError, match="seed"):
        mix_key(-1)


def test_permutation_is_a_permutation():
    for n in (0, 1, 2, 17, 1000):
        p = permutation(shard_key(7, "x", n), n)
        assert sorted(p.tolist()) == list(range(n))


def test_mix_generator_seek_is_exact_and_state_canonical():
    g = MixGenerator(9)
    ref = g.draw(50)
    for k in (0, 1, 3, 4, 5, 17, 49):
        h = MixGenerator(9)
        h.seek(k)
        assert np.array_equal(h.draw(50 - k), ref[k:])
        assert MixGenerator.canonical_state(9, k) == MixGenerator.canonical_state(9, k)
        assert MixGenerator.canonical_state(9, k)["position"] == k


def test_probabilities_are_share_over_mean_length_exactly():
    p = mix_probabilities([0.5, 0.25, 0.25], [10, 20, 5], [990, 380, 45])
    # mean lengths with separator: 100, 20, 10 -> raw 0.005, 0.0125, 0.025
    assert p == [Fraction(2, 17), Fraction(5, 17), Fraction(10, 17)]


def test_thresholds_are_integer_and_pick_matches_them():
    p = [Fraction(1, 3), Fraction(1, 6), Fraction(1, 2)]
    t = mix_thresholds(p)
    assert t.dtype == np.uint64 and t.tolist() == [(1 << 64) // 3, (1 << 64) // 2]
    u = np.array([0, int(t[0]) - 1, int(t[0]), int(t[1]) - 1, int(t[1]), (1 << 64) - 1], dtype=np.uint64)
    assert pick_sources(t, u).tolist() == [0, 0, 1, 1, 2, 2]
    draws = MixGenerator(3).draw(60_000)
    freq = np.bincount(pick_sources(t, draws), minlength=3) / draws.size
    assert np.allclose(freq, [1 / 3, 1 / 6, 1 / 2], atol=0.01)
    with pytest.raises(ConfigError):
        mix_thresholds([Fraction(1, 2), Fraction(1, 3)])
