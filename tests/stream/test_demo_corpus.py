import json

import stream
from stream.demo_corpus import DemoConfig, build_demo
from stream.fileio import blake3_file

SMALL = DemoConfig(code_bytes=60_000, prose_bytes=40_000, math_bytes=20_000, shard_bytes=30_000, vocab_size=600)


def test_demo_corpus_is_deterministic_and_streams(tmp_path):
    m1 = build_demo(tmp_path / "a", SMALL, progress=False)
    m2 = build_demo(tmp_path / "b", SMALL, progress=False)
    assert m1.digest == m2.digest  # same shards, same tokenizer, same counts
    for s in m1.sources:
        for e in s.shards:
            assert blake3_file(tmp_path / "b" / e.path) == e.blake3
    assert [s.name for s in m1.sources] == ["prose", "code", "math"]
    assert all(len(s.shards) >= 1 and s.documents > 0 for s in m1.sources)
    assert (tmp_path / "a" / "inputs.json").read_bytes() == (tmp_path / "b" / "inputs.json").read_bytes()
    inputs = json.loads((tmp_path / "a" / "inputs.json").read_text())
    assert inputs["stdlib_files"] and all(len(f["blake3"]) == 64 for f in inputs["stdlib_files"])
    s = stream.open_stream(tmp_path / "a", 128, 42)
    w = s.windows(0, 64)
    assert w.shape == (64, 129) and int(w.max()) < m1.vocab_size
