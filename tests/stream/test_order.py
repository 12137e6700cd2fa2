import numpy as np

from stream.order import SourceOrder


def test_every_epoch_visits_every_document_once_shard_by_shard():
    o = SourceOrder(5, "web", [4, 7, 1, 5])
    n = o.n
    shards, docs = o.locate(0, 3 * n)
    for e in range(3):
        sh, dc = shards[e * n:(e + 1) * n], docs[e * n:(e + 1) * n]
        assert sorted(zip(sh.tolist(), dc.tolist())) == [(h, d) for h, k in enumerate([4, 7, 1, 5]) for d in range(k)]
        runs = [int(h) for i, h in enumerate(sh) if i == 0 or sh[i - 1] != h]
        assert sorted(runs) == [0, 1, 2, 3]  # each shard is one contiguous run in its epoch
    assert not np.array_equal(shards[:n], shards[n:2 * n]) or not np.array_equal(docs[:n], docs[n:2 * n])


def test_locate_is_independent_of_how_it_is_split():
    o = SourceOrder(5, "web", [4, 7, 1, 5])
    ref = o.locate(0, 100)
    fresh = SourceOrder(5, "web", [4, 7, 1, 5])
    parts = [fresh.locate(a, b - a) for a, b in [(0, 3), (3, 4), (4, 40), (40, 41), (41, 100)]]
    assert np.array_equal(np.concatenate([p[0] for p in parts]), ref[0])
    assert np.array_equal(np.concatenate([p[1] for p in parts]), ref[1])


def test_one_document_source():
    shards, docs = SourceOrder(1, "x", [1]).locate(0, 5)
    assert shards.tolist() == [0] * 5 and docs.tolist() == [0] * 5
