"""The canonical window stream: documents picked by the mix, joined with separators, cut into windows.

The stream is a sequence of documents: document j comes from source pick(mix draw j); a source's k-th
pick is its k-th document in `SourceOrder` (per-source epochs roll over on their own). Each document
is followed by the separator (the cache stores it so); window m is tokens [m*L, (m+1)*L) of the
concatenation, L = seq_len + 1 (inputs and labels). Nothing here depends on ranks or machines.

Generation is block-wise (many mix draws at once, vectorized numpy) into a log of document records;
windows are gathered from the log, and the log is trimmed behind the read position. Blocks may run
ahead of what was read; `state(m)` is computed at window m's boundary from the log, so it does not
depend on the block size.
"""
from __future__ import annotations

import numpy as np

from stream.errors import ConfigError, StateError, StreamError
from stream.fileio import blake3_bytes
from stream.manifest import Manifest
from stream.mix import MixGenerator, mix_probabilities, mix_thresholds, pick_sources
from stream.order import SourceOrder
from stream.schedule import BatchSchedule
from stream.state import STATE_FORMAT, MemoryStateStore, check_state
from stream.store import ShardStore

_COLS = ("start", "src", "shard", "doc", "base", "length")  # per document: absolute first token, where, size
_MAX_BLOCK = 1 << 17  # documents per generation block: bounds memory, amortizes Python overhead
_LOOP_MIN_TOKENS = 64  # mean piece length from which one slice copy per document beats the vectorized gather


