"""The verified shard store: tokens of a shard, from the cache when present, after checking digests.

Every shard's raw bytes are hashed and compared with the manifest before its tokens are used (all at
open by default, or each at first use with verify="lazy"); a cache miss tokenizes the verified bytes
once and writes the cache. Loaded shards are kept in a small LRU bounded by token count.
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from stream.cache import ShardTokens, cache_path, read_cache, write_cache
from stream.errors import ConfigError, IntegrityError, StreamError
from stream.manifest import Manifest, read_shard_bytes, verify_file
from stream.readers import read_documents
from stream.tokenizer import LoadedTokenizer, load_tokenizer

VERIFY_MODES = ("open", "lazy")


class ShardStore:
    """Shard tokens by (source index, shard index), digests verified before use."""

    def __init__(self, manifest: Manifest, cache_dir: str | Path | None = None, verify: str = "open",
                 max_tokens: int = 1 << 30) -> None:
        if verify not in VERIFY_MODES:
            raise ConfigError(f"verify: expected one of {VERIFY_MODES}, got {verify!r}")
        self.manifest = manifest
        self.cache_dir = Path(cache_dir) if cache_dir is not None else manifest.root / "cache"
        self.max_tokens = max_tokens
        self._verified: set[tuple[int, int]] = set()
        self._lru: OrderedDict[tuple[int, int], ShardTokens] = OrderedDict()
        self._held = 0
        self._tokenizer: LoadedTokenizer | None = None
        verify_file("tokenizer", manifest.tokenizer_file, manifest.tokenizer_blake3)
        if verify == "open":
            self.verify_all()

    def verify_all(self) -> None:
        """Hash every shard now; the first mismatch raises IntegrityError naming it."""
        for si, src in enumerate(self.manifest.sources):
            for hi in range(len(src.shards)):
                self._verify(si, hi)

    def _verify(self, si: int, hi: int) -> bytes:
        e = self.manifest.sources[si].shards[hi]
        data, _ = read_shard_bytes(self.manifest.shard_file(e), e.blake3, e.bytes)
        self._verified.add((si, hi))
        return data

    def _tokenize(self, si: int, hi: int, data: bytes) -> ShardTokens:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.manifest.tokenizer_file, self.manifest.separator)
            if self._tokenizer.digest != self.manifest.tokenizer_blake3:
                raise IntegrityError("tokenizer", str(self.manifest.tokenizer_file),
                                     self.manifest.tokenizer_blake3, self._tokenizer.digest)
        src = self.manifest.sources[si]
        docs = read_documents(self.manifest.shard_file(src.shards[hi]), src.text_column, data)
        tokens, offsets = self._tokenizer.encode_documents(docs.texts)
        return ShardTokens(tokens, offsets, docs.spans, docs.unit)

    def get(self, si: int, hi: int) -> ShardTokens:
        """The tokens of shard `hi` of source `si` (verified; cached on disk and in memory)."""
        key = (si, hi)
        st = self._lru.get(key)
        if st is not None:
            self._lru.move_to_end(key)
            return st
        data = self._verify(si, hi) if key not in self._verified else None
        e = self.manifest.sources[si].shards[hi]
        path = cache_path(self.cache_dir, e.blake3, self.manifest.tokenizer_blake3)
        if path.is_file():
            st = read_cache(path)
        else:
            if data is None:
                data = self._verify(si, hi)  # re-read and re-check: the file may have changed since open
            st = self._tokenize(si, hi, data)
            write_cache(path, st)
        if st.documents != e.documents or st.text_tokens != e.tokens:
            raise StreamError(f"tokenized cache {path} of shard {e.path}: {st.documents} documents / {st.text_tokens} "
                              f"tokens, manifest says {e.documents} / {e.tokens}; delete the cache file")
        self._lru[key] = st
        self._held += st.tokens.size
        while self._held > self.max_tokens and len(self._lru) > 1:
            _, old = self._lru.popitem(last=False)
            self._held -= old.tokens.size
        return st
