import json
import os

import numpy as np
import pytest

import stream
from stream.cache import cache_path, read_cache
from stream.errors import IntegrityError, StreamError
from stream.fileio import blake3_file
from stream.manifest import load_manifest
from tests.stream.conftest import SEED, SEQ_LEN


def _entry(root, source="web", shard=1):
    m = load_manifest(root)
    src = next(s for s in m.sources if s.name == source)
    return m, src.shards[shard]


def test_manifest_records_digests_counts_and_tokenizer(tiny_corpus):
    m = load_manifest(tiny_corpus)
    assert m.tokenizer_blake3 == blake3_file(tiny_corpus / "tokenizer.json")
    for s in m.sources:
        for e in s.shards:
            assert e.blake3 == blake3_file(tiny_corpus / e.path)
            assert e.bytes == (tiny_corpus / e.path).stat().st_size
            st = read_cache(cache_path(tiny_corpus / "cache", e.blake3, m.tokenizer_blake3))
            assert (st.documents, st.text_tokens) == (e.documents, e.tokens)
            assert st.tokens.dtype == np.int32 and st.offsets.dtype == np.int64
            # every document ends with the separator
            assert np.all(st.tokens[st.offsets[1:] - 1] == m.separator_id)
    assert [s.documents for s in m.sources] == [150, 60, 90]  # the blank math line was dropped
    assert m.digest == load_manifest(tiny_corpus).digest


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing"])
def test_damaged_shard_is_an_error_naming_it_and_both_digests(tiny_copy, damage):
    m, e = _entry(tiny_copy)
    path = tiny_copy / e.path
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[:-7]))
    else:
        path.unlink()
    with pytest.raises(IntegrityError) as ei:
        stream.open_stream(tiny_copy, SEQ_LEN, SEED)
    msg = str(ei.value)
    assert e.path in msg and e.blake3 in msg
    if damage == "missing":
        assert "missing" in msg
    else:
        actual = blake3_file(path)
        assert actual in msg and ei.value.actual == actual != e.blake3
    if damage == "truncate":
        assert "truncated" in msg


def test_lazy_verification_fails_when_the_shard_is_first_used(tiny_copy):
    m, e = _entry(tiny_copy, "math", 0)
    (tiny_copy / e.path).write_bytes((tiny_copy / e.path).read_bytes() + b"\n")
    s = stream.open_stream(tiny_copy, SEQ_LEN, SEED, verify="lazy")  # opens: math shard not read yet
    with pytest.raises(IntegrityError, match="math-0.jsonl"):
        s.windows(0, 2000)


def test_changed_tokenizer_is_an_integrity_error(tiny_copy):
    p = tiny_copy / "tokenizer.json"
    p.write_bytes(p.read_bytes().replace(b'"<|endoftext|>"', b'"<|endoftext|> "', 1))
    with pytest.raises(IntegrityError, match="tokenizer"):
        stream.open_stream(tiny_copy, SEQ_LEN, SEED)


def test_cache_is_reused_and_rebuilt_when_missing(tiny_copy):
    s = stream.open_stream(tiny_copy, SEQ_LEN, SEED)
    ref = s.windows(0, 2000)  # about three epochs: every shard is read
    files = sorted((tiny_copy / "cache").rglob("*.npz.zst"))
    assert len(files) == 7
    mtimes = [f.stat().st_mtime_ns for f in files]
    stream.open_stream(tiny_copy, SEQ_LEN, SEED).windows(0, 2000)
    assert [f.stat().st_mtime_ns for f in files] == mtimes  # read, not rewritten
    for f in files:
        f.unlink()
    again = stream.open_stream(tiny_copy, SEQ_LEN, SEED).windows(0, 2000)  # re-tokenized from verified shards
    assert np.array_equal(ref, again)
    assert sorted((tiny_copy / "cache").rglob("*.npz.zst")) == files


def test_damaged_cache_is_reported_not_used(tiny_copy):
    m, e = _entry(tiny_copy, "web", 0)
    c = cache_path(tiny_copy / "cache", e.blake3, m.tokenizer_blake3)
    data = bytearray(c.read_bytes())
    data[len(data) // 2] ^= 0xFF
    c.write_bytes(bytes(data))
    with pytest.raises(StreamError, match=c.name):
        stream.open_stream(tiny_copy, SEQ_LEN, SEED).windows(0, 2000)


def test_cache_files_hold_no_pickles(tiny_corpus):
    import io

    import zstandard
    for f in (tiny_corpus / "cache").rglob("*.npz.zst"):
        raw = zstandard.ZstdDecompressor().decompress(f.read_bytes())
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            assert sorted(z.files) == ["offsets", "spans", "tokens", "unit"]
            assert all(z[k].dtype != object for k in z.files)


def test_writes_are_atomic_no_temp_files_left(tiny_corpus):
    leftovers = [p for p in tiny_corpus.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []
    assert json.loads((tiny_corpus / "manifest.json").read_text())["format"] == "stream-manifest/1"
    assert oct((tiny_corpus / "manifest.json").stat().st_mode & 0o777) == oct(0o644)
    assert os.access(tiny_corpus / "manifest.json", os.R_OK)
