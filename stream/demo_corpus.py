"""The embedded demo corpus: built from text every machine with this project installed has, no network.

Three sources, written as zstd jsonl shards with a corpus config, a tokenizer and a manifest:
  code  : Python standard-library modules (top-level `.py` files, sorted by name, up to a byte budget)
  prose : their docstrings (one document per module) and the pydoc help topics (`pydoc_data/topics.py`)
  math  : generated arithmetic worked examples (integer arithmetic from a fixed-key Philox, no floats)
Deterministic for the same inputs: file lists are sorted, nothing depends on mtimes, absolute paths or
set order. Standard libraries differ between Python versions, so `inputs.json` records every input
file with its blake3; two machines agree on digests when they agree on that list.
"""
from __future__ import annotations

import ast
import io
import json
import sys
import sysconfig
import tokenize
from dataclasses import dataclass
from math import gcd  # integer gcd: exact, no libm
from pathlib import Path

import numpy as np
import zstandard

from stream.errors import ConfigError
from stream.fileio import atomic_write_bytes, atomic_write_json, blake3_bytes
from stream.manifest import Manifest, build_manifest
from stream.sources import CorpusConfig, SourceConfig
from stream.tokenizer import TokenizerConfig, sample_texts, train_tokenizer


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo corpus: a few MB, so building and tokenizer training take seconds on 2 cores."""

    code_bytes: int = 1_500_000
    prose_bytes: int = 1_200_000
    math_bytes: int = 400_000
    max_file_bytes: int = 120_000  # skip the largest modules: more, smaller documents
    shard_bytes: int = 320_000  # text per shard (before compression)
    vocab_size: int = 4096
    weights: tuple[tuple[str, float], ...] = (("prose", 0.5), ("code", 0.3), ("math", 0.2))

    def __post_init__(self) -> None:
        for f in ("code_bytes", "prose_bytes", "math_bytes", "max_file_bytes", "shard_bytes"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1000:
                raise ConfigError(f"demo.{f}: expected an int >= 1000, got {v!r}")
        TokenizerConfig(vocab_size=self.vocab_size)


def stdlib_dir() -> Path:
    """The running interpreter's standard library (the base one, also inside a venv)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _read_source(path: Path) -> tuple[bytes, str]:
    raw = path.read_bytes()
    enc, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    return raw, raw.decode(enc)


def _module_files(lib: Path) -> list[Path]:
    # _sysconfigdata* holds this machine's build paths: not the same text on two machines
    return sorted((p for p in lib.glob("*.py") if p.is_file() and not p.name.startswith("_sysconfigdata")),
                  key=lambda p: p.name)


def _docstrings(name: str, text: str) -> str:
    """One prose document: a module's docstring and those of its classes and functions, in file order."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return ""
    parts = []
    doc = ast.get_docstring(tree, clean=True)
    if doc:
        parts.append(f"Module {name}\n\n{doc}")

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = f"{prefix}{node.name}"
                d = ast.get_docstring(node, clean=True)
                if d:
                    parts.append(f"{qual}\n\n{d}")
                if isinstance(node, ast.ClassDef):
                    walk(node.body, qual + ".")

    walk(tree.body, f"{name}.")
    return "\n\n".join(parts)


def _pydoc_topics(lib: Path) -> list[tuple[str, str]]:
    """The help topics as (key, text), parsed from the file's literal (not imported: the bytes decide)."""
    path = lib / "pydoc_data" / "topics.py"
    if not path.is_file():
        return []
    _, text = _read_source(path)
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "topics" for t in node.targets):
            topics = ast.literal_eval(node.value)
            return [(k, topics[k]) for k in sorted(topics) if isinstance(topics[k], str) and topics[k].strip()]
    return []


# -- math: worked integer arithmetic ---------------------------------------------------------------
class _Ints:
    """Bounded integers from raw Philox outputs (modulo: a tiny bias is irrelevant, determinism is not)."""

    def __init__(self) -> None:
        self._bg = np.random.Philox(key=np.frombuffer(b"stream/demo/math", dtype="<u8").astype(np.uint64))
        self._buf: list[int] = []

    def __call__(self, lo: int, hi: int) -> int:
        if not self._buf:
            self._buf = self._bg.random_raw(4096).tolist()[::-1]
        return lo + self._buf.pop() % (hi - lo + 1)


