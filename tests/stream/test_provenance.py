import json

import numpy as np

import stream
from app.cli import main as cli
from stream.provenance import step_provenance
from stream.readers import read_documents
from tests.stream.conftest import SEED, SEQ_LEN
from tests.stream.test_schedule import SCHED


def test_provenance_rows_rebuild_every_window_of_the_step(tiny_corpus):
    s = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
    step = 37
    rows = step_provenance(s, SCHED, step, world=4)
    a, b = SCHED.window_range(step)
    ref = stream.open_stream(tiny_corpus, SEQ_LEN, SEED).windows(a, b)
    m = s.manifest
    texts = {}
    for w in range(a, b):
        pieces = []
        for r in (r for r in rows if r["window"] == w):
            assert r["rank"] == w % 4 and r["step"] == step
            si = [x.name for x in m.sources].index(r["source"])
            st = s.store.get(si, r["shard_index"])
            lo, hi = r["tokens"]
            pieces.append(st.tokens[st.offsets[r["document"]] + lo:st.offsets[r["document"]] + hi])
            # the span points at the document in the shard file (decompressed for .zst, rows for parquet)
            key = (r["shard"], r["document"])
            if key not in texts:
                docs = read_documents(tiny_corpus / r["shard"], m.sources[si].text_column)
                texts[key] = (docs.texts[r["document"]], docs.spans[r["document"]].tolist())
            assert texts[key][1] == r["span"]
        assert np.array_equal(np.concatenate(pieces), ref[w - a])


def test_cli_inspect_prints_a_table_and_json(tiny_corpus, capsys):
    assert cli(["data", "inspect", "--step", "2", "--corpus", str(tiny_corpus), "--seq-len", str(SEQ_LEN),
                "--seed", str(SEED), "--windows-per-step", "4", "--world", "2"]) == 0
    out = capsys.readouterr().out
    assert "step 2: windows [8, 12)" in out and "web" in out
    assert cli(["data", "inspect", "--step", "2", "--corpus", str(tiny_corpus), "--seq-len", str(SEQ_LEN),
                "--seed", str(SEED), "--windows-per-step", "4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["window"] for r in rows} == {8, 9, 10, 11}
    assert all(r["id"] for r in rows if not r["shard"].endswith(".parquet"))
