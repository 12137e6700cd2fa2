import numpy as np
import pytest

import stream
import stream.windows as W
from stream.cache import cache_path, read_cache
from stream.errors import StreamError
from stream.mix import MixGenerator, doc_key, permutation, pick_sources, shard_key
from tests.stream.conftest import SEED, SEQ_LEN

L = SEQ_LEN + 1


def reference_tokens(root, seed, n_tokens):
    """The stream written out from the specification, one document at a time, sharing no engine code."""
    m = stream.load_manifest(root)
    s = stream.open_stream(root, SEQ_LEN, seed)  # only for its exact thresholds (tested in test_mix)
    caches = [[read_cache(cache_path(root / "cache", e.blake3, m.tokenizer_blake3)) for e in src.shards]
              for src in m.sources]
    used = [0] * len(m.sources)
    mix = MixGenerator(seed)
    out = []
    total = 0
    while total < n_tokens:
        si = int(pick_sources(s.thresholds, mix.draw(1))[0])
        src = m.sources[si]
        n = src.documents
        epoch, pos = divmod(used[si], n)
        used[si] += 1
        for h in permutation(shard_key(seed, src.name, epoch), len(src.shards)).tolist():
            k = src.shards[h].documents
            if pos < k:
                d = int(permutation(doc_key(seed, src.name, epoch, h), k)[pos])
                st = caches[si][h]
                doc = st.tokens[st.offsets[d]:st.offsets[d + 1]]
                assert doc[-1] == m.separator_id
                out.append(doc)
                total += doc.size
                break
            pos -= k
    return np.concatenate(out)


def test_windows_are_the_specified_stream_cut_into_seq_len_plus_one(tiny_corpus):
    s = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
    n = 2500  # several epochs of every source
    got = s.windows(0, n)
    assert got.shape == (n, L) and got.dtype == np.int32
    ref = reference_tokens(tiny_corpus, SEED, n * L)
    assert np.array_equal(got.reshape(-1), ref[:n * L])


@pytest.mark.parametrize("loop_min, block", [(1, 1 << 17), (10 ** 9, 1 << 17), (64, 3)])
def test_gather_paths_and_block_sizes_give_the_same_bits(tiny_corpus, monkeypatch, loop_min, block):
    ref = stream.open_stream(tiny_corpus, SEQ_LEN, SEED).windows(0, 800)
    monkeypatch.setattr(W, "_LOOP_MIN_TOKENS", loop_min)
    monkeypatch.setattr(W, "_MAX_BLOCK", block)
    s = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
    parts = [s.windows(a, b) for a, b in [(0, 1), (1, 7), (7, 300), (300, 301), (301, 800)]]
    assert np.array_equal(np.concatenate(parts), ref)


def test_window_take_and_skips_agree(tiny_corpus):
    ref = stream.open_stream(tiny_corpus, SEQ_LEN, SEED).windows(0, 400)
    s = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
    assert np.array_equal(s.window(5), ref[5])
    assert np.array_equal(s.take([10, 11, 12, 50, 399]), ref[[10, 11, 12, 50, 399]])
    s.advance(390)
    assert np.array_equal(s.windows(390, 400), ref[390:])
    with pytest.raises(StreamError, match="behind"):
        s.window(3)
    s.seek(3)  # no states given: back to the start, then forward
    assert np.array_equal(s.window(3), ref[3])
    with pytest.raises(StreamError, match="ascending"):
        s.take([5, 4])


def test_seed_and_seq_len_change_the_stream(tiny_corpus):
    a = stream.open_stream(tiny_corpus, SEQ_LEN, SEED).windows(0, 50).reshape(-1)
    b = stream.open_stream(tiny_corpus, SEQ_LEN, SEED + 1).windows(0, 50).reshape(-1)
    c = stream.open_stream(tiny_corpus, 2 * SEQ_LEN + 1, SEED).windows(0, 25).reshape(-1)
    assert not np.array_equal(a, b)
    assert np.array_equal(a, c)  # the buffer is the same; only the cut changes


def test_token_shares_follow_the_weights(tiny_corpus):
    s = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
    s._generate(30_000 * L)  # ~1M tokens of document records
    lg = s._log
    tok = np.bincount(lg["src"], weights=lg["length"], minlength=3)
    assert np.allclose(tok / tok.sum(), [0.6, 0.25, 0.15], atol=0.02)
