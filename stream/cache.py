"""The tokenized cache: one file per (shard digest, tokenizer digest), so a shard is tokenized once.

A cache file is an uncompressed .npz (plain .npy arrays, loaded with allow_pickle=False) inside one
zstd frame with a content checksum, so a damaged cache file fails to decompress instead of feeding
wrong tokens. Arrays: `tokens` (int32, every document followed by the separator), `offsets`
(int64, n+1: document d is tokens[offsets[d]:offsets[d+1]], separator included), `spans` (int64, n x 2:
where document d lies in the shard file) and `unit` (what a span counts).
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard

from stream.errors import StreamError
from stream.fileio import atomic_write_bytes


@dataclass(frozen=True)
class ShardTokens:
    """The tokenized documents of one shard."""

    tokens: np.ndarray
    offsets: np.ndarray
    spans: np.ndarray
    unit: str

    @property
    def documents(self) -> int:
        return self.offsets.size - 1

    @property
    def text_tokens(self) -> int:
        """Tokens without the separators (the count manifests record)."""
        return int(self.tokens.size) - self.documents


def cache_path(cache_dir: str | Path, shard_digest: str, tokenizer_digest: str) -> Path:
    """Where the tokens of a shard under a tokenizer live; both full digests are the key."""
    return Path(cache_dir) / tokenizer_digest[:2] / f"{shard_digest}.{tokenizer_digest}.npz.zst"


def write_cache(path: str | Path, st: ShardTokens) -> None:
    """Compress and write atomically."""
    buf = io.BytesIO()
    np.savez(buf, tokens=st.tokens.astype(np.int32, copy=False), offsets=st.offsets.astype(np.int64, copy=False),
             spans=st.spans.astype(np.int64, copy=False), unit=np.array(st.unit))
    data = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(buf.getvalue())
    atomic_write_bytes(path, data)


def read_cache(path: str | Path) -> ShardTokens:
    """Decompress and load (no pickle); a damaged file raises StreamError naming it."""
    try:
        raw = zstandard.ZstdDecompressor().decompress(Path(path).read_bytes())
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            st = ShardTokens(z["tokens"], z["offsets"], z["spans"], str(z["unit"]))
    except (zstandard.ZstdError, ValueError, KeyError, OSError) as e:
        raise StreamError(f"tokenized cache {path} is unreadable ({e}); delete it to re-tokenize") from None
    if st.tokens.dtype != np.int32 or st.offsets.dtype != np.int64 or st.offsets.size < 1 \
            or st.offsets[0] != 0 or st.offsets[-1] != st.tokens.size or st.spans.shape != (st.documents, 2):
        raise StreamError(f"tokenized cache {path} is malformed; delete it to re-tokenize")
    return st
