"""The calibration corpus builder: deterministic, held-out documents excluded, exact-match purge, drift refused."""
import json

import blake3
import pytest
import zstandard

from quant.calib import CalibConfig, build
from quant.errors import IntegrityError


def _corpus(root):
    """Three sources of generated documents, zstd jsonl shards, a manifest with blake3s, a word tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = [f"w{i}" for i in range(200)]
    vocab = {"<|endoftext|>": 0, **{w: i + 1 for i, w in enumerate(words)}, "[UNK]": 201}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(root / "tokenizer.json"))
    sources = []
    for si, name in enumerate(("code", "prose", "math")):
        docs = [" ".join(words[(si * 31 + d * 7 + j * (d % 5 + 1)) % 200] for j in range(150)) for d in range(20)]
        data = zstandard.ZstdCompressor().compress("".join(json.dumps({"text": t}) + "\n" for t in docs).encode())
        path = root / f"{name}.jsonl.zst"
        path.write_bytes(data)
        sources.append({"name": name, "shards": [{"path": path.name, "blake3": blake3.blake3(data).hexdigest()}]})
    (root / "manifest.json").write_text(json.dumps({"sources": sources}))


def test_build_is_deterministic_excludes_held_out_and_purges(tmp_path):
    _corpus(tmp_path)
    cfg = CalibConfig(corpus=str(tmp_path), seq_len=16, train=20, val=5, audit=5, purge_ngram=8)
    a, b = build(cfg), build(cfg)
    assert a["stats"]["blake3"] == b["stats"]["blake3"]
    assert a["train"].shape == (20, 17) and a["val"].shape[0] + a["audit"].shape[0] == 10
    assert all(v["held_out_documents"] == 2 for v in a["stats"]["sources"].values())
    # splits are disjoint windows
    rows = {tuple(r) for s in ("train", "val", "audit") for r in a[s].tolist()}
    assert len(rows) == 30
    # a held-out window given by the caller purges every training window sharing an 8-token run with it
    c = build(cfg, extra_held_out=a["train"][:3])
    assert sum(c["stats"]["purged_windows"].values()) >= sum(a["stats"]["purged_windows"].values()) + 3
    assert not ({tuple(r) for r in a["train"][:3].tolist()} & {tuple(r) for r in c["train"].tolist()})


def test_a_changed_shard_is_refused(tmp_path):
    _corpus(tmp_path)
    (tmp_path / "math.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "w1 w2"}\n'))
    with pytest.raises(IntegrityError, match="math.jsonl.zst"):
        build(CalibConfig(corpus=str(tmp_path), seq_len=16, train=4, val=1, audit=1))