def _gcd_steps(a: int, b: int) -> str:
    lines = [f"Find gcd({a}, {b}) with Euclid's algorithm."]
    x, y = a, b
    while y:
        q, r = divmod(x, y)
        lines.append(f"{x} = {q} * {y} + {r}")
        x, y = y, r
    lines.append(f"So gcd({a}, {b}) = {x}.")
    return "\n".join(lines)


def _problem(r: _Ints) -> str:
    kind = r(0, 6)
    if kind == 0:
        a, b = r(100, 99999), r(11, 9999)
        digits = str(b)[::-1]
        lines = [f"Compute {a} * {b}."]
        for i, d in enumerate(digits):
            lines.append(f"{a} * {d} * 10^{i} = {a * int(d) * 10 ** i}")
        lines.append(f"Sum: {a} * {b} = {a * b}.")
        return "\n".join(lines)
    if kind == 1:
        xs = [r(1, 9999) for _ in range(r(3, 7))]
        signs = [r(0, 1) for _ in xs[1:]]
        expr, acc, lines = str(xs[0]), xs[0], []
        for x, s in zip(xs[1:], signs):
            new = acc - x if s else acc + x
            lines.append(f"{acc} {'-' if s else '+'} {x} = {new}")
            expr += f" {'-' if s else '+'} {x}"
            acc = new
        return f"Evaluate {expr}.\n" + "\n".join(lines) + f"\nThe result is {acc}."
    if kind == 2:
        g = r(1, 60)
        return _gcd_steps(g * r(2, 999), g * r(2, 999))
    if kind == 3:
        a, b, c, d = r(1, 19), r(2, 20), r(1, 19), r(2, 20)
        den = b * d // gcd(b, d)
        num = a * (den // b) + c * (den // d)
        g = gcd(num, den)
        return (f"Add {a}/{b} + {c}/{d}.\nCommon denominator {den}: {a * (den // b)}/{den} + {c * (den // d)}/{den} "
                f"= {num}/{den}" + (f" = {num // g}/{den // g}." if g > 1 else "."))
    if kind == 4:
        a, x, b = r(2, 30), r(-50, 50), r(-200, 200)
        c = a * x + b
        sb = f"+ {b}" if b >= 0 else f"- {-b}"
        return f"Solve {a}x {sb} = {c}.\n{a}x = {c} - ({b}) = {c - b}\nx = {c - b} / {a} = {x}."
    if kind == 5:
        base, e, m = r(2, 99), r(5, 60), r(7, 997)
        lines = [f"Compute {base}^{e} mod {m} by repeated squaring."]
        res, p, k = 1, base % m, e
        while k:
            if k & 1:
                lines.append(f"bit 1: result = {res} * {p} mod {m} = {res * p % m}")
                res = res * p % m
            k >>= 1
            if k:
                lines.append(f"square: {p}^2 mod {m} = {p * p % m}")
                p = p * p % m
        lines.append(f"So {base}^{e} mod {m} = {res}.")
        return "\n".join(lines)
    n = r(12, 99999)
    m, f, fac = n, 2, []
    while f * f <= m:
        while m % f == 0:
            fac.append(f)
            m //= f
        f += 1
    if m > 1:
        fac.append(m)
    return f"Factor {n} into primes.\n{n} = {' * '.join(map(str, fac))}" + (" (prime)." if len(fac) == 1 else ".")


def math_documents(budget: int) -> list[tuple[str, str]]:
    """(id, text) worked-example documents until `budget` bytes of text."""
    r, docs, used = _Ints(), [], 0
    while used < budget:
        text = f"Exercise set {len(docs) + 1}\n\n" + "\n\n".join(_problem(r) for _ in range(r(3, 12)))
        docs.append((f"math/{len(docs):06d}", text))
        used += len(text.encode("utf-8"))
    return docs


# -- assembling ------------------------------------------------------------------------------------
def collect(cfg: DemoConfig, lib: Path | None = None) -> tuple[dict[str, list[tuple[str, str]]], list[dict]]:
    """The demo's documents per source, and the input files they came from (relative path, size, blake3)."""
    lib = stdlib_dir() if lib is None else lib
    code, prose, inputs = [], [], []
    used_code = used_prose = 0
    for p in _module_files(lib):
        raw, text = _read_source(p)
        roles = []
        if len(raw) <= cfg.max_file_bytes and used_code < cfg.code_bytes and text.strip():
            code.append((f"Lib/{p.name}", text))
            used_code += len(raw)
            roles.append("code")
        doc = _docstrings(p.stem, text)
        if doc and used_prose < cfg.prose_bytes // 2:  # half of prose from docstrings, half from help topics
            prose.append((f"Lib/{p.name}#docstrings", doc))
            used_prose += len(doc.encode("utf-8"))
            roles.append("prose")
        if roles:
            inputs.append({"path": f"Lib/{p.name}", "bytes": len(raw), "blake3": blake3_bytes(raw), "used_as": roles})
    topics_file = lib / "pydoc_data" / "topics.py"
    for key, text in _pydoc_topics(lib):
        if used_prose >= cfg.prose_bytes:
            break
        prose.append((f"Lib/pydoc_data/topics.py#{key}", text))
        used_prose += len(text.encode("utf-8"))
    if topics_file.is_file():
        raw = topics_file.read_bytes()
        inputs.append({"path": "Lib/pydoc_data/topics.py", "bytes": len(raw), "blake3": blake3_bytes(raw),
                       "used_as": ["prose"]})
    return {"prose": prose, "code": code, "math": math_documents(cfg.math_bytes)}, inputs


def _write_shards(out: Path, name: str, docs: list[tuple[str, str]], shard_bytes: int) -> list[str]:
    shards, cur, size = [], [], 0
    groups: list[list[tuple[str, str]]] = []
    for d in docs:
        cur.append(d)
        size += len(d[1].encode("utf-8"))
        if size >= shard_bytes:
            groups.append(cur)
            cur, size = [], 0
    if cur:
        groups.append(cur)
    cctx = zstandard.ZstdCompressor(level=3, write_checksum=True)
    for i, g in enumerate(groups):
        lines = "".join(json.dumps({"id": did, "text": text}, ensure_ascii=False, separators=(",", ":")) + "\n"
                        for did, text in g)
        rel = f"shards/{name}/{name}-{i:05d}.jsonl.zst"
        atomic_write_bytes(out / rel, cctx.compress(lines.encode("utf-8")))
        shards.append(rel)
    return shards


def build_demo(out: str | Path, cfg: DemoConfig = DemoConfig(), progress: bool = True) -> Manifest:
    """Write the demo corpus to `out`: shards, corpus.json, inputs.json, tokenizer.json, manifest.json, cache/."""
    out = Path(out)
    docs, inputs = collect(cfg)
    weights = dict(cfg.weights)
    sources = tuple(SourceConfig(name=n, shards=tuple(_write_shards(out, n, docs[n], cfg.shard_bytes)), weight=weights[n])
                    for n in weights)
    corpus = CorpusConfig(sources=sources, root=out)
    atomic_write_json(out / "corpus.json", corpus.to_dict())
    v = sys.version_info
    atomic_write_json(out / "inputs.json", {
        "python": f"{sys.implementation.name} {v.major}.{v.minor}.{v.micro}", "stdlib_files": inputs,
        "math": {"generator": "stream.demo_corpus.math_documents", "documents": len(docs["math"])},
        "config": {k: (list(map(list, val)) if k == "weights" else val) for k, val in vars(cfg).items()}})
    # the tokenizer sample: each source's documents in shard order, up to its share of the whole demo
    total = cfg.code_bytes + cfg.prose_bytes + cfg.math_bytes
    train_tokenizer(sample_texts(([t for _, t in docs[n]] for n in weights),
                                 [int(total * w) for w in weights.values()]),
                    out / corpus.tokenizer, TokenizerConfig(vocab_size=cfg.vocab_size))
    return build_manifest(corpus, progress=progress)