class WindowStream:
    """Windows of seq_len + 1 tokens of the canonical stream of (`manifest`, `seed`)."""

    def __init__(self, manifest: Manifest, store: ShardStore, seq_len: int, seed: int) -> None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 1 <= seq_len <= 1 << 24:
            raise ConfigError(f"seq_len: expected an int in [1, 2**24], got {seq_len!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 64:
            raise ConfigError(f"seed: expected an int in [0, 2**64), got {seed!r}")
        self.manifest, self.store, self.seq_len, self.seed = manifest, store, seq_len, seed
        self.L = seq_len + 1
        srcs = manifest.sources
        self.orders = [SourceOrder(seed, s.name, [e.documents for e in s.shards]) for s in srcs]
        self.probabilities = mix_probabilities([s.weight for s in srcs], [s.documents for s in srcs],
                                               [s.tokens for s in srcs])
        self.thresholds = mix_thresholds(self.probabilities)
        # expected tokens per document, separator included: only sizes generation blocks, never bits
        self._mean = float(sum(p * (s.tokens + s.documents) / s.documents for p, s in zip(self.probabilities, srcs)))
        self.identity = {"manifest": manifest.digest, "seed": seed, "seq_len": seq_len}
        self._mix = MixGenerator(seed)
        self._reset(0, 0, np.zeros(len(srcs), dtype=np.int64), None)

    # -- the log -------------------------------------------------------------------------------------
    def _reset(self, window: int, n: int, totals: np.ndarray, partial: tuple | None) -> None:
        """Position at window boundary `window` with n documents and per-source `totals` consumed."""
        self._mix.seek(n)
        self._totals = totals.copy()
        P = window * self.L
        if partial is None:
            self._log = {c: np.zeros(0, dtype=np.int64) for c in _COLS}
            self._n0, self._tot0, self._end = n, totals.copy(), P
        else:
            si, h, d, offset = partial
            offs = self.store.get(si, h).offsets
            base, length = int(offs[d]), int(offs[d + 1] - offs[d])
            rec = {"start": P - offset, "src": si, "shard": h, "doc": d, "base": base, "length": length}
            self._log = {c: np.array([rec[c]], dtype=np.int64) for c in _COLS}
            self._n0, self._tot0, self._end = n - 1, totals.copy(), P - offset + length
            self._tot0[si] -= 1
        self._lo = self._pos = window

    def _generate(self, min_end: int) -> None:
        """Append documents until the log reaches absolute token `min_end`."""
        while self._end < min_end:
            B = min(_MAX_BLOCK, int((min_end - self._end) / self._mean * 1.05) + 16)
            src = pick_sources(self.thresholds, self._mix.draw(B))
            shard = np.empty(B, dtype=np.int64)
            doc = np.empty(B, dtype=np.int64)
            for si in range(len(self.orders)):
                idx = np.flatnonzero(src == si)
                if idx.size:
                    shard[idx], doc[idx] = self.orders[si].locate(int(self._totals[si]), idx.size)
                    self._totals[si] += idx.size
            base = np.empty(B, dtype=np.int64)
            length = np.empty(B, dtype=np.int64)
            key = src * (1 << 32) + shard
            for k in np.unique(key):
                idx = np.flatnonzero(key == k)
                offs = self.store.get(int(k >> 32), int(k & 0xFFFFFFFF)).offsets
                d = doc[idx]
                base[idx] = offs[d]
                length[idx] = offs[d + 1] - offs[d]
            ends = np.cumsum(length) + self._end
            start = ends - length
            new = {"start": start, "src": src, "shard": shard, "doc": doc, "base": base, "length": length}
            self._log = {c: np.concatenate((self._log[c], new[c])) for c in _COLS}
            self._end = int(ends[-1])

    def _trim(self, window: int) -> None:
        """Forget documents that end at or before window `window`; they can only be re-read via a state."""
        ends = self._log["start"] + self._log["length"]
        i = int(np.searchsorted(ends, window * self.L, side="right"))
        if i:
            self._tot0 += np.bincount(self._log["src"][:i], minlength=len(self.orders))
            self._n0 += i
            self._log = {c: v[i:] for c, v in self._log.items()}
        self._lo = max(self._lo, window)

    def _need(self, start: int, end: int, chunked: bool = False) -> None:
        """Check [start, end) is ahead of the trimmed log and generate documents through it."""
        if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or not 0 <= start <= end:
            raise StreamError(f"window range [{start}, {end}) is not a valid range")
        if start < self._lo:
            raise StreamError(f"window {start} is behind this stream's position ({self._lo}); "
                              "restore a saved state at or before it (or open a fresh stream)")
        if chunked:
            # a long skip: generate in chunks of ~1M documents and trim behind, so memory stays bounded
            chunk = max(1, (_MAX_BLOCK * 8 * max(1, int(self._mean))) // self.L)
            while self._end < start * self.L:
                target = min(start, self._end // self.L + chunk)
                self._generate(target * self.L)
                self._trim(target)
        self._generate(end * self.L)

    # -- reading ---------------------------------------------------------------------------------------
    def _range(self, a: int, b: int) -> tuple[int, int]:
        """Log rows of the documents overlapping tokens [a, b)."""
        st = self._log["start"]
        return int(np.searchsorted(st, a, side="right")) - 1, int(np.searchsorted(st, b, side="left"))

    def _gather(self, a: int, b: int, out: np.ndarray) -> None:
        """Tokens [a, b) of the stream into `out` (the log covers them)."""
        i0, i1 = self._range(a, b)
        if i0 < 0 or i1 <= i0:
            raise StreamError(f"internal: tokens [{a}, {b}) are not covered by the document log")
        lg = self._log
        start, length = lg["start"][i0:i1], lg["length"][i0:i1]
        cs = np.maximum(start, a)
        ce = np.minimum(start + length, b)
        src_lo = lg["base"][i0:i1] + (cs - start)
        key = lg["src"][i0:i1] * (1 << 32) + lg["shard"][i0:i1]
        n = i1 - i0
        if n * _LOOP_MIN_TOKENS <= b - a:
            # long documents: one slice copy each; the Python loop costs ~1 us per document
            for k, lo, c0, c1 in zip(key.tolist(), src_lo.tolist(), cs.tolist(), ce.tolist()):
                out[c0 - a:c1 - a] = self.store.get(k >> 32, k & 0xFFFFFFFF).tokens[lo:lo + c1 - c0]
            return
        # short documents: build per-token source addresses with repeat/arange, one gather per shard
        seg = ce - cs
        for k in np.unique(key):
            sel = np.flatnonzero(key == k)
            lens = seg[sel]
            tot = int(lens.sum())
            excl = np.cumsum(lens) - lens
            step = np.arange(tot, dtype=np.int64) - np.repeat(excl, lens)
            toks = self.store.get(int(k >> 32), int(k & 0xFFFFFFFF)).tokens
            out[np.repeat(cs[sel] - a, lens) + step] = toks[np.repeat(src_lo[sel], lens) + step]

    def windows(self, start: int, end: int) -> np.ndarray:
        """Windows start..end-1 as an int32 array (end - start, seq_len + 1); sequential reads are cheapest."""
        self._need(start, end)
        out = np.empty((end - start) * self.L, dtype=np.int32)
        if end > start:
            self._gather(start * self.L, end * self.L, out)
        self._trim(start)
        self._pos = end
        return out.reshape(end - start, self.L)

    def window(self, m: int) -> np.ndarray:
        """Window m (int32, seq_len + 1 tokens)."""
        return self.windows(m, m + 1)[0]

    def take(self, indices: list[int] | range) -> np.ndarray:
        """The windows at ascending `indices` (e.g. one rank's share of a step), gathered run by run."""
        idx = [int(i) for i in indices]
        if any(b <= a for a, b in zip(idx, idx[1:])):
            raise StreamError("take: indices must be strictly ascending")
        out = np.empty((len(idx), self.L), dtype=np.int32)
        if not idx:
            return out
        self._need(idx[0], idx[-1] + 1)
        r = 0
        while r < len(idx):
            q = r
            while q + 1 < len(idx) and idx[q + 1] == idx[q] + 1:
                q += 1
            self._gather(idx[r] * self.L, (idx[q] + 1) * self.L, out[r:q + 1].reshape(-1))
            r = q + 1
        self._trim(idx[0])
        self._pos = idx[-1] + 1
        return out

    def advance(self, window: int) -> None:
        """Move to window boundary `window` without gathering tokens (metadata only, bounded memory)."""
        self._need(window, window, chunked=True)
        self._trim(window)
        self._pos = window

    def rewind(self) -> None:
        """Back to window 0 (the state every run starts from)."""
        self._reset(0, 0, np.zeros(len(self.orders), dtype=np.int64), None)

    def seek(self, window: int, states: MemoryStateStore | None = None, step: int | None = None) -> None:
        """Position at window boundary `window`: from here if behind it, else from the nearest saved state
        (`states`, looked up by `step`, the step that starts at `window`), else from the start."""
        near = states.nearest(step) if states is not None and step is not None else None
        if near is not None:
            w = near[1]["window"]
            if w > window:
                raise StateError(f"saved state of step {near[0]} is at window {w}, after window {window} of step {step}")
            # restore when we are past the target, or when the state lies beyond what we already generated
            if self._lo > window or w * self.L > self._end:
                self.restore(near[1])
        if self._lo > window:
            self.rewind()
        self.advance(window)

    def seek_step(self, step: int, schedule: BatchSchedule, states: MemoryStateStore | None = None) -> None:
        """Position at the first window of optimizer step `step`, using saved states when given."""
        self.seek(schedule.window_range(step)[0], states, step)

    @property
    def position(self) -> int:
        """The next window a sequential reader gets; `state()` is taken here."""
        return self._pos

    def segments(self, start: int, end: int) -> dict[str, np.ndarray]:
        """Which document tokens fill windows start..end-1: per (window, document) piece, in stream order."""
        self._need(start, end)
        a, b = start * self.L, end * self.L
        i0, i1 = self._range(a, b)
        lg = {c: v[i0:i1] for c, v in self._log.items()}
        wins, rows, lo, hi = [], [], [], []
        for m in range(start, end):
            wa, wb = m * self.L, (m + 1) * self.L
            j0 = int(np.searchsorted(lg["start"], wa, side="right")) - 1
            j1 = int(np.searchsorted(lg["start"], wb, side="left"))
            for j in range(j0, j1):
                s, ln = int(lg["start"][j]), int(lg["length"][j])
                wins.append(m)
                rows.append(j)
                lo.append(max(s, wa) - s)
                hi.append(min(s + ln, wb) - s)
        r = np.array(rows, dtype=np.int64)
        return {"window": np.array(wins, dtype=np.int64), "src": lg["src"][r], "shard": lg["shard"][r],
                "doc": lg["doc"][r], "doc_tokens": lg["length"][r], "tok_lo": np.array(lo, dtype=np.int64),
                "tok_hi": np.array(hi, dtype=np.int64), "ordinal": self._n0 + i0 + r}

    # -- state -----------------------------------------------------------------------------------------
    def state(self, window: int | None = None) -> dict:
        """The resumable state at window boundary `window` (default: `position`): JSON-serializable."""
        window = self._pos if window is None else window
        self._need(window, window)
        P = window * self.L
        lg = self._log
        j = int(np.searchsorted(lg["start"], P, side="left"))  # documents that started before P are consumed
        totals = self._tot0 + np.bincount(lg["src"][:j], minlength=len(self.orders))
        n = self._n0 + j
        partial = None
        if j and int(lg["start"][j - 1] + lg["length"][j - 1]) > P:
            si, h, d = int(lg["src"][j - 1]), int(lg["shard"][j - 1]), int(lg["doc"][j - 1])
            off = P - int(lg["start"][j - 1])
            toks = self.store.get(si, h).tokens[int(lg["base"][j - 1]) + off:int(lg["base"][j - 1] + lg["length"][j - 1])]
            partial = {"source": self.manifest.sources[si].name, "shard": h, "document": d, "offset": off,
                       "tokens": int(toks.size), "blake3": blake3_bytes(toks.astype("<i4").tobytes())}
        sources = {}
        for si, s in enumerate(self.manifest.sources):
            epoch, used = divmod(int(totals[si]), self.orders[si].n)
            sources[s.name] = {"epoch": epoch, "consumed": used}
        return {"format": STATE_FORMAT, "stream": dict(self.identity), "window": window, "documents": n,
                "mix": MixGenerator.canonical_state(self.seed, n), "sources": sources, "partial": partial}

    def state_for_step(self, step: int, schedule: BatchSchedule) -> dict:
        """The state before step `step` (at its first window): what every rank saves, whatever it read."""
        return self.state(schedule.window_range(step)[0])

    def restore(self, state: dict) -> None:
        """Continue from `state` exactly; a state of another corpus, seed or seq_len raises StateError."""
        st = check_state(state, self.identity, [s.name for s in self.manifest.sources])
        n, window = st["documents"], st["window"]
        if st["mix"] != MixGenerator.canonical_state(self.seed, n):
            raise StateError(f"state at window {window}: mix generator state does not match {n} draws")
        totals = np.array([st["sources"][s.name]["epoch"] * o.n + st["sources"][s.name]["consumed"]
                           for s, o in zip(self.manifest.sources, self.orders)], dtype=np.int64)
        if int(totals.sum()) != n:
            raise StateError(f"state at window {window}: per-source counts sum to {int(totals.sum())}, not {n}")
        p = st["partial"]
        partial = None
        if p is not None:
            si = [s.name for s in self.manifest.sources].index(p["source"])
            shard, doc = self.orders[si].locate(int(totals[si]) - 1, 1)
            if (int(shard[0]), int(doc[0])) != (p["shard"], p["document"]):
                raise StateError(f"state at window {window}: partial document is not source {p['source']!r}'s last")
            partial = (si, p["shard"], p["document"], p["offset"])
        self._reset(window, n, totals, partial)
        if p is not None:
            lg = self._log
            toks = self.store.get(partial[0], partial[1]).tokens[int(lg["base"][0]) + p["offset"]:int(lg["base"][0] + lg["length"][0])]
            if toks.size != p["tokens"] or blake3_bytes(toks.astype("<i4").tobytes()) != p["blake3"]:
                raise StateError(f"state at window {window}: the partial-window tokens do not match the corpus")
