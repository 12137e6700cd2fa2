"""Per-source document order: the t-th document a source supplies, over all epochs.

Epoch e of a source visits its shards in the order of permutation(shard_key(seed, source, e)), and
inside shard h its documents in the order of permutation(doc_key(seed, source, e, h)); h is the
shard's index in the declared shard list. Every epoch visits every document once, so ordinal t lies
in epoch t // N at position t % N (N = the source's document count).
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from stream.mix import doc_key, permutation, shard_key


class SourceOrder:
    """Maps per-source ordinals to (shard index, document index), permutations computed lazily."""

    def __init__(self, seed: int, name: str, shard_docs: list[int], keep: int = 64) -> None:
        self.seed, self.name = seed, name
        self.shard_docs = np.asarray(shard_docs, dtype=np.int64)
        self.n = int(self.shard_docs.sum())
        self._epochs: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._docs: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._keep = keep

    def _epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        t = self._epochs.get(e)
        if t is None:
            perm = permutation(shard_key(self.seed, self.name, e), self.shard_docs.size)
            ends = np.cumsum(self.shard_docs[perm])  # end position of each shard in the epoch, permuted order
            t = self._epochs[e] = (perm, ends)
            if len(self._epochs) > 4:
                self._epochs.popitem(last=False)
        return t

    def _doc_perm(self, e: int, h: int) -> np.ndarray:
        p = self._docs.get((e, h))
        if p is None:
            p = self._docs[(e, h)] = permutation(doc_key(self.seed, self.name, e, h), int(self.shard_docs[h]))
            if len(self._docs) > self._keep:
                self._docs.popitem(last=False)
        else:
            self._docs.move_to_end((e, h))
        return p

    def locate(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard, document) of ordinals first .. first+count-1 (int64 arrays)."""
        shards = np.empty(count, dtype=np.int64)
        docs = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            t = first + done
            e, pos = divmod(t, self.n)
            k = min(count - done, self.n - pos)  # ordinals left in this epoch
            perm, ends = self._epoch(e)
            # the positions are consecutive, so each shard they touch is one contiguous run
            lo = 0
            while lo < k:
                s = int(np.searchsorted(ends, pos + lo, side="right"))  # slot in the permuted shard order
                hi = min(k, int(ends[s]) - pos)
                h = int(perm[s])
                start = int(ends[s]) - int(self.shard_docs[h])  # epoch position of this shard's first document
                shards[done + lo:done + hi] = h
                docs[done + lo:done + hi] = self._doc_perm(e, h)[pos + lo - start:pos + hi - start]
                lo = hi
            done += k
        return shards, docs
