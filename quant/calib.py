"""The deterministic calibration corpus (the ARVQ write-up, section 8), built from the project's embedded corpus.

Documents come from the corpus's shards (each file's blake3 checked against its manifest first), tokenized
with the corpus's own tokenizer (no special tokens, as the stream does), or with a model's own tokenizer.json
(a Hugging Face donor: its ids, its end-of-text id as the separator). Per source, a Philox shuffle of
the documents under seed 42; the last `held_out_share` of each shuffle is held out (the calibration's
held-out prompts) and never enters a split. The rest is joined with the separator (id 0) per source,
cut into windows of seq_len + 1 tokens, and windows are drawn by the domain mix (token shares) into the
train / val / audit splits. Exact-match purge: a training window that shares any `purge_ngram`-token run
with a held-out prompt (or with extra held-out windows, e.g. the model's held-out CE set) is removed.
The held-out documents, joined and cut the same way, come back as 'held_out' windows: a held-out
cross-entropy set no split has seen.
quant does not import stream (layering): it reads the shard files the stream wrote, and verifies them.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import blake3
import numpy as np
import torch
import zstandard

from kernels.ref.philox import random_bits
from quant.errors import ConfigError, IntegrityError

SEPARATOR = 0
SPLIT_SIZES = (("train", 256), ("val", 32), ("audit", 32))


@dataclass(frozen=True)
class CalibConfig:
    """Defaults: seed 42, a code/prose/math mix, 10% of documents held out, windows of the tiny models."""
    corpus: str = "data/demo"
    seed: int = 42
    mix: tuple[tuple[str, float], ...] = (("code", 0.4), ("prose", 0.4), ("math", 0.2))
    held_out_share: float = 0.1
    seq_len: int = 64
    train: int = 256
    val: int = 32
    audit: int = 32
    purge_ngram: int = 16

    def __post_init__(self) -> None:
        if not 0 < self.held_out_share < 1:
            raise ConfigError(f"CalibConfig.held_out_share must be in (0, 1), got {self.held_out_share}")
        if not self.mix or any(w <= 0 for _, w in self.mix):
            raise ConfigError(f"CalibConfig.mix needs positive shares, got {self.mix}")
        for name in ("seq_len", "train", "val", "audit", "purge_ngram"):
            if getattr(self, name) < 1:
                raise ConfigError(f"CalibConfig.{name} must be >= 1, got {getattr(self, name)}")


def _documents(corpus: Path, source: dict) -> list[str]:
    docs = []
    for shard in source["shards"]:
        path = corpus / shard["path"]
        data = path.read_bytes()
        got = blake3.blake3(data).hexdigest()
        if got != shard["blake3"]:
            raise IntegrityError(path, f"blake3 {shard['blake3']}", f"blake3 {got}", "shard changed since the manifest")
        for line in zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 30).decode().splitlines():
            docs.append(json.loads(line)[source.get("text_column", "text")])
    return docs


def _shuffle(n: int, seed: int, stream: int) -> list[int]:
    keys = random_bits(seed, stream, n) * max(n, 1) + torch.arange(n)  # distinct int64 keys: a permutation
    return torch.sort(keys).indices.tolist()


def _ngrams(ids: np.ndarray, n: int) -> set[bytes]:
    if len(ids) < n:
        return set()
    v = np.lib.stride_tricks.sliding_window_view(ids.astype(np.int32), n)
    return {row.tobytes() for row in v}


def _windows(enc: list[np.ndarray], separator: int, seq_len: int) -> np.ndarray:
    buf = np.concatenate([np.append(e, separator) for e in enc]) if enc else np.zeros(0, dtype=np.int64)
    w = len(buf) // (seq_len + 1)
    return buf[: w * (seq_len + 1)].reshape(w, seq_len + 1)


def build(cfg: CalibConfig = CalibConfig(), extra_held_out: torch.Tensor | None = None,
          tokenizer: str | Path | None = None, separator: int = SEPARATOR) -> dict:
    """{'train'|'val'|'audit'|'held_out': int64 windows [W, seq_len + 1], 'stats': provenance and counts}.
    `tokenizer`: a tokenizer.json to use instead of the corpus's, `separator` its id joining documents."""
    from tokenizers import Tokenizer
    corpus = Path(cfg.corpus)
    manifest = json.loads((corpus / "manifest.json").read_text())
    tok_path = Path(tokenizer) if tokenizer is not None else corpus / "tokenizer.json"
    tok = Tokenizer.from_file(str(tok_path))
    sources = {s["name"]: s for s in manifest["sources"]}
    unknown = [name for name, _ in cfg.mix if name not in sources]
    if unknown:
        raise ConfigError(f"CalibConfig.mix: sources {unknown} not in {corpus} (has {sorted(sources)})")
    held_grams: set[bytes] = set()
    held_docs: list[np.ndarray] = []
    streams, stats = {}, {"config": asdict(cfg), "corpus_manifest_blake3": blake3.blake3(
        (corpus / "manifest.json").read_bytes()).hexdigest(), "sources": {}}
    if tokenizer is not None:
        stats["tokenizer_blake3"] = blake3.blake3(tok_path.read_bytes()).hexdigest()
    for si, (name, _) in enumerate(cfg.mix):
        docs = _documents(corpus, sources[name])
        order = _shuffle(len(docs), cfg.seed, si)
        cut = len(order) - max(1, round(cfg.held_out_share * len(order)))
        enc = [np.array(e.ids, dtype=np.int64) for e in tok.encode_batch([docs[i] for i in order],
                                                                         add_special_tokens=False)]
        for e in enc[cut:]:
            held_grams |= _ngrams(e, cfg.purge_ngram)
        held_docs += enc[cut:]
        streams[name] = _windows(enc[:cut], separator, cfg.seq_len)
        w = len(streams[name])
        stats["sources"][name] = {"documents": len(docs), "held_out_documents": len(docs) - cut, "windows": w}
    if extra_held_out is not None:
        for row in extra_held_out.numpy():
            held_grams |= _ngrams(row, cfg.purge_ngram)
    purged = {}
    for name, win in streams.items():
        keep = [i for i in range(len(win)) if not (_ngrams(win[i], cfg.purge_ngram) & held_grams)]
        purged[name] = len(win) - len(keep)
        streams[name] = win[keep]
    stats["purged_windows"] = purged
    # the mix: each split takes round(share * size) windows per source, sources in mix order, in window order
    total = sum(w for _, w in cfg.mix)
    pos = {name: 0 for name in streams}
    out = {}
    for split, size in (("train", cfg.train), ("val", cfg.val), ("audit", cfg.audit)):
        rows = []
        for name, share in cfg.mix:
            n = round(size * share / total)
            if pos[name] + n > len(streams[name]):
                raise ConfigError(f"calibration split {split}: source {name} has {len(streams[name])} windows, "
                                  f"needs {pos[name] + n}")
            rows.append(streams[name][pos[name]:pos[name] + n])
            pos[name] += n
        out[split] = torch.from_numpy(np.concatenate(rows)).to(torch.int64)
    stats["windows"] = {k: int(v.shape[0]) for k, v in out.items()}
    stats["blake3"] = {k: blake3.blake3(v.numpy().tobytes()).hexdigest() for k, v in out.items()}
    out["held_out"] = torch.from_numpy(_windows(held_docs, separator, cfg.seq_len)).to(torch.int64)
    out["stats"] = stats
    return out
