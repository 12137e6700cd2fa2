"""A tiny three-source corpus in all three shard formats, built once per session in a temporary directory."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

WORDS = ("the of and to in is was for on that with as by at from this data stream window token shard seed "
         "epoch rank model step loss batch replay audit digest source mix order bit exact").split()


def _draws(tag: bytes, n: int) -> list[int]:
    return np.random.Philox(key=np.frombuffer(tag.ljust(16, b"\0")[:16], dtype="<u8").astype(np.uint64)).random_raw(n).tolist()


def web_docs(n: int) -> list[str]:
    r = iter(_draws(b"web", 100_000))
    docs = []
    for _ in range(n):
        k = 3 + next(r) % 120  # short and long documents: both gather paths get exercised
        docs.append(" ".join(WORDS[next(r) % len(WORDS)] for _ in range(k)).capitalize() + ".")
    return docs


def code_docs(n: int) -> list[str]:
    r = iter(_draws(b"code", 100_000))
    return ["\n".join(f"def f_{next(r) % 100}(x):\n    return x * {next(r) % 10} + {next(r) % 100}"
                      for _ in range(1 + next(r) % 12)) for _ in range(n)]


def math_docs(n: int) -> list[str]:
    r = iter(_draws(b"math", 100_000))
    out = []
    for _ in range(n):
        lines = []
        for _ in range(1 + next(r) % 8):
            a, b = next(r) % 1000, next(r) % 1000
            lines.append(f"{a} + {b} = {a + b}")
        out.append("\n".join(lines))
    return out


def write_jsonl(path: Path, texts: list[str], field: str = "text", compress: bool = False, blank_at: int | None = None) -> None:
    lines = []
    for i, t in enumerate(texts):
        if i == blank_at:
            lines.append(json.dumps({field: ""}))  # an empty document: dropped at read time
        lines.append(json.dumps({"id": f"{path.stem}/{i}", field: t}))
    data = ("\n".join(lines) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(data) if compress else data)


def write_parquet(path: Path, texts: list[str], column: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({column: texts}), path)


def make_tiny_corpus(root: Path, vocab_size: int = 400) -> Path:
    """Write shards and a TOML config, then prepare (tokenizer + manifest + cache). Returns the config path."""
    from stream.prepare import prepare_corpus

    web, code, math = web_docs(150), code_docs(60), math_docs(90)
    for i in range(3):
        write_jsonl(root / f"web/web-{i}.jsonl.zst", web[i * 50:(i + 1) * 50], compress=True)
    for i in range(2):
        write_parquet(root / f"code/code-{i}.parquet", code[i * 30:(i + 1) * 30], "content")
    write_jsonl(root / "math/math-0.jsonl", math[:60], blank_at=7)
    write_jsonl(root / "math/math-1.jsonl", math[60:])
    cfg = root / "corpus.toml"
    cfg.write_text('''tokenizer = "tokenizer.json"

[[sources]]
name = "web"
weight = 0.6
shards = ["web/web-0.jsonl.zst", "web/web-1.jsonl.zst", "web/web-2.jsonl.zst"]

[[sources]]
name = "code"
weight = 0.25
text_column = "content"
shards = ["code/code-0.parquet", "code/code-1.parquet"]

[[sources]]
name = "math"
weight = 0.15
shards = ["math/math-0.jsonl", "math/math-1.jsonl"]
''')
    prepare_corpus(cfg, vocab_size=vocab_size, progress=False)
    return cfg


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared corpus directory (read-only by convention: tests that damage it use `tiny_copy`)."""
    root = tmp_path_factory.mktemp("tiny")
    make_tiny_corpus(root)
    return root


@pytest.fixture
def tiny_copy(tiny_corpus: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny corpus, cache included, free to damage."""
    dst = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, dst)
    return dst


SEQ_LEN = 32
SEED = 1234
