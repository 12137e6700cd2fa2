"""The stream's three generators, each a Philox4x64-10 (numpy's `Philox`) keyed only by run constants.

Keys are the first 16 bytes of SHA-256 over a canonical byte encoding (a domain tag, then each field as
8 bytes big-endian, the source as SHA-256 of its UTF-8 name), read as two little-endian uint64:

    mix    : SHA-256(b"stream/mix\\0"    + seed)
    shards : SHA-256(b"stream/shards\\0" + seed + H(source) + epoch)
    docs   : SHA-256(b"stream/docs\\0"   + seed + H(source) + epoch + shard)

Only raw 64-bit outputs (`random_raw`) are used: numpy guarantees bit-generator streams across versions,
not `Generator` methods. A permutation of n items is the stable argsort of the first n raw outputs.
The mix picks source i for a draw u when T[i-1] <= u < T[i], with integer thresholds
T[i] = floor(2**64 * P[i]) from exact rational cumulative probabilities P: no float touches the choice.
"""
from __future__ import annotations

import hashlib
from fractions import Fraction

import numpy as np

from stream.errors import ConfigError, StateError

_U64 = 1 << 64


def _u64(x: int, field: str) -> bytes:
    if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < _U64:
        raise ConfigError(f"{field}: expected an int in [0, 2**64), got {x!r}")
    return x.to_bytes(8, "big")


def source_hash(name: str) -> bytes:
    """H(source): SHA-256 of the UTF-8 name (never Python's per-process hash())."""
    return hashlib.sha256(name.encode("utf-8")).digest()


def _key(tag: bytes, payload: bytes) -> np.ndarray:
    d = hashlib.sha256(tag + b"\0" + payload).digest()
    return np.frombuffer(d[:16], dtype="<u8").astype(np.uint64)


def mix_key(seed: int) -> np.ndarray:
    return _key(b"stream/mix", _u64(seed, "seed"))


def shard_key(seed: int, source: str, epoch: int) -> np.ndarray:
    return _key(b"stream/shards", _u64(seed, "seed") + source_hash(source) + _u64(epoch, "epoch"))


def doc_key(seed: int, source: str, epoch: int, shard: int) -> np.ndarray:
    return _key(b"stream/docs", _u64(seed, "seed") + source_hash(source) + _u64(epoch, "epoch") + _u64(shard, "shard"))


def permutation(key: np.ndarray, n: int) -> np.ndarray:
    """A permutation of range(n) (int64): stable argsort of n raw Philox outputs (ties, ~n**2/2**65, by index)."""
    return np.argsort(np.random.Philox(key=key).random_raw(n), kind="stable").astype(np.int64, copy=False)


def mix_probabilities(shares: list[Fraction], documents: list[int], tokens: list[int]) -> list[Fraction]:
    """P(source) proportional to token share / mean document length, exactly.

    The mean length counts the separator (tokens + documents per document), so the expected share of
    the stream's tokens, separators included, is exactly the declared share.
    """
    raw = [Fraction(w) * d / (t + d) for w, d, t in zip(shares, documents, tokens)]
    total = sum(raw)
    return [r / total for r in raw]


def mix_thresholds(probabilities: list[Fraction]) -> np.ndarray:
    """Integer thresholds T[0..S-2] (uint64) of the cumulative probabilities."""
    if not probabilities or any(p <= 0 for p in probabilities) or sum(probabilities) != 1:
        raise ConfigError("mix probabilities: expected positive rationals summing to 1")
    cum, out = Fraction(0), []
    for p in probabilities[:-1]:
        cum += p
        out.append(cum.numerator * _U64 // cum.denominator)
    return np.array(out, dtype=np.uint64)


def pick_sources(thresholds: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """Source index of each uint64 draw: the number of thresholds <= draw (integer comparisons only)."""
    return np.searchsorted(thresholds, draws, side="right").astype(np.int64)


def _jsonable(state: dict) -> dict:
    """numpy's bit-generator state with arrays as lists of Python ints (exact in JSON)."""
    out = {}
    for k, v in state.items():
        out[k] = _jsonable(v) if isinstance(v, dict) else ([int(x) for x in v] if isinstance(v, np.ndarray) else v)
    return out


class MixGenerator:
    """The mix RNG: draw k is the k-th raw output of Philox(mix_key(seed)); `position` counts draws used."""

    def __init__(self, seed: int) -> None:
        self.key = mix_key(seed)
        self.seek(0)

    def seek(self, position: int) -> None:
        """Jump to draw `position` in O(1): Philox is counter based (4 outputs per counter step)."""
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise StateError(f"mix position: expected an int >= 0, got {position!r}")
        g = np.random.Philox(key=self.key)
        g.advance(position // 4)
        if position % 4:
            g.random_raw(position % 4)
        self._bg, self.position = g, position

    def draw(self, n: int) -> np.ndarray:
        """The next n draws (uint64)."""
        out = self._bg.random_raw(n)
        self.position += n
        return out

    def state(self) -> dict:
        """The exact bit-generator state (JSON-serializable), canonical for `position`."""
        return {"position": self.position, "bit_generator": _jsonable(self._bg.state)}

    @classmethod
    def canonical_state(cls, seed: int, position: int) -> dict:
        g = cls(seed)
        g.seek(position)
        return g.state()
