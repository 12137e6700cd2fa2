import json

import numpy as np
import pytest
import zstandard

from stream.errors import ConfigError, StreamError
from stream.readers import read_bytes_zst, read_documents
from stream.sources import CorpusConfig, SourceConfig, load_corpus_config, shard_format
from tests.stream.conftest import write_jsonl, write_parquet


def test_jsonl_spans_point_at_lines_and_empty_documents_drop(tmp_path):
    p = tmp_path / "a.jsonl"
    write_jsonl(p, ["alpha", "beta é", "gamma"], blank_at=1)
    docs = read_documents(p)
    assert docs.texts == ["alpha", "beta é", "gamma"] and docs.unit == "byte"
    raw = p.read_bytes()
    for text, (a, b) in zip(docs.texts, docs.spans):
        assert json.loads(raw[a:b])["text"] == text


def test_jsonl_zst_spans_are_in_the_decompressed_stream(tmp_path):
    p = tmp_path / "a.jsonl.zst"
    write_jsonl(p, ["one", "two", "three"], compress=True)
    docs = read_documents(p)
    raw = zstandard.ZstdDecompressor().decompress(p.read_bytes())
    assert read_bytes_zst(p.read_bytes()) == raw
    assert docs.unit == "decompressed byte"
    assert [json.loads(raw[a:b])["text"] for a, b in docs.spans] == ["one", "two", "three"]


def test_parquet_with_configurable_column(tmp_path):
    p = tmp_path / "a.parquet"
    write_parquet(p, ["x", "", "z"], "content")
    docs = read_documents(p, "content")
    assert docs.texts == ["x", "z"] and docs.unit == "row"
    assert np.array_equal(docs.spans, [[0, 1], [2, 3]])
    with pytest.raises(StreamError, match="a.parquet"):
        read_documents(p, "text")


def test_bad_json_names_the_shard_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(StreamError, match=r"bad\.jsonl: line 2"):
        read_documents(p)


def test_configs_in_json_and_toml_agree(tmp_path):
    d = {"sources": [{"name": "web", "weight": 2, "shards": ["a.jsonl", "b.jsonl.zst"]},
                     {"name": "code", "weight": 0.5, "shards": ["c.parquet"], "text_column": "content"}]}
    (tmp_path / "c.json").write_text(json.dumps(d))
    (tmp_path / "c.toml").write_text('[[sources]]\nname = "web"\nweight = 2\nshards = ["a.jsonl", "b.jsonl.zst"]\n'
                                     '[[sources]]\nname = "code"\nweight = 0.5\nshards = ["c.parquet"]\ntext_column = "content"\n')
    a, b = load_corpus_config(tmp_path / "c.json"), load_corpus_config(tmp_path / "c.toml")
    assert a == b and a.root == tmp_path and a.sources[1].text_column == "content"
    assert [shard_format(s) for s in a.sources[0].shards] == ["jsonl", "jsonl.zst"]


@pytest.mark.parametrize("kw, field", [
    (dict(name="", shards=("a.jsonl",), weight=1.0), "name"),
    (dict(name="w", shards=(), weight=1.0), "shards"),
    (dict(name="w", shards=("a.txt",), weight=1.0), "unknown format"),
    (dict(name="w", shards=("a.jsonl",), weight=0.0), "weight"),
    (dict(name="w", shards=("a.jsonl",), weight=float("nan")), "weight"),
    (dict(name="w", shards=("a.jsonl", "a.jsonl"), weight=1.0), "duplicate"),
])
def test_bad_source_values_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=field):
        SourceConfig(**kw)


def test_duplicate_source_names_rejected():
    s = SourceConfig("w", ("a.jsonl",), 1.0)
    with pytest.raises(ConfigError, match="duplicate source name"):
        CorpusConfig(sources=(s, s))
